"""Tests of `clarify report` (batch/report/html.py) and the plots (batch/report/plots.py).

The run directories are built from real data: ASQA dev questions and their disambiguations
(data/asqa/dev.json), Wikipedia passages (data/wiki/passages.jsonl) retrieved per tree node with a
small BM25, quoted answers whose spans are real substrings of those passages (plus one repaired
and one bad-source span), and a hostile model output to check escaping.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import re
from collections import Counter
from functools import lru_cache
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest

from clarify import schemas
from clarify.batch.report import html as report
from clarify.batch.report import plots
from clarify.batch.rundir import Run
from clarify.batch.toc import quotes
from clarify.errors import InputError
from tests.run_fixtures import write_run

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)> True"
TOKEN = re.compile(r"\w+")


# ------------------------------------------------------------------ a real run directory


@lru_cache(maxsize=1)
def _asqa() -> dict:
    return json.loads((ROOT / "data/asqa/dev.json").read_text())["dev"]


@lru_cache(maxsize=1)
def _corpus() -> tuple[list[dict], list[Counter], dict[str, int], float]:
    rows = [json.loads(line) for line in (ROOT / "data/wiki/passages.jsonl").open()]
    tfs = [Counter(TOKEN.findall(f"{r['title']} {r['text']}".lower())) for r in rows]
    df: Counter = Counter()
    for tf in tfs:
        df.update(tf.keys())
    avg = sum(sum(tf.values()) for tf in tfs) / len(tfs)
    return rows, tfs, dict(df), avg


def bm25_top(query: str, k: int = 5) -> list[tuple[dict, float]]:
    """Okapi BM25 (Robertson & Zaragoza 2009, eq. 3.? with k1=0.9, b=0.4 as in Pyserini's defaults)."""
    rows, tfs, df, avg = _corpus()
    n = len(rows)
    terms = set(TOKEN.findall(query.lower()))
    k1, b = 0.9, 0.4
    scored = []
    for row, tf in zip(rows, tfs):
        dl = sum(tf.values())
        s = 0.0
        for t in terms:
            f = tf.get(t, 0)
            if f:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += idf * f * (k1 + 1) / (f + k1 * (1 - b + b * dl / avg))
        if s > 0:
            scored.append((row, s))
    scored.sort(key=lambda x: (-x[1], x[0]["id"]))
    return scored[:k]


def build_run_dir(
    run_dir: Path,
    *,
    model: str = "SmolLM2-135M-Instruct",
    params: float | None = 1.35e8,
    n_questions: int = 3,
) -> dict:
    """Write a run directory for the first `n_questions` ASQA dev questions; return what was written.

    Question 0 gets every node status (root, valid+expanded, valid, pruned, duplicate at depth 2) and
    a quoted answer with verbatim, repaired and bad-source spans; its pruned node carries HOSTILE
    model output as verdict and the answer's connector text too.
    """
    asqa = _asqa()
    qids = list(asqa)[:n_questions]
    questions, nodes, hits, calls, raw_answers, scores = [], [], [], [], [], []
    used_passages: dict[str, dict] = {}

    def add_hits(qid: str, node_id: str, query: str, wave: int, skip: int = 0) -> list[dict]:
        top = bm25_top(query, k=5 + skip)[skip:]
        for rank, (row, score) in enumerate(top, 1):
            used_passages[row["id"]] = row
            hits.append(
                {
                    "qid": qid,
                    "node_id": node_id,
                    "query": query,
                    "passage_id": row["id"],
                    "score": score,
                    "rank": rank,
                    "retriever": "bm25",
                    "wave": wave,
                }
            )
        return [r for r, _ in top]

    def call(
        step: str, qid: str, node_id: str, wave: int, prompt: str, completion: str, cached: bool
    ) -> None:
        calls.append(
            {
                "call_id": f"{qid}-{node_id}-{step}",
                "step": step,
                "qid": qid,
                "node_id": node_id,
                "wave": wave,
                "model": model,
                "prompt": prompt,
                "completion": completion,
                "finish_reason": "stop",
                "prompt_tokens": len(prompt.split()),
                "output_tokens": len(completion.split()),
                "cached": cached,
                "parse_error": None,
            }
        )

    for qi, qid in enumerate(qids):
        item = asqa[qid]
        aq = item["ambiguous_question"]
        questions.append({"qid": qid, "question": aq, "dataset": "asqa"})
        root_top = add_hits(qid, "n0", aq, wave=1)
        if qi == 0:  # a restart from the root retrieves again, without the passages already used
            add_hits(qid, "n0", aq, wave=3, skip=5)
        nodes.append(
            {
                "qid": qid,
                "node_id": "n0",
                "parent_id": None,
                "depth": 0,
                "question": aq,
                "answers": [],
                "status": "root",
                "wave": 0,
                "evidence_passage_id": None,
                "verdict_text": None,
            }
        )
        call(
            "clarify",
            qid,
            "n0",
            0,
            f"Context: ...\nQuestion: {aq}\nDisambiguations:",
            "\n".join(
                f"DQ {i}: {p['question']}\nDA {i}: {p['short_answers'][0]}"
                for i, p in enumerate(item["qa_pairs"], 1)
            ),
            cached=False,
        )
        plan = ["valid", "valid", "pruned", "valid", "valid", "valid"]
        for i, pair in enumerate(item["qa_pairs"][:6]):
            status = plan[i] if qi == 0 else ("valid" if i < 2 else "pruned")
            node_id = f"n{i + 1}"
            top = add_hits(qid, node_id, pair["question"], wave=2)
            answer = pair["short_answers"][0]
            evidence = next((r["id"] for r in top if answer.lower() in r["text"].lower()), top[0]["id"])
            verdict = (
                HOSTILE if (qi == 0 and status == "pruned") else ("False" if status == "pruned" else "True")
            )
            nodes.append(
                {
                    "qid": qid,
                    "node_id": node_id,
                    "parent_id": "n0",
                    "depth": 1,
                    "question": pair["question"],
                    "answers": pair["short_answers"][:2],
                    "status": status,
                    "wave": 1,
                    "evidence_passage_id": evidence,
                    "verdict_text": verdict,
                }
            )
            call(
                "verify",
                qid,
                node_id,
                1,
                f"Context: {evidence}\nQuestion: {aq}\nProposed Answer: {answer}",
                verdict,
                cached=i % 2 == 1,
            )
        if qi == 0:
            # Expanding n1 proposed its own question again: a duplicate at depth 2.
            first = item["qa_pairs"][0]
            nodes.append(
                {
                    "qid": qid,
                    "node_id": "n1.1",
                    "parent_id": "n1",
                    "depth": 2,
                    "question": first["question"],
                    "answers": first["short_answers"][:1],
                    "status": "duplicate",
                    "wave": 2,
                    "evidence_passage_id": None,
                    "verdict_text": None,
                }
            )
            add_hits(qid, "n1.1", first["question"], wave=3)
            call(
                "clarify",
                qid,
                "n1",
                2,
                f"Question: {first['question']}\nDisambiguations:",
                f"DQ 1: {first['question']}\nDA 1: {first['short_answers'][0]}",
                cached=False,
            )
        # A quoted answer over the root's passages, as the model would write it (real passage text).
        sources = root_top[:3]
        t1 = sources[0]["text"]
        raw = f"It depends on the competition: [1 {' '.join(t1.split()[:6])}]."
        if qi == 0:
            t2 = sources[1]["text"].split()
            near_miss = t2[8:14]
            near_miss[1] = near_miss[1].upper() + "S"  # one changed word: the checker repairs it
            raw += (
                f" Meanwhile <b>bold</b> & {HOSTILE[:40]} [2 {' '.join(t2[2:8])}], and [2 {' '.join(near_miss)}]"
                " [7 a source the prompt never had] [3 zebra quantum marmalade orbit] "
                f"[1 {' '.join(t1.split()[2:9])}] [3 {sources[2]['title']}] [1]."
            )
        raw_answers.append(
            {"qid": qid, "answer": raw, "passage_ids": [r["id"] for r in sources], "style": "quoted"}
        )
        call("answer", qid, "n0", 3, "Answer:", raw, cached=False)
    # The project's quote checker anchors, repairs or unmarks every span (as the pipeline does).
    passages_df = pl.DataFrame(
        [{"passage_id": r["id"], "title": r["title"], "text": r["text"]} for r in used_passages.values()],
        schema=schemas.PASSAGES,
    )
    raw_df = pl.DataFrame(
        raw_answers, schema={k: v for k, v in schemas.ANSWERS.items() if k != "answer_plain"}
    )
    checked, spans_df = quotes.check_answers(
        raw_df.with_columns(answer_raw=pl.col("answer")), passages_df, progress=False
    )
    answers_df = schemas.conform(
        checked.with_columns(answer=pl.col("repaired_answer")).drop("repaired_answer"), "answers"
    )
    for qid, item in ((q, asqa[q]) for q in qids):
        # STR-EM (ASQA paper §3.3): share of qa_pairs with a short answer inside the answer text.
        plain = answers_df.filter(pl.col("qid") == qid)["answer_plain"][0].lower()
        hit = [any(a.lower() in plain for a in p["short_answers"]) for p in item["qa_pairs"]]
        mine = spans_df.filter(pl.col("qid") == qid)
        scores.append({"qid": qid, "metric": "str_em", "value": 100.0 * sum(hit) / len(hit)})
        scores.append({"qid": qid, "metric": "answer_words", "value": float(len(plain.split()))})
        scores.append({"qid": qid, "metric": "quote_verbatim", "value": 100.0 * mine["verbatim"].mean()})
    tables = {
        "questions": schemas.conform(pl.DataFrame(questions), "questions"),
        "nodes": schemas.conform(pl.DataFrame(nodes, schema=schemas.NODES), "nodes"),
        "hits": pl.DataFrame(hits),
        "llm_calls": schemas.conform(pl.DataFrame(calls, schema=schemas.LLM_CALLS), "llm_calls"),
        "answers": answers_df,
        "spans": spans_df,
        "passages": passages_df,
        "scores": schemas.conform(pl.DataFrame(scores), "scores"),
    }
    metrics = {m: v for m, v in tables["scores"].group_by("metric").agg(pl.col("value").mean()).iter_rows()}
    all_spans = tables["spans"]
    summary = {
        "metrics": metrics,
        "wall_s": 12.5,
        "llm_calls": len(calls),
        "tokens": {
            "prompt": int(tables["llm_calls"]["prompt_tokens"].sum()),
            "output": int(tables["llm_calls"]["output_tokens"].sum()),
        },
        "quote_fidelity": {"spans": all_spans.height, "verbatim": int(all_spans["verbatim"].sum())},
    }
    if params is not None:
        summary["params"] = params
    summary["name"] = run_dir.name
    settings = {"dataset": "asqa", "model.model": model, "model.max_model_len": 6144, "index": "wiki-bm25",
                "answer_style": "quoted", "limit": n_questions, "toc.max_depth": 3, "toc.max_nodes": 10,
                "toc.max_expansions": 15}
    write_run(run_dir, settings, summary, **tables)
    return {"tables": tables, "summary": summary, "config": Run.open(run_dir).settings}


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


def parse(html_text: str) -> Node:
    b = DomBuilder()
    b.feed(html_text)
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
def one_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "smol-asqa"
    written = build_run_dir(run_dir)
    out = report.write_report([run_dir], run_dir / "report.html")
    return run_dir, written, out.read_text(encoding="utf-8")


def test_every_node_present_with_its_status(one_run):
    _, written, text = one_run
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
        assert badge.text() == report.STATUS_LABELS[r["status"]]
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
    ptext = dict(zip(passages["passage_id"], passages["text"]))
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
        assert got == want and all(len(g) == 5 for g in got)
        n_lists += len(got)
        for li in body.iter():
            if li.tag == "li" and "passage" in li.classes:
                assert ptext[li.attrs["data-passage-id"]] in li.text()
    assert n_lists == hits.select("qid", "node_id", "wave").unique().height


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
            assert "⚠" in a.text() and report.SPAN_LABELS[status] in a.text()
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
    env = report.environment()
    assert env.from_string("{{ x }}").render(x="<b>") == "&lt;b&gt;"
    assert env.get_template("report.html.j2").environment.autoescape is True
    _, _, text = one_run
    dom = parse(text)
    style = next(n for n in dom.iter() if n.tag == "style").text()
    script = next(n for n in dom.iter() if n.tag == "script").text()
    css = (report.TEMPLATES / "report.css").read_text(encoding="utf-8")
    js = (report.TEMPLATES / "report.js").read_text(encoding="utf-8")
    assert style.strip() == css.strip() and ".qspan.nonverbatim{" in style
    assert script.strip() == js.strip() and "addEventListener('click'" in script


def test_hostile_text_in_every_run_file_is_escaped(tmp_path):
    """Model output and run files are untrusted: <script> in a question, an answer, a passage, a node,
    a config or summary value (or key) and a score name comes out as text, never as markup."""
    run_dir = tmp_path / "r"
    written = build_run_dir(run_dir, n_questions=1)
    t = written["tables"]
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
    config = {**written["config"], "index": HOSTILE, "questions": HOSTILE}
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "summary.json").write_text(json.dumps({**written["summary"], "name": HOSTILE, HOSTILE: HOSTILE}))
    text = report.write_report([run_dir], tmp_path / "r.html").read_text(encoding="utf-8")
    dom = parse(text)
    assert len([n for n in dom.iter() if n.tag == "script"]) == 1  # ours
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
    dom = parse(f'<p class="passage">{report._highlight(text, [(1, *a), (2, *b)], "t")}</p>')
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
    assert len(scripts) == 1 and "src" not in scripts[0].attrs  # only our inline script
    assert not any("onerror" in n.attrs for n in dom.iter())
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in text
    verdicts = [n.text() for n in dom.iter() if "verdict" in n.classes]
    assert HOSTILE in verdicts
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
    shape = plots.tree_shape(written["tables"]["nodes"])
    q0 = list(_asqa())[0]
    row = shape.filter(pl.col("qid") == q0).row(0, named=True)
    # Question 0 (3 qa_pairs): n1 (expanded) + n2 valid; n3 pruned; n1.1 duplicate at depth 2.
    assert (row["valid_nodes"], row["max_depth"], row["nodes"]) == (2, 2, 5)


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
    assert kinds == ["headline", "question", "question", "question", "plots", "runinfo", "runinfo"]
    cards = {m: n for n in run.iter() if "data-metric" in n.attrs for m in n.attrs["data-metric"].split()}
    for m, v in written["summary"]["metrics"].items():
        value = next(c for c in cards[m].iter() if "mvalue" in c.classes).text()
        assert value == f"{v:.4g}"
    assert "answer length (words)" not in text  # only the run's own metrics
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
    assert groups["Model and engine"]["model"] == "SmolLM2-135M-Instruct"
    assert groups["Tree of clarifications"]["max_depth"] == "3" and groups["Run"]["dataset"] == "asqa"
    fid = written["summary"]["quote_fidelity"]
    assert groups["Quotes"]["quote fidelity: verbatim"] == str(fid["verbatim"])
    assert groups["Work per question"]["LLM calls"] == str(written["summary"]["llm_calls"])


