"""Tests of `clarify report` (batch/report/html.py) and the plots (batch/report/plots.py).

The run directories are real: two runs of the pipeline over ASQA dev questions, each with a scripted
model (tests/fixtures_report.py `report_runs`): every node status, quoted answers with
every span status (verbatim, repaired, bad source, unmarked, empty), hostile model output to check
escaping, and the summary.json finalize writes. The tests read what the runs wrote.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
import warnings
import zlib
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest

from clarify.batch.report import cli as report_cli
from clarify.batch.report import html as report
from clarify.batch.report import labels, plots, render, shape
from clarify.batch.report.comparison import comparison_table, fmt, plotted_metrics
from clarify.batch.run.rundir import Run
from clarify.batch.toc import quotes
from clarify.errors import InputError
from tests.fixtures_report import HOSTILE, copy_run

ROOT = Path(__file__).resolve().parents[1]


def _tables(run_dir: Path) -> dict[str, pl.DataFrame]:
    """The run's tables as it wrote them."""
    return {p.stem: pl.read_parquet(p) for p in run_dir.glob("*.parquet")}


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))


# ------------------------------------------------------------------ a small DOM for assertions


class Node:
    def __init__(self, tag: str, attrs: dict, parent: Node | None):
        self.tag, self.attrs, self.parent, self.children = tag, attrs, parent, []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def ancestors(self):
        p = self.parent
        while p is not None:
            yield p
            p = p.parent

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


VOID = {"meta", "img", "br", "hr", "input", "link", "col", "area", "base", "source", "wbr"}


class DomBuilder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, dict(attrs), self.cur))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        assert n is not None, f"stray </{tag}>"
        assert n is self.cur, f"</{tag}> closes <{self.cur.tag}> early: malformed nesting"
        self.cur = n.parent

    def handle_data(self, data):
        self.cur.children.append(data)


PACKED_BODY = re.compile(r'<script type="application/octet-stream" class="qz">([A-Za-z0-9+/=]*)</script>')


def unpack(b64: str) -> str:
    """What report.js inflates: base64 of raw DEFLATE (batch/report/render.py `pack`)."""
    return zlib.decompress(base64.b64decode(b64), -15).decode("utf-8")


def inflated(html_text: str) -> str:
    """The page as a reader sees it with every question opened: each packed body (script.qz) in its place."""
    return PACKED_BODY.sub(lambda m: unpack(m[1]), html_text)


def passage_store(dom: Node) -> dict[str, str]:
    """A run's passage texts (script.ptexts, packed)."""
    return json.loads(unpack(next(n for n in dom.iter() if n.tag == "script" and "ptexts" in n.classes).text()))


def parse(html_text: str) -> Node:
    """The report's DOM with every packed question body put in, as report.js does when a question opens."""
    b = DomBuilder()
    b.feed(inflated(html_text))
    b.close()
    assert b.cur is b.root, f"unclosed <{b.cur.tag}>"
    return b.root


def by_id(dom: Node) -> dict[str, Node]:
    ids: dict[str, Node] = {}
    for n in dom.iter():
        if "id" in n.attrs:
            assert n.attrs["id"] not in ids, f"duplicate id {n.attrs['id']}"
            ids[n.attrs["id"]] = n
    return ids


# ------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def one_run(report_runs, tmp_path_factory):
    """The first run, what it wrote ({"tables", "summary"}) and its report."""
    run_dir = report_runs[0]
    written = {"tables": _tables(run_dir), "summary": _summary(run_dir)}
    out = report.write_report([run_dir], tmp_path_factory.mktemp("report") / "report.html")
    return run_dir, written, out.read_text(encoding="utf-8")


