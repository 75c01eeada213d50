"""Which GPUs each model of `clarify compare` runs on, and when: packed by memory need.

Each model's need is the preflight's estimate (local_llm/preflight.py `need_per_gpu`: its weights in its
dtype and one sequence's KV cache at its max_model_len, shared by its tensor-parallel GPUs, plus the
overhead each GPU carries), against what an engine may use of a GPU (`budget_of`: free memory, at most
gpu_memory_utilization of the total). A model gets the fewest GPUs that hold it: the smallest
tensor_parallel_size, a power of two dividing the GPU count (vLLM shards attention heads evenly; a group
of 2^k GPUs tiles the machine), or the one its entry sets. A model that fits on no group is refused
before anything starts, and so is a GPU the pinned CUDA 13 stack cannot run on (compute capability
< 7.5: a V100).

Models start largest first (the one that needs the most GPUs cannot be starved by small ones) on the
lowest free GPU ids; what does not fit waits in that order and starts the moment enough GPUs are free
(`Pool`, `run_queue`): a queued model that fits on the freed GPUs starts even when one before it still
waits for more. On a Ray cluster (`--ray-address`) the same tensor_parallel_size becomes the run's
resource request (batch/run/cluster.py `_plan`: a placement group of that many GPU bundles), and Ray queues it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from clarify.errors import InputError
from clarify.local_llm.preflight import Gpu, ModelShape, Need, budget_of, gib, need_per_gpu
from clarify.local_llm.settings import Ask, Device, dtype_for, unsupported


@dataclass(frozen=True)
class Model:
    """One model to place: its name, shape (None: it needs no GPU of this machine, e.g. an OpenAI-compatible
    server) and its `[model]` settings as an Ask (tensor_parallel_size 0: the planner chooses)."""

    name: str
    shape: ModelShape | None
    ask: Ask


@dataclass
class Placement:
    name: str
    tp: int  # GPUs it runs on (its tensor_parallel_size); 0: none
    need: Need | None
    dtype: str
    why: str
    gpus: list[int] = field(default_factory=list)  # GPUs at the start (empty: queued, or none needed)
    order: int = 0  # 1, 2, ...: the order in which models start or are queued
    eligible: frozenset[int] = frozenset()  # the GPUs with room for its share (free memory differs by GPU)


@dataclass
class Plan:
    gpus: list[Gpu]
    placements: list[Placement]  # in start order

    def started(self) -> list[Placement]:
        return [p for p in self.placements if p.gpus or p.tp == 0]

    def queued(self) -> list[Placement]:
        return [p for p in self.placements if p.tp and not p.gpus]

    def text(self) -> str:
        """The plan as printed before anything starts."""
        if self.gpus:
            g = self.gpus[0]
            same = all((x.name, x.total_bytes) == (g.name, g.total_bytes) for x in self.gpus)
            head = (f"plan: {len(self.gpus)} GPUs ({g.name}, {gib(g.total_bytes)} each)" if same else
                    f"plan: {len(self.gpus)} GPUs ({', '.join(f'{i}: {x.name} {gib(x.total_bytes)}' for i, x in enumerate(self.gpus))})")
        else:
            head = "plan: no GPU on this machine"
        width = max(len(p.name) for p in self.placements)
        lines = [head]
        for p in self.placements:
            if p.tp == 0:
                where = "no GPU"
            elif p.gpus:
                where = f"GPUs {','.join(map(str, p.gpus))}" if p.tp > 1 else f"GPU {p.gpus[0]}"
            else:
                where = f"queued: the first {p.tp} GPU{'s' if p.tp > 1 else ''} that free up"
            lines.append(f"  {p.order}. {p.name:<{width}}  {where}  ({p.why})")
        idle = sorted(set(range(len(self.gpus))) - {i for p in self.placements for i in p.gpus})
        if self.gpus and idle:
            lines.append(f"  idle at the start: GPU{'s' if len(idle) > 1 else ''} {','.join(map(str, idle))}")
        return "\n".join(lines)


def group_sizes(n_gpus: int) -> list[int]:
    """The tensor-parallel sizes a model may get on `n_gpus`: powers of two dividing the count."""
    return [k for k in (1 << i for i in range(n_gpus.bit_length())) if k <= n_gpus and n_gpus % k == 0]


def place(model: Model, gpus: list[Gpu]) -> Placement:
    """The fewest GPUs that hold `model` (or the tensor_parallel_size it sets), and why; InputError naming
    the model when no group of these GPUs holds it."""
    if model.shape is None:
        return Placement(model.name, 0, None, model.ask.dtype, "needs no GPU here (a server's model)")
    first = gpus[0]
    dtype = dtype_for(Device("cuda", capability=first.capability, name=first.name, count=len(gpus)), model.ask)
    budgets = sorted((budget_of(g, model.ask.gpu_memory_utilization) for g in gpus), reverse=True)
    util = model.ask.gpu_memory_utilization
    asked = model.ask.tensor_parallel_size
    sizes = [asked] if asked else group_sizes(len(gpus))
    if asked > len(gpus):
        raise InputError(f"model {model.name!r}: tensor_parallel_size {asked} needs {asked} GPUs; this machine has "
                         f"{len(gpus)}", field="tensor_parallel_size")
    smaller = None
    for tp in sizes:
        need = need_per_gpu(model.shape, model.ask, dtype, tp)
        if need.total <= budgets[tp - 1]:  # the tp GPUs with the most room each hold a share
            why = f"{gib(need.total)} per GPU: {need.why(model.ask.max_model_len, dtype)}"
            if smaller is not None:
                why += f"; on {smaller[0]} GPU{'s' if smaller[0] > 1 else ''} {gib(smaller[1].total)} > {gib(budgets[0])}"
            elif tp == asked and asked > 1:
                why += ", tensor_parallel_size as set"
            room = frozenset(i for i, g in enumerate(gpus) if need.total <= budget_of(g, util))
            return Placement(model.name, tp, need, dtype, why, eligible=room)
        smaller = (tp, need)
    tp, need = smaller
    raise InputError(f"model {model.name!r} fits on no GPU group here: on {tp} GPU{'s' if tp > 1 else ''} it needs "
                     f"{gib(need.total)} per GPU ({need.why(model.ask.max_model_len, dtype)}), each has at most "
                     f"{gib(budgets[0])} (gpu_memory_utilization {util}); use a quantized model, a smaller "
                     f"max_model_len or more GPUs", field="models")


def plan(models: list[Model], gpus: list[Gpu]) -> Plan:
    """Every model placed (`place`; all checked before anything starts), the largest first, and which
    start at once on which GPUs (`Pool`); the rest queued in that order."""
    if not gpus:
        raise InputError("no GPU visible: a GPU plan needs CUDA_VISIBLE_DEVICES / nvidia-smi GPUs", field="models")
    for i, g in enumerate(gpus):  # CUDA 13 has no kernels below 7.5 (local_llm/settings.py GPU_MIN_CAPABILITY)
        if why := unsupported(Device("cuda", capability=g.capability, name=g.name, count=len(gpus))):
            raise InputError(f"GPU {i}: {why}", field="models")
    placements = [place(m, gpus) for m in models]
    order = sorted(range(len(placements)),
                   key=lambda i: (-placements[i].tp, -(placements[i].need.total if placements[i].need else 0)))
    ranked = [placements[i] for i in order]
    pool = Pool(len(gpus))
    for k, p in enumerate(ranked, 1):
        p.order = k
        if p.tp and (ids := pool.take(p.tp, p.eligible)) is not None:
            p.gpus = ids
    return Plan(gpus, ranked)


class Pool:
    """Free GPU ids; `take(k, eligible)`: the k lowest free ids among `eligible` (the GPUs with room for the
    model), aligned to a block of k where one is free (so groups of 2 and 4 stay on neighbouring GPUs), or
    None when fewer than k are free."""

    def __init__(self, n: int):
        self.free = set(range(n))
        self.n = n

    def take(self, k: int, eligible: frozenset[int] | None = None) -> list[int] | None:
        usable = self.free if eligible is None else self.free & eligible
        if len(usable) < k:
            return None
        for start in range(0, self.n - k + 1, k):
            block = set(range(start, start + k))
            if block <= usable:
                self.free -= block
                return sorted(block)
        ids = sorted(usable)[:k]
        self.free -= set(ids)
        return ids

    def give(self, ids: list[int]) -> None:
        self.free |= set(ids)


def run_queue(the_plan: Plan, start: Callable[[Placement, list[int]], object],
              on_finished: Callable[[Placement, object], None] | None = None, poll_s: float = 0.2,
              sleep: Callable[[float], None] = time.sleep) -> list[tuple[str, list[int]]]:
    """Start the plan's models as GPUs allow: those placed at the start, then each queued model the moment
    enough GPUs are free. `start(placement, gpu_ids)` returns a handle with `poll()` (None while running,
    as subprocess.Popen); `on_finished(placement, handle)` is called as each ends. Returns the starts in
    order, (model, GPU ids)."""
    pool = Pool(len(the_plan.gpus))
    running: dict[str, tuple[Placement, list[int], object]] = {}
    waiting = list(the_plan.placements)
    starts: list[tuple[str, list[int]]] = []
    while waiting or running:
        for p in list(waiting):
            ids = [] if p.tp == 0 else pool.take(p.tp, p.eligible)
            if ids is None:
                continue
            waiting.remove(p)
            running[p.name] = (p, ids, start(p, ids))
            starts.append((p.name, ids))
        done = [name for name, (_, _, h) in running.items() if h.poll() is not None]
        for name in done:
            p, ids, h = running.pop(name)
            pool.give(ids)
            if on_finished:
                on_finished(p, h)
        if running and not done:
            sleep(poll_s)
    return starts
