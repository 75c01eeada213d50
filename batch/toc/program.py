"""One question's Tree of Clarifications as a program: what it needs, asked for one request at a time.

`tree_program(tree, res, s, rows)` is a generator (`s`: its `TreeSettings`, the tree's part of the run
config, batch/toc/settings.py). It walks the official loop (gankim/tree-of-clarifications
`run_toc.py` main loop, stepped by `Tree`, batch/toc/tree.py) and, wherever it needs the outside world, it
yields a request and receives the result:

    Search(queries, k)          → per query [(passage_id, score)] best first, and the retriever's name
    Rerank(queries, ids, k)     → per query its candidates reranked, top k [(passage_id, score)]
    Embed(texts)                → {text: vector}
    Generate(step, nodes, prompts, params) → [Completion] in order

Everything else (passage lookup, demo selection, parsing, the tree's bookkeeping) is local and pure. The
tree's state depends only on the results it receives, and every result depends only on the request
(seeds and cache keys are functions of the question, node, expansion count or prompt; ranking scores
are rounded before sorting), so the drivers of batch/run/scheduler.py — one question at a time, waves, or
the continuous step loop — only differ in how many requests they resolve together and build identical
tables from the same completions (docs/architecture.md#one-questions-tree, tests/test_scheduler.py).

The program records its own rows (`TreeRows`: LLM calls, hits, the answer) in the order it makes them,
so a tree's rows never depend on which other trees ran beside it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from clarify.batch.config import (
    AnswerPassagesFrom,
    AnswerStyle,
    EmptyTreeAnswer,
    Evidence,
    NodePassages,
    Removal,
)
from clarify.batch.toc.constraints import answer_grammar, clarify_grammar
from clarify.batch.toc.demos import KnnPool
from clarify.batch.toc.format import (
    ANSWER_STOP,
    CLARIFY_STOP,
    DA_SEPARATOR,
    VERDICTS,
    Disambiguation,
    clean_long_answer,
    parse_disambiguations,
    parse_verdict,
    shown_da,
)
from clarify.batch.toc.match import MATCHING, AnswerIndex, Matching
from clarify.batch.toc.prompts import (
    Demo,
    Passage,
    answer_prompt,
    clarify_prompt,
    quoted_answer_prompt,
    verify_prompt,
)
from clarify.batch.toc.settings import TreeSettings
from clarify.batch.toc.tree import ROOT, Node, Status, Tree
from clarify.index.search import cosine
from clarify.local_llm.engine import Completion, Engine, GenParams, request_key
from clarify.schemas import LlmCall, RunHit, TreeAnswer

if TYPE_CHECKING:
    from clarify.index.search import Searcher

Embed = Callable[[list[str]], np.ndarray]
# The configured reranker (index.search.PairScorer.score): per query, one score per candidate passage id.
RerankFn = Callable[[list[str], list[list[str]]], list[np.ndarray]]

TOO_LONG = "prompt longer than the model's context: not sent"


class Step(StrEnum):
    """What a model request is for (the `step` column of llm_calls, schemas.LLM_CALLS)."""

    CLARIFY = "clarify"  # DQ/DA pairs of a node (ToC §3.1)
    VERIFY = "verify"  # True/False for one candidate (toc/pruning.py)
    ANSWER = "answer"  # the tree's long-form answer


@dataclass
class Resources:
    """What the programs need, passed in (never looked up from a global)."""

    engine: Engine
    searcher: Searcher | None  # search(DataFrame[qid, query], k) -> hits; None: the dataset gives the sources
    passages: Callable[[list[str]], dict[str, Passage]]  # passage ids → passages
    embed: Embed
    demos: KnnPool | None  # clarification demos
    quoted_demos: KnnPool | None = None  # SEMQA demos
    fixed_passages: dict[str, list[Passage]] = field(default_factory=dict)  # qid → given sources (QuoteSum)
    rerank: RerankFn | None = None  # None: the dense encoder's cosine over "title | text"


# -- requests ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Search:
    """Search the index for each query, top k. Result: ([[(passage_id, score)], ...], retriever name)."""

    queries: tuple[str, ...]
    k: int


@dataclass(frozen=True)
class Rerank:
    """Rank each query's candidates by the configured reranker, top k. Result: [[(passage_id, score)], ...]."""

    queries: tuple[str, ...]
    candidates: tuple[tuple[str, ...], ...]
    k: int


