"""`clarify report`: one self-contained HTML file for one or more run directories
(docs/architecture.md#reports-and-comparisons).

The file needs no network: CSS and JS are inline, plots are PNGs embedded as base64 `data:` URIs.
Per run it shows the frozen config, the summary metrics, plots (`batch/report/plots.py`), an index of the
questions, and a tree viewer per question: the ambiguous question, its tree of disambiguations
(root / valid / pruned / duplicate / pending, colour + text label, collapsible `<details>`), each
node's retrieved passages, and the final answer as the model wrote it with each quoted `[k span]`
linked to the span's offsets highlighted inside source passage k. Spans that are not verbatim are
marked. Several runs over the same questions get one section each plus a comparison table
(`batch/report/comparison.py`: paired-bootstrap intervals, cost per run, and a metric-vs-size plot when
parameter counts are known); runs over different questions are refused.

The HTML comes from Jinja2 templates in `batch/report/templates/` (`report.html.j2`, its macros in
`macros.html.j2`; `report.css` and `report.js` are inlined). The environment autoescapes: every value
from a run file is HTML-escaped, since model output is untrusted; the only markup built here is the
passage highlighting (`_highlight`, which escapes every text segment).

Runs are read by the one run reader (`batch/run/rundir.py` Run.open: config.json, summary.json and every
table, checked against its schema in `schemas.py`; a table not written yet is shown empty and named).
Every marker of answer_raw (the model's text) is shown with its check, placed by its span's
marker_start/marker_end (`quotes.check_answers`); spans' `field` ("text" | "title") says which
passage field start/end index; start/end of -1 or null = not anchored.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import json
import os
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2
import polars as pl
from markupsafe import Markup, escape
from tqdm import tqdm

from clarify.batch.report import plots
from clarify.batch.report.comparison import (
    compare_stats,
    comparison_table,
    flatten,
    fmt,
    plotted_metrics,
    split_summary,
)
from clarify.batch.run.records import RunSummary
from clarify.batch.run.rundir import Run, RunDir, check_distinct, enclosing_run, run_labels
from clarify.batch.toc import quotes
from clarify.batch.toc.tree import Status
from clarify.errors import InputError
from clarify.files import write_text

# ---------------------------------------------------------------- rendering

# Hit lists shown per node: the last stage of the retrieval pipeline that is present.
RETRIEVER_PREFERENCE = ("rerank", "fused", "dense", "bm25")
STATUS_LABELS = {s: s.value.upper() for s in Status}  # the nodes table's statuses (batch/toc/tree.py)
SPAN_LABELS = {
    "verbatim": "verbatim",
    "repaired": "not verbatim: repaired",
    "unmarked": "not verbatim: unmarked",
    "bad_source": "not verbatim: no such source",
    "empty": "empty marker, no quote",
    "unverified": "not verbatim",
}
# The headline metrics in words (eval/asqa.py, eval/quotesum.py, eval/reader.py name them); others keep their key.
METRIC_WORDS = {  # in the order the headline shows them
    "rouge_l": "ROUGE-L", "str_em": "STR-EM", "answer_f1": "Answer-F1", "d_f1": "Disambig-F1",
    "dr": "DR (sqrt Disambig-F1 x ROUGE-L)", "sem_f1": "Sem-F1", "sem_rec": "Sem-Rec",
    "semqa": "SEMQA (sqrt Sem-F1 x ROUGE-L)", "rouge1": "ROUGE-1", "rouge2": "ROUGE-2", "qa_em": "QA exact match",
    "qa_hit": "QA hit", "length": "answer length (words)", "missing_predictions": "questions without an answer",
}
READER_NOTE = ("needs a reader: a SQuAD 2.0 extractive QA model, given to `clarify eval --reader DIR` "
               "(eval/reader.py)")
# summary.json grouped for the folded run summary: (group title, its keys' prefixes); the rest go last.
SUMMARY_GROUPS = (
    ("Run", ("name", "dataset", "model", "engine_model_id", "params", "answer_style", "n_questions", "constraints",
             "scheduler", "parts")),
    ("Work per question", ("llm_calls", "cached_calls", "tokens", "parse_errors", "prompts_too_long",
                           "valid_nodes_per_question", "max_depth", "node_status")),
    ("Quotes", ("quote_fidelity",)),
    ("Time", ("wall_s_last_session", "wall_s_total", "toc_s_last_session", "seconds_last_session",
              "engine_tokens_per_s")),
    ("Engine", ("engine", "engine_usage_last_session", "cache_recomputed", "cluster")),
)
SUMMARY_WORDS = {
    "n_questions": "questions", "engine_model_id": "engine model id", "params": "model parameters",
    "llm_calls": "LLM calls", "llm_calls_per_question": "LLM calls per question",
    "llm_calls_per_question_max": "LLM calls, most for one question", "cached_calls": "calls from the cache",
    "tokens.prompt": "prompt tokens", "tokens.output": "output tokens", "parse_errors": "completions not parsed",
    "prompts_too_long": "prompts over the context", "valid_nodes_per_question": "valid nodes per question",
    "max_depth": "deepest node", "wall_s_last_session": "wall seconds, last session",
    "wall_s_total": "wall seconds, all sessions", "toc_s_last_session": "ToC seconds, last session",
    "engine_tokens_per_s": "engine tokens/s (prompt + output)", "parts": "checkpoint parts",
}
# config.json's sections in words (batch/config/schema.py); top-level settings are the run's own.
CONFIG_SECTIONS = {"": "Run", "model": "Model and engine", "retrieval": "Retrieval", "toc": "Tree of clarifications",
                   "answer": "Answer", "cluster": "Cluster"}
TEMPLATES = Path(__file__).parent / "templates"  # package data (pyproject `[tool.setuptools.package-data]`)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The report's Jinja2 environment: templates from TEMPLATES, autoescape on (model output is untrusted),
    None rendered as nothing, `fmt` (comparison.fmt) as a filter and `inline(name)` for a template folder
    file's text as it is (report.css, report.js: ours, not from a run)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=lambda value: "" if value is None else value,
    )
    env.filters["fmt"] = fmt
    env.globals["inline"] = lambda name: Markup(env.loader.get_source(env, name)[0])
    return env


def _data_uri(png: bytes | None) -> str | None:
    return None if png is None else "data:image/png;base64," + base64.b64encode(png).decode("ascii")


@dataclass
class _Ctx:
    """Per-question lookups used while rendering (all frames already filtered to the question)."""

    prefix: str  # html id prefix, e.g. "r0-q3"
    passages: dict[str, tuple[str, str]]  # passage_id -> (title, text)
    hits_by_node: dict[str | None, list[dict]]
    stored: dict[str, str]  # the run's passage texts shown folded under a node, once each (`text_store`)


def _passage(ctx: _Ctx, pid: str, elem_id: str, hit: dict | None = None, evidence: bool = False) -> dict:
    """A passage as the template's `passage` macro shows it; hit: the retrieval row (rank, score), None
    for the evidence passage. Its text goes into the run's store once (`text_store`): the same passages
    are shown under many nodes (1,722 passage elements, ~300 distinct texts, for 50 questions), and inline
    they made a 500-question report ~14 MB (bench/bench_report.py: 504 questions of a real run, 16.7 MB
    with the texts stored once and every question inline, 2.8 MB packed)."""
    title, text = ctx.passages.get(pid, (None, None))
    if text is not None:
        ctx.stored[pid] = text
    return {"id": elem_id, "pid": pid, "title": title or pid, "text": text, "hit": hit, "evidence": evidence}


def pack(text: str) -> Markup:
    """`text` deflated (raw DEFLATE, RFC 1951) and base64-encoded, for a `<script type="application/
    octet-stream">` that report.js inflates with the browser's DecompressionStream("deflate-raw"). Base64
    has no `<` or `&`, so nothing packed can close the script element; what is packed was escaped when it
    was rendered (autoescape) or is put in as text (the passage store)."""
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)  # wbits -15: no zlib header, as "deflate-raw" wants
    return Markup(base64.b64encode(deflate.compress(text.encode("utf-8")) + deflate.flush()).decode("ascii"))


def text_store(texts: dict[str, str]) -> Markup:
    """The run's folded passage texts, a JSON object packed (`pack`): report.js fills a passage's text from
    it when its <details> opens, as textContent, never markup."""
    return pack(json.dumps(texts, ensure_ascii=False, sort_keys=True))


def _node_hits(ctx: _Ctx, node_id: str, k: int) -> list[list[dict]]:
    """The node's retrieval lists, one per retrieval (a root retrieved again after a restart has one
    per wave): the top k of the last pipeline stage present, best rank first, passages not repeated."""
    hits = ctx.hits_by_node.get(node_id, [])
    if not hits:
        return []
    present = {h["retriever"] for h in hits}
    chosen = next((r for r in RETRIEVER_PREFERENCE if r in present), None)
    if chosen is not None:
        hits = [h for h in hits if h["retriever"] == chosen]
    by_wave: dict = {}
    for h in hits:
        by_wave.setdefault(h.get("wave"), []).append(h)
    lists = []
    for wave in sorted(by_wave, key=lambda w: (w is None, w or 0)):
        seen, top = set(), []
        for h in sorted(by_wave[wave], key=lambda h: h["rank"] if h["rank"] is not None else 1 << 30):
            if h["passage_id"] not in seen and len(top) < k:
                seen.add(h["passage_id"])
                top.append(h)
        lists.append(top)
    return lists


def _node(ctx: _Ctx, node: dict, children: dict, idx: dict, k: int, seen: set) -> dict:
    """One tree node for the template's recursive `node` macro, its children nested."""
    nid = node["node_id"]
    seen.add(nid)
    status = node["status"] or "unknown"
    is_root = status == Status.ROOT or node["parent_id"] is None
    elem = f"{ctx.prefix}-n{idx[nid]}"
    ev = node.get("evidence_passage_id")
    lists = _node_hits(ctx, nid, k)
    retrievals = [
        {
            "query": hits[0].get("query"),
            "retriever": hits[0]["retriever"],
            "wave": hits[0].get("wave") if len(lists) > 1 else None,
            "passages": [
                _passage(ctx, h["passage_id"], f"{elem}-l{li}p{j}", h, h["passage_id"] == ev)
                for j, h in enumerate(hits)
            ],
        }
        for li, hits in enumerate(lists)
    ]
    kids = [c for c in children.get(nid, []) if c["node_id"] not in seen]
    return {
        "id": elem,
        "node_id": nid,
        "status": status,
        "label": STATUS_LABELS.get(status, status.upper()),
        "open": is_root,
        "question": node["question"],
        "answers": "; ".join(node["answers"] or []),
        "depth": node["depth"],
        "wave": node.get("wave"),
        "verdict": node.get("verdict_text"),
        "evidence": _passage(ctx, ev, f"{elem}-ev", evidence=True) if ev is not None else None,
        "retrievals": retrievals,
        "children": [_node(ctx, c, children, idx, k, seen) for c in kids],
    }


