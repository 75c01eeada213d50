"""A run's tables shaped for the report's templates: each question's tree of nodes with their retrieved
passages, its answer with every quoted span placed and checked, the question index, the headline metrics
and facts, and one run's whole section (`_run`). Read from a loaded Run (batch/run/rundir.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl
from markupsafe import Markup, escape
from tqdm import tqdm

from clarify.batch.report import plots
from clarify.batch.report.comparison import fmt
from clarify.batch.report.labels import (
    METRIC_WORDS,
    READER_NOTE,
    SPAN_LABELS,
    STATUS_LABELS,
    config_groups,
    summary_groups,
)
from clarify.batch.report.render import data_uri, environment, pack, text_store
from clarify.batch.run.records import RunSummary
from clarify.batch.run.rundir import Run
from clarify.batch.toc import quotes
from clarify.batch.toc.tree import Status
from clarify.schemas import AnswerRow, NodeRow, Passage, QuestionRow, RunHit, ScoreRow, SpanRow, rows

# Hit lists shown per node: the last stage of the retrieval pipeline that is present.
RETRIEVER_PREFERENCE = ("rerank", "fused", "dense", "bm25")


@dataclass
class _Ctx:
    """Per-question lookups used while rendering (all frames already filtered to the question)."""

    prefix: str  # html id prefix, e.g. "r0-q3"
    passages: dict[str, tuple[str, str]]  # passage_id -> (title, text)
    hits_by_node: dict[str | None, list[RunHit]]
    stored: dict[str, str]  # the run's passage texts shown folded under a node, once each (`text_store`)


def _passage(ctx: _Ctx, pid: str, elem_id: str, hit: RunHit | None = None, evidence: bool = False) -> dict:
    """A passage as the template's `passage` macro shows it; hit: the retrieval row (rank, score), None
    for the evidence passage. Its text goes into the run's store once (`text_store`): the same passages
    are shown under many nodes (1,722 passage elements, ~300 distinct texts, for 50 questions), and inline
    they made a 500-question report ~14 MB (bench/bench_report.py: 504 questions of a real run, 16.7 MB
    with the texts stored once and every question inline, 2.8 MB packed)."""
    title, text = ctx.passages.get(pid, (None, None))
    if text is not None:
        ctx.stored[pid] = text
    return {"id": elem_id, "pid": pid, "title": title or pid, "text": text, "hit": hit, "evidence": evidence}


def _node_hits(ctx: _Ctx, node_id: str, k: int) -> list[list[RunHit]]:
    """The node's retrieval lists, one per retrieval (a root retrieved again after a restart has one
    per wave): the top k of the last pipeline stage present, best rank first, passages not repeated."""
    hits = ctx.hits_by_node.get(node_id, [])
    if not hits:
        return []
    present = {h.retriever for h in hits}
    chosen = next((r for r in RETRIEVER_PREFERENCE if r in present), None)
    if chosen is not None:
        hits = [h for h in hits if h.retriever == chosen]
    by_wave: dict = {}
    for h in hits:
        by_wave.setdefault(h.wave, []).append(h)
    lists = []
    for wave in sorted(by_wave, key=lambda w: (w is None, w or 0)):
        seen, top = set(), []
        for h in sorted(by_wave[wave], key=lambda h: h.rank if h.rank is not None else 1 << 30):
            if h.passage_id not in seen and len(top) < k:
                seen.add(h.passage_id)
                top.append(h)
        lists.append(top)
    return lists


def _node(ctx: _Ctx, node: NodeRow, children: dict, idx: dict, k: int, seen: set) -> dict:
    """One tree node for the template's recursive `node` macro, its children nested."""
    nid = node.node_id
    seen.add(nid)
    status = node.status or "unknown"
    is_root = status == Status.ROOT or node.parent_id is None
    elem = f"{ctx.prefix}-n{idx[nid]}"
    ev = node.evidence_passage_id
    lists = _node_hits(ctx, nid, k)
    retrievals = [
        {
            "query": hits[0].query,
            "retriever": hits[0].retriever,
            "wave": hits[0].wave if len(lists) > 1 else None,
            "passages": [
                _passage(ctx, h.passage_id, f"{elem}-l{li}p{j}", h, h.passage_id == ev)
                for j, h in enumerate(hits)
            ],
        }
        for li, hits in enumerate(lists)
    ]
    kids = [c for c in children.get(nid, []) if c.node_id not in seen]
    return {
        "id": elem,
        "node_id": nid,
        "status": status,
        "label": STATUS_LABELS.get(status, status.upper()),
        "open": is_root,
        "question": node.question,
        "answers": "; ".join(node.answers or []),
        "depth": node.depth,
        "wave": node.wave,
        "verdict": node.verdict_text,
        "evidence": _passage(ctx, ev, f"{elem}-ev", evidence=True) if ev is not None else None,
        "retrievals": retrievals,
        "children": [_node(ctx, c, children, idx, k, seen) for c in kids],
    }