def test_missing_metrics_say_why_and_bookkeeping_is_not_a_metric(tmp_path):
    """A metric not computed reads "n/a" with what it needs (Disambig-F1, DR: a reader); the scores' bookkeeping
    rows (n_gold, n_pairs, n_predicted) are no per-question metric, in the table or the plots."""
    written = build_run_dir(tmp_path / "r", n_questions=2)
    summary = {**written["summary"], "metrics": {**written["summary"]["metrics"], "d_f1": None, "dr": None}}
    (tmp_path / "r" / "summary.json").write_text(json.dumps(summary))
    scores = written["tables"]["scores"]
    extra = scores.filter(pl.col("metric") == "str_em").with_columns(metric=pl.lit("n_gold"), value=pl.lit(6.0))
    pl.concat([scores, extra, extra.with_columns(metric=pl.lit("n_pairs"))]).write_parquet(tmp_path / "r/scores.parquet")
    dom = parse(report.write_report([tmp_path / "r"], tmp_path / "r.html").read_text())
    shown = [n for n in dom.iter() if "data-metric" in n.attrs]
    cards = {m: n for n in shown for m in n.attrs["data-metric"].split()}
    assert cards["d_f1"] is cards["dr"]  # one card for the metrics missing for one reason, after the others
    assert shown[-1] is cards["d_f1"] and shown[0].attrs["data-metric"] == "str_em"
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


