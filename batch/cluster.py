"""`clarify run --workers N` / `--ray-address ADDR`: one run spread over many engines with Ray (issue 14).

    driver   the `clarify run` process. It holds the run directory (its lock, config, parts, final tables),
             hands out chunks of `chunk_questions` unfinished questions from a queue (a free worker takes
             the next one, so fast workers take more) and writes each finished chunk as one part
             (batch/rundir.py) the moment it returns; then the final tables, exactly as a one-process run.
    workers  Ray actors (`Worker`), one engine each: a GPU (`num_gpus=1`), a tensor-parallel group of GPUs
             (a placement group of `tensor_parallel_size` GPU bundles on one node; vLLM's Ray executor
             places its shards in it), or on CPU its own cores (VLLM_CPU_OMP_THREADS_BIND). Each opens the
             index (from a path every node can read), the demo pools and its own completion cache file
             `cache/worker-NN.sqlite` (SQLite is never written from two hosts), reading the run's other
             cache files too, and runs the configured scheduler (continuous by default) over its chunk.

Results never depend on which worker ran a chunk, or how the questions were chunked: a tree's requests,
keys and seeds depend only on its question, node and expansion count (batch/program.py), and the final
tables are sorted by question (pipeline.finalize). A worker that dies (actor killed, node lost) has its
chunk put back at the head of the queue and its slot restarted (`MAX_RESTARTS`); what it computed before
dying is in its cache file, so the redo is cheap. A finished chunk is written once and never redone; a
resumed run (driver killed, `clarify run` again) queues only the questions no part holds.

Ray is imported only here, only when a run asks for workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from clarify import console, faults
from clarify.batch.config import ClusterConfig, RunConfig, from_dict
from clarify.batch.rundir import RunDir
from clarify.batch.scheduler import SchedStats
from clarify.batch.tree import Tree
from clarify.errors import InputError

MAX_RESTARTS = 3  # a worker slot whose actor died this many times is given up (the others go on)
POLL_S = 1.0  # seconds between progress polls of the workers
# What a worker process needs from the driver's environment (a local cluster inherits it anyway; a joined
# cluster's nodes were started with their own): where models, index and data live, test hooks.
FORWARD_ENV = ("CLARIFY_HOME", "CLARIFY_DATA", "CLARIFY_ENGINE_BUSY", "CLARIFY_ENGINE_TOKENS_LOG",
               "CLARIFY_CROSS_ENCODER", "HF_HOME", "VLLM_CPU_KVCACHE_SPACE")
WORKER_KILL_ENV = "CLARIFY_WORKER_KILL_AT"  # faults.ENV inside workers only (tests); the driver's is not passed


def chunks_of(qids: list[str], size: int) -> list[list[str]]:
    """Consecutive chunks of `size` questions, in question order."""
    return [qids[i:i + size] for i in range(0, len(qids), size)]


def wanted(cfg: RunConfig) -> bool:
    """Does this config run its trees on Ray workers?"""
    return cfg.cluster.workers > 0 or bool(cfg.cluster.ray_address)


# ------------------------------------------------------------------------------------------------ worker
class Worker:
    """One engine and its retrieval, in a Ray actor. Made a Ray actor class by `_actor_class` (so this
    module imports without Ray); `max_concurrency=2` lets `progress` answer while `run_chunk` runs."""

    def __init__(self, slot: int, cfg: dict, run_dir: str, questions: pl.DataFrame, index_path: str,
                 search_cache: str | None, env: dict[str, str], cores: list[int] | None, engine_kwargs: dict):
        os.environ.update(env)
        os.environ.pop(faults.ENV, None)
        if env.get(WORKER_KILL_ENV):
            os.environ[faults.ENV] = env[WORKER_KILL_ENV]
        if cores:  # before vLLM is imported: it reads the binding at start (local_llm/vllm_engine.py)
            from clarify.local_llm.vllm_engine import _cpu_list

            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = _cpu_list(set(cores))
        self.slot, self.node = slot, socket.gethostname()
        self._logs = contextlib.ExitStack()  # vLLM's and the libraries' output: run_dir/logs/worker-NN-….log
        self._logs.enter_context(console.session(Path(run_dir) / "logs", f"worker-{slot:02d}"))
        from clarify.batch.pipeline import _engine_reports_to, engine_for, open_resources
        from clarify.index import open_index

        self.cfg = from_dict(cfg)
        self.questions = dict(zip(questions["qid"].to_list(), questions["question"].to_list()))
        self.res = open_resources(self.cfg, questions, RunDir(run_dir).cache_dir, index=open_index(index_path),
                                  engine_factory=lambda c: engine_for(c, **engine_kwargs),
                                  search_cache=Path(search_cache) if search_cache else None,
                                  cache_name=f"worker-{slot:02d}.sqlite")
        self.calls = self.tokens = 0
        _engine_reports_to(self.res.engine, self._count)

    def _count(self, requests: int, tokens: int) -> None:
        self.calls += requests
        self.tokens += tokens

    def progress(self) -> tuple[int, int, int]:
        """(LLM calls finished, tokens processed, requests in flight) over this worker's life."""
        from clarify.batch.pipeline import _in_flight

        return self.calls, self.tokens, _in_flight(self.res.engine)

    def run_chunk(self, qids: list[str]) -> dict:
        """Run these questions' trees to the end; their trees, rows and what it cost."""
        from clarify.batch.pipeline import _tables, engine_facts, engine_usage, engine_usage_start
        from clarify.batch.scheduler import DRIVERS

        trees = [Tree.new(q, self.questions[q], verify=self.cfg.toc.verify) for q in qids]
        rows: dict = {}
        before = engine_usage_start(self.res.engine)
        stats = DRIVERS[self.cfg.scheduler](trees, self.res, self.cfg, lambda t, r: rows.__setitem__(t.qid, r))
        self.res.engine.flush()  # committed before the driver writes the part (as pipeline._Parts does)
        return {"trees": [t.to_dict() for t in trees], "tables": _tables([rows[q] for q in qids]),
                "stats": stats, "usage": engine_usage(self.res.engine, before, stats),
                "engine": engine_facts(self.res.engine), "node": self.node}

    def close(self) -> None:
        self.res.engine.close()
        self._logs.close()


