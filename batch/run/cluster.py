"""`clarify run --workers N` / `--ray-address ADDR`: one run spread over many engines with Ray (docs/scale.md).

    driver   the `clarify run` process. It holds the run directory (its lock, config, parts, final tables),
             keeps each worker holding `PREFETCH` chunks of `chunk_questions` unfinished questions from
             one queue (a worker that finishes sooner takes the next chunk sooner, so fast workers take
             more) and writes each finished chunk as one part (batch/run/rundir.py) the moment it comes
             back; then the final tables, exactly as a one-process run.
    workers  Ray actors (`Worker`), one engine each: a GPU (`num_gpus=1`), a tensor-parallel group of GPUs
             (a placement group of `tensor_parallel_size` GPU bundles on one node; vLLM's Ray executor
             places its shards in it), or on CPU its own cores (VLLM_CPU_OMP_THREADS_BIND). Each opens the
             index (from a path every node can read), the demo pools and its own completion cache file
             `cache/worker-NN.sqlite` (SQLite is never written from two hosts), reading the run's other
             cache files too, and runs the continuous driver for its whole life, admitting the next
             chunk's trees as capacity frees (`run_continuous(more=...)`): no tail between chunks.

Results never depend on which worker ran a chunk, or how the questions were chunked: a tree's requests,
keys and seeds depend only on its question, node and expansion count (batch/toc/program.py), and the final
tables are sorted by question (pipeline.finalize). A worker that dies (actor killed, node lost) has the
chunks it held put back at the head of the queue and its slot restarted (`MAX_RESTARTS`); what it
computed before dying is in its cache file, so the redo is cheap. A finished chunk is written once and
never redone; a resumed run (driver killed, `clarify run` again) queues only the questions no part holds.

Ray is imported only here, only when a run asks for workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from clarify import console, faults, files, stops
from clarify.batch.config import ClusterConfig, ModelConfig, RunConfig, from_dict
from clarify.batch.run.records import ATTACHED, MODEL, Pin, RanOn, WorkerWork
from clarify.batch.run.resources import PreparedRun
from clarify.batch.run.rundir import RunDir
from clarify.batch.run.scheduler import SchedStats
from clarify.batch.toc.settings import TreeSettings
from clarify.batch.toc.tree import Tree
from clarify.errors import InputError
from clarify.local_llm.hardware import affinity

MAX_RESTARTS = 3  # a worker slot whose actor died this many times is given up (the others go on)
POLL_S = 1.0  # seconds between progress polls of the workers
# What a worker process needs from the driver's environment (a local cluster inherits it anyway; a joined
# cluster's nodes were started with their own): where models, index and data live, test hooks.
# A joined cluster's workers also get the no-telemetry settings (local_llm/vllm_engine.py NO_TELEMETRY).
FORWARD_ENV = ("CLARIFY_HOME", "CLARIFY_DATA", "CLARIFY_ENGINE_BUSY", "CLARIFY_ENGINE_TOKENS_LOG", "CLARIFY_FILE_MODE",
               "HF_HOME", "VLLM_CPU_KVCACHE_SPACE")
WORKER_KILL_ENV = "CLARIFY_WORKER_KILL_AT"  # faults.ENV inside workers only (tests); the driver's is not passed


def worker_env() -> dict[str, str]:
    """The environment each worker is handed (FORWARD_ENV from the driver's), with telemetry off."""
    from clarify.local_llm.vllm_engine import NO_TELEMETRY

    return {k: os.environ[k] for k in (*FORWARD_ENV, WORKER_KILL_ENV) if os.environ.get(k)} | NO_TELEMETRY


def chunks_of(qids: list[str], size: int) -> list[list[str]]:
    """Consecutive chunks of `size` questions, in question order."""
    return [qids[i:i + size] for i in range(0, len(qids), size)]


def wanted(c: ClusterConfig) -> bool:
    """Does this `[cluster]` table run the trees on Ray workers?"""
    return c.workers > 0 or bool(c.ray_address)


# ------------------------------------------------------------------------------------------------ worker
@dataclass(frozen=True)
class ChunkResult:
    """A chunk whose trees are all finished, handed by its worker to the driver (`Worker.take`), which writes
    it as one part (`_write`, batch/run/rundir.py write_part)."""

    qids: list[str]  # the chunk's questions, in the order the driver gave them
    trees: list[dict]  # each finished tree (batch/toc/tree.py Tree.to_dict), in `qids` order
    tables: dict[str, pl.DataFrame]  # their rows (batch/run/resources.py `tables`)
    tokens: int  # prompt + output tokens the worker's engine computed for them (cache hits excluded)
    engine: dict | None  # the worker's engine facts (device, dtype)
    node: str  # the host the worker ran on


@dataclass
class _Chunk:
    """A chunk a worker runs: its questions in the driver's order, their trees, and each finished tree's rows."""

    qids: list[str]
    trees: list[Tree]
    rows: dict[str, Any] = field(default_factory=dict)  # qid -> TreeRows (batch/toc/program.py)


class Worker:
    """One engine and its retrieval, in a Ray actor (made one by `_actor_class`, so this module imports
    without Ray). `serve` runs the continuous driver for the actor's whole life, admitting the trees of
    each chunk it is `give`n as capacity frees — the next chunk's trees start while the last one's
    finish, so a worker's engine never drains between chunks; a chunk whose trees are all finished is
    committed to the cache and handed back by `take`. Threaded (`max_concurrency`), so `give` and `take`
    answer while `serve` runs. It is handed the driver's whole frozen config (`cfg`: RunConfig.to_dict, as
    config.json holds it but with any credentials), the one thing a worker re-opens the run from
    (resources.for_worker); after that it keeps only the tree's part (`tree`) and its resources."""

    def __init__(self, slot: int, cfg: dict, run_dir: str, questions: pl.DataFrame, pins: dict[str, Pin],
                 search_cache: str | None, env: dict[str, str], cores: list[int] | None, engine_kwargs: dict):
        os.environ.update(env)
        files.restrict_umask()  # what it writes into the run directory is private like the driver's
        os.environ.pop(faults.ENV, None)
        if env.get(WORKER_KILL_ENV):
            os.environ[faults.ENV] = env[WORKER_KILL_ENV]
        if cores:  # before vLLM is imported: it reads the binding at start (local_llm/vllm_engine.py)
            from clarify.local_llm.hardware import cpu_list

            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(set(cores))
            os.environ["CLARIFY_FAISS_THREADS"] = str(len(cores))  # FAISS's OpenMP threads (index/dense.py)
        self.slot, self.node = slot, socket.gethostname()
        self._logs = contextlib.ExitStack()  # vLLM's and the libraries' output: run_dir/logs/worker-NN-….log
        rd = RunDir(run_dir)
        self._logs.enter_context(console.session(rd.logs_dir, rd.worker_name(slot)))
        from clarify.batch.run.resources import engine_for, for_worker, open_resources

        # exactly the index, FAISS folder, encoder and model folder the driver pinned (inputs.json), refused
        # when this node's copies differ (resources.open_run_index); the FAISS part memory-mapped, so the
        # workers of a node share one copy of it in the page cache, and its OpenMP threads set to this
        # worker's cores
        run_cfg = from_dict(cfg)
        self.tree = TreeSettings.of(run_cfg)
        prep = for_worker(run_cfg, questions, pins, engine_factory=lambda model: engine_for(
            model, self.tree, pin=pins.get(MODEL), **engine_kwargs))
        self.questions = dict(zip(questions["qid"].to_list(), questions["question"].to_list()))
        self.res = open_resources(prep, rd.cache_dir, search_cache=Path(search_cache) if search_cache else None,
                                  cache_name=rd.worker_cache(slot))
        self.calls = self.tokens = 0
        self.res.engine.on_progress = self._count
        self.inbox: queue.Queue = queue.Queue()  # chunks (lists of qids) to run; None: no more will come
        self.outbox: queue.Queue = queue.Queue()  # finished chunks
        self.of: dict[str, _Chunk] = {}  # qid -> its chunk while unfinished

    def _count(self, requests: int, tokens: int) -> None:
        self.calls += requests
        self.tokens += tokens

    def give(self, qids: list[str] | None) -> None:
        """One more chunk to run (None: the last has been given)."""
        self.inbox.put(qids)

    def take(self) -> tuple[list[ChunkResult], tuple[int, int, int]]:
        """The chunks finished since the last call, and (LLM calls finished, tokens processed, requests in
        flight) over this worker's life."""
        done = []
        while not self.outbox.empty():
            done.append(self.outbox.get())
        return done, (self.calls, self.tokens, self.res.engine.pending())

    def serve(self) -> SchedStats:
        """Run every chunk given until `give(None)`; returns what the driver did."""
        from clarify.batch.run.scheduler import run_continuous

        return run_continuous([], self.res, self.tree, self._tree_done, more=self._more)

    def _more(self, block: bool) -> list[Tree] | None:
        try:
            qids = self.inbox.get(timeout=POLL_S) if block else self.inbox.get_nowait()
        except queue.Empty:
            return []
        if qids is None:
            return None
        trees = [Tree.new(q, self.questions[q], verify=self.tree.toc.verify) for q in qids]
        chunk = _Chunk(qids, trees)
        self.of.update({q: chunk for q in qids})
        return trees

    def _tree_done(self, tree: Tree, rows) -> None:
        from clarify.batch.run.resources import tables

        chunk = self.of.pop(tree.qid)
        chunk.rows[tree.qid] = rows
        if len(chunk.rows) < len(chunk.qids):
            return
        self.res.engine.flush()  # committed before the driver writes the part (as pipeline._Parts does)
        ordered = [chunk.rows[q] for q in chunk.qids]
        self.outbox.put(ChunkResult(qids=chunk.qids, trees=[t.to_dict() for t in chunk.trees],
                                    tables=tables(ordered), tokens=sum(r.tokens for r in ordered),
                                    engine=self.res.engine.facts(), node=self.node))

    def close(self) -> None:
        self.res.engine.close()
        self._logs.close()


@contextlib.contextmanager
def _fatal_signal_handlers_kept():
    """Restore this process's handlers of fatal signals after Ray has connected it. Ray installs its own
    over them (Python's faulthandler in ray/_private/worker.py `connect`, absl's failure signal handler in
    its C++ core), and a JVM started before (Lucene search) relies on its SIGSEGV handler for routine work
    (HotSpot's null checks and safepoints): with another handler in front, the process dies at the JVM's
    next such fault — why pytest runs with `-p no:faulthandler` (pyproject.toml). The handlers are C
    structs Python's `signal` cannot hold, so they are saved and put back through libc's sigaction."""
    import ctypes
    import faulthandler
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        saved = {}
        for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE):
            buf = ctypes.create_string_buffer(256)  # struct sigaction (152 bytes on x86-64 glibc), opaque here
            if libc.sigaction(int(sig), None, buf) == 0:
                saved[sig] = buf
    except (OSError, AttributeError):  # not a libc we can ask: leave it
        saved, libc = {}, None
    was_on = faulthandler.is_enabled()
    try:
        yield
    finally:
        if not was_on:
            faulthandler.disable()
        for sig, buf in saved.items():
            libc.sigaction(int(sig), buf, None)


