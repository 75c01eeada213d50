"""`clarify report`: one self-contained HTML file for one or more run directories (DESIGN §8).

The file needs no network: CSS and JS are inline, plots are PNGs embedded as base64 `data:` URIs.
Per run it shows the frozen config, the summary metrics, plots (`batch/plots.py`), an index of the
questions, and a tree viewer per question: the ambiguous question, its tree of disambiguations
(root / valid / expanded / pruned / duplicate, colour + text label, collapsible `<details>`), each
node's retrieved passages, and the final answer with each quoted `[k span]` linked to the span's
offsets highlighted inside source passage k. Spans that are not verbatim are marked. Several runs
get one section each plus a comparison table (and a metric-vs-size plot when parameter counts are
known). All text from run files is HTML-escaped: model output is untrusted.

Run directory files read (missing tables are tolerated and reported, except config.json):
  config.json, summary.json, questions.parquet[qid, question, dataset],
  nodes.parquet[qid, node_id, parent_id, depth, question, answers, status, wave, evidence_passage_id,
  verdict_text], hits.parquet[qid, passage_id, score, rank, retriever, (node_id, query)],
  passages.parquet[passage_id, title, text], llm_calls.parquet[qid, step, prompt_tokens,
  output_tokens, cached], answers.parquet[qid, answer, passage_ids, style, (answer_raw)],
  spans.parquet[qid, span_no, source_k, passage_id, text, start, end, verbatim, status, (field)],
  scores.parquet[qid, metric, value]. Optional columns in parentheses: hits without node_id belong
  to the root; with answer_raw (the model's text) every marker is shown with its check, span_no
  being the marker's order there (`quotes.check_answers`); spans' `field` ("text" | "title") says
  which passage field start/end index (default text); start/end of -1 or null = not anchored.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import html
import json
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from tqdm import tqdm

from clarify import schemas
from clarify.batch import plots, quotes
from clarify.batch.comparison import comparison_table, flatten, fmt, plotted_metrics
from clarify.errors import InputError

# Columns the report reads from each table (a subset of the schemas in clarify.schemas).
READ_COLUMNS: dict[str, list[str]] = {
    "questions": ["qid", "question"],
    "nodes": ["qid", "node_id", "parent_id", "depth", "question", "answers", "status"],
    "hits": ["qid", "passage_id", "score", "rank"],
    "passages": ["passage_id", "title", "text"],
    "llm_calls": ["qid", "step", "prompt_tokens", "output_tokens", "cached"],
    "answers": ["qid", "answer", "passage_ids"],
    "spans": ["qid", "span_no", "source_k", "passage_id", "text", "start", "end"],
    "scores": ["qid", "metric", "value"],
}
# Hit lists shown per node: the last stage of the retrieval pipeline that is present.
RETRIEVER_PREFERENCE = ("rerank", "fused", "dense", "bm25")
STATUS_LABELS = {
    "root": "ROOT",
    "valid": "VALID",
    "expanded": "VALID · EXPANDED",
    "pruned": "PRUNED",
    "duplicate": "DUPLICATE",
    "pending": "PENDING",
}
SPAN_LABELS = {
    "verbatim": "verbatim",
    "repaired": "not verbatim: repaired",
    "unmarked": "not verbatim: unmarked",
    "bad_source": "not verbatim: no such source",
    "empty": "empty marker, no quote",
    "unverified": "not verbatim",
    "unchecked": "not checked",
}


def esc(value: object) -> str:
    """HTML-escape any value (quotes too, so the result is safe inside attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


@dataclass
class Run:
    """One run directory, loaded. Tables missing on disk are empty frames listed in `missing`."""

    path: Path
    name: str
    config: dict
    summary: dict
    tables: dict[str, pl.DataFrame]
    missing: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> pl.DataFrame:
        tables = self.__dict__.get("tables", {})
        if name in tables:
            return tables[name]
        raise AttributeError(name)


def _read_json(path: Path, required: bool) -> dict:
    if not path.is_file():
        if required:
            raise InputError("not a run directory: config.json is missing", path=str(path.parent))
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", path=str(path), line=exc.lineno) from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8: {exc}", path=str(path)) from exc
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, got {type(data).__name__}", path=str(path), line=1)
    return data