def test_every_node_present_with_its_status(one_run):
    run_dir, written, text = one_run
    assert Run.open(run_dir).missing == []  # the run wrote every table
    dom = parse(text)
    nodes = written["tables"]["nodes"]
    shown = {}
    for n in dom.iter():
        if n.tag == "details" and "node" in n.classes:
            q = next(a for a in n.ancestors() if "question" in a.classes)
            shown[(q.attrs["data-qid"], n.attrs["data-node-id"])] = n
    assert set(shown) == {(r["qid"], r["node_id"]) for r in nodes.iter_rows(named=True)}
    assert {r["status"] for r in nodes.iter_rows(named=True)} >= {
        "root",
        "valid",
        "pruned",
        "duplicate",
    }
    for r in nodes.iter_rows(named=True):
        el = shown[(r["qid"], r["node_id"])]
        assert el.attrs["data-status"] == r["status"]
        assert f"status-{r['status']}" in el.classes  # colour comes from this class
        summary = el.children[0]
        badge = next(c for c in summary.children if isinstance(c, Node) and "badge" in c.classes)
        assert badge.text() == labels.STATUS_LABELS[r["status"]]
        assert r["question"] in summary.text()
        # Tree shape: a node sits inside its parent's <details>.
        if r["parent_id"] is not None:
            parent = next(a for a in el.ancestors() if a.tag == "details" and "node" in a.classes)
            assert parent.attrs["data-node-id"] == r["parent_id"]
        # Root open, the rest collapsed until the reader opens them.
        assert ("open" in el.attrs) == (r["status"] == "root")


def test_node_passages_come_from_hits_and_passages(one_run):
    _, written, text = one_run
    dom = parse(text)
    hits, passages = written["tables"]["hits"], written["tables"]["passages"]
    top_k = Run.open(one_run[0]).config.retrieval.top_k  # passages shown per retrieval
    assert hits.group_by("qid", "node_id").agg(pl.col("wave").n_unique())["wave"].max() > 1  # a node retrieved twice
    ptext = dict(zip(passages["passage_id"], passages["text"]))
    store = passage_store(dom)
    n_lists = 0
    for el in dom.iter():
        if el.tag != "details" or "node" not in el.classes:
            continue
        q = next(a for a in el.ancestors() if "question" in a.classes).attrs["data-qid"]
        mine = hits.filter((pl.col("qid") == q) & (pl.col("node_id") == el.attrs["data-node-id"]))
        # One list per retrieval (wave), each in rank order.
        want = [
            mine.filter(pl.col("wave") == w).sort("rank")["passage_id"].to_list()
            for w in sorted(set(mine["wave"]))
        ]
        body = next(c for c in el.children if isinstance(c, Node) and "nbody" in c.classes)
        got = [
            [li.attrs["data-passage-id"] for li in ol.iter() if li.tag == "li"]
            for ol in body.children
            if isinstance(ol, Node)
            and ol.tag == "ol"
            and not any(li.attrs.get("id", "").endswith("-ev") for li in ol.iter())
        ]
        assert got == want and all(len(g) == top_k for g in got)
        n_lists += len(got)
        for li in body.iter():
            if li.tag == "li" and "passage" in li.classes:
                # the text is in the run's store once, keyed by passage, and filled in when it opens (report.js)
                holder = next(n for n in li.iter() if "ptext" in n.classes)
                assert holder.attrs["data-ptext"] == li.attrs["data-passage-id"] and not holder.text()
                assert store[li.attrs["data-passage-id"]] == ptext[li.attrs["data-passage-id"]]
    assert n_lists == hits.select("qid", "node_id", "wave").unique().height
    # each text once: the store holds exactly the passages shown folded under the nodes
    shown = {n.attrs["data-ptext"] for n in dom.iter() if "data-ptext" in n.attrs}
    assert set(store) == shown and text.count('class="ptexts"') == 1


def _status_class(el: Node) -> str:
    return next(c[3:] for c in el.classes if c.startswith("st-"))


def _answer_spans(dom: Node) -> list[Node]:
    """The quoted-span elements inside the answers, in document order."""
    return [n for p in dom.iter() if "answer" in p.classes for n in p.iter() if "qspan" in n.classes]


def _check_span_links(dom: Node, spans: pl.DataFrame, passages_df: pl.DataFrame) -> tuple[set, set]:
    """Every linked answer span resolves to its offsets highlighted in source k; returns the statuses
    of linked and unlinked spans."""
    ids = by_id(dom)
    fields = {r["passage_id"]: r for r in passages_df.iter_rows(named=True)}
    linked, unlinked = set(), set()
    for a in _answer_spans(dom):
        q = next(x for x in a.ancestors() if "question" in x.classes).attrs["data-qid"]
        status = _status_class(a)
        assert ("nonverbatim" in a.classes) == (status != "verbatim")
        if status != "verbatim":
            assert "⚠" in a.text() and labels.SPAN_LABELS[status] in a.text()
        if a.tag != "a":
            unlinked.add(status)
            continue
        n = int(a.attrs["data-span"])
        row = spans.filter((pl.col("qid") == q) & (pl.col("span_no") == n)).row(0, named=True)
        assert status == row["status"]
        target = ids[a.attrs["href"][1:]]  # the anchor exists ...
        box = next(x for x in target.ancestors() if "passage" in x.classes)
        assert box.attrs["data-passage-id"] == row["passage_id"]  # ... inside source k's passage element
        part = next(x for x in target.ancestors() if x.classes & {"ptitle", "ptext"})
        assert part.classes == {"ptitle" if row["field"] == "title" else "ptext"}
        marks = [m for m in box.iter() if m.tag == "mark" and str(n) in m.attrs["data-spans"].split()]
        # The span's offsets, in the passage field they index, are what is highlighted.
        assert (
            "".join(m.text() for m in marks)
            == fields[row["passage_id"]][row["field"]][row["start"] : row["end"]]
        )
        linked.add(status)
    return linked, unlinked