def _actor_class():
    import ray

    return ray.remote(max_concurrency=2)(Worker)


# ----------------------------------------------------------------------------------------------- driver
@dataclass
class Outcome:
    """What the cluster did this session (summary.json `cluster`)."""

    workers: int
    chunks: int = 0  # chunks finished (parts written) this session
    requeued: int = 0  # chunks put back after their worker died
    restarts: int = 0  # worker actors started again
    stats: SchedStats = field(default_factory=SchedStats)
    per_worker: dict[int, dict] = field(default_factory=dict)
    engine: dict | None = None
    stopped: bool = False

    def summary(self, wall_s: float) -> dict:
        return {"workers": self.workers, "chunks": self.chunks, "requeued": self.requeued,
                "restarts": self.restarts, "engine_tokens": self.stats.tokens,
                "engine_tokens_per_s_all_workers": round(self.stats.tokens / wall_s, 1) if wall_s > 0 else None,
                "per_worker": [{"slot": s, **w} for s, w in sorted(self.per_worker.items())]}


def _start_ray(c: ClusterConfig) -> bool:
    """Connect to Ray (`ray_address`) or start a local cluster; True when this process started it."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # air-gapped: nothing is reported anywhere
    # Ray's records go to the run's log like every library's (console.session), not to the terminal:
    # `import ray` gives its logger a terminal handler of its own (ray/_private/log.py)
    ray_log = logging.getLogger("ray")
    for h in list(ray_log.handlers):
        ray_log.removeHandler(h)
    ray_log.propagate = True
    kw = dict(include_dashboard=False, logging_level=logging.INFO, configure_logging=False, log_to_driver=False)
    if c.ray_address:
        try:
            ray.init(address=c.ray_address, **kw)
        except (ConnectionError, RuntimeError) as exc:
            raise InputError(f"cannot join the Ray cluster at {c.ray_address!r}: {exc}", field="--ray-address") from None
        return True
    # a small object store: chunks' tables are kilobytes (Ray's default takes 30% of the RAM)
    ray.init(num_cpus=len(os.sched_getaffinity(0)), object_store_memory=256 * 2**20, **kw)
    return True


@dataclass
class _Plan:
    workers: int
    options: list[dict]  # Ray actor options per slot
    cores: list[list[int] | None]  # CPU cores bound per slot (None on GPUs)
    engine_kwargs: dict


def _plan(cfg: RunConfig) -> _Plan:
    """How many workers and what each one gets: GPUs when the cluster has them, else CPU cores."""
    import ray

    c, tp = cfg.cluster, cfg.model.tensor_parallel_size
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus:
        workers = c.workers or max(1, gpus // tp)
        if workers * tp > gpus:
            raise InputError(f"{workers} workers × tensor_parallel_size {tp} need {workers * tp} GPUs; the Ray "
                             f"cluster has {gpus}", field="--workers")
        if tp == 1:
            return _Plan(workers, [{"num_gpus": 1, "num_cpus": 1}] * workers, [None] * workers, {})
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options = []
        for _ in range(workers):  # the GPUs of one engine on one node; vLLM's Ray executor uses the bundles
            pg = placement_group([{"GPU": 1, "CPU": 1}] * tp, strategy="STRICT_PACK")
            options.append({"num_gpus": 0, "num_cpus": 0, "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_capture_child_tasks=True)})
        return _Plan(workers, options, [None] * workers, {"distributed_executor_backend": "ray"})
    cores = sorted(os.sched_getaffinity(0))
    workers = c.workers or 1
    per = c.cores_per_worker or max(1, len(cores) // workers)
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if workers * per > cpus:
        raise InputError(f"{workers} workers × {per} cores need {workers * per} CPUs; the Ray cluster has {cpus}",
                         field="--workers")
    slots = [[cores[(k * per + i) % len(cores)] for i in range(per)] for k in range(workers)]
    return _Plan(workers, [{"num_cpus": per}] * workers, slots, {})


class Pool:
    """The worker actors, by slot; what each is doing. Tests reach it through `run_chunks(on_part=...)`."""

    def __init__(self, plan: _Plan, make: Callable[[int], object]):
        self.plan, self.make = plan, make
        self.actors: dict[int, object] = {s: make(s) for s in range(plan.workers)}
        self.busy: dict[object, tuple[int, list[str]]] = {}  # ObjectRef -> (slot, chunk)
        self.restarts = {s: 0 for s in self.actors}

    def busy_slots(self) -> list[int]:
        return sorted(slot for slot, _ in self.busy.values())

    def idle_slots(self) -> list[int]:
        taken = set(self.busy_slots())
        return [s for s in sorted(self.actors) if s not in taken]

    def restart(self, slot: int) -> bool:
        """A new actor in a dead one's slot; False when the slot has died too often (it is dropped)."""
        self.actors.pop(slot, None)
        if self.restarts[slot] >= MAX_RESTARTS:
            return False
        self.restarts[slot] += 1
        self.actors[slot] = self.make(slot)
        return True

    def close(self) -> None:
        import ray

        done = [a.close.remote() for a in self.actors.values()]
        with contextlib.suppress(Exception):
            ray.wait(done, num_returns=len(done), timeout=60)
        for a in self.actors.values():
            with contextlib.suppress(Exception):
                ray.kill(a)