def test_several_runs_get_sections_and_a_comparison(tmp_path):
    small = build_run_dir(tmp_path / "smol", model="SmolLM2-135M-Instruct", params=1.35e8, n_questions=3)
    big = build_run_dir(tmp_path / "gemma", model="gemma-3-270m", params=2.68e8, n_questions=3)
    out = report.write_report([tmp_path / "smol", tmp_path / "gemma"], tmp_path / "cmp.html")
    dom = parse(out.read_text())
    sections = [n for n in dom.iter() if n.tag == "section"]
    assert [s.attrs["id"] for s in sections] == ["comparison", "run-0", "run-1"]
    ids = by_id(dom)  # ids stay unique across runs
    assert "r0-q0" in ids and "r1-q2" in ids
    table = report.comparison_table([Run.open(tmp_path / "smol"), Run.open(tmp_path / "gemma")])
    assert table["model"].to_list() == ["SmolLM2-135M-Instruct", "gemma-3-270m"]
    assert table["str_em"].to_list() == [
        small["summary"]["metrics"]["str_em"],
        big["summary"]["metrics"]["str_em"],
    ]
    calls = [small["tables"]["llm_calls"].height / 3, big["tables"]["llm_calls"].height / 3]
    assert table["llm_calls_per_question"].to_list() == calls
    cmp_imgs = [n for n in sections[0].iter() if n.tag == "img"]
    assert "model size" in cmp_imgs[0].attrs["alt"]
    grid = next(t for t in sections[0].iter() if t.tag == "table" and "compare" in t.classes)
    rows = [tr for tr in grid.iter() if tr.tag == "tr"]
    assert len(rows) == 3  # header + one per run


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