def test_span_links_resolve_to_highlighted_passage_offsets(one_run):
    _, written, text = one_run
    dom = parse(text)
    spans = written["tables"]["spans"]
    assert len(_answer_spans(dom)) == spans.height  # with answer_raw every marker the model wrote is shown
    linked, unlinked = _check_span_links(dom, spans, written["tables"]["passages"])
    assert linked == {"verbatim", "repaired"}
    assert unlinked == {"bad_source", "unmarked", "empty"}
    assert "title" in spans["field"].to_list()  # a span quoting a title is highlighted in the title


def _answer_pieces(p: Node) -> list:
    """The children of a `p.answer`: text (str) and the quoted-span elements, in order."""
    out: list = []
    for c in p.children:
        if isinstance(c, Node) and "qspan" in c.classes:
            out.append(c)
        elif isinstance(c, str) and out and isinstance(out[-1], str):
            out[-1] += c
        else:
            out.append(c if isinstance(c, str) else c.text())
    return out


def test_markers_sit_where_marker_start_end_say(one_run):
    """The answer shown is answer_raw with each span's marker (answer_raw[marker_start:marker_end]) replaced
    by its quoted-span element, in span_no order; the answer as scored is there too when it differs."""
    _, written, text = one_run
    dom = parse(text)
    answers, spans = written["tables"]["answers"], written["tables"]["spans"]
    questions = [n for n in dom.iter() if n.tag == "details" and "question" in n.classes]
    assert len(questions) == answers.height
    for q in questions:
        row = answers.filter(pl.col("qid") == q.attrs["data-qid"]).row(0, named=True)
        mine = spans.filter(pl.col("qid") == q.attrs["data-qid"]).sort("span_no")
        raw, pos, want = row["answer_raw"], 0, []
        for sp in mine.iter_rows(named=True):
            want += [raw[pos : sp["marker_start"]], (sp["source_k"], sp["status"])]
            pos = sp["marker_end"]
        want.append(raw[pos:])
        shown = next(n for n in q.iter() if n.tag == "p" and "answer" in n.classes)
        got = [
            x if isinstance(x, str) else (int(x.attrs["data-source"]), _status_class(x))
            for x in _answer_pieces(shown)
        ]
        assert got == [w for w in want if w != ""]
        scored = [n for n in q.iter() if n.tag == "details" and "scored" in n.classes]
        if row["answer"] != raw:
            assert scored[0].children[1].text() == row["answer"]
        else:
            assert scored == []
    # Question 0 has every status and its answer was repaired: the scored answer is shown.
    assert set(spans["status"]) == set(quotes.STATUSES)


def test_environment_autoescapes_and_inlines_css_and_js(one_run):
    env = render.environment()
    assert env.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"
    assert env.get_template("report.html.j2").environment.autoescape is True
    _, _, text = one_run
    dom = parse(text)
    style = next(n for n in dom.iter() if n.tag == "style").text()
    script = next(n for n in dom.iter() if n.tag == "script" and "type" not in n.attrs).text()
    css = (render.TEMPLATES / "report.css").read_text(encoding="utf-8")
    js = (render.TEMPLATES / "report.js").read_text(encoding="utf-8")
    assert style.strip() == css.strip() and ".qspan.nonverbatim{" in style
    assert script.strip() == js.strip() and "addEventListener('click'" in script