def _tree(ctx: _Ctx, nodes: list[NodeRow], k: int) -> list[dict]:
    """The question's top nodes (the root, orphans), each with its subtree."""
    ids = {n.node_id for n in nodes}
    idx = {n.node_id: i for i, n in enumerate(nodes)}
    children: dict[str, list[NodeRow]] = {}
    tops = []
    for n in sorted(nodes, key=lambda n: (n.depth or 0, n.wave or 0, idx[n.node_id])):
        if n.parent_id is None or n.parent_id not in ids:
            tops.append(n)  # the root, or an orphan whose parent row is missing
        else:
            children.setdefault(n.parent_id, []).append(n)
    seen: set[str] = set()
    items = [_node(ctx, n, children, idx, k, seen) for n in tops]
    # Nodes on a parent cycle are never reached from a top node: still show them.
    items += [_node(ctx, n, {}, idx, k, seen) for n in nodes if n.node_id not in seen]
    return items


def _span_status(span: SpanRow) -> str:
    if span.status:
        return span.status
    return "verbatim" if span.verbatim else "unverified"


def _filled(span: SpanRow) -> SpanRow:
    """The span row with its status filled in (`_span_status`); `_label` says it in words."""
    return replace(span, status=_span_status(span))


def _label(span: SpanRow) -> str:
    return SPAN_LABELS.get(span.status, span.status)


def _highlight(text: str, spans: list[tuple[int, int, int, str]], prefix: str) -> Markup:
    """Passage text with each span's [start, end) wrapped in <mark data-spans="n ...">, and an empty
    anchor element `{prefix}-s{n}` at each span's start. spans: (span_no, start, end, status).
    Every text segment and attribute is escaped (Markup.format)."""
    bounds = sorted({0, len(text)} | {s for _, s, _, _ in spans} | {e for _, _, e, _ in spans})
    starts: dict[int, list[int]] = {}
    for n, s, _, _ in spans:
        starts.setdefault(s, []).append(n)
    anchor = Markup('<span class="anchor" id="{}-s{}" data-span="{}"></span>')
    out = []
    for a, b in zip(bounds, bounds[1:]):
        out += [anchor.format(prefix, n, n) for n in starts.get(a, [])]
        cover = [(n, st) for n, s, e, st in spans if s <= a and b <= e]
        if cover:
            nums = " ".join(str(n) for n, _ in cover)
            cls = "quote" + ("" if all(st == "verbatim" for _, st in cover) else " nonverbatim")
            out.append(Markup('<mark class="{}" data-spans="{}">{}</mark>').format(cls, nums, text[a:b]))
        else:
            out.append(escape(text[a:b]))
    out += [anchor.format(prefix, n, n) for n in starts.get(len(text), [])]  # an empty span at the very end
    return Markup("").join(out)


def _answer(ctx: _Ctx, answer: AnswerRow, spans: list[SpanRow]) -> dict:
    """The answer as the model wrote it (answer_raw), cut at each span's marker_start/marker_end into
    text and markers, with the span table and the numbered sources (spans highlighted). spans: the
    question's, in span_no order, each `_filled`."""
    pids = list(answer.passage_ids or [])
    # Which spans can be linked: a source that exists and offsets inside the passage field they index.
    linkable: set[int] = set()
    per_field: dict[tuple[int, str], list[tuple[int, int, int, str]]] = {}
    for sp in spans:
        k, s, e = sp.source_k, sp.start, sp.end
        if k is None or not 1 <= k <= len(pids) or s is None or e is None:
            continue
        fld = sp.field or "text"
        title, text = ctx.passages.get(pids[k - 1], (None, None))
        target = title if fld == "title" else text
        if target is None or not 0 <= s < e <= len(target):
            continue
        linkable.add(sp.span_no)
        per_field.setdefault((k, fld), []).append((sp.span_no, s, e, sp.status))
    raw = answer.answer_raw or ""
    segments: list = []  # str (text) | dict (a marker)
    pos = 0
    for sp in spans:  # in span_no order = marker order in answer_raw
        s, e = sp.marker_start, sp.marker_end
        if s is None or e is None or not pos <= s < e <= len(raw):
            continue  # no place in the text: the span table still lists it
        segments.append(raw[pos:s])
        pos = e
        written = quotes.parse_quoted(raw[s:e])[0]  # the one marker there: its text as the model wrote it
        title = f"source {sp.source_k} · {_label(sp)}"
        if sp.status == "repaired":
            title += f" · passage says: {sp.text}"
        segments.append(
            {
                "k": sp.source_k,
                "text": written[0].text if written else sp.text,
                "status": sp.status,
                "label": _label(sp),
                "title": title,
                "n": sp.span_no if sp.span_no in linkable else None,
            }
        )
    segments.append(raw[pos:])
    table = [
        {
            "n": sp.span_no,
            "linked": sp.span_no in linkable,
            "k": sp.source_k,
            "status": sp.status,
            "label": _label(sp),
            "field": sp.field or "text",
            "start": sp.start,
            "end": sp.end,
            "text": sp.text,
        }
        for sp in spans
    ]
    sources = []
    for k, pid in enumerate(pids, 1):
        title, ptext = ctx.passages.get(pid, (None, None))
        marks = {fld: sorted(per_field.get((k, fld), []), key=lambda t: t[1]) for fld in ("title", "text")}
        sources.append(
            {
                "k": k,
                "pid": pid,
                "head": _highlight(title, marks["title"], ctx.prefix) if title is not None else pid,
                "body": _highlight(ptext, marks["text"], ctx.prefix) if ptext is not None else None,
            }
        )
    return {
        "style": answer.style or "",
        "segments": segments,
        "scored": answer.answer if answer.answer != answer.answer_raw else None,
        "spans": table,
        "n_verbatim": sum(sp.status == "verbatim" for sp in spans),
        "sources": sources,
    }