def _read_table(run_dir: Path, name: str) -> pl.DataFrame | None:
    path = run_dir / f"{name}.parquet"
    if not path.is_file():
        return None
    try:
        df = pl.read_parquet(path)
    except Exception as exc:  # polars raises several error types for broken files
        raise InputError(f"cannot read Parquet file: {exc}", path=str(path)) from exc
    if df.height == 0 and df.width == 0:  # an empty table written without columns (older runs)
        return schemas.empty(name)
    try:
        schemas.check(df, name, columns=READ_COLUMNS[name])
    except schemas.SchemaError as exc:
        missing = [c for c in READ_COLUMNS[name] if c not in df.columns]
        raise InputError(str(exc), path=str(path), field=missing[0] if missing else None) from exc
    return df


def load_run(run_dir: Path | str) -> Run:
    """Load a run directory; raise InputError naming the file for anything unreadable."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError("run directory does not exist", path=str(run_dir))
    config = _read_json(run_dir / "config.json", required=True)
    summary = _read_json(run_dir / "summary.json", required=False)
    tables: dict[str, pl.DataFrame] = {}
    missing = []
    for name in READ_COLUMNS:
        df = _read_table(run_dir, name)
        if df is None:
            missing.append(f"{name}.parquet")
            df = schemas.empty(name)
        tables[name] = df
    if tables["questions"].height == 0 and tables["nodes"].height:
        # No questions table yet: the roots carry the ambiguous questions.
        roots = tables["nodes"].filter(pl.col("parent_id").is_null())
        tables["questions"] = roots.select("qid", "question").unique("qid", keep="first", maintain_order=True)
    if "node_id" not in tables["hits"].columns:
        tables["hits"] = tables["hits"].with_columns(pl.lit(None, pl.String).alias("node_id"))
    return Run(run_dir, str(config.get("name") or run_dir.name), config, summary, tables, missing)


# ---------------------------------------------------------------- tables


def _kv_table(d: dict, cls: str) -> str:
    if not d:
        return '<p class="muted">(empty)</p>'
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(fmt(v))}</td></tr>" for k, v in d.items())
    return f'<table class="kv {cls}">{rows}</table>'


def _df_table(df: pl.DataFrame, cls: str) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(fmt(v))}</td>" for v in row) + "</tr>" for row in df.iter_rows()
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _img(png: bytes | None, alt: str) -> str:
    if png is None:
        return f'<p class="muted">{esc(alt)}: no data</p>'
    data = base64.b64encode(png).decode("ascii")
    return f'<figure><img alt="{esc(alt)}" src="data:image/png;base64,{data}"><figcaption>{esc(alt)}</figcaption></figure>'


# ---------------------------------------------------------------- per-question tree viewer


@dataclass
class _Ctx:
    """Per-question lookups used while rendering (all frames already filtered to the question)."""

    prefix: str  # html id prefix, e.g. "r0-q3"
    passages: dict[str, tuple[str, str]]  # passage_id -> (title, text)
    hits_by_node: dict[str | None, list[dict]]


def _passage_block(ctx: _Ctx, pid: str, elem_id: str, caption: str, open_: bool = False) -> str:
    title, text = ctx.passages.get(pid, (None, None))
    body = (
        esc(text) if text is not None else '<span class="muted">(passage text not in passages.parquet)</span>'
    )
    return (
        f'<li class="passage" id="{elem_id}" data-passage-id="{esc(pid)}"><details{" open" if open_ else ""}>'
        f'<summary><span class="ptitle">{esc(title or pid)}</span> <span class="meta">{caption}</span></summary>'
        f'<p class="ptext">{body}</p></details></li>'
    )


def _node_hits(ctx: _Ctx, node_id: str, is_root: bool, k: int) -> list[list[dict]]:
    """The node's retrieval lists, one per retrieval (a root retrieved again after a restart has one
    per wave): the top k of the last pipeline stage present, best rank first, passages not repeated."""
    hits = ctx.hits_by_node.get(node_id, [])
    if not hits and is_root:
        hits = ctx.hits_by_node.get(None, [])  # hits without node_id belong to the root query
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


def _node_html(ctx: _Ctx, node: dict, children: dict, idx: dict, k: int, seen: set) -> str:
    nid = node["node_id"]
    seen.add(nid)
    status = node["status"] or "unknown"
    is_root = status == "root" or node["parent_id"] is None
    label = STATUS_LABELS.get(status, status.upper())
    elem = f"{ctx.prefix}-n{idx[nid]}"
    answers = node["answers"] or []
    da = f' <span class="arrow">→</span> <span class="da">{esc("; ".join(answers))}</span>' if answers else ""
    meta = f"depth {esc(node['depth'])}" + (
        f" · wave {esc(node['wave'])}" if node.get("wave") is not None else ""
    )
    parts = [f'<div class="nbody"><p class="meta">node <code>{esc(nid)}</code> · {meta}</p>']
    if node.get("verdict_text") is not None:
        parts.append(f'<p>verifier said: <code class="verdict">{esc(node["verdict_text"])}</code></p>')
    lists = _node_hits(ctx, nid, is_root, k)
    ev = node.get("evidence_passage_id")
    if ev is not None:
        parts.append('<p class="sub">evidence passage (shown to the verifier):</p><ol class="passages">')
        parts.append(_passage_block(ctx, ev, f"{elem}-ev", '<span class="evtag">evidence</span>'))
        parts.append("</ol>")
    for li, hits in enumerate(lists):
        query = hits[0].get("query")
        q = f" for <q>{esc(query)}</q>" if query else ""
        wave = f", wave {esc(hits[0]['wave'])}" if len(lists) > 1 and hits[0].get("wave") is not None else ""
        parts.append(
            f'<p class="sub">retrieved passages{q} ({esc(hits[0]["retriever"])}, top {len(hits)}{wave}):</p>'
        )
        parts.append('<ol class="passages">')
        for j, h in enumerate(hits):
            cap = f"rank {esc(h['rank'])} · score {esc(fmt(h['score']))}"
            if h["passage_id"] == ev:
                cap += ' · <span class="evtag">evidence</span>'
            parts.append(_passage_block(ctx, h["passage_id"], f"{elem}-l{li}p{j}", cap))
        parts.append("</ol>")
    if not lists:
        parts.append('<p class="muted">no retrieved passages for this node</p>')
    parts.append("</div>")
    kids = [c for c in children.get(nid, []) if c["node_id"] not in seen]
    if kids:
        parts.append('<ul class="tree">')
        parts += [f"<li>{_node_html(ctx, c, children, idx, k, seen)}</li>" for c in kids]
        parts.append("</ul>")
    return (
        f'<details class="node status-{esc(status)}" id="{elem}" data-node-id="{esc(nid)}" '
        f'data-status="{esc(status)}"{" open" if is_root else ""}><summary>'
        f'<span class="badge b-{esc(status)}">{esc(label)}</span> <span class="dq">{esc(node["question"])}</span>'
        f"{da}</summary>{''.join(parts)}</details>"
    )


def _tree_html(ctx: _Ctx, nodes: list[dict], k: int) -> str:
    if not nodes:
        return '<p class="muted">no tree nodes for this question</p>'
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
    items = [f"<li>{_node_html(ctx, n, children, idx, k, seen)}</li>" for n in tops]
    # Nodes on a parent cycle are never reached from a top node: still show them.
    items += [f"<li>{_node_html(ctx, n, {}, idx, k, seen)}</li>" for n in nodes if n["node_id"] not in seen]
    return f'<ul class="tree root-level">{"".join(items)}</ul>'


def _span_status(span: dict) -> str:
    status = span.get("status")
    if status:
        return status
    return "verbatim" if span.get("verbatim") else "unverified"


def _highlight(text: str, spans: list[tuple[int, int, int, str]], prefix: str) -> str:
    """Passage text with each span's [start, end) wrapped in <mark data-spans="n ...">, and an empty
    anchor element `{prefix}-s{n}` at each span's start. spans: (span_no, start, end, status)."""
    bounds = sorted({0, len(text)} | {s for _, s, _, _ in spans} | {e for _, _, e, _ in spans})
    starts: dict[int, list[int]] = {}
    for n, s, _, _ in spans:
        starts.setdefault(s, []).append(n)
    out = []
    for a, b in zip(bounds, bounds[1:]):
        for n in starts.get(a, []):
            out.append(f'<span class="anchor" id="{prefix}-s{n}" data-span="{n}"></span>')
        cover = [(n, st) for n, s, e, st in spans if s <= a and b <= e]
        seg = esc(text[a:b])
        if cover:
            nums = " ".join(str(n) for n, _ in cover)
            cls = "quote" + ("" if all(st == "verbatim" for _, st in cover) else " nonverbatim")
            out.append(f'<mark class="{cls}" data-spans="{nums}">{seg}</mark>')
        else:
            out.append(seg)
    for n in starts.get(len(text), []):  # an empty span at the very end
        out.append(f'<span class="anchor" id="{prefix}-s{n}" data-span="{n}"></span>')
    return "".join(out)


