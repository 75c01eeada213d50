"""Three drivers of the same tree programs (batch/toc/program.py): how requests are resolved, nothing else.

    sequential   the official code's way (run_toc.py): one question at a time, each request alone.
    waves        every tree advances together; the searches and embeddings of all trees are resolved
                 in one call per kind, then ONE `generate` for every tree's next model request — the
                 barrier: a wave lasts as long as its longest completion.
    continuous   vLLM's own step loop (`StepEngine.submit` / `step`, local_llm/engine.py): a tree's
                 request goes into the running engine the moment the tree has it, and the tree goes on
                 the moment its completion returns — verifications right after their clarification, the
                 answer right after the tree's last expansion. New trees are admitted while the requests
                 in flight are below `ADMIT_FACTOR` × what the engine runs at once; the searches and
                 embeddings asked for since the last engine step are resolved together; the engine's
                 priority queue runs verifications before clarifications before answers (PRIORITY).

A tree's state depends only on the results of its own requests, so given the same completions (one
completion cache) the three drivers build identical trees and rows; tests/test_scheduler.py checks it.
Each driver calls `on_tree(tree, rows)` as each tree finishes (the run directory writes finished trees
in parts there: batch/run/rundir.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from clarify import stops
from clarify.batch.config import SCHEDULERS, Scheduler  # noqa: F401 (SCHEDULERS re-exported beside DRIVERS)
from clarify.batch.toc.program import (
    EmbedTexts,
    Generate,
    Request,
    Rerank,
    Resources,
    Search,
    TreeRows,
    passage_string,
    rank_by_scores,
    tree_program,
)
from clarify.batch.toc.settings import TreeSettings
from clarify.batch.toc.tree import Tree
from clarify.index.search import cosine
from clarify.local_llm.engine import Completion, as_step_engine
from clarify.local_llm.engine import Request as EngineRequest
from clarify.schemas import LlmCall, RunHit, TreeAnswer

ADMIT_FACTOR = 2  # admit trees while requests in flight < ADMIT_FACTOR × the engine's batch capacity
DEFAULT_CAPACITY = 64  # engines that do not say how many requests they run at once (scripted engines)
OnTree = Callable[[Tree, TreeRows], None]


@dataclass
class SchedStats:
    """What a driver did: seconds per kind of work, engine tokens computed, requests resolved."""

    seconds: dict[str, float] = field(default_factory=lambda: {"retrieval": 0.0, "generate": 0.0, "embed": 0.0})
    tokens: int = 0  # prompt + output tokens the engine computed (cache hits excluded)
    generate_calls: int = 0  # batch `generate` calls (sequential, waves)
    # `step()` calls on the engine the driver holds (continuous). Not the model's steps: in front of the
    # model is the completion cache (local_llm/cache.py CachedEngine), whose `step()` answers in-run
    # repeats of a byte-identical request without stepping the model when nothing else is in flight.
    # The model's own steps are EngineStats.steps (`engine_steps` in a run's summary): 0 < engine steps
    # <= step_calls <= engine steps + cache hits.
    step_calls: int = 0
    trees: int = 0


class Resolver:
    """Resolves many programs' requests of one kind with one call: searches, reranks, embeddings, and
    (for the batch drivers) one `generate`."""

    def __init__(self, res: Resources, stats: SchedStats):
        self.res, self.stats = res, stats

    # -- retrieval and embeddings --------------------------------------------------------------
    def resolve(self, reqs: Sequence[Request]) -> list:
        """Results of non-generate requests, in order; one call per kind."""
        out: list = [None] * len(reqs)
        for kind, fn in ((Search, self._search), (Rerank, self._rerank), (EmbedTexts, self._embed)):
            idx = [i for i, r in enumerate(reqs) if isinstance(r, kind)]
            if idx:
                for i, result in zip(idx, fn([reqs[i] for i in idx])):
                    out[i] = result
        return out

    def _search(self, reqs: list[Search]) -> list:
        t0 = time.perf_counter()
        out: list = [None] * len(reqs)
        for k in dict.fromkeys(r.k for r in reqs):
            idx = [i for i, r in enumerate(reqs) if r.k == k]
            keys = [f"{i}\t{j}" for i in idx for j in range(len(reqs[i].queries))]
            queries = [q for i in idx for q in reqs[i].queries]
            hits = self.res.searcher.search(pl.DataFrame({"qid": keys, "query": queries}), k=k)
            retriever = hits["retriever"][0] if hits.height else ""
            got: dict[str, list] = {}
            for row in hits.sort(["qid", "rank"]).iter_rows(named=True):
                got.setdefault(row["qid"], []).append((row["passage_id"], row["score"]))
            for i in idx:
                out[i] = ([got.get(f"{i}\t{j}", []) for j in range(len(reqs[i].queries))], retriever)
        self.stats.seconds["retrieval"] += time.perf_counter() - t0
        return out

    def _rerank(self, reqs: list[Rerank]) -> list:
        queries = [q for r in reqs for q in r.queries]
        lists = [list(c) for r in reqs for c in r.candidates]
        t0 = time.perf_counter()
        live = [i for i, ids in enumerate(lists) if ids]  # nothing to rank: no scorer call
        scores: list = [np.zeros(0) for _ in lists]
        if live and self.res.rerank is not None:
            for i, sc in zip(live, self.res.rerank([queries[i] for i in live], [lists[i] for i in live])):
                scores[i] = sc
        elif live:  # the dense encoder's cosine over "title | text"
            store = self.res.passages(list(dict.fromkeys(p for i in live for p in lists[i])))
            vecs = self._vectors([queries[i] for i in live] + [passage_string(store[p]) for i in live for p in lists[i]])
            for i in live:
                scores[i] = cosine(vecs[queries[i]], [vecs[passage_string(store[p])] for p in lists[i]])
        self.stats.seconds["retrieval"] += time.perf_counter() - t0
        out, pos = [], 0
        for r in reqs:
            out.append([rank_by_scores(lists[pos + j], scores[pos + j], r.k) for j in range(len(r.queries))])
            pos += len(r.queries)
        return out

    def _embed(self, reqs: list[EmbedTexts]) -> list:
        vecs = self._vectors([t for r in reqs for t in r.texts])
        return [{t: vecs[t] for t in r.texts} for r in reqs]

    def _vectors(self, texts: list[str]) -> dict[str, np.ndarray]:
        uniq = list(dict.fromkeys(texts))
        if not uniq:
            return {}
        t0 = time.perf_counter()
        vecs = np.asarray(self.res.embed(uniq), dtype=np.float32)
        self.stats.seconds["embed"] += time.perf_counter() - t0
        return dict(zip(uniq, vecs))

    # -- generation ----------------------------------------------------------------------------
    def fits(self, prompts: Sequence[str], max_tokens: Sequence[int]) -> list[bool]:
        """Which prompts fit the model's context with room for their max_tokens. One over-long prompt must
        not fail a whole batch (vLLM rejects a batch containing one); it is recorded and never sent."""
        engine = self.res.engine  # a CachedEngine: EngineInfo (local_llm/engine.py), None where unknown
        limit = engine.max_model_len
        if limit is None:
            return [True] * len(prompts)
        # Cheap bound first: a token covers at least one UTF-8 byte (byte-level BPE, SentencePiece byte
        # fallback), plus a few template tokens for chat models; a character may be several tokens
        # (non-Latin text), so near the limit the prompt is counted exactly.
        return [len(p.encode("utf-8")) + 64 + m <= limit or (engine.count_tokens(p) or 0) + m <= limit
                for p, m in zip(prompts, max_tokens)]

    def generate(self, reqs: Sequence[Generate]) -> list[list[Completion]]:
        """Every prompt of every request in ONE engine `generate` call."""
        prompts = [p for r in reqs for p in r.prompts]
        params = [p for r in reqs for p in r.params]
        comps = [TOO_LONG_COMPLETION] * len(prompts)
        sent = [i for i, ok in enumerate(self.fits(prompts, [p.max_tokens for p in params])) if ok]
        if sent:
            t0 = time.perf_counter()
            got = self.res.engine.generate([prompts[i] for i in sent], [params[i] for i in sent])
            self.stats.seconds["generate"] += time.perf_counter() - t0
            self.stats.generate_calls += 1
            for i, c in zip(sent, got):
                comps[i] = c
        self.stats.tokens += sum(c.prompt_tokens + c.output_tokens for c in comps if not c.cached)
        it = iter(comps)
        return [[next(it) for _ in r.prompts] for r in reqs]


TOO_LONG_COMPLETION = Completion(("",), "prompt_too_long", 0, 0)


class _Slot:
    """One tree's running program and the request it waits on."""

    __slots__ = ("tree", "rows", "gen", "req", "comps", "left")

    def __init__(self, tree: Tree, res: Resources, settings: TreeSettings):
        self.tree, self.rows = tree, TreeRows()
        self.gen = tree_program(tree, res, settings, self.rows)
        self.req: Request | None = None
        self.comps: list[Completion | None] = []
        self.left = 0  # completions still in the engine (continuous)

    def start(self) -> bool:
        return self.send(None)

    def send(self, result) -> bool:
        """Give the program its result; False when the tree is finished."""
        try:
            self.req = self.gen.send(result)
            return True
        except StopIteration:
            self.req = None
            return False


