"""Engines that answer from a finished run's completion caches instead of a model (docs/scale.md#host-cost-and-the-gpu-speed-simulator).

`ReplayEngine` answers every request with the completion a finished run stored for it (the same key:
local_llm/engine.py `request_key`) and fails on a miss (`ReplayMiss`): it never computes anything, so a run
replayed through it costs exactly clarify's own work (retrieval, prompts, parsing, grammars, cache,
tables). bench/bench_host.py times that work with it.

With a `GpuModel` it becomes the GPU-speed engine simulator: each `step()` is one step of a continuous-
batching engine (vLLM V1's scheduler, reduced to what sets its speed: a token budget per step, decode first,
then prefill chunks by priority, at most `max_num_seqs` running, a KV cache of fixed size), timed by a
roofline model of the GPU (`GpuModel.step_s`) on a **virtual clock**, never by sleeping. The host's own
time between engine calls is measured (wall clock, minus this engine's own book-keeping) and added to the
same clock, so the projected wall time of a run is the real scheduler and tree program's work at this
machine's speed plus a *modelled* engine: a model, not a measurement (every result says so).

Two ways the engine and the host share the clock (`overlap`):
* False, the engine core in the host's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, local_llm/settings.py):
  the engine steps only inside `step()`; every second of host work is a second the GPU waits.
* True, the engine core in its own process (vLLM V1's default design: vllm/v1/engine/core_client.py
  `MPClient`): the engine keeps stepping on what it has while the host works; `step()` returns what
  finished by the host's time, or waits for the next step that finishes something.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clarify.errors import InputError
from clarify.local_llm.cache import _checksum, _completion, read_only_uri
from clarify.local_llm.engine import Completion, GenParams, NoEngineInfo, Request, request_key


class ReplayMiss(RuntimeError):
    """A request the finished run never made (another config, prompt code or model): a replay must not guess."""


def read_caches(paths: Sequence[str | os.PathLike]) -> dict[str, Completion]:
    """Every completion of the given cache files (SQLite, local_llm/cache.py), by key; a row whose checksum
    fails is left out (a replay then misses it loudly)."""
    out: dict[str, Completion] = {}
    for path in paths:
        if os.path.getsize(path) == 0:
            continue
        try:
            con = sqlite3.connect(read_only_uri(path), uri=True)
            rows = con.execute("SELECT key, payload, checksum FROM completions").fetchall()
            con.close()
        except sqlite3.DatabaseError as exc:
            raise InputError(f"not a completion cache ({exc})", path=str(path)) from exc
        for key, payload, checksum in rows:
            if checksum == _checksum(key, payload):
                out.setdefault(key, _completion(payload))
    return out


def run_caches(run_dir: str | os.PathLike) -> list[Path]:
    """A run directory's completion caches (its own and its workers': `cache/*.sqlite`)."""
    files = sorted(Path(run_dir, "cache").glob("*.sqlite"))
    if not files:
        raise InputError("holds no completion cache (cache/*.sqlite): replay a run that made its trees",
                         path=str(run_dir))
    return files


# --------------------------------------------------------------------------- the GPU model


@dataclass(frozen=True)
class GpuModel:
    """One model on one GPU, as the simulator times it. Every number is a published specification or a
    stated assumption (`sources`); `step_s` is a roofline: a step costs the larger of reading the weights
    and the running sequences' KV cache from memory, and its matmul FLOPs (2 x parameters per token,
    Kaplan et al. 2020, §2.1), plus a fixed per-step overhead."""

    name: str
    params: float  # model parameters
    bytes_per_param: float  # 2: bfloat16 weights
    kv_bytes_per_token: float  # 2 (K, V) x layers x KV heads x head dim x 2 bytes
    peak_flops: float  # dense bfloat16 tensor FLOP/s
    mfu: float  # share of peak a step's matmuls reach (assumption)
    hbm_bytes_per_s: float
    bandwidth_efficiency: float  # share of peak bandwidth a step's reads reach (assumption)
    step_overhead_s: float  # scheduling, sampling, launch per step (assumption)
    gpu_bytes: float
    memory_utilization: float  # vLLM's gpu_memory_utilization default
    max_num_seqs: int
    max_num_batched_tokens: int
    sources: tuple[str, ...]

    def kv_tokens(self) -> int:
        """Tokens the KV cache holds: the memory vLLM may use, less the weights (activations ignored)."""
        return int((self.gpu_bytes * self.memory_utilization - self.params * self.bytes_per_param)
                   / self.kv_bytes_per_token)

    def step_s(self, prefill_tokens: int, decode_seqs: int, kv_tokens_read: int) -> float:
        """Seconds of one engine step that prefills `prefill_tokens`, decodes one token for each of
        `decode_seqs` sequences and reads `kv_tokens_read` tokens of KV cache."""
        memory = (self.params * self.bytes_per_param + kv_tokens_read * self.kv_bytes_per_token) / (
            self.hbm_bytes_per_s * self.bandwidth_efficiency)
        compute = 2 * self.params * (prefill_tokens + decode_seqs) / (self.peak_flops * self.mfu)
        return self.step_overhead_s + max(memory, compute)


def _h100_llama_8b() -> GpuModel:
    from clarify.local_llm.settings import GPU_MAX_NUM_BATCHED_TOKENS, GPU_MAX_NUM_SEQS

    return GpuModel(
        name="Llama-3.1-8B-Instruct, bfloat16, one H100 SXM 80 GB (vLLM V1)",
        params=8.03e9, bytes_per_param=2, kv_bytes_per_token=2 * 32 * 8 * 128 * 2,
        peak_flops=989e12, mfu=0.5, hbm_bytes_per_s=3.35e12, bandwidth_efficiency=0.7, step_overhead_s=0.002,
        gpu_bytes=80e9, memory_utilization=0.9,
        max_num_seqs=GPU_MAX_NUM_SEQS, max_num_batched_tokens=GPU_MAX_NUM_BATCHED_TOKENS,
        sources=(
            "parameters, layers (32), KV heads (8), head dim (128): meta-llama/Llama-3.1-8B-Instruct config.json",
            "989 TFLOP/s dense BF16, 3.35 TB/s HBM3, 80 GB: NVIDIA H100 SXM datasheet",
            "2 FLOPs per parameter per token: Kaplan et al., 'Scaling Laws for Neural Language Models', 2020, §2.1",
            "max_num_seqs, max_num_batched_tokens, gpu_memory_utilization: local_llm/settings.py (vLLM's defaults)",
            "assumed: 50 % MFU in prefill, 70 % of peak bandwidth in decode, 2 ms per step of scheduling and "
            "sampling; at batch 1 the model gives ~9 ms per output token, as published vLLM H100 runs of "
            "Llama-3.1-8B report 6-10 ms",
        ),
    )


GPU_MODELS = {"h100-llama-8b": _h100_llama_8b}  # the declared table: name -> model (bench/bench_simulate.py --gpu)


# --------------------------------------------------------------------------- the engine


@dataclass
class _Seq:
    """One request inside the simulated engine."""

    rid: str
    comp: Completion
    priority: int
    arrival: float
    serial: int
    prompt_left: int  # prompt tokens still to prefill
    out_left: int  # output tokens still to decode
    context: int = 0  # tokens in its KV cache


@dataclass
class SimStats:
    """What the simulated engine did on its virtual clock (seconds)."""

    busy_s: float = 0.0  # engine steps
    host_s: float = 0.0  # measured host work between engine calls
    wall_s: float = 0.0  # the virtual clock at the last engine call
    steps: int = 0
    prefill_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    running: list[int] = field(default_factory=list)  # running sequences per step

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        run = d.pop("running")
        d["running_mean"] = round(sum(run) / len(run), 1) if run else None
        d["busy_share"] = round(self.busy_s / self.wall_s, 4) if self.wall_s else None
        return d


class ReplayEngine(NoEngineInfo):
    """An Engine and a StepEngine (local_llm/engine.py) answering from `completions` (key -> Completion,
    `read_caches`) under `model_id`, the engine model id the finished run recorded (summary.json
    `engine.model_id`): the keys are the run's own. A miss raises ReplayMiss naming the request.

    `gpu`: time each `step()` on a virtual clock (module docstring; `overlap` chooses how the host and the
    engine share it); None: an instant engine whose `step()` returns everything submitted.
    `max_model_len`, `count_tokens`: the context check the real engine made (the scheduler sends no prompt
    that does not fit: the same decision, so the same requests). `capacity`: what the real engine ran at
    once (the scheduler admits trees by it)."""

    def __init__(self, completions: dict[str, Completion], model_id: str, *, gpu: GpuModel | None = None,
                 overlap: bool = False, max_model_len: int | None = None, count_tokens=None,
                 capacity: int | None = None, prefix_cached_share: float = 0.0):
        self.completions, self.model_id, self.gpu, self.overlap = completions, model_id, gpu, overlap
        self.max_model_len = max_model_len
        self._count = count_tokens
        self._capacity = capacity if capacity is not None else (gpu.max_num_seqs if gpu else None)
        self.prefix_cached_share = prefix_cached_share  # prompt tokens served by vLLM's prefix cache
        self.sim = SimStats()
        self.own_s = 0.0  # wall seconds spent in this engine's own methods (not host work, not engine work)
        self._waiting: list[_Seq] = []  # submitted, not yet admitted (in submission order)
        self._running: list[_Seq] = []
        self._done: list[tuple[float, str, Completion]] = []  # (finish time, rid, completion), finish order
        self._queue: list[tuple[str, Completion]] = []  # instant mode
        self._serial = 0
        self._clock = 0.0  # the host's virtual time at the last engine call's return
        self._engine_clock = 0.0  # overlap: where the engine's own timeline is
        self._ends: list[float] = []  # overlap: ends of the steps the host has not seen yet
        self._back = time.perf_counter()  # wall time the last engine call returned
        self._own_since = 0.0  # own seconds since then

    def start_clock(self) -> None:
        """The virtual clock starts now: what the host did before (opening the index, the encoder) is not
        part of the run's ToC time."""
        self._back, self._own_since, self._clock = time.perf_counter(), 0.0, 0.0

    # -- EngineInfo -----------------------------------------------------------------------------------
    def count_tokens(self, prompt: str) -> int | None:
        return self._count(prompt) if self._count is not None else None

    def capacity(self) -> int | None:
        return self._capacity

    def facts(self) -> dict:
        return {"model_id": self.model_id, "device": "replay" if self.gpu is None else "simulated",
                "simulated": self.gpu.name if self.gpu else None}

    # -- answers --------------------------------------------------------------------------------------
    def _answer(self, prompt: str, params: GenParams) -> Completion:
        key = request_key(self.model_id, prompt, params)
        comp = self.completions.get(key)
        if comp is None:
            raise ReplayMiss(f"request {key[:16]} is not in the replayed caches (the run was made with other "
                             f"settings, prompt code or model than this replay; prompt starts "
                             f"{prompt[:80]!r})")
        return dataclasses.replace(comp, cached=False)

    def generate(self, prompts: Sequence[str], params: Sequence[GenParams]) -> list[Completion]:
        t0 = time.perf_counter()
        try:
            return [self._answer(p, gp) for p, gp in zip(prompts, params)]
        finally:
            self.own_s += time.perf_counter() - t0

    # -- the step loop --------------------------------------------------------------------------------
    def _host_now(self, t: float) -> float:
        """The host's virtual time at wall time `t`: the last return plus the host work since."""
        return self._clock + max(0.0, t - self._back - self._own_since)

    def submit(self, requests: Sequence[Request]) -> None:
        t0 = time.perf_counter()
        arrival = self._host_now(t0)
        for r in requests:
            comp = self._answer(r.prompt, r.params)
            if self.gpu is None:
                self._queue.append((r.rid, comp))
                continue
            prompt = max(1, round(comp.prompt_tokens * (1 - self.prefix_cached_share)))
            self._waiting.append(_Seq(r.rid, comp, r.priority, arrival, self._serial, prompt,
                                      max(1, comp.output_tokens)))
            self._serial += 1
            self.sim.requests += 1
        spent = time.perf_counter() - t0
        self.own_s += spent
        self._own_since += spent

    def pending(self) -> int:
        return len(self._queue) + len(self._waiting) + len(self._running) + len(self._done)

    def cancel(self) -> None:
        self._queue, self._waiting, self._running, self._done = [], [], [], []

    def step(self) -> list[tuple[str, Completion]]:
        t_in = time.perf_counter()
        if self.gpu is None:
            out, self._queue = self._queue, []
            self.own_s += time.perf_counter() - t_in
            return out
        now = self._host_now(t_in)
        self.sim.host_s += now - self._clock
        if self.overlap:
            # vLLM's LLMEngine.step() with the core in its own process returns the outputs of the core's steps
            # that ended since the last call, or waits for the next one to end (vllm/v1/engine/llm_engine.py
            # `step`: engine_core.get_output())
            last = self._clock
            self._advance(now)
            if not any(last < e <= now for e in self._ends) and (self._waiting or self._running):
                if self._engine_clock > now:  # a step under way ends after the host's time: wait for it
                    now = self._engine_clock
                else:
                    now = self._one_step(max(now, self._engine_clock, self._next_start()))
            self._ends = [e for e in self._ends if e > now]
        elif self._waiting or self._running:  # the engine runs only now: one step, from the host's time
            now = self._one_step(max(now, self._next_start()))
        out = [(rid, c) for t, rid, c in self._done if t <= now]
        self._done = [d for d in self._done if d[0] > now]
        self._clock = self.sim.wall_s = now
        self._back, self._own_since = time.perf_counter(), 0.0
        self.own_s += self._back - t_in
        return out

    def _next_start(self) -> float:
        """When the next step can start: now if sequences run, else when the first waiting request arrived."""
        return 0.0 if self._running else min((s.arrival for s in self._waiting), default=0.0)

    def _advance(self, until: float) -> None:
        """Overlap: the engine's own steps on what has arrived, while its clock is behind `until`; an engine
        with nothing to do waits at `until`."""
        while self._waiting or self._running:
            start = max(self._engine_clock, self._next_start())
            if start >= until:
                return
            self._one_step(start)
        self._engine_clock = max(self._engine_clock, until)

    def _one_step(self, start: float) -> float:
        """One engine step from `start` (vLLM V1's scheduler, simplified: decode every running sequence, then
        prefill in priority order within the token budget, admitting while seats and KV cache allow)."""
        gpu = self.gpu
        budget = gpu.max_num_batched_tokens
        decoding = [s for s in self._running if s.prompt_left == 0]
        budget -= len(decoding)
        prefill = 0
        kv_free = gpu.kv_tokens() - sum(s.context + s.out_left for s in self._running)
        for s in (s for s in self._running if s.prompt_left > 0):  # chunked prefills already admitted
            take = min(s.prompt_left, budget)
            s.prompt_left -= take
            s.context += take
            prefill += take
            budget -= take
        # vLLM's priority policy: lower priority value first, then arrival (local_llm/settings.py scheduling_policy)
        arrived = sorted((s for s in self._waiting if s.arrival <= start), key=lambda s: (s.priority, s.serial))
        admitted: set[int] = set()
        for s in arrived:
            need = s.prompt_left + s.out_left
            if budget <= 0 or len(self._running) >= gpu.max_num_seqs or need > kv_free:
                break
            admitted.add(s.serial)
            kv_free -= need
            take = min(s.prompt_left, budget)
            s.prompt_left -= take
            s.context += take
            prefill += take
            budget -= take
            self._running.append(s)
        if admitted:
            self._waiting = [s for s in self._waiting if s.serial not in admitted]
        kv_read = sum(s.context for s in decoding)
        dt = gpu.step_s(prefill, len(decoding), kv_read)
        end = start + dt
        # every sequence whose prompt is in the cache after this step samples a token: the decoding ones,
        # and a prefill completed in this step (its first output token)
        sampled = [s for s in self._running if s.prompt_left == 0]
        for s in sampled:
            s.out_left -= 1
            s.context += 1
        finished = [s for s in sampled if s.out_left == 0]
        if finished:
            self._running = [s for s in self._running if s.out_left > 0 or s.prompt_left > 0]
            self._done.extend((end, s.rid, s.comp) for s in finished)
        self.sim.busy_s += dt
        self.sim.steps += 1
        self.sim.prefill_tokens += prefill
        self.sim.output_tokens += len(sampled)
        self.sim.running.append(len(self._running) + len(finished))
        self._engine_clock = end
        if self.overlap:
            self._ends.append(end)
        return end