def _pair_markers(answer: dict, rows: list[dict]) -> tuple[str, list[tuple]]:
    """The answer text to show and its markers paired with their span rows: [(QuotedSpan, row | None)].

    With `answer_raw` (the model's text, kept by the pipeline) every marker is shown, and span_no is
    the marker's 1-based order there (`quotes.check_answers`), so pairing is exact. Without it, the
    answer holds only the kept (verbatim/repaired) markers: pair them in order when sources agree,
    else by source and text.
    """
    raw = answer.get("answer_raw")
    text = raw if raw is not None else (answer.get("answer") or "")
    markers, _ = quotes.parse_quoted(text)
    if raw is not None:
        by_no = {r["span_no"]: r for r in rows}
        return text, [(m, by_no.get(m.span_no)) for m in markers]
    kept = [r for r in rows if _span_status(r) in quotes.KEPT]
    if len(kept) == len(markers) and all(r["source_k"] == m.source_k for r, m in zip(kept, markers)):
        return text, list(zip(markers, kept))
    unused, pairs = list(rows), []
    for m in markers:
        norm = " ".join(m.text.split())
        row = next(
            (
                r
                for r in unused
                if r["source_k"] == m.source_k and " ".join((r["text"] or "").split()) == norm
            ),
            None,
        )
        row = row or next((r for r in unused if r["source_k"] == m.source_k), None)
        if row is not None:
            unused.remove(row)
        pairs.append((m, row))
    return text, pairs