def test_cli_report_prints_path(tmp_path, capsys):
    build_run_dir(tmp_path / "r", n_questions=1)
    parser = argparse.ArgumentParser(prog="clarify")
    report.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", str(tmp_path / "r")])
    assert args.func(args) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(tmp_path / "r" / "report.html") and Path(printed).is_file()
    args = parser.parse_args(
        ["report", str(tmp_path / "r"), "--out", str(tmp_path / "x.html"), "--max-questions", "1"]
    )
    assert args.func(args) == 0 and (tmp_path / "x.html").is_file()


def test_bad_run_directories_name_the_file(tmp_path):
    with pytest.raises(InputError, match="no such folder"):
        Run.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="config.json is missing"):
        Run.open(tmp_path / "empty")
    build_run_dir(tmp_path / "r", n_questions=1)
    (tmp_path / "r" / "summary.json").write_text('{"metrics": {"a": 1},\n oops}')
    with pytest.raises(InputError, match=r"summary.json: damaged .*line 2"):
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


def test_partial_run_still_reports(tmp_path):
    build_run_dir(tmp_path / "r", n_questions=2)
    for name in ("answers", "spans", "scores", "llm_calls"):  # questions.parquet is written first (rundir.py)
        (tmp_path / "r" / f"{name}.parquet").unlink()
    out = report.write_report([tmp_path / "r"], tmp_path / "r.html")
    dom = parse(out.read_text())
    assert len([n for n in dom.iter() if n.tag == "details" and "question" in n.classes]) == 2
    assert "answers.parquet" in next(n for n in dom.iter() if "warn" in n.classes).text()


