"""The wave scheduler: Tree of Clarifications breadth-first across ALL questions at once.

In each wave every unfinished tree names its next node; the wave then makes
  1. one `search` call for the questions met for the first time (each question's pool of passages) and
     one rerank call that ranks each node's pool by its own question (or, with
     retrieval.node_passages = "search", one `search` call for all those nodes' queries),
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
from clarify.batch.parse import (
    Disambiguation,
    clean_long_answer,
    da_text,
    parse_disambiguations,
    parse_verdict,
)
from clarify.batch.prompts import (
    Demo,
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
# The configured reranker (index.search.PairScorer.score): per query, one score per candidate passage id.
Rerank = Callable[[list[str], list[list[str]]], list[np.ndarray]]

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
    rerank: Rerank | None = None  # None: the dense encoder's cosine over "title | text"


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


def clarify_seed(cfg: RunConfig, t: Tree, n: Node, prompt: str) -> int:
    """The clarification's sampling seed. By default (toc.restart_resample = False) it is a function of
    the prompt alone, so a byte-identical prompt — a node re-expanded after a restart with nothing
    exhausted or removed since, or two nodes asking the same question — is the same request and the
    completion cache answers it with the same completion, as dsp's request cache does for the official
    run (run_toc.py:221, temperature 0.7); a different prompt is an independent sample. With the switch
    on, the seed depends on the node and the expansion count instead, so every expansion samples anew."""
    if cfg.toc.restart_resample:
        return seed_for(cfg.seed, t.qid, n.node_id, t.n_expansions, "clarify")
    return seed_for(cfg.seed, hashlib.sha256(prompt.encode("utf-8")).hexdigest(), "clarify")


def rank_by_scores(ids: Sequence[str], scores: Sequence[float], k: int) -> list[tuple[str, float]]:
    """toc/retrieval/combine.py:3-8 rerank: best first, top k. Scores are rounded to 5 decimals and ties
    keep the given order (stable), so a ranking never depends on float noise between batches."""
    r = np.round(np.asarray(scores, dtype=np.float64), 5)
    order = sorted(range(len(ids)), key=lambda i: (-r[i], i))[:k]
    return [(ids[i], float(scores[i])) for i in order]


def passage_string(p: Passage) -> str:
    """A passage as the official code sees it: dsp's retriever returns `long_text`, "title | text"
    (dsp/primitives/search.py:10), and answers are matched against all of it."""
    return f"{p.title} | {p.text}"


def _rerank(res: Resources, rec: Recorder, queries: list[str], id_lists: list[list[str]],
            k: int) -> list[list[tuple[str, float]]]:
    """Each query's candidates reranked by the configured reranker, top k (one batched call)."""
    if not queries:
        return []
    t0 = time.perf_counter()
    if not any(id_lists):
        scores: list = [np.zeros(0) for _ in queries]
    elif res.rerank is not None:
        scores = res.rerank(queries, id_lists)
    else:
        store = res.passages(list(dict.fromkeys(p for ids in id_lists for p in ids)))
        vecs = _embed(res, rec, queries + [passage_string(store[p]) for ids in id_lists for p in ids])
        scores = [np.array([vecs[q] @ vecs[passage_string(store[p])] for p in ids]) for q, ids in zip(queries, id_lists)]
    rec.seconds["retrieval"] += time.perf_counter() - t0
    return [rank_by_scores(ids, sc, k) for ids, sc in zip(id_lists, scores)]


def _search(res: Resources, rec: Recorder, keys: list[str], queries: list[str], k: int) -> dict[str, list]:
    """One batched search: key → [(passage_id, score)] best first, and the retriever's name under ''."""
    t0 = time.perf_counter()
    hits = res.searcher.search(pl.DataFrame({"qid": keys, "query": queries}), k=k)
    rec.seconds["retrieval"] += time.perf_counter() - t0
    out: dict[str, list] = {"": hits["retriever"][0] if hits.height else ""}
    for row in hits.sort(["qid", "rank"]).iter_rows(named=True):
        out.setdefault(row["qid"], []).append((row["passage_id"], row["score"]))
    return out