def _question(ri: int, qi: int, q: QuestionRow, frames: dict, k: int, open_: bool, stored: dict[str, str]) -> dict:
    """One question's section for the template's `question` macro; `verbatim` ("n/m" spans, — for none)
    and `scores` also fill its row of the question index (`_run`)."""
    prefix = f"r{ri}-q{qi}"
    qid = q.qid
    nodes = frames["nodes"].get(qid, [])
    hits_by_node: dict[str | None, list[RunHit]] = {}
    for h in frames["hits"].get(qid, []):
        hits_by_node.setdefault(h.node_id, []).append(h)
    ctx = _Ctx(prefix, frames["passages"], hits_by_node, stored)
    answer = frames["answers"].get(qid, [None])[0]
    spans = [_filled(s) for s in sorted(frames["spans"].get(qid, []), key=lambda s: s.span_no)]
    return {
        "id": prefix,
        "qid": qid,
        "question": q.question,
        "open": open_,
        "packed": None,  # `_run` packs the body of a question shown closed
        "n_valid": sum(n.status in plots.VALID_STATUSES for n in nodes),
        "depth": max((n.depth or 0 for n in nodes), default=0),
        "n_nodes": len(nodes),
        "tree": _tree(ctx, nodes, k) if nodes else None,
        "answer": _answer(ctx, answer, spans) if answer is not None else None,
        "verbatim": f"{sum(s.status == 'verbatim' for s in spans)}/{len(spans)}" if spans else "—",
        "scores": [(s.metric, s.value) for s in frames["scores"].get(qid, [])],
    }


def per_question_metrics(scores: pl.DataFrame) -> pl.DataFrame:
    """The scores table without its bookkeeping rows (n_gold, n_pairs, n_predicted: eval/summary.py
    NON_METRICS), which runs before the scores table dropped them still hold."""
    from clarify.eval.summary import NON_METRICS

    return scores.filter(~pl.col("metric").is_in(sorted(NON_METRICS)))


def _group(df: pl.DataFrame, record: type) -> dict[str, list]:
    """The table's rows as `record`s, by question."""
    out: dict = {}
    for row in rows(df, record):
        out.setdefault(row.qid, []).append(row)
    return out


# The record of each table a question's section reads (schemas.py)
_ROWS = {"nodes": NodeRow, "hits": RunHit, "answers": AnswerRow, "spans": SpanRow}


def _metric_note(name: str, value, notes: dict) -> str | None:
    """The note shown beside a headline metric: the run's own (summary.json `metric_notes`), else, for a
    metric not computed, why (eval/summary.py DEFAULT_NOTES; a derived one names what it needs)."""
    from clarify.eval.asqa import NO_READER
    from clarify.eval.summary import DEFAULT_NOTES, DERIVED

    note = notes.get(name)
    if note is None and value is None:
        needs = [m for m in DERIVED.get(name, ()) if m in DEFAULT_NOTES]
        note = DEFAULT_NOTES.get(name) or (f"needs {needs[0]}: {DEFAULT_NOTES[needs[0]]}" if needs else None)
    if note and NO_READER in note:
        return READER_NOTE
    return note