def run_chunks(rd: RunDir, cfg: RunConfig, questions: pl.DataFrame, finished: set[str], *, index_path: str,
               search_cache: Path | None, display, run_s: Callable[[], float | None],
               stop_after_parts: int | None = None, on_part: Callable[[Pool], None] | None = None) -> Outcome:
    """Run every unfinished question's tree on Ray workers, writing each finished chunk as a part."""
    import ray

    todo = [q for q in questions["qid"].to_list() if q not in finished]
    queue = deque(chunks_of(todo, cfg.cluster.chunk_questions))
    started = _start_ray(cfg.cluster)
    try:
        plan = _plan(cfg)
        outcome = Outcome(workers=plan.workers)
        env = {k: os.environ[k] for k in (*FORWARD_ENV, WORKER_KILL_ENV) if os.environ.get(k)}
        cfg_dict = cfg.to_dict()
        actor = _actor_class()

        def make(slot: int):
            return actor.options(name=None, **plan.options[slot]).remote(
                slot, cfg_dict, str(rd.path.resolve()), questions, index_path,
                str(search_cache.resolve()) if search_cache else None, env, plan.cores[slot], plan.engine_kwargs)

        console.say(f"{plan.workers} Ray workers ({'GPU' if plan.cores[0] is None else 'CPU cores ' + str(plan.cores)}),"
                    f" {len(queue)} chunks of ≤ {cfg.cluster.chunk_questions} questions; worker logs in {rd.path / 'logs'}")
        pool = Pool(plan, make)
        try:
            _loop(rd, pool, queue, outcome, display, run_s, stop_after_parts, on_part)
        finally:
            pool.close()
        return outcome
    finally:
        if started:
            ray.shutdown()