def _actor_class():
    import ray

    return ray.remote(max_concurrency=4)(Worker)  # serve, give, take, close


# ----------------------------------------------------------------------------------------------- driver
@dataclass
class Outcome:
    """What the cluster did this session (summary.json `cluster`)."""

    workers: int
    chunks: int = 0  # chunks finished (parts written) this session
    requeued: int = 0  # chunks put back after their worker died
    restarts: int = 0  # worker actors started again
    stats: SchedStats = field(default_factory=SchedStats)
    per_worker: dict[int, WorkerWork] = field(default_factory=dict)
    engine: dict | None = None
    stopped: bool = False

    def summary(self, wall_s: float) -> dict:
        return {"workers": self.workers, "chunks": self.chunks, "requeued": self.requeued,
                "restarts": self.restarts, "engine_tokens": self.stats.tokens,
                "engine_tokens_per_s_all_workers": round(self.stats.tokens / wall_s, 1) if wall_s > 0 else None,
                "per_worker": [w.to_json() for _, w in sorted(self.per_worker.items())]}


def _start_ray(c: ClusterConfig) -> bool:
    """Connect to Ray (`ray_address`) or start a local cluster; True when this process started it."""
    import ray

    if ray.is_initialized():
        return False
    from clarify.local_llm.vllm_engine import NO_TELEMETRY

    os.environ.update(NO_TELEMETRY)  # air-gapped: nothing is reported anywhere (a local cluster inherits it)
    # Ray's records go to the run's log like every library's (console.session), not to the terminal:
    # `import ray` gives its logger a terminal handler of its own (ray/_private/log.py)
    ray_log = logging.getLogger("ray")
    for h in list(ray_log.handlers):
        ray_log.removeHandler(h)
    ray_log.propagate = True
    kw = dict(include_dashboard=False, logging_level=logging.INFO, configure_logging=False, log_to_driver=False)
    if c.ray_address:
        kw["address"] = c.ray_address
    else:  # a local cluster with a small object store: chunks' tables are kilobytes (Ray's default: 30% of RAM)
        kw.update(num_cpus=len(affinity()), object_store_memory=256 * 2**20)
    try:
        with _fatal_signal_handlers_kept():
            ray.init(**kw)
        stops.reclaim()  # ray.init makes SIGTERM a bare sys.exit (ray/_private/worker.py `init`)
    except (ConnectionError, RuntimeError) as exc:
        if not c.ray_address:
            raise
        raise InputError(f"cannot join the Ray cluster at {c.ray_address!r}: {exc}", field="--ray-address") from None
    return True