def _settle_cheap(slots: list[_Slot], resolver: Resolver) -> list[_Slot]:
    """Resolve every slot's searches and embeddings, batched across slots, until each waits for the model
    or is finished. Returns the finished slots."""
    finished: list[_Slot] = []
    while cheap := [s for s in slots if s.req is not None and not isinstance(s.req, Generate)]:
        for s, result in zip(cheap, resolver.resolve([s.req for s in cheap])):
            if not s.send(result):
                finished.append(s)
    return finished


def _batched(groups: Sequence[Sequence[Tree]], res: Resources, settings: TreeSettings,
             on_tree: OnTree | None) -> SchedStats:
    """Each group of trees advances together: cheap requests batched, then one generate for all."""
    stats = SchedStats()
    resolver = Resolver(res, stats)
    for group in groups:
        slots = [_Slot(t, res, settings) for t in group]
        done = [s for s in slots if not s.start()]
        while True:
            done += _settle_cheap(slots, resolver)
            for s in done:
                _finish(s, stats, on_tree)
            slots = [s for s in slots if s.req is not None]
            if not slots:
                break
            done = [s for s, comps in zip(slots, resolver.generate([s.req for s in slots])) if not s.send(comps)]
    return stats


def _finish(s: _Slot, stats: SchedStats, on_tree: OnTree | None) -> None:
    stats.trees += 1
    if on_tree:
        on_tree(s.tree, s.rows)


