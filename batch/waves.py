"""The wave scheduler: Tree of Clarifications breadth-first across ALL questions at once.

In each wave every unfinished tree names its next node; the wave then makes
  1. one `search` call for all those nodes' queries,
  2. one `generate` call for all clarification prompts,
  3. one `generate` call for all self-verification prompts,
and the trees take the results. After the last wave, one `generate` call writes every final answer.

`expand` and `answer` take any list of trees, so the per-question loop of the official code
(`run_sequential`) is the same code called with one tree at a time; a test checks that both build
identical tables from the same completions.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from clarify.batch.config import RunConfig
from clarify.batch.demos import KnnPool
from clarify.batch.parse import Disambiguation, clean_long_answer, parse_disambiguations, parse_verdict
from clarify.batch.prompts import (
    Passage,
    answer_prompt,
    clarify_prompt,
    quoted_answer_prompt,
    verify_prompt,
)
from clarify.batch.tree import ROOT, Node, Tree, has_answer
from clarify.eval.normalize import token_f1
from clarify.local_llm.engine import Completion, Engine, GenParams, request_key

Embed = Callable[[list[str]], np.ndarray]

# The clarification's long answer is not used (ToC appendix): stop before it to save tokens.
CLARIFY_STOP = ("\nAnswer:", "\n---", "\nQuestion:")
ANSWER_STOP = ("\n---", "\nQuestion:", "\nContext:", "\nSources:")


@dataclass
class Resources:
    """What the scheduler needs, passed in (never looked up from a global)."""

    engine: Engine
    searcher: object | None  # clarify.index Searcher: search(DataFrame[qid, query], k) -> hits
    passages: Callable[[list[str]], dict[str, Passage]]  # passage ids → passages
    embed: Embed
    demos: KnnPool | None  # clarification demos
    quoted_demos: KnnPool | None = None  # SEMQA demos
    fixed_passages: dict[str, list[Passage]] = field(default_factory=dict)  # qid → given sources (QuoteSum)


@dataclass
class Recorder:
    """Rows produced by the stages, per wave; turned into tables at checkpoint time."""

    llm_calls: list[dict] = field(default_factory=list)
    hits: list[dict] = field(default_factory=list)
    answers: list[dict] = field(default_factory=list)
    tokens: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: {"retrieval": 0.0, "generate": 0.0, "embed": 0.0})

    def take(self) -> Recorder:
        out = Recorder(self.llm_calls, self.hits, self.answers, self.tokens, dict(self.seconds))
        self.llm_calls, self.hits, self.answers = [], [], []
        return out


def seed_for(base: int, *parts: object) -> int:
    """A per-request seed that depends only on the request's identity, never on batch composition."""
    h = hashlib.sha256("|".join(map(str, (base, *parts))).encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def _generate(res: Resources, rec: Recorder, step: str, wave: int, keys: list[tuple[str, str]],
              prompts: list[str], params: list[GenParams]) -> list[Completion]:
    if not prompts:
        return []
    t0 = time.perf_counter()
    fits = _fits(res.engine, prompts, params)
    sent = [i for i, ok in enumerate(fits) if ok]
    got = res.engine.generate([prompts[i] for i in sent], [params[i] for i in sent]) if sent else []
    comps: list[Completion] = [Completion(("",), "prompt_too_long", 0, 0)] * len(prompts)
    for i, c in zip(sent, got):
        comps[i] = c
    rec.seconds["generate"] += time.perf_counter() - t0
    for (qid, node_id), prompt, p, c in zip(keys, prompts, params, comps):
        if not c.cached:  # tokens the engine really processed in this session
            rec.tokens += c.prompt_tokens + c.output_tokens
        rec.llm_calls.append({
            "call_id": request_key(res.engine.model_id, prompt, p), "step": step, "qid": qid,
            "node_id": node_id, "wave": wave, "model": res.engine.model_id, "prompt": prompt,
            "completion": c.text, "finish_reason": c.finish_reason, "prompt_tokens": c.prompt_tokens,
            "output_tokens": c.output_tokens, "cached": c.cached,
            "parse_error": "prompt longer than the model's context: not sent" if c.finish_reason == "prompt_too_long"
            else None,
        })
    return comps


def _fits(engine: Engine, prompts: list[str], params: list[GenParams]) -> list[bool]:
    """Which prompts fit the model's context with room for their max_tokens. One over-long prompt must
    not fail the whole batch (vLLM rejects a batch containing one); it is recorded and skipped."""
    inner = getattr(engine, "engine", engine)
    count, limit = getattr(inner, "count_tokens", None), getattr(inner, "max_model_len", None)
    if count is None or limit is None:
        return [True] * len(prompts)
    # Cheap bound first: a token is at least one character (plus a few template tokens for chat models).
    return [len(p) + 64 + gp.max_tokens <= limit or count(p) + gp.max_tokens <= limit
            for p, gp in zip(prompts, params)]


def _embed(res: Resources, rec: Recorder, texts: list[str]) -> dict[str, np.ndarray]:
    uniq = list(dict.fromkeys(texts))
    if not uniq:
        return {}
    t0 = time.perf_counter()
    vecs = np.asarray(res.embed(uniq), dtype=np.float32)
    rec.seconds["embed"] += time.perf_counter() - t0
    return dict(zip(uniq, vecs))


def expand(trees: Sequence[Tree], nodes: Sequence[Node], res: Resources, cfg: RunConfig, wave: int,
           rec: Recorder) -> None:
    """One expansion step for each (tree, node): retrieve, clarify, dedup, verify — all batched."""
    if not trees:
        return
    r, toc = cfg.retrieval, cfg.toc
    # 1. Retrieval: one batch for every node of the wave.
    t0 = time.perf_counter()
    queries = pl.DataFrame({"qid": [f"{t.qid}\t{n.node_id}" for t, n in zip(trees, nodes)],
                            "query": [n.question for n in nodes]})
    hits = res.searcher.search(queries, k=r.pool)
    rec.seconds["retrieval"] += time.perf_counter() - t0
    by_query: dict[str, list[tuple[str, float]]] = {}
    for row in hits.sort(["qid", "rank"]).iter_rows(named=True):
        by_query.setdefault(row["qid"], []).append((row["passage_id"], row["score"]))
    retriever = hits["retriever"][0] if hits.height else ""
    contexts: list[list[str]] = []
    for t, n in zip(trees, nodes):
        ranked = by_query.get(f"{t.qid}\t{n.node_id}", [])
        if n.node_id == ROOT and not t.root_passages:
            t.root_passages = [pid for pid, _ in ranked]
        used = [(pid, s) for pid, s in ranked if pid not in t.exhausted_passages][: r.top_k]
        contexts.append([pid for pid, _ in used])
        t.note_passages([pid for pid, _ in used])
        rec.hits.extend({"qid": t.qid, "node_id": n.node_id, "wave": wave, "query": n.question,
                         "passage_id": pid, "score": float(s), "rank": k, "retriever": retriever}
                        for k, (pid, s) in enumerate(used, 1))
    store = res.passages(list(dict.fromkeys(pid for ctx in contexts for pid in ctx)))

    # 2. Clarification: kNN demos for each node's question, one generate for the wave.
    qvecs = _embed(res, rec, [n.question for n in nodes])
    demo_lists = res.demos.select(np.stack([qvecs[n.question] for n in nodes]), [n.question for n in nodes],
                                  toc.n_demos, [t.removed_demos for t in trees])
    prompts, params, keys = [], [], []
    for t, n, ctx, demos in zip(trees, nodes, contexts, demo_lists):
        prompts.append(clarify_prompt(n.question, [store[p] for p in ctx], demos))
        params.append(GenParams(temperature=toc.temperature, max_tokens=toc.clarify_max_tokens,
                                stop=CLARIFY_STOP + cfg.model.stop,
                                seed=seed_for(cfg.seed, t.qid, n.node_id, t.n_expansions, "clarify")))
        keys.append((t.qid, n.node_id))
    comps = _generate(res, rec, "clarify", wave, keys, prompts, params)
    calls = rec.llm_calls[-len(comps):]

    children_of: list[list[Node]] = []
    for t, n, ctx, demos, comp, call in zip(trees, nodes, contexts, demo_lists, comps, calls):
        parsed = parse_disambiguations(comp.text, comp.finish_reason)
        call["parse_error"] = call["parse_error"] or parsed.error
        children_of.append(t.add_candidates(n, parsed.pairs, wave))
        if toc.verify and parsed.pairs:
            # run_toc.py (with --verify): drop context passages that hold a found answer and demos whose
            # answers match a found answer (F1 > 0.8), so re-expansions look elsewhere.
            found = [a for p in parsed.pairs for a in p.answers]
            t.exhausted_passages.extend(p for p in ctx if has_answer(store[p].text, found)
                                        and p not in t.exhausted_passages)
            t.removed_demos.extend(d.demo_id for d in demos if d.demo_id not in t.removed_demos
                                   and any(token_f1(b, a) > 0.8 for dp in d.pairs for a in dp.answers for b in found))

    # 3. Self-verification of every pending child of the wave, one generate.
    pending = [(t, c) for t, kids in zip(trees, children_of) for c in kids if c.status == "pending"]
    evidence = _evidence(pending, res, rec)
    prompts, params, keys = [], [], []
    for (t, c), ev in zip(pending, evidence):
        prompts.append(verify_prompt(ev, t.question, "; ".join(c.answers)))
        params.append(GenParams(temperature=0.0, max_tokens=toc.verify_max_tokens, choices=("True", "False")))
        keys.append((t.qid, c.node_id))
    comps = _generate(res, rec, "verify", wave, keys, prompts, params)
    calls = rec.llm_calls[-len(comps):] if comps else []
    verdicts: dict[tuple[str, str], tuple[bool, str | None, str | None]] = {}
    for (t, c), ev, comp, call in zip(pending, evidence, comps, calls):
        keep, err = parse_verdict(comp.text)
        call["parse_error"] = call["parse_error"] or err
        verdicts[(t.qid, c.node_id)] = (keep, comp.text.strip(), ev.passage_id)
    for t, kids in zip(trees, children_of):
        t.settle(kids, {c.node_id: verdicts[(t.qid, c.node_id)] for c in kids if c.status == "pending"}, toc)


def _evidence(pending: list[tuple[Tree, Node]], res: Resources, rec: Recorder) -> list[Passage]:
    """toc/pruning.py get_evidence: among the passages the tree has shown, those containing the answer
    (all of them if none does), the one most similar to the DQ. Similarity is the dense encoder's cosine —
    the same scorer as the reranker fallback."""
    if not pending:
        return []
    store = res.passages(list(dict.fromkeys(p for t, _ in pending for p in t.seen_passages)))
    pools = []
    for t, c in pending:
        pos = [p for p in t.seen_passages if has_answer(store[p].text, c.answers)]
        pools.append(pos or list(t.seen_passages))
    vecs = _embed(res, rec, [c.question for _, c in pending] + [store[p].text for pool in pools for p in pool])
    out = []
    for (_, c), pool in zip(pending, pools):
        scores = [round(float(vecs[c.question] @ vecs[store[p].text]), 5) for p in pool]
        out.append(store[pool[int(np.argmax(scores))]])
    return out


def answer_passages(t: Tree, store: dict[str, Passage], n_nodes: int, n_passages: int) -> list[str]:
    """Up to `n_passages` passages for the final answer (toc/tree.py select_passages): for each valid
    node in BFS order, the first passage the tree has shown that contains its answer; then the question's
    own top passages to fill up."""
    picked: list[str] = []
    for node in t.valid_nodes()[:n_nodes]:
        for pid in t.seen_passages:
            if pid not in picked and has_answer(store[pid].text, node.answers):
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


def answer(trees: Sequence[Tree], res: Resources, cfg: RunConfig, wave: int, rec: Recorder) -> None:
    """The final long-form answer of every tree: one generate at temperature 0."""
    if not trees:
        return
    toc = cfg.toc
    ids = list(dict.fromkeys(p for t in trees for p in t.root_passages + t.seen_passages))
    store = res.passages(ids) if ids else {}
    contexts: list[list[Passage]] = []
    for t in trees:
        if t.qid in res.fixed_passages:
            contexts.append(res.fixed_passages[t.qid])
        else:
            contexts.append([store[p] for p in answer_passages(t, store, toc.answer_nodes, toc.answer_passages)])
    pairs_of = [[_pair(n) for n in t.valid_nodes()[: toc.answer_nodes]] for t in trees]
    qs = [t.question for t in trees]
    qvecs = _embed(res, rec, qs)
    qmat = np.stack([qvecs[q] for q in qs])
    prompts = []
    if cfg.answer_style == "quoted":
        demo_lists = res.quoted_demos.select(qmat, qs, 2, [[t.qid] for t in trees])
        for t, pairs, ctx, demos in zip(trees, pairs_of, contexts, demo_lists):
            prompts.append(quoted_answer_prompt(t.question, pairs, ctx, demos))
    else:
        demo_lists = res.demos.select(qmat, qs, toc.n_demos, [t.removed_demos for t in trees])
        for t, pairs, ctx, demos in zip(trees, pairs_of, contexts, demo_lists):
            prompts.append(answer_prompt(t.question, pairs, ctx, demos))
    params = [GenParams(temperature=0.0, max_tokens=toc.answer_max_tokens, stop=ANSWER_STOP + cfg.model.stop)
              for _ in trees]
    comps = _generate(res, rec, "answer", wave, [(t.qid, ROOT) for t in trees], prompts, params)
    for t, ctx, comp, call in zip(trees, contexts, comps, rec.llm_calls[-len(comps):]):
        text = clean_long_answer(comp.text)
        if not text:
            call["parse_error"] = call["parse_error"] or "empty answer"
        rec.answers.append({"qid": t.qid, "answer": text, "passage_ids": [p.passage_id for p in ctx],
                            "style": cfg.answer_style})


def _pair(n: Node) -> Disambiguation:
    return Disambiguation(n.question, tuple(n.answers))


def run_waves(trees: list[Tree], res: Resources, cfg: RunConfig, *, start_wave: int = 1,
              on_wave: Callable[[int, Recorder, list[Tree]], None] | None = None,
              progress: bool = True) -> Recorder:
    """Advance all trees together until every one is finished, then answer all of them.

    `on_wave(wave, rows, trees)` is called after each finished wave (the run directory checkpoints there);
    the answer step is the last wave."""
    from tqdm.auto import tqdm

    rec = Recorder()
    wave = start_wave
    bar = tqdm(desc="ToC waves", unit="wave", disable=not progress)
    while True:
        active, nodes = [], []
        for t in trees:
            if t.qid in res.fixed_passages:
                t.done = True
            node = None if t.done else t.next_node(cfg.toc)
            if node is not None:
                active.append(t)
                nodes.append(node)
        if not active:
            break
        expand(active, nodes, res, cfg, wave, rec)
        bar.update(1)
        bar.set_postfix(active=len(active), finished=len(trees) - len(active), tokens=rec.tokens)
        if on_wave:
            on_wave(wave, rec.take(), trees)
        wave += 1
    answer(trees, res, cfg, wave, rec)
    bar.set_postfix(active=0, finished=len(trees), tokens=rec.tokens)
    bar.close()
    if on_wave:
        on_wave(wave, rec.take(), trees)
    return rec


def run_sequential(trees: list[Tree], res: Resources, cfg: RunConfig) -> Recorder:
    """The official code's way: one question at a time, one request per step. Same stages as
    `run_waves`, so with the same completions it must build the same trees (tests check this)."""
    rec = Recorder()
    for t in trees:
        if t.qid in res.fixed_passages:
            t.done = True
        wave = 1
        while (node := t.next_node(cfg.toc)) is not None:
            expand([t], [node], res, cfg, wave, rec)
            wave += 1
        answer([t], res, cfg, wave, rec)
    return rec