def node_passages(trees: Sequence[Tree], nodes: Sequence[Node], res: Resources, cfg: RunConfig,
                  rec: Recorder) -> tuple[list[list[tuple[str, float]]], str]:
    """The top_k passages (id, score) shown to each node's clarification, and the retriever's name.

    retrieval.node_passages = "pool" (official): the question is searched once, run_toc.py:198-199
    (`retrieve_passages` → dsp.retrieve(question, k=top_k_docs), toc/rac.py:5), and every node — the root
    too — reranks that pool minus the exhausted passages by its own question, run_toc.py:219 → :61-64.
    "search": every node searches the index with its own question and skips exhausted passages."""
    r = cfg.retrieval
    if r.node_passages == "pool":
        first = [t for t in trees if not t.searched]
        if first:
            got = _search(res, rec, [t.qid for t in first], [t.question for t in first], r.pool)
            for t in first:
                t.root_passages, t.searched = [pid for pid, _ in got.get(t.qid, [])], True
        gone = [set(t.exhausted_passages) for t in trees]
        cands = [[p for p in t.root_passages if p not in g] for t, g in zip(trees, gone)]
        return _rerank(res, rec, [n.question for n in nodes], cands, r.top_k), "rerank"
    keys = [f"{t.qid}\t{n.node_id}" for t, n in zip(trees, nodes)]
    got = _search(res, rec, keys, [n.question for n in nodes], r.pool)
    out = []
    for t, n, key in zip(trees, nodes, keys):
        ranked = got.get(key, [])
        if n.node_id == ROOT and not t.searched:
            t.root_passages, t.searched = [pid for pid, _ in ranked], True
        gone = set(t.exhausted_passages)
        out.append([(pid, s) for pid, s in ranked if pid not in gone][: r.top_k])
    return out, got[""]


def exhausted_by(pairs: list[Disambiguation], ctx: list[str], store: dict[str, Passage], removal: str) -> list[str]:
    """Shown passages that hold an answer of this expansion, to be skipped from now on.
    removal = "official": run_toc.py:110-123 remove_dup_psgs — a passage of the shown context that
    contains a whole DA string (`disambig['answer']`, unsplit), matched against "title | text"
    (dsp.passage_has_answers, dsp/primitives/demonstrate.py:129-134). "shown": any single answer, text only."""
    if removal == "official":
        found = [da_text(p.answers) for p in pairs]
        return [p for p in ctx if has_answer(passage_string(store[p]), found)]
    found = [a for p in pairs for a in p.answers]
    return [p for p in ctx if has_answer(store[p].text, found)]


def removed_by(pairs: list[Disambiguation], shown: list[Demo], pool: Sequence[Demo], removal: str) -> list[str]:
    """Demos whose answer this expansion found, to be left out from now on (dsp F1 > 0.8).
    removal = "official": run_toc.py:94-108 remove_dup_demos — over every demo still in `cur_demos`
    (the whole pool: `cur_demos = train.copy()`, run_toc.py:191), each demo DA (its first short answer,
    toc/utils.py:18) against the whole DA strings found. "shown": only the demos in this prompt,
    against each single answer."""
    if removal == "official":
        found = [da_text(p.answers) for p in pairs]
        return [d.demo_id for d in pool if any(token_f1(b, da_text(dp.answers)) > 0.8 for dp in d.pairs for b in found)]
    found = [a for p in pairs for a in p.answers]
    return [d.demo_id for d in shown if any(token_f1(b, a) > 0.8 for dp in d.pairs for a in dp.answers for b in found)]


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
    # Cheap bound first: a token covers at least one UTF-8 byte (byte-level BPE, SentencePiece byte
    # fallback), plus a few template tokens for chat models; a character may be several tokens (non-Latin
    # text), so near the limit the prompt is counted exactly.
    return [len(p.encode("utf-8")) + 64 + gp.max_tokens <= limit or count(p) + gp.max_tokens <= limit
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
    toc = cfg.toc
    # 1. Retrieval: one batch for every node of the wave.
    ranked, retriever = node_passages(trees, nodes, res, cfg, rec)
    contexts: list[list[str]] = []
    for t, n, used in zip(trees, nodes, ranked):
        contexts.append([pid for pid, _ in used])
        t.note_passages([pid for pid, _ in used])  # run_toc.py:220 toc.slt_psgs += qd_example.context
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
                                seed=clarify_seed(cfg, t, n, prompts[-1])))
        keys.append((t.qid, n.node_id))
    comps = _generate(res, rec, "clarify", wave, keys, prompts, params)
    calls = rec.llm_calls[-len(comps):]

    children_of: list[list[Node]] = []
    for t, n, ctx, demos, comp, call in zip(trees, nodes, contexts, demo_lists, comps, calls):
        parsed = parse_disambiguations(comp.text, comp.finish_reason)
        call["parse_error"] = call["parse_error"] or parsed.error
        children_of.append(t.add_candidates(n, parsed.pairs, wave, toc.duplicates))
        if toc.verify and parsed.pairs:
            # run_toc.py:229-231 (only with --verify, pruning or not): with every parsed pair (before
            # pruning), drop found answers' passages and demos so re-expansions look elsewhere. (With no
            # pair the official remove_dup_demos raises on `max()` of nothing; here nothing is removed.)
            t.exhausted_passages.extend(p for p in exhausted_by(parsed.pairs, ctx, store, toc.removal)
                                        if p not in t.exhausted_passages)
            t.removed_demos.extend(d for d in removed_by(parsed.pairs, demos, res.demos.items, toc.removal)
                                   if d not in t.removed_demos)

    # 3. Self-verification of every pending child of the wave, one generate.
    pending = [(t, c) for t, kids in zip(trees, children_of) for c in kids if c.status == "pending"]
    evidence = _evidence(pending, res, rec, toc.evidence)
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
        verdicts[(t.qid, c.node_id)] = (keep, comp.text.strip(), ev.passage_id if ev else None)
    for t, kids in zip(trees, children_of):
        t.settle(kids, {c.node_id: verdicts[(t.qid, c.node_id)] for c in kids if c.status == "pending"}, toc)