def _tree(ctx: _Ctx, nodes: list[dict], k: int) -> list[dict]:
    """The question's top nodes (the root, orphans), each with its subtree."""
    ids = {n["node_id"] for n in nodes}
    idx = {n["node_id"]: i for i, n in enumerate(nodes)}
    children: dict[str, list[dict]] = {}
    tops = []
    for n in sorted(nodes, key=lambda n: (n["depth"] or 0, n.get("wave") or 0, idx[n["node_id"]])):
        if n["parent_id"] is None or n["parent_id"] not in ids:
            tops.append(n)  # the root, or an orphan whose parent row is missing
        else:
            children.setdefault(n["parent_id"], []).append(n)
    seen: set[str] = set()
    items = [_node(ctx, n, children, idx, k, seen) for n in tops]
    # Nodes on a parent cycle are never reached from a top node: still show them.
    items += [_node(ctx, n, {}, idx, k, seen) for n in nodes if n["node_id"] not in seen]
    return items


def _span_status(span: dict) -> str:
    status = span.get("status")
    if status:
        return status
    return "verbatim" if span.get("verbatim") else "unverified"


def _labelled(span: dict) -> dict:
    """The span row with its status filled in (`_span_status`) and that status's label (SPAN_LABELS)."""
    status = _span_status(span)
    return {**span, "status": status, "label": SPAN_LABELS.get(status, status)}


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