def test_hostile_text_in_every_run_file_is_escaped(report_runs, tmp_path):
    """Model output and run files are untrusted: <script> in a question, an answer, a passage, a node,
    a config or summary value (or key) and a score name comes out as text, never as markup."""
    run_dir = copy_run(report_runs[0], tmp_path / "r")
    t = _tables(run_dir)
    settings, summary = Run.open(run_dir).settings, _summary(run_dir)
    t["questions"].with_columns(question=pl.lit(HOSTILE)).write_parquet(run_dir / "questions.parquet")
    t["nodes"].with_columns(question=pl.lit(HOSTILE), answers=pl.lit([HOSTILE])).write_parquet(
        run_dir / "nodes.parquet"
    )
    # Appended at the end of every passage: the spans' offsets stay where they were.
    passages = t["passages"].with_columns(text=pl.col("text") + HOSTILE, title=pl.col("title") + HOSTILE)
    passages.write_parquet(run_dir / "passages.parquet")
    answers = t["answers"].with_columns(answer_raw=pl.col("answer_raw") + HOSTILE, style=pl.lit(HOSTILE))
    answers.write_parquet(run_dir / "answers.parquet")
    t["scores"].with_columns(metric=pl.lit(HOSTILE)).write_parquet(run_dir / "scores.parquet")
    # config.json is a checked RunConfig: the hostile text goes into its free-text settings
    config = {**settings, "index": HOSTILE, "questions": HOSTILE}
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "summary.json").write_text(json.dumps({**summary, "name": HOSTILE, HOSTILE: HOSTILE}))
    text = report.write_report([run_dir], tmp_path / "r.html").read_text(encoding="utf-8")
    dom = parse(text)
    scripts = [n for n in dom.iter() if n.tag == "script"]
    # ours, and the run's passage texts as packed data (`text_store`: base64, no < or & in it), put in as text
    assert sorted(n.attrs.get("type") or "" for n in scripts) == ["", "application/octet-stream"]
    assert any(v.endswith(HOSTILE) for v in passage_store(dom).values())
    # the closed questions' bodies are packed too: nothing of a run's text reaches the page unescaped
    packed = PACKED_BODY.findall(text)
    assert packed and all(re.fullmatch(r"[A-Za-z0-9+/=]*", b) for b in packed)
    text = inflated(text)
    assert not any(n.tag == "img" and "onerror" in n.attrs for n in dom.iter())
    assert "<script>alert" not in text and "<img src=x" not in text
    shown = [n.text() for n in dom.iter() if not any(isinstance(c, Node) for c in n.children)]
    for where in ("aq", "dq", "da", "ptext", "ptitle", "answer"):
        assert any(HOSTILE in n.text() for n in dom.iter() if where in n.classes), where
    assert text.count("&lt;script&gt;alert(") >= 10
    assert HOSTILE in shown  # a config/summary cell holding the value alone


def test_overlapping_spans_highlight_each_offset_range():
    row = json.loads((ROOT / "data/wiki/passages.jsonl").open().readline())
    text = row["text"]
    a, b = (0, 40, "verbatim"), (25, 70, "repaired")
    dom = parse(f'<p class="passage">{shape._highlight(text, [(1, *a), (2, *b)], "t")}</p>')
    for n, (s, e, _) in ((1, a), (2, b)):
        marks = [m for m in dom.iter() if m.tag == "mark" and str(n) in m.attrs["data-spans"].split()]
        assert "".join(m.text() for m in marks) == text[s:e]
    assert dom.text() == text  # highlighting never drops or repeats passage text
    overlap = [m for m in dom.iter() if m.tag == "mark" and m.attrs["data-spans"] == "1 2"]
    assert overlap[0].text() == text[25:40] and "nonverbatim" in overlap[0].classes


def test_report_is_self_contained_and_escapes_model_output(one_run):
    _, _, text = one_run
    dom = parse(text)
    for n in dom.iter():
        for attr in ("src", "href", "action", "poster", "data"):
            v = n.attrs.get(attr) or ""
            assert not re.match(r"\s*(https?:)?//", v, re.I), f"external reference <{n.tag} {attr}={v}>"
        assert n.tag not in ("link", "iframe", "object", "embed")
    assert not re.search(r"url\(\s*['\"]?(https?:)?//|@import", text, re.I)
    scripts = [n for n in dom.iter() if n.tag == "script"]
    # our inline script, and the run's passage texts as packed data (never run: type application/octet-stream)
    assert len(scripts) == 2 and not any("src" in n.attrs for n in scripts)
    assert [n.attrs.get("type") for n in scripts if "type" in n.attrs] == ["application/octet-stream"]
    assert not any("onerror" in n.attrs for n in dom.iter())
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in text
    # the model proposed a disambiguated question with markup in it: shown as text, in its pruned node
    pruned = [n for n in dom.iter() if n.tag == "details" and n.attrs.get("data-status") == "pruned"]
    assert any(HOSTILE in d.text() for n in pruned for d in n.iter() if "dq" in d.classes)
    assert "Meanwhile <b>bold</b> &" in next(n for n in dom.iter() if "answer" in n.classes).text()