def _answer_html(ctx: _Ctx, answer: dict | None, spans: list[dict]) -> str:
    if answer is None:
        return '<p class="muted">no answer for this question (answers.parquet has no row)</p>'
    pids = list(answer.get("passage_ids") or [])
    style = answer.get("style") or ""
    # Which spans can be linked: a source that exists and offsets inside the passage field they index.
    linkable: dict[int, dict] = {}
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
        linkable[sp["span_no"]] = sp
        per_field.setdefault((k, fld), []).append((sp["span_no"], s, e, _span_status(sp)))
    shown, pairs = _pair_markers(answer, spans)
    out, pos = [], 0
    for m, sp in pairs:
        out.append(esc(shown[pos : m.start]))
        pos = m.end
        k = m.source_k
        status = _span_status(sp) if sp is not None else "unchecked"
        label = SPAN_LABELS.get(status, status)
        flag = "" if status == "verbatim" else f'<span class="flag">⚠ {esc(label)}</span>'
        title = f"source {k} · {label}"
        if sp is not None and status == "repaired":
            title += f" · passage says: {sp['text']}"
        inner = f'<sup class="k">{k}</sup>{esc(m.text)}{flag}'
        cls = f"qspan st-{esc(status)}" + ("" if status == "verbatim" else " nonverbatim")
        if sp is not None and sp["span_no"] in linkable:
            n = sp["span_no"]
            out.append(
                f'<a class="{cls}" href="#{ctx.prefix}-s{n}" data-span="{n}" data-source="{k}" '
                f'title="{esc(title)}">{inner}</a>'
            )
        else:
            out.append(f'<span class="{cls}" data-source="{k}" title="{esc(title)}">{inner}</span>')
    out.append(esc(shown[pos:]))
    raw = answer.get("answer_raw") is not None
    parts = [
        f'<p class="meta">style: {esc(style)}'
        + (" · as the model wrote it; every marker shown with its check" if raw else "")
        + "</p>",
        f'<p class="answer">{"".join(out)}</p>',
    ]
    if raw and answer.get("answer") != answer.get("answer_raw"):
        parts.append(
            '<details class="scored"><summary>answer as scored (repaired spans re-quoted, unmarked ones '
            f'as free text)</summary><p class="answer">{esc(answer.get("answer"))}</p></details>'
        )
    if spans:
        rows = []
        for sp in spans:
            st = _span_status(sp)
            n = sp["span_no"]
            link = f'<a href="#{ctx.prefix}-s{n}">{n}</a>' if n in linkable else esc(n)
            where = (
                f"{esc(sp.get('field') or 'text')} {esc(sp['start'])}–{esc(sp['end'])}"
                if n in linkable
                else "—"
            )
            rows.append(
                f'<tr class="st-{esc(st)}"><td>{link}</td><td>{esc(sp["source_k"])}</td>'
                f"<td>{esc(SPAN_LABELS.get(st, st))}</td><td>{where}</td><td>{esc(sp['text'])}</td></tr>"
            )
        n_ok = sum(_span_status(s) == "verbatim" for s in spans)
        parts.append(
            f'<details class="spans"><summary>quoted spans: {n_ok} of {len(spans)} verbatim</summary>'
            '<table class="grid"><thead><tr><th>span</th><th>source</th><th>status</th><th>offsets</th>'
            f"<th>text (repaired: the passage's)</th></tr></thead><tbody>{''.join(rows)}</tbody></table></details>"
        )
    if pids:
        parts.append(
            '<p class="sub">sources (numbered as in the answer prompt):</p><ol class="passages sources">'
        )
        for k, pid in enumerate(pids, 1):
            title, ptext = ctx.passages.get(pid, (None, None))
            head = (
                _highlight(title, sorted(per_field.get((k, "title"), []), key=lambda t: t[1]), ctx.prefix)
                if title is not None
                else esc(pid)
            )
            body = (
                _highlight(ptext, sorted(per_field.get((k, "text"), []), key=lambda t: t[1]), ctx.prefix)
                if ptext is not None
                else '<span class="muted">(passage text not in passages.parquet)</span>'
            )
            parts.append(
                f'<li class="passage source" id="{ctx.prefix}-src{k}" data-passage-id="{esc(pid)}" value="{k}">'
                f'<span class="ptitle">[{k}] {head}</span><p class="ptext">{body}</p></li>'
            )
        parts.append("</ol>")
    return "".join(parts)