def run_sequential(trees: Sequence[Tree], res: Resources, settings: TreeSettings,
                   on_tree: OnTree | None = None) -> SchedStats:
    """The official code's loop: one question at a time, one request at a time."""
    return _batched([[t] for t in trees], res, settings, on_tree)


def run_waves(trees: Sequence[Tree], res: Resources, settings: TreeSettings,
              on_tree: OnTree | None = None) -> SchedStats:
    """All trees together, one `generate` per wave for every tree's next model request."""
    return _batched([list(trees)], res, settings, on_tree)


def engine_capacity(engine) -> int:
    """How many requests the engine runs at once: VLLMEngine.capacity() (its scheduler's max_num_seqs,
    bounded by what its KV cache holds), else DEFAULT_CAPACITY."""
    cap = engine.capacity()
    return max(1, cap) if cap is not None else DEFAULT_CAPACITY


# More trees for a running continuous loop: called when it could admit more and has none left, with
# block=True when nothing is in flight (wait a little for some); returns trees (maybe none yet), or None
# once no more will come. A Ray worker feeds the chunks it is given this way (batch/run/cluster.py).
More = Callable[[bool], "list[Tree] | None"]


def run_continuous(trees: Sequence[Tree], res: Resources, settings: TreeSettings,
                   on_tree: OnTree | None = None, more: More | None = None) -> SchedStats:
    """vLLM's step loop: every tree advances the moment its own request returns (module docstring).
    `more`: a source of further trees, admitted like the first ones while the loop runs (no tail between
    one batch of trees and the next)."""
    loop = _StepLoop(res, settings, on_tree)
    try:
        return loop.run(trees, more)
    finally:
        loop.close()