def test_plots_are_embedded_pngs(one_run):
    from matplotlib.image import imread

    _, _, text = one_run
    imgs = [n for n in parse(text).iter() if n.tag == "img"]
    assert [i.attrs["alt"] for i in imgs] == [
        "LLM calls per question",
        "tokens",
        "tree depth and valid nodes",
        "per-question metrics",
    ]
    for img in imgs:
        src = img.attrs["src"]
        assert src.startswith("data:image/png;base64,")
        pixels = imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])), format="png")
        assert pixels.shape[0] > 200 and pixels.shape[1] > 400
        assert pixels.std() > 0.01  # something was drawn


def test_tree_shape_counts(one_run):
    _, written, _ = one_run
    nodes = written["tables"]["nodes"]
    shape = plots.tree_shape(nodes)
    assert shape.height == nodes["qid"].n_unique()
    for row in shape.iter_rows(named=True):
        mine = nodes.filter(pl.col("qid") == row["qid"])
        # valid nodes, deepest node and all nodes of the question's tree (root, pruned and duplicates too)
        want = (mine.filter(pl.col("status") == "valid").height, mine["depth"].max(), mine.height)
        assert (row["valid_nodes"], row["max_depth"], row["nodes"]) == want
    # the first question's tree has a duplicate below a valid node: depth 2 beside pruned and valid nodes
    first = nodes.filter(pl.col("qid") == nodes["qid"][0])
    assert {"valid", "pruned", "duplicate"} <= set(first["status"]) and first["depth"].max() == 2


def _kv(table: Node) -> dict[str, str]:
    out = {}
    for tr in table.iter():
        if tr.tag == "tr":
            cells = [c for c in tr.children if isinstance(c, Node)]
            out[cells[0].text()] = cells[1].text()
    return out


def test_report_leads_with_the_answers(one_run):
    """Headline metrics first, then the questions (tree viewer, answers), then plots; the run summary and
    the config last, folded, grouped under titles in words."""
    _, written, text = one_run
    dom = parse(text)
    run = next(n for n in dom.iter() if n.tag == "section" and "run" in n.classes)
    order = [n for n in run.iter() if n.classes & {"headline", "question", "plots", "runinfo"}]
    kinds = [next(iter(n.classes & {"headline", "question", "plots", "runinfo"})) for n in order]
    n_questions = written["tables"]["questions"].height
    assert kinds == ["headline", *["question"] * n_questions, "plots", "runinfo", "runinfo"]
    cards = {m: n for n in run.iter() if "data-metric" in n.attrs for m in n.attrs["data-metric"].split()}
    assert set(cards) == set(written["summary"]["metrics"])  # only the run's own metrics
    for m, v in written["summary"]["metrics"].items():
        value = next(c for c in cards[m].iter() if "mvalue" in c.classes).text()
        assert value == (f"{v:.4g}" if v is not None else "n/a")
    # the summary and the config: folded, in groups named in words
    summary_box, config_box = [n for n in order if "runinfo" in n.classes]
    assert "open" not in summary_box.attrs and "open" not in config_box.attrs
    groups = {}
    for box in (summary_box, config_box):
        title = None
        for n in box.children:
            if isinstance(n, Node) and n.tag == "h4":
                title = n.text()
            elif isinstance(n, Node) and n.tag == "table":
                groups[title] = _kv(n)
    config = Run.open(one_run[0]).config
    assert groups["Model and engine"]["model"] == config.model.model
    assert groups["Tree of clarifications"]["max_depth"] == str(config.toc.max_depth)
    assert groups["Run"]["dataset"] == config.dataset == "asqa"
    fid = written["summary"]["quote_fidelity"]
    assert groups["Quotes"]["quote fidelity: n verbatim"] == str(fid["n_verbatim"])
    assert groups["Work per question"]["LLM calls"] == str(written["summary"]["llm_calls"])