def test_report_of_a_pipeline_run_directory(tmp_path):
    """The run directory written by `clarify.batch.pipeline.run` (scripted engine, stand-in index over
    real passages) renders: every node, every span, node passages from its hits."""
    from clarify.batch import config
    from clarify.batch.pipeline import run
    from clarify.local_llm.scripted import ScriptedEngine
    from tests.test_toc import make_responder
    from tests.toc_fakes import FakeIndex

    cfg = config.load(
        None, {"dataset": "asqa", "limit": 3, "answer_style": "quoted", "toc.max_expansions": 4}
    )
    index = FakeIndex()
    run(
        cfg,
        tmp_path / "run",
        engine_factory=lambda c: ScriptedEngine("s", make_responder()),
        index=index,
        progress=False,
    )
    out = report.write_report([tmp_path / "run"], tmp_path / "run.html")
    dom = parse(out.read_text())
    loaded = Run.open(tmp_path / "run")
    assert loaded.missing == []
    shown = {
        (
            next(a for a in n.ancestors() if "question" in a.classes).attrs["data-qid"],
            n.attrs["data-node-id"],
            n.attrs["data-status"],
        )
        for n in dom.iter()
        if n.tag == "details" and "node" in n.classes
    }
    assert shown == {(r["qid"], r["node_id"], r["status"]) for r in loaded.nodes.iter_rows(named=True)}
    assert len(_answer_spans(dom)) == loaded.spans.height > 0
    _check_span_links(dom, loaded.spans, loaded.passages)
    passages_shown = [n for n in dom.iter() if n.tag == "li" and "passage" in n.classes]
    assert len(passages_shown) >= loaded.nodes.height  # every node got its retrieved passages