def _question_html(run: Run, ri: int, qi: int, q: dict, frames: dict, k: int, open_: bool) -> str:
    prefix = f"r{ri}-q{qi}"
    qid = q["qid"]
    nodes = frames["nodes"].get(qid, [])
    hits_by_node: dict[str | None, list[dict]] = {}
    for h in frames["hits"].get(qid, []):
        hits_by_node.setdefault(h["node_id"], []).append(h)
    ctx = _Ctx(prefix, frames["passages"], hits_by_node)
    answer = frames["answers"].get(qid, [None])[0]
    spans = sorted(frames["spans"].get(qid, []), key=lambda s: s["span_no"])
    scores = frames["scores"].get(qid, [])
    n_valid = sum(n["status"] in plots.VALID_STATUSES for n in nodes)
    depth = max((n["depth"] or 0 for n in nodes), default=0)
    score_txt = "".join(
        f"<tr><th>{esc(s['metric'])}</th><td>{esc(fmt(s['value']))}</td></tr>" for s in scores
    )
    return (
        f'<details class="question" id="{prefix}" data-qid="{esc(qid)}"{" open" if open_ else ""}>'
        f'<summary><span class="qid">{esc(qid)}</span> <span class="aq">{esc(q["question"])}</span> '
        f'<span class="pill">{n_valid} valid · depth {depth} · {len(nodes)} nodes</span></summary>'
        '<div class="qbody"><h4>Tree of clarifications</h4>'
        '<div class="tools"><button type="button" data-act="expand">expand all</button> '
        '<button type="button" data-act="collapse">collapse all</button></div>'
        f"{_tree_html(ctx, nodes, k)}<h4>Answer</h4>{_answer_html(ctx, answer, spans)}"
        + (f'<h4>Scores</h4><table class="kv">{score_txt}</table>' if scores else "")
        + "</div></details>"
    )


def _group(df: pl.DataFrame, key: str = "qid") -> dict:
    out: dict = {}
    for row in df.iter_rows(named=True):
        out.setdefault(row[key], []).append(row)
    return out