def test_missing_metrics_say_why_and_bookkeeping_is_not_a_metric(report_runs, tmp_path):
    """A metric not computed reads "n/a" with what it needs (Disambig-F1, DR: a reader); the scores' bookkeeping
    rows (n_gold, n_pairs, n_predicted: runs written before scores.parquet held metrics only) are no
    per-question metric, in the table or the plots."""
    copy_run(report_runs[0], tmp_path / "r")
    metrics = _summary(tmp_path / "r")["metrics"]
    assert metrics["d_f1"] is None and metrics["dr"] is None  # the run had no reader
    scores = pl.read_parquet(tmp_path / "r" / "scores.parquet")
    extra = scores.filter(pl.col("metric") == "str_em").with_columns(metric=pl.lit("n_gold"), value=pl.lit(6.0))
    pl.concat([scores, extra, extra.with_columns(metric=pl.lit("n_pairs"))]).write_parquet(tmp_path / "r/scores.parquet")
    dom = parse(report.write_report([tmp_path / "r"], tmp_path / "r.html").read_text())
    shown = [n for n in dom.iter() if "data-metric" in n.attrs]
    cards = {m: n for n in shown for m in n.attrs["data-metric"].split()}
    assert cards["d_f1"] is cards["dr"]  # one card for the metrics missing for one reason, after the others
    assert shown[-1] is cards["d_f1"] and shown[0].attrs["data-metric"] == "rouge_l"  # ROUGE-L leads
    for m in ("d_f1", "dr"):
        assert "na" in cards[m].classes
        words = " ".join(cards[m].text().split())
        assert "n/a" in words and "needs a reader" in words and "clarify eval --reader DIR" in words
    assert "Disambig-F1, DR (sqrt Disambig-F1 x ROUGE-L)" in cards["d_f1"].text()
    header = [th.text() for t in dom.iter() if "qindex" in t.classes for th in t.iter() if th.tag == "th"]
    assert "str_em" in header and "n_gold" not in header and "n_pairs" not in header
    per_q = [k for t in dom.iter() if t.tag == "details" and "question" in t.classes
             for table in t.iter() if table.tag == "table" and "kv" in table.classes for k in _kv(table)]
    assert "str_em" in per_q and "n_gold" not in per_q


def test_plots_fit_the_number_of_questions():
    """A histogram from plots.HIST_FROM questions; below that one point per question."""
    fig, (ax_few, ax_many) = plots._figure(2)
    assert plots._distribution(ax_few, [1.0, 2.0, 2.0], "red") == "one point per question"
    assert len(ax_few.patches) == 0 and len(ax_few.collections[0].get_offsets()) == 3
    assert plots._distribution(ax_many, [float(i % 5) for i in range(plots.HIST_FROM)], "red") == "questions"
    assert len(ax_many.patches) > 1 and not ax_many.collections


def test_several_runs_get_sections_and_a_comparison(report_runs, tmp_path):
    out = report.write_report(report_runs, tmp_path / "cmp.html")
    dom = parse(out.read_text())
    sections = [n for n in dom.iter() if n.tag == "section"]
    assert [s.attrs["id"] for s in sections] == ["comparison", "run-0", "run-1"]
    ids = by_id(dom)  # ids stay unique across runs
    assert "r0-q0" in ids and "r1-q2" in ids
    runs = [Run.open(d) for d in report_runs]
    table = comparison_table(runs)
    assert [Path(m).name for m in table["model"]] == ["SmolLM2-135M-Instruct", "gemma-3-270m"]
    assert table["params"].to_list() == [r.summary.params for r in runs] and None not in table["params"]
    assert table["str_em"].to_list() == [r.summary.metrics["str_em"] for r in runs]
    calls = [r.llm_calls.height / r.questions.height for r in runs]
    assert table["llm_calls_per_question"].to_list() == calls and calls[0] != calls[1]  # one model prunes
    cmp_imgs = [n for n in sections[0].iter() if n.tag == "img"]
    assert "model size" in cmp_imgs[0].attrs["alt"]
    grid = next(t for t in sections[0].iter() if t.tag == "table" and "compare" in t.classes)
    rows = [tr for tr in grid.iter() if tr.tag == "tr"]
    assert len(rows) == 3  # header + one per run