def headline(run: Run) -> list[dict]:
    """The run's metrics in words, each with its value and note (`_metric_note`), in METRIC_WORDS' order;
    the metrics not computed come last, one card per reason (four of ASQA's need a reader)."""
    metrics = run.summary.metrics if run.summary else {}
    notes = (run.summary.metric_notes if run.summary else None) or {}
    order = list(METRIC_WORDS)
    names = sorted(metrics, key=lambda m: (order.index(m) if m in order else len(order), m))
    cards = [{"ids": [m], "name": METRIC_WORDS.get(m, m), "value": metrics[m], "note": _metric_note(m, metrics[m], notes)}
             for m in names if metrics[m] is not None]
    missing: dict[str | None, list[str]] = {}
    for m in names:
        if metrics[m] is None:
            missing.setdefault(_metric_note(m, None, notes), []).append(m)
    cards += [{"ids": ms, "name": ", ".join(METRIC_WORDS.get(m, m) for m in ms), "value": None, "note": note}
              for note, ms in missing.items()]
    return cards


def run_facts(run: Run) -> list[tuple[str, str]]:
    """What the trees and answers amount to, beside the metrics: questions, valid nodes and LLM calls per
    question, quotes verbatim."""
    s = run.summary or RunSummary(n_questions=run.questions.height)  # unfinished: the questions so far
    facts = [("questions", fmt(s.n_questions))]
    if s.valid_nodes_per_question is not None:
        facts.append(("valid nodes per question", f"{s.valid_nodes_per_question:.1f}"))
    if s.llm_calls_per_question is not None:
        facts.append(("LLM calls per question", f"{s.llm_calls_per_question:.1f}"))
    fid = s.quote_fidelity
    if fid and fid.n_spans:
        facts.append(("quotes verbatim", f"{fid.n_verbatim or 0} of {fid.n_spans}"))
    return facts


def run_section(run: Run, ri: int, label: str, k: int, max_questions: int | None) -> dict:
    """One run's section: summary, config, plots, the question index and every question's tree. label: the
    run's name in the report (rundir.run_labels)."""
    questions = run.questions.unique("qid", keep="first", maintain_order=True)
    if max_questions is not None:
        questions = questions.head(max_questions)
    shown = pl.col("qid").is_in(questions["qid"].implode())  # --max-questions: group only those rows
    frames = {name: _group(run.table(name).filter(shown), record) for name, record in _ROWS.items()}
    per_q = per_question_metrics(run.scores)
    frames["scores"] = _group(per_q.filter(shown), ScoreRow)
    frames["passages"] = {p.passage_id: (p.title, p.text)
                          for p in rows(run.passages.unique("passage_id", keep="first"), Passage)}
    stored: dict[str, str] = {}  # filled by _passage: the run's text store
    trees = [
        _question(ri, qi, q, frames, k, open_=qi == 0, stored=stored)
        for qi, q in enumerate(
            tqdm(
                rows(questions, QuestionRow),
                total=questions.height,
                desc=f"report {label}",
                leave=False,  # gone once done; not drawn at all when stderr is not a terminal (a log)
                disable=None,
            )
        )
    ]
    qbody = environment().get_template("macros.html.j2").module.qbody
    for t in trees:  # a closed question's body is packed: inflated by report.js when it opens
        if not t["open"]:
            t["packed"] = pack(qbody(t))
    # Question index: one row per question, linking to its tree.
    calls = dict(run.llm_calls.group_by("qid").len().iter_rows())
    metric_names = sorted(per_q["metric"].unique().to_list())
    index = []
    for t in trees:
        scores = dict(t["scores"])
        index.append(
            {
                "id": t["id"],
                "qid": t["qid"],
                "question": t["question"],
                "valid_nodes": t["n_valid"],
                "max_depth": t["depth"],
                "calls": calls.get(t["qid"], 0),
                "spans": t["verbatim"],
                "scores": [scores.get(m) for m in metric_names],
            }
        )
    return {
        "id": f"run-{ri}",
        "name": label,
        "path": str(run.path),
        "n_shown": questions.height,
        "n_questions": run.questions.height,
        "missing": ", ".join(run.missing),
        "headline": headline(run),
        "facts": run_facts(run),
        "summary_groups": summary_groups(run.summary),
        "config_groups": config_groups(run.settings),
        "plots": [
            (data_uri(plots.llm_calls_png(run.llm_calls)), "LLM calls per question"),
            (data_uri(plots.tokens_png(run.llm_calls)), "tokens"),
            (data_uri(plots.tree_png(run.nodes)), "tree depth and valid nodes"),
            (data_uri(plots.scores_png(per_q)), "per-question metrics"),
        ],
        "metric_names": metric_names,
        "index": index,
        "questions": trees,
        "texts": text_store(stored),
    }