def _evidence(pending: list[tuple[Tree, Node]], res: Resources, rec: Recorder, mode: str) -> list[Passage | None]:
    """The context of each verification: one passage the tree has shown (None when it has shown none).

    toc/pruning.py:17-25 get_evidence means: among the shown passages (deduplicated `slt_psgs`), those
    containing the answer (all of them if none does), the reranker's top-1 for the DQ. As published it
    calls `passage_has_answers(passage, cur_qa['answer'])` with a string: the "answers" are its single
    characters, which normalise to nothing and match every passage, so the filter is a no-op.
    mode "filter": the intended filter (each `;`-separated answer, as toc/tree.py:55 splits them, against
    "title | text"), scored by the reranker; "official": no filter, reranker top-1 of all shown passages;
    "filter-embed": the filter against the text, scored by the dense encoder's cosine (before issue 12)."""
    if not pending:
        return []
    store = res.passages(list(dict.fromkeys(p for t, _ in pending for p in t.seen_passages)))
    pools = []
    for t, c in pending:
        if mode == "official":
            pools.append(list(t.seen_passages))
            continue
        text = (lambda p: store[p].text) if mode == "filter-embed" else (lambda p: passage_string(store[p]))
        pos = [p for p in t.seen_passages if has_answer(text(p), c.answers)]
        pools.append(pos or list(t.seen_passages))
    if mode == "filter-embed":
        vecs = _embed(res, rec, [c.question for _, c in pending] + [store[p].text for pool in pools for p in pool])
        best = [rank_by_scores(pool, [float(vecs[c.question] @ vecs[store[p].text]) for p in pool], 1)
                for (_, c), pool in zip(pending, pools)]
    else:
        best = _rerank(res, rec, [c.question for _, c in pending], pools, 1)
    return [store[b[0][0]] if b else None for b in best]


def answer_passages(t: Tree, store: dict[str, Passage], n_nodes: int, n_passages: int) -> list[str]:
    """toc.answer_passages_from = "nodes" (clarify's choice; toc/tree.py:49-70 select_passages is never
    called by run_toc.py): up to `n_passages` passages, for each valid node in BFS order the first passage
    the tree has shown that contains its answer; then the question's own top passages to fill up."""
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
    searched = [t for t in trees if t.qid not in res.fixed_passages]
    if toc.answer_passages_from == "pool":
        # run_toc.py:259 get_example(args, cur_demos, tree_ins, all_passages, ...): the question's whole
        # retrieved pool (exhaustion not applied) reranked by the question, top --top_k_reranked
        top = _rerank(res, rec, [t.question for t in searched], [list(t.root_passages) for t in searched],
                      toc.answer_passages)
        picked = {t.qid: [pid for pid, _ in ranked] for t, ranked in zip(searched, top)}
    else:
        picked = {t.qid: answer_passages(t, store, toc.answer_nodes, toc.answer_passages) for t in searched}
    contexts: list[list[Passage]] = [res.fixed_passages[t.qid] if t.qid in res.fixed_passages
                                     else [store[p] for p in picked[t.qid]] for t in trees]
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