def test_report_of_two_runs_plots_wall_time_per_question(report_runs, tmp_path):
    """The wall seconds per question of each run, from summary.json as finalize writes it (`wall_s_total`,
    batch/run/pipeline.py), in the cost table and as a panel of the metrics-against-model-size plot."""
    runs = [Run.open(d) for d in report_runs]
    walls = [r.summary.wall_s_total / r.questions.height for r in runs]
    assert all(w > 0 for w in walls)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plot whose layout collapsed (matplotlib warns) fails here
        dom = parse(report.write_report(report_runs, tmp_path / "cmp.html").read_text())
    section = next(n for n in dom.iter() if n.tag == "section" and n.attrs.get("id") == "comparison")
    cost = next(t for t in section.iter() if t.tag == "table" and "cost" in t.classes)
    head = [th.text() for th in cost.iter() if th.tag == "th"]
    cells = [[td.text() for td in tr.iter() if td.tag == "td"] for tr in cost.iter() if tr.tag == "tr"][1:]
    assert [c[head.index("wall_s_per_question")] for c in cells] == [fmt(w) for w in walls]
    # the panel: one point per run at its model's size, its wall seconds per question
    table = comparison_table(runs)
    metrics = plotted_metrics(runs, table)
    panel = next(ax for ax in plots.compare_figure(table, metrics).axes if ax.get_title() == "wall_s_per_question")
    xs, ys = panel.lines[0].get_data()
    by_size = sorted(zip((r.summary.params for r in runs), walls))
    assert list(xs) == [p for p, _ in by_size] and list(ys) == pytest.approx([w for _, w in by_size])
    # ... is the plot the report embeds
    img = next(n for n in section.iter() if n.tag == "img" and "model size" in n.attrs["alt"])
    assert base64.b64decode(img.attrs["src"].split(",", 1)[1]) == plots.compare_png(table, metrics)