class _StepLoop:
    """The continuous driver's state: trees to admit, slots waiting on the engine, engine request ids."""

    def __init__(self, res: Resources, settings: TreeSettings, on_tree: OnTree | None):
        self.res, self.settings, self.on_tree = res, settings, on_tree
        self.stats = SchedStats()
        self.resolver = Resolver(res, self.stats)
        self.engine = as_step_engine(res.engine)
        self.limit = ADMIT_FACTOR * engine_capacity(res.engine)
        self.waiting: dict[str, tuple[_Slot, int]] = {}  # engine request id → (slot, position in its request)
        self.active = 0  # slots whose program waits on the engine
        self.serial = 0

    def run(self, trees: Sequence[Tree], more: More | None = None) -> SchedStats:
        todo = deque(trees)
        while todo or self.active or more is not None:
            if more is not None and not todo and self.engine.pending() < self.limit:
                got = more(not self.active)
                if got is None:
                    more = None
                else:
                    todo.extend(got)
            fresh: list[_Slot] = []
            while todo and self.engine.pending() + len(fresh) < self.limit:
                fresh.append(_Slot(todo.popleft(), self.res, self.settings))
            self._feed([s for s in fresh if s.start() or self._done(s)])
            if not self.active:
                continue
            t0 = time.perf_counter()
            with stops.deferred():  # a stop signal waits until the step's completions reached the cache
                finished = self.engine.step()
            self.stats.seconds["generate"] += time.perf_counter() - t0
            self.stats.step_calls += 1
            back: list[_Slot] = []
            for rid, comp in finished:
                s, j = self.waiting.pop(rid)
                s.comps[j] = comp
                s.left -= 1
                if not comp.cached:
                    self.stats.tokens += comp.prompt_tokens + comp.output_tokens
                if s.left == 0:
                    back.append(s)
            self.active -= len(back)
            self._feed([s for s in back if s.send(list(s.comps)) or self._done(s)])
        return self.stats

    def _done(self, s: _Slot) -> bool:
        _finish(s, self.stats, self.on_tree)
        return False

    def _feed(self, slots: list[_Slot]) -> None:
        """Resolve the slots' searches and embeddings together, then put each one's model request into the
        engine (a request whose prompts are all too long for the context returns at once)."""
        while slots:
            for s in _settle_cheap(slots, self.resolver):
                self._done(s)
            submit, again = [], []
            for s in (s for s in slots if s.req is not None):
                req = s.req
                ok = self.resolver.fits(req.prompts, [p.max_tokens for p in req.params])
                s.comps = [None if fit else TOO_LONG_COMPLETION for fit in ok]
                s.left = sum(ok)
                for j in (j for j, fit in enumerate(ok) if fit):
                    rid = str(self.serial)
                    self.serial += 1
                    self.waiting[rid] = (s, j)
                    submit.append(EngineRequest(rid, req.prompts[j], req.params[j], req.priority))
                if s.left:
                    self.active += 1
                elif s.send(list(s.comps)) or self._done(s):
                    again.append(s)
            if submit:
                self.engine.submit(submit)
            slots = again

    def close(self) -> None:
        """A stopped or failed run leaves nothing in flight in the (process-wide, shared) engine."""
        if self.waiting:
            self.engine.cancel()
            self.waiting.clear()


DRIVERS = {Scheduler.CONTINUOUS: run_continuous, Scheduler.WAVES: run_waves, Scheduler.SEQUENTIAL: run_sequential}
assert set(DRIVERS) == set(Scheduler)  # one driver per declared name


@dataclass
class Driven:
    """Every tree's rows, concatenated in the order the trees were given (what a run directory's final
    tables hold), and the driver's stats."""

    llm_calls: list[LlmCall]
    hits: list[RunHit]
    answers: list[TreeAnswer]
    stats: SchedStats

    @property
    def tokens(self) -> int:
        return self.stats.tokens


def drive(scheduler: str, trees: Sequence[Tree], res: Resources, settings: TreeSettings) -> Driven:
    """Run `trees` to the end under one driver and collect their rows (benchmarks, tests)."""
    rows: dict[str, TreeRows] = {}
    stats = DRIVERS[scheduler](trees, res, settings, lambda t, r: rows.__setitem__(t.qid, r))
    ordered = [rows[t.qid] for t in trees]
    return Driven([c for r in ordered for c in r.llm_calls], [h for r in ordered for h in r.hits],
                  [a for r in ordered for a in r.answers], stats)