def _loop(rd: RunDir, pool: Pool, queue: deque, outcome: Outcome, display, run_s, stop_after_parts, on_part) -> None:
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    seen = {s: (0, 0) for s in pool.actors}  # (calls, tokens) of each slot's actor, last polled
    polls: dict[object, int] = {}
    last_poll = 0.0
    while queue or pool.busy:
        for slot in pool.idle_slots():
            if not queue:
                break
            chunk = queue.popleft()
            pool.busy[pool.actors[slot].run_chunk.remote(chunk)] = (slot, chunk)
        if not pool.busy:
            raise RuntimeError("every Ray worker died too often; see the worker logs in " + str(rd.path / "logs"))
        ready, _ = ray.wait(list(pool.busy), num_returns=1, timeout=POLL_S)
        if time.monotonic() - last_poll >= POLL_S:
            last_poll = time.monotonic()
            _poll(pool, polls, seen, display)
        for ref in ready:
            slot, chunk = pool.busy.pop(ref)
            try:
                out = ray.get(ref)
            except RayTaskError as exc:  # the chunk's code raised: the same error would come back anywhere
                raise exc.as_instanceof_cause() from None
            except RayActorError as exc:  # the actor died: killed, out of memory, its node lost
                queue.appendleft(chunk)
                outcome.requeued += 1
                back = pool.restart(slot)
                outcome.restarts += back
                seen[slot] = (0, 0)
                console.say(f"worker {slot} died ({type(exc).__name__}); its {len(chunk)} question(s) go back to "
                            f"the queue" + ("" if back else f"; slot {slot} is given up after {MAX_RESTARTS} restarts"))
                continue
            trees = [Tree.from_dict(t) for t in out["trees"]]
            n = rd.write_part(out["tables"], trees, run_s=run_s(), engine=out["engine"],
                              extra={"worker": slot, "node": out["node"], "qids": chunk})
            faults.point(f"part-done:{n}")
            outcome.chunks += 1
            outcome.engine = out["engine"] or outcome.engine
            st = out["stats"]
            outcome.stats.tokens += st.tokens
            outcome.stats.steps += st.steps
            outcome.stats.generate_calls += st.generate_calls
            for k, v in st.seconds.items():
                outcome.stats.seconds[k] = outcome.stats.seconds.get(k, 0.0) + v
            w = outcome.per_worker.setdefault(slot, {"node": out["node"], "chunks": 0, "trees": 0, "engine_tokens": 0,
                                                     "generate_s": 0.0})
            w["chunks"] += 1
            w["trees"] += len(trees)
            w["engine_tokens"] += st.tokens
            w["generate_s"] = round(w["generate_s"] + st.seconds.get("generate", 0.0), 2)
            for _ in trees:
                display.tree_done(running=0)
            if on_part is not None:
                on_part(pool)
            if stop_after_parts is not None and len(rd.part_dirs()) >= stop_after_parts:
                outcome.stopped = True
                return


def _poll(pool: Pool, polls: dict, seen: dict, display) -> None:
    """Ask each worker how far it is (answered between its engine steps) and show the sum."""
    import ray
    from ray.exceptions import RayError

    for slot, actor in pool.actors.items():
        if slot not in polls.values():
            polls[actor.progress.remote()] = slot
    done, _ = ray.wait(list(polls), num_returns=len(polls), timeout=0)
    calls = tokens = running = 0
    for ref in done:
        slot = polls.pop(ref)
        try:
            c, t, r = ray.get(ref)
        except RayError:  # a dead worker: handled where its chunk comes back
            continue
        before = seen.get(slot, (0, 0))
        calls, tokens, running = calls + max(0, c - before[0]), tokens + max(0, t - before[1]), running + r
        seen[slot] = (c, t)
    if done:
        display.engine_update(calls, tokens, running)