@dataclass
class _Plan:
    workers: int
    options: list[dict]  # Ray actor options per slot
    cores: list[list[int] | None]  # CPU cores bound per slot (None on GPUs)
    engine_kwargs: dict


def _plan(c: ClusterConfig, model: ModelConfig) -> _Plan:
    """How many workers and what each one gets (`[cluster]`; `[model]`: its backend and tensor parallel size):
    GPUs when the cluster has them, else CPU cores."""
    import ray

    from clarify.local_llm import backends

    tp = model.tensor_parallel_size
    if not backends.get(model.backend).uses_gpus:  # a server's clients: no GPU, no core of their own
        workers = c.workers or 1
        return _Plan(workers, [{"num_cpus": 0}] * workers, [None] * workers, {})
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
        # vLLM's Ray executor places the shards in this group (the settings table's distributed_executor_backend
        # row, local_llm/settings.py)
        return _Plan(workers, options, [None] * workers, {"ray_worker": True})
    cores = sorted(affinity())
    workers = c.workers or 1
    per = c.cores_per_worker or max(1, len(cores) // workers)
    cpus = int(ray.cluster_resources().get("CPU", 0))
    if workers * per > cpus:
        raise InputError(f"{workers} workers × {per} cores need {workers * per} CPUs; the Ray cluster has {cpus}",
                         field="--workers")
    slots = [[cores[(k * per + i) % len(cores)] for i in range(per)] for k in range(workers)]
    return _Plan(workers, [{"num_cpus": per}] * workers, slots, {})


PREFETCH = 2  # chunks a worker holds at once: the one running and the next, admitted as capacity frees


class Pool:
    """The worker actors, by slot, and the chunks each holds. Tests reach it through `run_chunks(on_part=...)`."""

    def __init__(self, plan: _Plan, make: Callable[[int], object]):
        self.make = make
        self.actors: dict[int, object] = {}
        self.serving: dict[int, object] = {}  # slot -> the ObjectRef of its `serve` call
        self.given: dict[int, list[list[str]]] = {}  # slot -> chunks given and not yet back
        self.restarts = {s: 0 for s in range(plan.workers)}
        self.last_death = ""  # why the last actor died
        for slot in range(plan.workers):
            self._start(slot)

    def _start(self, slot: int) -> None:
        self.actors[slot] = actor = self.make(slot)
        self.serving[slot] = actor.serve.remote()
        self.given[slot] = []

    def busy_slots(self) -> list[int]:
        return sorted(s for s, chunks in self.given.items() if chunks)

    def give(self, slot: int, chunk: list[str]) -> None:
        self.actors[slot].give.remote(chunk)
        self.given[slot].append(chunk)

    def lost(self, slot: int) -> tuple[list[list[str]], bool]:
        """A dead actor's chunks, and whether a new actor took its slot (False: it died too often)."""
        chunks = self.given.pop(slot, [])
        self.actors.pop(slot, None)
        self.serving.pop(slot, None)
        if self.restarts[slot] >= MAX_RESTARTS:
            return chunks, False
        self.restarts[slot] += 1
        self._start(slot)
        return chunks, True

    def finish(self) -> list[SchedStats]:
        """No more chunks: each worker finishes and returns what its driver did (a worker that died after
        its last chunk came back has nothing left to lose: it is skipped)."""
        import ray
        from ray.exceptions import RayActorError

        for actor in self.actors.values():
            actor.give.remote(None)
        out = []
        for ref in self.serving.values():
            with contextlib.suppress(RayActorError):
                out.append(ray.get(ref))
        return out

    def close(self, graceful: bool) -> None:
        """Commit and close each worker's cache and engine (graceful: its `serve` has returned), then end the
        actors. A stopped run kills them at once: their caches keep every committed group."""
        import ray

        if graceful:
            with contextlib.suppress(Exception):
                ray.get([a.close.remote() for a in self.actors.values()], timeout=60)
        for a in self.actors.values():
            with contextlib.suppress(Exception):
                ray.kill(a)


def run_chunks(rd: RunDir, prep: PreparedRun, cfg: RunConfig, finished: set[str], *, search_cache: Path | None,
               display, run_s: Callable[[], float | None], stop_after_parts: int | None = None,
               on_part: Callable[[Pool], None] | None = None) -> Outcome:
    """Run every unfinished question's tree of a prepared run (batch/run/resources.py) on Ray workers, writing
    each finished chunk as a part. The workers open what the driver pinned (`prep.inputs`). `cfg`: the whole
    frozen config — its `[cluster]` table places the workers, and each worker re-opens the run from all of it
    (`Worker`: another process, maybe another node)."""
    import ray

    questions = prep.questions
    index_path = getattr(prep.index, "path", None)
    if not index_path:
        raise InputError("a cluster run needs an index directory every worker can open (--index)", field="--index")
    pins = {k: v for k, v in prep.inputs.items() if k in (*ATTACHED, MODEL)}
    index_pin = pins.get("index")  # the index the driver opened, by path when its pin has none (a stand-in)
    pins["index"] = Pin.of({"path": str(index_path)} | (index_pin.to_json() if index_pin else {}))
    todo = deque(chunks_of([q for q in questions["qid"].to_list() if q not in finished], cfg.cluster.chunk_questions))
    started = _start_ray(cfg.cluster)
    try:
        plan = _plan(cfg.cluster, cfg.model)
        outcome = Outcome(workers=plan.workers)
        env = worker_env()
        cfg_dict = cfg.to_dict()
        actor = _actor_class()

        def make(slot: int):
            return actor.options(**plan.options[slot]).remote(
                slot, cfg_dict, str(rd.path.resolve()), questions, pins,
                str(search_cache.resolve()) if search_cache else None, env, plan.cores[slot], plan.engine_kwargs)

        where = "GPU" if plan.cores[0] is None else f"CPU cores {plan.cores}"
        console.say(f"{plan.workers} Ray workers ({where}), {len(todo)} chunks of ≤ {cfg.cluster.chunk_questions} "
                    f"questions; worker logs in {rd.logs_dir}")
        pool = Pool(plan, make)
        graceful = False
        try:
            _loop(rd, pool, todo, outcome, display, run_s, stop_after_parts, on_part)
            if not outcome.stopped:
                for st in pool.finish():
                    outcome.stats.step_calls += st.step_calls
                    for k, v in st.seconds.items():
                        outcome.stats.seconds[k] = outcome.stats.seconds.get(k, 0.0) + v
                graceful = True
        finally:
            pool.close(graceful)
        return outcome
    finally:
        if started:
            ray.shutdown()


def _loop(rd: RunDir, pool: Pool, todo: deque, outcome: Outcome, display, run_s, stop_after_parts, on_part) -> None:
    """Keep every worker holding PREFETCH chunks; write each chunk that comes back; requeue a dead worker's."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    seen: dict[int, tuple[int, int]] = {}  # (calls, tokens) of each slot's actor, last polled
    taking: dict[int, object] = {}  # slot -> its pending `take` call

    def died(slot: int, exc: RayActorError) -> None:
        if exc.actor_init_failed:  # it could not start (no model, no index there): so would a new one
            raise InputError(f"Ray worker {slot} could not start (are the model, the index and clarify at the same "
                             f"paths on its node?): {str(exc)[-3000:]}") from None
        chunks, back = pool.lost(slot)
        todo.extendleft(reversed(chunks))
        outcome.requeued += len(chunks)
        outcome.restarts += back
        pool.last_death = str(exc)
        seen.pop(slot, None)
        taking.pop(slot, None)
        console.say(f"worker {slot} died ({type(exc).__name__}); its {len(chunks)} chunk(s) go back to the queue"
                    + ("" if back else f"; slot {slot} is given up after {MAX_RESTARTS} restarts"))

    while todo or any(pool.given.values()):
        if not pool.actors:
            raise RuntimeError(f"every Ray worker died {MAX_RESTARTS + 1} times; the last: {pool.last_death[-2000:]} "
                               f"(worker logs: {rd.logs_dir})")
        for depth in range(1, PREFETCH + 1):  # every worker one chunk before any gets its second
            for slot in sorted(pool.actors):
                if todo and len(pool.given[slot]) < depth:
                    pool.give(slot, todo.popleft())
        # a `serve` call ends before the last chunk only when its worker died or its code failed; waiting on
        # them paces the loop (one round of `take` per POLL_S: polling faster steals the workers' CPU)
        ended, _ = ray.wait(list(pool.serving.values()), num_returns=1, timeout=POLL_S)
        for ref in ended:
            slot = next(s for s, r in pool.serving.items() if r == ref)
            try:
                ray.get(ref)
            except RayTaskError as exc:  # the trees' code raised: the same error would come back anywhere
                raise exc.as_instanceof_cause() from None
            except RayActorError as exc:
                died(slot, exc)
        for slot in pool.actors:
            if slot not in taking:
                taking[slot] = pool.actors[slot].take.remote()
        ready, _ = ray.wait(list(taking.values()), num_returns=len(taking), timeout=POLL_S)
        calls = tokens = running = 0
        for ref in ready:
            slot = next(s for s, r in taking.items() if r == ref)
            del taking[slot]
            try:
                done, (c, t, r) = ray.get(ref)
            except RayActorError as exc:
                died(slot, exc)
                continue
            before = seen.get(slot, (0, 0))
            calls, tokens, running = calls + max(0, c - before[0]), tokens + max(0, t - before[1]), running + r
            seen[slot] = (c, t)
            for out in done:
                n = _write(rd, pool, slot, out, outcome, display, run_s)
                if on_part is not None:
                    on_part(pool)
                if stop_after_parts is not None and n >= stop_after_parts:
                    outcome.stopped = True
                    return
        if ready:
            display.engine_update(calls, tokens, running)


def _write(rd: RunDir, pool: Pool, slot: int, out: ChunkResult, outcome: Outcome, display, run_s) -> int:
    """A finished chunk, written as one part; returns the part's number."""
    trees = [Tree.from_dict(t) for t in out.trees]
    n = rd.write_part(out.tables, trees, run_s=run_s(), engine=out.engine,
                      ran_on=RanOn(worker=slot, node=out.node, qids=out.qids))
    faults.point(f"part-done:{n}")
    pool.given[slot].remove(out.qids)
    outcome.chunks += 1
    outcome.engine = out.engine or outcome.engine
    outcome.stats.tokens += out.tokens
    w = outcome.per_worker.get(slot) or WorkerWork(slot=slot, node=out.node)
    outcome.per_worker[slot] = dataclasses.replace(w, chunks=w.chunks + 1, trees=w.trees + len(trees),
                                                   engine_tokens=w.engine_tokens + out.tokens)
    for _ in trees:
        display.tree_done(running=0)
    return n