def _run_html(run: Run, ri: int, k: int, max_questions: int | None) -> str:
    questions = run.questions.unique("qid", keep="first", maintain_order=True)
    if max_questions is not None:
        questions = questions.head(max_questions)
    frames = {
        "nodes": _group(run.nodes),
        "hits": _group(run.hits),
        "answers": _group(run.answers),
        "spans": _group(run.spans),
        "scores": _group(run.scores),
        "passages": {
            r["passage_id"]: (r["title"], r["text"])
            for r in run.passages.unique("passage_id", keep="first").iter_rows(named=True)
        },
    }
    summary = dict(run.summary)
    metrics = summary.pop("metrics", {}) or {}
    head = [
        f'<section class="run" id="run-{ri}"><h2>Run <code>{esc(run.name)}</code></h2>',
        f'<p class="meta">directory <code>{esc(run.path)}</code> · {questions.height} questions shown'
        f" of {run.questions.height}</p>",
    ]
    if run.missing:
        head.append(
            f'<p class="warn">files not present (parts left empty): {esc(", ".join(run.missing))}</p>'
        )
    head.append('<div class="cols"><div><h3>Summary metrics</h3>')
    head.append(_kv_table(flatten(metrics), "metrics"))
    head.append("<h3>Run summary</h3>" + _kv_table(flatten(summary), "summary"))
    head.append("</div><div><h3>Config</h3>" + _kv_table(flatten(run.config), "config") + "</div></div>")
    head.append('<h3>Plots</h3><div class="plots">')
    head.append(_img(plots.llm_calls_png(run.llm_calls), "LLM calls per question"))
    head.append(_img(plots.tokens_png(run.llm_calls), "tokens"))
    head.append(_img(plots.tree_png(run.nodes), "tree depth and valid nodes"))
    head.append(_img(plots.scores_png(run.scores), "score distributions"))
    head.append("</div>")
    # Question index: one row per question, linking to its tree.
    shape = (
        {r["qid"]: r for r in plots.tree_shape(run.nodes).iter_rows(named=True)} if run.nodes.height else {}
    )
    calls = dict(run.llm_calls.group_by("qid").len().iter_rows()) if run.llm_calls.height else {}
    metric_names = sorted(run.scores["metric"].unique().to_list()) if run.scores.height else []
    score_map = {(r["qid"], r["metric"]): r["value"] for r in run.scores.iter_rows(named=True)}
    span_ok = {}
    for qid, sps in frames["spans"].items():
        span_ok[qid] = f"{sum(_span_status(s) == 'verbatim' for s in sps)}/{len(sps)}"
    th = "".join(f"<th>{esc(m)}</th>" for m in metric_names)
    rows = []
    for qi, q in enumerate(questions.iter_rows(named=True)):
        sh = shape.get(q["qid"], {})
        tds = "".join(f"<td>{esc(fmt(score_map.get((q['qid'], m))))}</td>" for m in metric_names)
        rows.append(
            f'<tr><td><a href="#r{ri}-q{qi}">{esc(q["qid"])}</a></td><td>{esc(q["question"])}</td>'
            f"<td>{esc(sh.get('valid_nodes', 0))}</td><td>{esc(sh.get('max_depth', 0))}</td>"
            f"<td>{esc(calls.get(q['qid'], 0))}</td><td>{esc(span_ok.get(q['qid'], '—'))}</td>{tds}</tr>"
        )
    head.append(
        '<h3>Questions</h3><div class="scroll"><table class="grid qindex"><thead><tr><th>qid</th><th>question</th>'
        f"<th>valid nodes</th><th>depth</th><th>LLM calls</th><th>verbatim spans</th>{th}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div><h3>Trees</h3>"
    )
    body = [
        _question_html(run, ri, qi, q, frames, k, open_=qi == 0)
        for qi, q in enumerate(
            tqdm(
                questions.iter_rows(named=True),
                total=questions.height,
                desc=f"report {run.name}",
                leave=False,  # gone once done; not drawn at all when stderr is not a terminal (a log)
                disable=None,
            )
        )
    ]
    return "".join(head) + "".join(body) + "</section>"