@dataclass(frozen=True)
class EmbedTexts:
    """Dense vectors of the texts. Result: {text: vector}."""

    texts: tuple[str, ...]


@dataclass(frozen=True)
class Generate:
    """Completions of the prompts (one per node). Result: [Completion] in order; a prompt that does not
    fit the model's context comes back with finish_reason "prompt_too_long" and is never sent."""

    step: Step
    node_ids: tuple[str, ...]
    prompts: tuple[str, ...]
    params: tuple[GenParams, ...]
    priority: int = 0  # lower = sooner (batch/run/scheduler.py continuous driver)


Request = Search | Rerank | EmbedTexts | Generate
Program = Generator[Request, Any, None]


@dataclass
class TreeRows:
    """A tree's rows, in the order its program made them (row records of schemas.py: each table's schema
    is its record's); `tokens`: prompt + output tokens of its completions that the engine computed in this
    session (not cache hits)."""

    llm_calls: list[LlmCall] = field(default_factory=list)
    hits: list[RunHit] = field(default_factory=list)
    answers: list[TreeAnswer] = field(default_factory=list)
    tokens: int = 0


# -- the pure helpers ---------------------------------------------------------------------------------
def seed_for(base: int, *parts: object) -> int:
    """A per-request seed that depends only on the request's identity, never on batch composition."""
    h = hashlib.sha256("|".join(map(str, (base, *parts))).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def clarify_seed(s: TreeSettings, t: Tree, n: Node, prompt: str) -> int:
    """The clarification's sampling seed. By default (toc.restart_resample = False) it is a function of
    the prompt alone, so a byte-identical prompt — a node re-expanded after a restart with nothing
    exhausted or removed since, or two nodes asking the same question — is the same request and the
    completion cache answers it with the same completion, as dsp's request cache does for the official
    run (run_toc.py:221, temperature 0.7); a different prompt is an independent sample. With the switch
    on, the seed depends on the node and the expansion count instead, so every expansion samples anew."""
    if s.toc.restart_resample:
        return seed_for(s.seed, t.qid, n.node_id, t.n_expansions, Step.CLARIFY)
    return seed_for(s.seed, hashlib.sha256(prompt.encode("utf-8")).hexdigest(), Step.CLARIFY)


def rank_by_scores(ids: Sequence[str], scores: Sequence[float], k: int) -> list[tuple[str, float]]:
    """toc/retrieval/combine.py:3-8 rerank: best first, top k. Scores are rounded to 5 decimals and ties
    keep the given order (stable), so a ranking does not depend on float noise between batches (~1e-7),
    unless a score lies that close to a rounding boundary."""
    r = np.round(np.asarray(scores, dtype=np.float64), 5)
    order = sorted(range(len(ids)), key=lambda i: (-r[i], i))[:k]
    return [(ids[i], float(scores[i])) for i in order]


def passage_string(p: Passage) -> str:
    """A passage as the official code sees it: dsp's retriever returns `long_text`, "title | text"
    (dsp/primitives/search.py:10), and answers are matched against all of it."""
    return f"{p.title} | {p.text}"


def exhausted_by(pairs: list[Disambiguation], ctx: list[str], store: dict[str, Passage], removal: Removal,
                 match: Matching) -> list[str]:
    """Shown passages that hold an answer of this expansion, to be skipped from now on (`match`: toc.matching).
    removal = "official": run_toc.py:110-123 remove_dup_psgs — a passage of the shown context that
    contains a whole DA string as written (`disambig['answer']`, unsplit), matched against "title | text"
    (dsp.passage_has_answers, dsp/primitives/demonstrate.py:129-134); `same_text` then takes the pool's
    passages with the same text. "shown": any single answer, text only."""
    if removal == Removal.OFFICIAL:
        found = [p.da for p in pairs]
        return [p for p in ctx if match.has_answer(passage_string(store[p]), found)]
    found = [a for p in pairs for a in p.answers]
    return [p for p in ctx if match.has_answer(store[p].text, found)]


def same_text(ids: list[str], pool: Sequence[str], store: dict[str, Passage]) -> list[str]:
    """The passages of `pool` (then of `ids`) whose "title | text" is that of one of `ids`, in that order.
    The official code holds passages as strings: remove_dup_psgs drops every pool passage that `in contexts`
    equals a shown one holding an answer (run_toc.py:116-118), so two passages with one text go together."""
    texts = {passage_string(store[p]) for p in ids}
    return [p for p in dict.fromkeys([*pool, *ids]) if passage_string(store[p]) in texts]


def removed_by(pairs: list[Disambiguation], shown: list[Demo], pool: Sequence[Demo], removal: Removal,
               match: Matching) -> list[str]:
    """Demos whose answer this expansion found, to be left out from now on (F1 > 0.8, `match`: toc.matching;
    dsp's F1 scores two answers without tokens 0, so a DA like "The" removes nothing, dsp/utils/metrics.py:67-73).
    removal = "official": run_toc.py:94-108 remove_dup_demos — over every demo still in `cur_demos`
    (the whole pool: `cur_demos = train.copy()`, run_toc.py:191), each demo DA (its first short answer,
    toc/utils.py:18) against the whole DA strings found, as written. "shown": only the demos in this prompt,
    against each single answer."""
    if removal == Removal.OFFICIAL:
        index, owner = _pool_answers(pool, match)  # scores only the pairs that can exceed 0.8 (match.py)
        hit = {owner[i] for i in index.above([p.da for p in pairs], 0.8)}
        return [d.demo_id for j, d in enumerate(pool) if j in hit]
    found = [a for p in pairs for a in p.answers]
    return [d.demo_id for d in shown if any(match.f1(b, a) > 0.8 for dp in d.pairs for a in dp.answers for b in found)]


_POOL_ANSWERS: dict[tuple[int, Matching], tuple[Sequence[Demo], AnswerIndex, list[int]]] = {}


def _pool_answers(pool: Sequence[Demo], match: Matching) -> tuple[AnswerIndex, list[int]]:
    """The demo pool's DAs as an AnswerIndex, and the pool position of each: built once per pool (a run holds
    one or two, res.demos and res.quoted_demos) and kept while the pool object lives."""
    got = _POOL_ANSWERS.get((id(pool), match))
    if got is None or got[0] is not pool:
        if len(_POOL_ANSWERS) >= 8:
            _POOL_ANSWERS.clear()
        das = [(j, shown_da(dp)) for j, d in enumerate(pool) for dp in d.pairs]
        got = (pool, AnswerIndex([a for _, a in das], match), [j for j, _ in das])
        _POOL_ANSWERS[(id(pool), match)] = got
    return got[1], got[2]


def answer_passages(t: Tree, store: dict[str, Passage], n_nodes: int, n_passages: int, match: Matching) -> list[str]:
    """toc.answer_passages_from = "nodes" (clarify's choice; toc/tree.py:49-70 select_passages is never
    called by run_toc.py): up to `n_passages` passages, for each valid node in BFS order the first passage
    the tree has shown that contains its answer; then the question's own top passages to fill up."""
    picked: list[str] = []
    for node in t.valid_nodes()[:n_nodes]:
        for pid in t.seen_passages:
            if pid not in picked and match.has_answer(store[pid].text, node.answers):
                picked.append(pid)
                break
        if len(picked) >= n_passages:
            break
    for pid in t.root_passages + t.seen_passages:
        if len(picked) >= n_passages:
            break
        if pid not in picked:
            picked.append(pid)
    return picked[:n_passages]


# Priorities of the continuous driver (lower = sooner): work that shortens the critical path first.
# A verification unblocks its tree's next expansion, a clarification starts one, an answer ends a tree.
PRIORITY = {Step.VERIFY: 0, Step.CLARIFY: 1, Step.ANSWER: 2}


def _priority(step: Step, t: Tree, s: TreeSettings) -> int:
    """Step first; then trees with more expansions ahead of them (fewer done) sooner."""
    return PRIORITY[step] * 1000 + min(t.n_expansions, s.toc.max_expansions + 1)


# -- the program -------------------------------------------------------------------------------------
def tree_program(t: Tree, res: Resources, s: TreeSettings, rows: TreeRows) -> Program:
    """A whole tree: expand node after node until the official loop stops, then the final answer.
    `wave` in the rows is the tree's own round: 1 for its first expansion, the round after its last
    expansion for its answer — the same under every driver."""
    if t.qid in res.fixed_passages:  # QuoteSum: the question's own sources, no tree (docs/architecture.md#the-index)
        t.done = True
    wave = 0
    while (node := t.next_node(s.toc)) is not None:
        wave += 1
        yield from expand(t, node, res, s, wave, rows)
    yield from answer(t, res, s, wave + 1, rows)


def _record(res: Resources, rows: TreeRows, t: Tree, req: Generate, wave: int, comps: Sequence[Completion],
            errors: Sequence[str | None]) -> None:
    """The request's llm_calls rows, complete when written: `errors[i]` is why completion i did not parse
    (None: it did); a prompt too long for the model says so instead."""
    out = []
    for node_id, prompt, p, c, err in zip(req.node_ids, req.prompts, req.params, comps, errors):
        if not c.cached:  # tokens the engine really processed in this session
            rows.tokens += c.prompt_tokens + c.output_tokens
        out.append(LlmCall(
            call_id=request_key(res.engine.model_id, prompt, p), step=req.step, qid=t.qid,
            node_id=node_id, wave=wave, model=res.engine.model_id, prompt=prompt,
            completion=c.text, finish_reason=c.finish_reason, prompt_tokens=c.prompt_tokens,
            output_tokens=c.output_tokens, cached=c.cached,
            parse_error=TOO_LONG if c.finish_reason == "prompt_too_long" else err,
        ))
    rows.llm_calls.extend(out)


def node_passages(t: Tree, n: Node, s: TreeSettings) -> Generator[Request, Any, tuple[list[tuple[str, float]], str]]:
    """The top_k passages (id, score) shown to the node's clarification, and the retriever's name.

    retrieval.node_passages = "pool" (official): the question is searched once, run_toc.py:198-199
    (`retrieve_passages` → dsp.retrieve(question, k=top_k_docs), toc/rac.py:5), and every node — the root
    too — reranks that pool minus the exhausted passages by its own question, run_toc.py:219 → :61-64.
    "search": every node searches the index with its own question and skips exhausted passages."""
    gone = set(t.exhausted_passages)
    if s.node_passages == NodePassages.POOL:
        if not t.searched:
            (found,), _ = yield Search((t.question,), s.pool)
            t.root_passages, t.searched = [pid for pid, _ in found], True
        cands = tuple(p for p in t.root_passages if p not in gone)
        (ranked,) = yield Rerank((n.question,), (cands,), s.top_k)
        return ranked, "rerank"
    (ranked,), retriever = yield Search((n.question,), s.pool)
    if n.node_id == ROOT and not t.searched:
        t.root_passages, t.searched = [pid for pid, _ in ranked], True
    return [(pid, score) for pid, score in ranked if pid not in gone][: s.top_k], retriever


def expand(t: Tree, n: Node, res: Resources, s: TreeSettings, wave: int, rows: TreeRows) -> Program:
    """One expansion of node `n`: retrieve, clarify, dedup, verify (run_toc.py:215-249)."""
    toc = s.toc
    # 1. Retrieval.
    used, retriever = yield from node_passages(t, n, s)
    ctx = [pid for pid, _ in used]
    t.note_passages(ctx)  # run_toc.py:220 toc.slt_psgs += qd_example.context
    # scores as ranked: rounded (rank_by_scores), so the table does not carry float noise that depends on
    # the batch a query was scored in
    rows.hits.extend(RunHit(qid=t.qid, node_id=n.node_id, wave=wave, query=n.question,
                            passage_id=pid, score=round(float(score), 5), rank=k, retriever=retriever)
                     for k, (pid, score) in enumerate(used, 1))
    store = res.passages(ctx) if ctx else {}

    # 2. Clarification with kNN demos for the node's question (run_toc.py:219 get_example → knn).
    vecs = yield EmbedTexts((n.question,))
    (demos,) = res.demos.select(vecs[n.question][None, :], [n.question], toc.n_demos, [t.removed_demos])
    prompt = clarify_prompt(n.question, [store[p] for p in ctx], demos)
    # [toc] constrain_format: the same prompt, decoded under the DQ/DA grammar (batch/toc/format.py)
    params = GenParams(temperature=toc.temperature, max_tokens=toc.clarify_max_tokens,
                       stop=CLARIFY_STOP + s.stop, seed=clarify_seed(s, t, n, prompt),
                       grammar=clarify_grammar(s))
    req = Generate(Step.CLARIFY, (n.node_id,), (prompt,), (params,), _priority(Step.CLARIFY, t, s))
    comps = yield req
    parsed = parse_disambiguations(comps[0].text, comps[0].finish_reason, toc.parsing)
    _record(res, rows, t, req, wave, comps, [parsed.error])
    children = t.add_candidates(n, parsed.pairs, wave, toc.duplicates)
    if toc.verify and parsed.pairs:
        # run_toc.py:229-231 (only with --verify, pruning or not): with every parsed pair (before
        # pruning), drop found answers' passages and demos so re-expansions look elsewhere. (With no
        # pair the official remove_dup_demos raises on `max()` of nothing; here nothing is removed.)
        match = MATCHING[toc.matching]
        gone = exhausted_by(parsed.pairs, ctx, store, toc.removal, match)
        if gone and toc.removal == Removal.OFFICIAL:
            pool = [p for p in t.root_passages if p not in t.exhausted_passages]
            gone = same_text(gone, pool, res.passages(list(dict.fromkeys(pool + ctx))))
        t.exhausted_passages.extend(p for p in gone if p not in t.exhausted_passages)
        t.removed_demos.extend(d for d in removed_by(parsed.pairs, demos, res.demos.items, toc.removal, match)
                               if d not in t.removed_demos)

    # 3. Self-verification of the pending children (toc/pruning.py:27-41), one request for all of them.
    pending = [c for c in children if c.status == Status.PENDING]
    verdicts: dict[str, tuple[bool, str | None, str | None]] = {}
    if pending:
        evidence = yield from _evidence(t, pending, res, toc.evidence, MATCHING[toc.matching])
        # the proposed answer is the DA string as written (toc/templates/load.py:46 `cur_qa['answer']`)
        req = Generate(Step.VERIFY, tuple(c.node_id for c in pending),
                       tuple(verify_prompt(ev, t.question, c.pair.da) for c, ev in zip(pending, evidence)),
                       tuple(GenParams(temperature=0.0, max_tokens=toc.verify_max_tokens, choices=VERDICTS)
                             for _ in pending), _priority(Step.VERIFY, t, s))
        comps = yield req
        parsed_verdicts = [parse_verdict(comp.text) for comp in comps]
        _record(res, rows, t, req, wave, comps, [err for _, err in parsed_verdicts])
        for c, ev, comp, (keep, _) in zip(pending, evidence, comps, parsed_verdicts):
            verdicts[c.node_id] = (keep, comp.text.strip(), ev.passage_id if ev else None)
    t.settle(children, verdicts, toc)


def _evidence(t: Tree, pending: list[Node], res: Resources, mode: Evidence,
              match: Matching) -> Generator[Request, Any, list[Passage | None]]:
    """The context of each verification: one passage the tree has shown (None when it has shown none).

    toc/pruning.py:17-25 get_evidence: among the passages the tree has shown, deduplicated by text
    (`deduplicate(tree.slt_psgs)`, :18: strings, the first of each kept), those holding the answer (all of
    them if none does), the reranker's top-1 for the DQ. As published it passes the DA *string* to
    `passage_has_answers` (:20), which iterates it: the "answers" are its single characters. A character
    that normalises to nothing (a space, punctuation, the letter a) is in every passage, so for most
    answers nothing is filtered; an answer without one ("16", "1092") keeps the passages that hold one of
    its characters as a token of its own (`match`: toc.matching).
    mode "filter": the intended filter, the DA string split on ';' as toc/tree.py:55 splits it, against
    "title | text", scored by the reranker; "official": as published, the DA string's characters;
    "filter-embed": the filter against the text, scored by the dense encoder's cosine (clarify's earlier choice, docs/fidelity.md)."""
    store = res.passages(list(t.seen_passages)) if t.seen_passages else {}
    first: dict[str, str] = {}
    for p in t.seen_passages:
        first.setdefault(passage_string(store[p]), p)
    shown = list(first.values())
    text = (lambda p: store[p].text) if mode == Evidence.FILTER_EMBED else (lambda p: passage_string(store[p]))
    pools = []
    for c in pending:
        answers = list(c.pair.da) if mode == Evidence.OFFICIAL else c.pair.da.split(DA_SEPARATOR)
        pools.append([p for p in shown if match.has_answer(text(p), answers)] or shown)
    if mode == Evidence.FILTER_EMBED:
        texts = tuple(dict.fromkeys([c.question for c in pending] + [store[p].text for pool in pools for p in pool]))
        vecs = yield EmbedTexts(texts)
        best = [rank_by_scores(pool, cosine(vecs[c.question], [vecs[store[p].text] for p in pool]), 1)
                for c, pool in zip(pending, pools)]
    else:
        best = yield Rerank(tuple(c.question for c in pending), tuple(tuple(p) for p in pools), 1)
    return [store[b[0][0]] if b else None for b in best]


def answer(t: Tree, res: Resources, s: TreeSettings, wave: int, rows: TreeRows) -> Program:
    """The tree's final long-form answer, at temperature 0 (run_toc.py:253-262)."""
    toc = s.toc
    if t.qid in res.fixed_passages:
        ctx = res.fixed_passages[t.qid]
    else:
        if toc.answer_passages_from == AnswerPassagesFrom.POOL:
            # run_toc.py:259 get_example(args, cur_demos, tree_ins, all_passages, ...): the question's whole
            # retrieved pool (exhaustion not applied) reranked by the question, top --top_k_reranked
            (top,) = yield Rerank((t.question,), (tuple(t.root_passages),), toc.answer_passages)
            picked = [pid for pid, _ in top]
        else:
            ids = list(dict.fromkeys(t.root_passages + t.seen_passages))
            picked = answer_passages(t, res.passages(ids) if ids else {}, toc.answer_nodes, toc.answer_passages,
                                     MATCHING[toc.matching])
        store = res.passages(picked) if picked else {}
        ctx = [store[p] for p in picked]
    pairs = [n.pair for n in t.valid_nodes()[: toc.answer_nodes]]
    vecs = yield EmbedTexts((t.question,))
    qmat = vecs[t.question][None, :]
    if s.answer_style == AnswerStyle.QUOTED:
        (demos,) = res.quoted_demos.select(qmat, [t.question], 2, [[t.qid]])
        prompt = quoted_answer_prompt(t.question, pairs, ctx, demos)
    else:
        (demos,) = res.demos.select(qmat, [t.question], toc.n_demos, [t.removed_demos])
        open_empty = toc.empty_tree_answer == EmptyTreeAnswer.OPEN
        prompt = answer_prompt(t.question, pairs, ctx, demos, open_empty=open_empty)
    # [answer] constrain_quotes: quoted spans decoded as runs of their source's words (batch/toc/constraints.py)
    params = GenParams(temperature=0.0, max_tokens=toc.answer_max_tokens, stop=ANSWER_STOP + s.stop,
                       grammar=answer_grammar(s, ctx))
    req = Generate(Step.ANSWER, (ROOT,), (prompt,), (params,), _priority(Step.ANSWER, t, s))
    comps = yield req
    # the official answer is the whole completion (dsp/templates/template_v2.py:146-176 extract: every field
    # before `answer` is given, the DQ/DA one as "" for an empty tree): after an open prompt, the DQ/DA
    # lines the model wrote are part of it
    text = clean_long_answer(comps[0].text)
    _record(res, rows, t, req, wave, comps, [None if text else "empty answer"])
    rows.answers.append(TreeAnswer(qid=t.qid, answer=text, passage_ids=tuple(p.passage_id for p in ctx),
                                   style=str(s.answer_style)))