def _answer(ctx: _Ctx, answer: dict, spans: list[dict]) -> dict:
    """The answer as the model wrote it (answer_raw), cut at each span's marker_start/marker_end into
    text and markers, with the span table and the numbered sources (spans highlighted). spans: the
    question's, in span_no order, each `_labelled`."""
    pids = list(answer.get("passage_ids") or [])
    # Which spans can be linked: a source that exists and offsets inside the passage field they index.
    linkable: set[int] = set()
    per_field: dict[tuple[int, str], list[tuple[int, int, int, str]]] = {}
    for sp in spans:
        k, s, e = sp["source_k"], sp["start"], sp["end"]
        if k is None or not 1 <= k <= len(pids) or s is None or e is None:
            continue
        fld = sp.get("field") or "text"
        title, text = ctx.passages.get(pids[k - 1], (None, None))
        target = title if fld == "title" else text
        if target is None or not 0 <= s < e <= len(target):
            continue
        linkable.add(sp["span_no"])
        per_field.setdefault((k, fld), []).append((sp["span_no"], s, e, sp["status"]))
    raw = answer.get("answer_raw") or ""
    segments: list = []  # str (text) | dict (a marker)
    pos = 0
    for sp in spans:  # in span_no order = marker order in answer_raw
        s, e = sp.get("marker_start"), sp.get("marker_end")
        if s is None or e is None or not pos <= s < e <= len(raw):
            continue  # no place in the text: the span table still lists it
        segments.append(raw[pos:s])
        pos = e
        written = quotes.parse_quoted(raw[s:e])[0]  # the one marker there: its text as the model wrote it
        title = f"source {sp['source_k']} · {sp['label']}"
        if sp["status"] == "repaired":
            title += f" · passage says: {sp['text']}"
        segments.append(
            {
                "k": sp["source_k"],
                "text": written[0].text if written else sp["text"],
                "status": sp["status"],
                "label": sp["label"],
                "title": title,
                "n": sp["span_no"] if sp["span_no"] in linkable else None,
            }
        )
    segments.append(raw[pos:])
    rows = [
        {
            "n": sp["span_no"],
            "linked": sp["span_no"] in linkable,
            "k": sp["source_k"],
            "status": sp["status"],
            "label": sp["label"],
            "field": sp.get("field") or "text",
            "start": sp["start"],
            "end": sp["end"],
            "text": sp["text"],
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
        "style": answer.get("style") or "",
        "segments": segments,
        "scored": answer.get("answer") if answer.get("answer") != answer.get("answer_raw") else None,
        "spans": rows,
        "n_verbatim": sum(r["status"] == "verbatim" for r in rows),
        "sources": sources,
    }


def _question(ri: int, qi: int, q: dict, frames: dict, k: int, open_: bool, stored: dict[str, str]) -> dict:
    """One question's section for the template's `question` macro; `verbatim` ("n/m" spans, — for none)
    and `scores` also fill its row of the question index (`_run`)."""
    prefix = f"r{ri}-q{qi}"
    qid = q["qid"]
    nodes = frames["nodes"].get(qid, [])
    hits_by_node: dict[str | None, list[dict]] = {}
    for h in frames["hits"].get(qid, []):
        hits_by_node.setdefault(h["node_id"], []).append(h)
    ctx = _Ctx(prefix, frames["passages"], hits_by_node, stored)
    answer = frames["answers"].get(qid, [None])[0]
    spans = [_labelled(s) for s in sorted(frames["spans"].get(qid, []), key=lambda s: s["span_no"])]
    return {
        "id": prefix,
        "qid": qid,
        "question": q["question"],
        "open": open_,
        "packed": None,  # `_run` packs the body of a question shown closed
        "n_valid": sum(n["status"] in plots.VALID_STATUSES for n in nodes),
        "depth": max((n["depth"] or 0 for n in nodes), default=0),
        "n_nodes": len(nodes),
        "tree": _tree(ctx, nodes, k) if nodes else None,
        "answer": _answer(ctx, answer, spans) if answer is not None else None,
        "verbatim": f"{sum(s['status'] == 'verbatim' for s in spans)}/{len(spans)}" if spans else "—",
        "scores": [(s["metric"], s["value"]) for s in frames["scores"].get(qid, [])],
    }


def per_question_metrics(scores: pl.DataFrame) -> pl.DataFrame:
    """The scores table without its bookkeeping rows (n_gold, n_pairs, n_predicted: eval/summary.py
    NON_METRICS), which runs before the scores table dropped them still hold."""
    from clarify.eval.summary import NON_METRICS

    return scores.filter(~pl.col("metric").is_in(sorted(NON_METRICS)))


def _group(df: pl.DataFrame, key: str = "qid") -> dict:
    out: dict = {}
    for row in df.iter_rows(named=True):
        out.setdefault(row[key], []).append(row)
    return out


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


def _words(key: str) -> str:
    """A flattened summary key in words: SUMMARY_WORDS, else its parts with spaces (`quote_fidelity.n_spans`
    -> `quote fidelity: n spans`)."""
    return SUMMARY_WORDS.get(key) or ": ".join(part.replace("_", " ") for part in key.split("."))


def summary_groups(summary: RunSummary | None) -> list[tuple[str, list[tuple[str, object]]]]:
    """summary.json but its metrics (shown first), flattened, in SUMMARY_GROUPS, keys in words."""
    _, rest = split_summary(summary)
    groups, taken = [], set()
    for title, prefixes in SUMMARY_GROUPS:
        keys = [k for k in rest if k not in taken and any(k == p or k.startswith(p + ".") or k.startswith(p + "_")
                                                          for p in prefixes)]
        taken.update(keys)
        if keys:
            groups.append((title, [(_words(k), rest[k]) for k in keys]))
    other = [k for k in rest if k not in taken]
    if other:
        groups.append(("Other", [(_words(k), rest[k]) for k in other]))
    return groups


def config_groups(settings: dict) -> list[tuple[str, list[tuple[str, object]]]]:
    """config.json by section (CONFIG_SECTIONS), each setting by its name in the section."""
    top = [(k, v) for k, v in settings.items() if not isinstance(v, dict)]
    groups = [(CONFIG_SECTIONS[""], top)] if top else []
    for section, values in settings.items():
        if isinstance(values, dict):
            groups.append((CONFIG_SECTIONS.get(section, section), list(flatten(values).items())))
    return groups


def _run(run: Run, ri: int, label: str, k: int, max_questions: int | None) -> dict:
    """One run's section: summary, config, plots, the question index and every question's tree. label: the
    run's name in the report (rundir.run_labels)."""
    questions = run.questions.unique("qid", keep="first", maintain_order=True)
    if max_questions is not None:
        questions = questions.head(max_questions)
    shown = pl.col("qid").is_in(questions["qid"].implode())  # --max-questions: group only those rows
    frames = {name: _group(run.table(name).filter(shown)) for name in ("nodes", "hits", "answers", "spans")}
    per_q = per_question_metrics(run.scores)
    frames["scores"] = _group(per_q.filter(shown))
    frames["passages"] = {
        r["passage_id"]: (r["title"], r["text"])
        for r in run.passages.unique("passage_id", keep="first").iter_rows(named=True)
    }
    stored: dict[str, str] = {}  # filled by _passage: the run's text store
    trees = [
        _question(ri, qi, q, frames, k, open_=qi == 0, stored=stored)
        for qi, q in enumerate(
            tqdm(
                questions.iter_rows(named=True),
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
            (_data_uri(plots.llm_calls_png(run.llm_calls)), "LLM calls per question"),
            (_data_uri(plots.tokens_png(run.llm_calls)), "tokens"),
            (_data_uri(plots.tree_png(run.nodes)), "tree depth and valid nodes"),
            (_data_uri(plots.scores_png(per_q)), "per-question metrics"),
        ],
        "metric_names": metric_names,
        "index": index,
        "questions": trees,
        "texts": text_store(stored),
    }


def render_report(runs: list[Run], *, passages_per_node: int = 5, max_questions: int | None = None) -> str:
    """The whole HTML document for loaded runs (see the module docstring)."""
    comparison = None
    if len(runs) > 1:
        table = comparison_table(runs)
        metric_cols = plotted_metrics(runs, table)
        plot = None
        if table["params"].drop_nulls().len() >= 2 and metric_cols:
            plot = _data_uri(plots.compare_png(table, metric_cols))
        stats = compare_stats(runs, table, metric_cols)
        stats.update(forest=_data_uri(stats["forest"]), quality_cost=_data_uri(stats["quality_cost"]))
        comparison = {"columns": table.columns, "rows": list(table.iter_rows()), "plot": plot, **stats}
    return environment().get_template("report.html.j2").render(
        written=_dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        runs=[_run(run, ri, label, passages_per_node, max_questions)
              for ri, (run, label) in enumerate(zip(runs, run_labels([r.path for r in runs])))],
        comparison=comparison,
    )


def write_report(
    run_dirs: list[Path], out: Path, *, passages_per_node: int = 5, max_questions: int | None = None
) -> Path:
    """Write one self-contained HTML report for `run_dirs` to `out` (atomically) and return `out`. The same
    folder named twice, and an `out` that is a folder or a run's own file (`check_out`), are refused first."""
    if not run_dirs:
        raise InputError("no run directory given", field="run_dirs")
    check_distinct(run_dirs)  # one run twice would be compared with itself
    check_out(out)
    runs = [Run.open(d) for d in run_dirs]
    doc = render_report(runs, passages_per_node=passages_per_node, max_questions=max_questions)
    return write_text(doc, out)


def check_out(out: Path) -> None:
    """InputError, in one line naming --out, when `out` is a folder, or a file inside a run directory
    (rundir.enclosing_run: config.json, summary.json, a table, a part, a log, ...) other than its report.html
    (`RunDir.report_file`, where `clarify report RUN` writes by default): the report is written by renaming
    onto that path (files.write_text), so it would replace the run's file and Run.open would then refuse the
    run as damaged (docs/running-toc.md#reading-the-report)."""
    if Path(out).is_dir():
        raise InputError("is a folder; give the HTML file to write (e.g. report.html in it)", path=str(out),
                         field="--out")
    run = enclosing_run(out)
    if run is not None and Path(os.path.realpath(out)) != RunDir(run).report_file:
        raise InputError(f"is inside the run directory {run}, and would replace one of its files; write the report "
                         f"to {RunDir(run).report_file} or outside the run", path=str(out), field="--out")


def default_out(run_dirs: list[Path]) -> Path:
    """RUN_DIR/report.html for one run; for several, report.html in the first run's parent directory."""
    if len(run_dirs) == 1:
        return RunDir(run_dirs[0]).report_file
    return Path(run_dirs[0]).parent / RunDir(run_dirs[0]).report_file.name


def _cmd_report(args: argparse.Namespace) -> int:
    run_dirs = [Path(d) for d in args.run_dirs]
    out = Path(args.out) if args.out else default_out(run_dirs)
    path = write_report(run_dirs, out, passages_per_node=args.passages, max_questions=args.max_questions)
    print(path)
    return 0


def register(sub) -> None:
    """Add `clarify report RUN_DIR [RUN_DIR...] [--out FILE]` to the CLI subparsers."""
    p = sub.add_parser("report", help="write one self-contained HTML report for run directories",
                       epilog="examples:\n"
                              "  clarify report runs/demo                      writes runs/demo/report.html\n"
                              "  clarify report runs/a runs/b --out ab.html    one section per run + a comparison\n\n"
                              "The file is self-contained (config, metrics, plots, a tree viewer per question):\n"
                              "open it in any browser, offline.")
    p.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories (several, over the same questions: one section each, a comparison with paired 95%% intervals and cost per run)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="HTML file to write (default: RUN_DIR/report.html, or report.html beside the runs); never a folder, "
             "nor a file inside a run directory other than its report.html",
    )
    p.add_argument(
        "--passages", type=int, default=5, help="retrieved passages shown per tree node (default 5)"
    )
    p.add_argument("--max-questions", type=int, default=None, help="show only the first N questions' trees")
    p.set_defaults(func=_cmd_report)