CSS = """
:root{--root:#2563eb;--valid:#15803d;--pruned:#b91c1c;--dup:#b45309;--pend:#6b7280}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1200px;
 padding:1em 1.5em;color:#1f2937;background:#fff}
h1{margin:.2em 0}h2{border-bottom:2px solid #e5e7eb;padding-bottom:.2em;margin-top:2em}h4{margin:.8em 0 .3em}
code{background:#f3f4f6;padding:0 .25em;border-radius:3px}
.meta,.muted{color:#6b7280;font-size:.9em}.warn{color:#92400e;background:#fef3c7;padding:.3em .6em}
table{border-collapse:collapse;margin:.4em 0}th,td{border:1px solid #e5e7eb;padding:.2em .5em;
 text-align:left;vertical-align:top}thead th{background:#f9fafb}
table.kv th{font-weight:600;background:#f9fafb;white-space:nowrap}
.cols{display:flex;gap:2em;flex-wrap:wrap}.cols>div{flex:1;min-width:320px}
.plots{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0}figure img{max-width:100%;border:1px solid #e5e7eb}
figcaption{font-size:.85em;color:#6b7280}
details.question{border:1px solid #d1d5db;border-radius:6px;margin:.6em 0;padding:.3em .8em}
details.question>summary{cursor:pointer;font-weight:600}.qid{font-family:monospace;color:#6b7280;font-weight:400}
.pill{font-weight:400;font-size:.85em;background:#eef2ff;border-radius:9px;padding:0 .6em}
ul.tree{list-style:none;padding-left:1.4em;margin:.2em 0;border-left:1px dashed #d1d5db}
ul.tree.root-level{border-left:none;padding-left:0}
details.node{margin:.25em 0;border-left:4px solid var(--pend);padding-left:.5em}
details.node>summary{cursor:pointer}
.status-root{border-color:var(--root)!important}.status-valid,.status-expanded{border-color:var(--valid)!important}
.status-pruned{border-color:var(--pruned)!important}.status-duplicate{border-color:var(--dup)!important}
.status-pruned>summary .dq,.status-duplicate>summary .dq{color:#6b7280;text-decoration:line-through}
.badge{display:inline-block;font-size:.72em;font-weight:700;color:#fff;border-radius:3px;padding:0 .45em;
 background:var(--pend);letter-spacing:.03em}
.b-root{background:var(--root)}.b-valid,.b-expanded{background:var(--valid)}.b-pruned{background:var(--pruned)}
.b-duplicate{background:var(--dup)}
.da{font-weight:600;color:#111827}.arrow{color:#9ca3af}
.nbody{margin:.2em 0 .4em .2em}.sub{margin:.3em 0 .1em;font-size:.9em;color:#374151}
ol.passages{margin:.1em 0;padding-left:1.6em}li.passage{margin:.15em 0}
.ptitle{font-weight:600}.ptext{margin:.2em 0 .5em;white-space:pre-wrap}
.evtag{background:#fef9c3;color:#854d0e;border-radius:3px;padding:0 .3em}
.verdict{white-space:pre-wrap}
p.answer{background:#f9fafb;border:1px solid #e5e7eb;padding:.6em .8em;border-radius:4px}
.qspan{background:#dcfce7;border-bottom:2px solid var(--valid);text-decoration:none;color:inherit;
 border-radius:2px;padding:0 .1em}
.qspan.nonverbatim{background:#fee2e2;border-bottom:2px dashed var(--pruned)}
.qspan sup.k{font-weight:700;color:#1d4ed8;margin-right:.15em}
.flag{font-size:.75em;color:var(--pruned);font-weight:700;margin-left:.25em}
mark.quote{background:#bbf7d0}mark.quote.nonverbatim{background:#fecaca}
mark.flash,.flash{outline:3px solid #f59e0b;transition:outline .2s}
tr.st-repaired td,tr.st-bad_source td,tr.st-unmarked td,tr.st-unverified td{background:#fef2f2}
.tools button{font-size:.8em}.scroll{overflow-x:auto;max-width:100%}
"""