def test_plot_compare_log_size_axis(tmp_path):
    table = pl.DataFrame(
        {
            "model": ["gemma-3-270m", "SmolLM2-135M"],
            "params": [2.68e8, 1.35e8],
            "str_em": [31.0, 22.5],
            "rougeLsum": [25.0, 20.1],
        }
    )
    fig = plots.compare_figure(table)
    assert len(fig.axes) == 2
    for ax, metric in zip(fig.axes, ["str_em", "rougeLsum"]):
        assert ax.get_xscale() == "log" and ax.get_title() == metric
        xs, ys = ax.lines[0].get_data()
        assert list(xs) == [1.35e8, 2.68e8]  # sorted by size
        assert list(ys) == table.sort("params")[metric].to_list()
    out = plots.plot_compare(table, tmp_path / "sub" / "cmp.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InputError, match="params"):
        plots.compare_figure(table.drop("params"))


def test_plot_compare_draws_the_empty_answer_floor_in_its_metric_panel():
    table = pl.DataFrame({"model": ["a", "b"], "params": [1e8, 2e8], "sem_f1": [38.3, 38.8],
                          "sem_f1_empty": [38.25, 38.25], "rouge_l": [15.0, 16.0]})
    fig = plots.compare_figure(table, ["sem_f1", "rouge_l"])
    sem, rouge = fig.axes
    floors = [ln for ln in sem.lines if ln.get_linestyle() == "--"]
    assert len(floors) == 1 and list(floors[0].get_ydata()) == [38.25, 38.25]
    assert all(ln.get_linestyle() != "--" for ln in rouge.lines)  # no floor column for rouge_l


def test_cli_report_prints_path(report_runs, tmp_path, capsys):
    copy_run(report_runs[0], tmp_path / "r")
    parser = argparse.ArgumentParser(prog="clarify")
    report_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", str(tmp_path / "r")])
    assert args.func(args) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(tmp_path / "r" / "report.html") and Path(printed).is_file()
    args = parser.parse_args(
        ["report", str(tmp_path / "r"), "--out", str(tmp_path / "x.html"), "--max-questions", "1"]
    )
    assert args.func(args) == 0 and (tmp_path / "x.html").is_file()


def test_bad_run_directories_name_the_file(report_runs, tmp_path):
    with pytest.raises(InputError, match="no such folder"):
        Run.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="config.json is missing"):
        Run.open(tmp_path / "empty")
    copy_run(report_runs[0], tmp_path / "r")
    (tmp_path / "r" / "summary.json").write_text('{"metrics": {"a": 1},\n oops}')
    with pytest.raises(InputError, match=r"summary.json:2: damaged \(bad JSON"):
        Run.open(tmp_path / "r")
    (tmp_path / "r" / "summary.json").write_text("{}")
    (tmp_path / "r" / "spans.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="spans.parquet"):
        report.write_report([tmp_path / "r"], tmp_path / "r.html")
    (tmp_path / "r" / "spans.parquet").unlink()  # a missing table is fine: the report says so
    nodes = pl.read_parquet(tmp_path / "r" / "nodes.parquet").drop("status")
    nodes.write_parquet(tmp_path / "r" / "nodes.parquet")
    with pytest.raises(InputError, match="nodes.parquet.*'status'"):
        report.write_report([tmp_path / "r"], tmp_path / "r.html")


def test_partial_run_still_reports(report_runs, tmp_path):
    copy_run(report_runs[0], tmp_path / "r")
    n_questions = pl.read_parquet(tmp_path / "r" / "questions.parquet").height
    for name in ("answers", "spans", "scores", "llm_calls"):  # questions.parquet is written first (rundir.py)
        (tmp_path / "r" / f"{name}.parquet").unlink()
    out = report.write_report([tmp_path / "r"], tmp_path / "r.html")
    dom = parse(out.read_text())
    assert len([n for n in dom.iter() if n.tag == "details" and "question" in n.classes]) == n_questions
    assert "answers.parquet" in next(n for n in dom.iter() if "warn" in n.classes).text()


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    """`clarify ARGV` as the command line runs it: (exit status, stderr)."""
    from clarify.batch.cli import main

    rc = main(argv)
    return rc, capsys.readouterr().err


def test_out_inside_a_run_directory_is_refused_and_the_run_untouched(report_runs, tmp_path, capsys):
    """--out onto a run's own file (config.json, summary.json, a table, a part's state, a new file in its logs)
    would replace it with HTML and lose the run (docs/running-toc.md#reading-the-report): refused in one line,
    for a run named on the command line, another run, or a run reached through a symlink."""
    run = copy_run(report_runs[0], tmp_path / "r")
    other = copy_run(report_runs[1], tmp_path / "other")
    (tmp_path / "link").symlink_to(run, target_is_directory=True)
    part = next((run / "parts").iterdir()) / "state.json"
    files = {p: p.read_bytes() for p in (run / "config.json", run / "summary.json", run / "scores.parquet", part,
                                         other / "config.json")}
    for out in (*files, run / "logs" / "new.html", run / "notes.html", tmp_path / "link" / "config.json"):
        rc, err = _cli(["report", str(run), "--out", str(out)], capsys)
        assert rc == 2 and err.count("\n") == 1, (out, err)
        assert f"{out} (field '--out'): is inside the run directory" in err and "report.html" in err
    assert all(p.read_bytes() == before for p, before in files.items())
    assert not (run / "logs" / "new.html").exists() and not (run / "notes.html").exists()
    assert Run.open(run).scores.height  # the run still reads
    # its report.html, as `clarify report RUN` writes it by default, and a file outside every run are fine
    for out in (run / "report.html", tmp_path / "link" / "report.html", tmp_path / "elsewhere.html"):
        assert _cli(["report", str(run), "--out", str(out)], capsys)[0] == 0 and out.is_file()
    assert _cli(["report", str(run)], capsys)[0] == 0


def test_out_that_is_a_folder_is_refused_in_one_line(report_runs, tmp_path, capsys):
    run = copy_run(report_runs[0], tmp_path / "r")
    (tmp_path / "d").mkdir()
    for out in (tmp_path / "d", run):
        rc, err = _cli(["report", str(run), "--out", str(out)], capsys)
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert f"{out} (field '--out'): is a folder" in err
    assert list((tmp_path / "d").iterdir()) == []


def test_the_summary_groups_and_words_name_the_records_fields():
    """The folded run summary groups and names summary.json's keys (html.py SUMMARY_GROUPS, SUMMARY_WORDS): each
    is a field of its record (batch/run/records.py RunSummary, or a declared key of one of its parts), so a renamed
    field fails here, not when a page renders."""
    import dataclasses

    from clarify.batch.run.records import RunSummary, _part_fields

    fields, parts = {f.name for f in dataclasses.fields(RunSummary)}, _part_fields(RunSummary)
    assert {p for _, prefixes in labels.SUMMARY_GROUPS for p in prefixes} <= fields
    for key in labels.SUMMARY_WORDS:
        top, _, sub = key.partition(".")
        assert top in fields and (not sub or sub in parts[top]._names()), key