JS = """
(function () {
  'use strict';
  function reveal(el) {
    for (var p = el; p; p = p.parentElement) { if (p.tagName === 'DETAILS') { p.open = true; } }
  }
  function flash(el) {
    var targets = [el];
    var n = el.getAttribute('data-span');
    var box = el.closest('.passage');
    if (n && box) { targets = Array.prototype.slice.call(box.querySelectorAll('mark[data-spans~="' + n + '"]')); }
    targets.forEach(function (t) { t.classList.add('flash'); });
    window.setTimeout(function () { targets.forEach(function (t) { t.classList.remove('flash'); }); }, 1600);
  }
  function go(id) {
    var el = document.getElementById(id);
    if (!el) { return false; }
    reveal(el);
    el.scrollIntoView({block: 'center'});
    flash(el);
    return true;
  }
  document.addEventListener('click', function (ev) {
    var a = ev.target.closest('a[href^="#"]');
    if (a) {
      var id = decodeURIComponent(a.getAttribute('href').slice(1));
      if (go(id)) { ev.preventDefault(); history.replaceState(null, '', '#' + id); }
      return;
    }
    var b = ev.target.closest('button[data-act]');
    if (b) {
      var open = b.getAttribute('data-act') === 'expand';
      b.closest('.qbody').querySelectorAll('details.node').forEach(function (d) { d.open = open; });
    }
  });
  window.addEventListener('hashchange', function () { go(decodeURIComponent(location.hash.slice(1))); });
  if (location.hash.length > 1) { go(decodeURIComponent(location.hash.slice(1))); }
})();
"""


def render_report(runs: list[Run], *, passages_per_node: int = 5, max_questions: int | None = None) -> str:
    """The whole HTML document for loaded runs (see the module docstring)."""
    now = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    nav = " · ".join(f'<a href="#run-{i}">{esc(r.name)}</a>' for i, r in enumerate(runs))
    parts = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>clarify report: {esc(', '.join(r.name for r in runs))}</title><style>{CSS}</style></head><body>",
        f'<header><h1>clarify report</h1><p class="meta">written {esc(now)} · {len(runs)} run(s): {nav}</p>',
        '<p class="meta">Node labels: <span class="badge b-root">ROOT</span> ambiguous question · '
        '<span class="badge b-valid">VALID</span> kept by the verifier · '
        '<span class="badge b-pruned">PRUNED</span> rejected by the verifier · '
        '<span class="badge b-duplicate">DUPLICATE</span> repeats an earlier question/answer. '
        'Quoted spans: <span class="qspan">verbatim</span> '
        '<span class="qspan nonverbatim">not verbatim<span class="flag">⚠</span></span>; '
        "click a span to see it in its source passage.</p></header>",
    ]
    if len(runs) > 1:
        table = comparison_table(runs)
        parts.append('<section id="comparison"><h2>Comparison</h2>')
        parts.append(f'<div class="scroll">{_df_table(table, "grid compare")}</div>')
        metric_cols = plotted_metrics(runs, table)
        if table["params"].drop_nulls().len() >= 2 and metric_cols:
            fig = plots.compare_figure(table, metric_cols)
            parts.append(_img(plots._png(fig), "each metric against model size (parameters, log scale)"))
        else:
            parts.append(
                '<p class="muted">no metric-vs-size plot: fewer than two runs state a parameter count '
                "(summary.json `params`)</p>"
            )
        parts.append("</section>")
    for ri, run in enumerate(runs):
        parts.append(_run_html(run, ri, passages_per_node, max_questions))
    parts.append(f"<script>{JS}</script></body></html>")
    return "".join(parts)


def write_report(
    run_dirs: list[Path], out: Path, *, passages_per_node: int = 5, max_questions: int | None = None
) -> Path:
    """Write one self-contained HTML report for `run_dirs` to `out` (atomically) and return `out`."""
    if not run_dirs:
        raise InputError("no run directory given", field="run_dirs")
    runs = [load_run(d) for d in run_dirs]
    doc = render_report(runs, passages_per_node=passages_per_node, max_questions=max_questions)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(doc, encoding="utf-8")
    tmp.replace(out)
    return out


def default_out(run_dirs: list[Path]) -> Path:
    """RUN_DIR/report.html for one run; for several, report.html in the first run's parent directory."""
    if len(run_dirs) == 1:
        return Path(run_dirs[0]) / "report.html"
    return Path(run_dirs[0]).parent / "report.html"


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
        help="run directories (several: one section each + a comparison)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="HTML file to write (default: RUN_DIR/report.html, or report.html beside the runs)",
    )
    p.add_argument(
        "--passages", type=int, default=5, help="retrieved passages shown per tree node (default 5)"
    )
    p.add_argument("--max-questions", type=int, default=None, help="show only the first N questions' trees")
    p.set_defaults(func=_cmd_report)
