"""Tests of the quote checker (clarify.batch.toc.quotes) on real QuoteSum answers and real Wikipedia passages.

Measured numbers (QuoteSum dev, 265 human summaries, 1,130 spans;
`.venv/bin/python -m pytest tests/test_quotes.py -s`):
verbatim 1,125 (99.56%): 1,045 byte-exact in the source text, 75 quoting the source *title*, 4 only
after NBSP -> space, 1 only after case-folding ("Blastocyst"); repaired 3, unmarked 2, bad source 0.
All 5 non-verbatim spans are one annotation artifact: the annotator quoted "<title> :" (3) or
"<title> :<text prefix>" (2), both parts verbatim on their own.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import polars as pl
import pytest

from clarify.batch.toc.quotes import (
    QuotedSpan,
    check_answers,
    fidelity_by_qid,
    normalise,
    parse_quoted,
    quote_fidelity,
)
from clarify.errors import InputError

DATA = Path(__file__).resolve().parents[1] / "data"
# google-research-datasets/QuoteSum evals/scorers.py (strict form) and the looser form
# docs/architecture.md#quoted-answers gives.
OFFICIAL_STRICT = re.compile(r"\[ ([1-9]) ([^\[\]]*) \]")
OFFICIAL_LOOSE = re.compile(r"\[ ?(\d) ([^\[\]]*) ?\]")


# ---------------------------------------------------------------- data


@pytest.fixture(scope="module")
def quotesum():
    """(answers, passages, rows) of QuoteSum dev: one answer per human summary (qid = unique_id);
    passage `<qid>:<k>` is source k of that question, passage_ids list the non-empty sources 1..K."""
    rows = [json.loads(line) for line in (DATA / "quotesum" / "dev.jsonl").read_text().splitlines()]
    passages, answers = {}, []
    for r in rows:
        ks = [k for k in range(1, 9) if r[f"source{k}"]]
        assert ks == list(range(1, len(ks) + 1)), "QuoteSum sources are numbered without gaps"
        for k in ks:
            passages[f"{r['qid']}:{k}"] = (r[f"title{k}"], r[f"source{k}"])
        answers.append({"qid": r["unique_id"], "answer": r["summary"],
                        "passage_ids": [f"{r['qid']}:{k}" for k in ks]})
    passages_df = pl.DataFrame(
        [{"passage_id": p, "title": t, "text": x} for p, (t, x) in passages.items()],
        schema={"passage_id": pl.String, "title": pl.String, "text": pl.String},
    )
    answers_df = pl.DataFrame(
        answers, schema={"qid": pl.String, "answer": pl.String, "passage_ids": pl.List(pl.String)}
    )
    return answers_df, passages_df, rows


@pytest.fixture(scope="module")
def checked(quotesum):
    answers, passages, _ = quotesum
    return check_answers(answers, passages, progress=False)


@pytest.fixture(scope="module")
def wiki():
    """Two real Wikipedia passages (shipped corpus) with curly apostrophes and en dashes."""
    wanted = {"81a0bc6d593f76d9", "29942cfd64305678"}
    rows = []
    with open(DATA / "wiki" / "passages.jsonl") as f:
        for line in f:
            p = json.loads(line)
            if p["id"] in wanted:
                rows.append({"passage_id": p["id"], "title": p["title"], "text": p["text"]})
    assert len(rows) == 2
    return pl.DataFrame(rows)


# ---------------------------------------------------------------- parser


@pytest.mark.parametrize(
    "answer, expected, plain",
    [
        ("[1 span] x", [(1, "span")], "span x"),
        ("[ 1 span ] x", [(1, "span")], "span x"),
        ("[\t1\n span  ]", [(1, "span")], "span"),
        # a digit glued to a word is text, not a marker
        ("[1span] and [1990s fashion]", [], "[1span] and [1990s fashion]"),
        ("[1, 2] says", [], "[1, 2] says"),
        # multi-digit source numbers are parsed (range is checked later)
        ("[12 x] y", [(12, "x")], "x y"),
        # adjacent markers
        ("[1 a][2 b] [ 3 c ]", [(1, "a"), (2, "b"), (3, "c")], "ab c"),
        # plain brackets inside a span nest and stay in the quote
        ("[1 he said [sic] so] ok", [(1, "he said [sic] so")], "he said [sic] so ok"),
        # a marker inside a span is flattened into it
        ("[1 a [2 b] c]", [(1, "a b c")], "a b c"),
        ("[1 Paris [3] is big]", [(1, "Paris  is big")], "Paris is big"),
        # unclosed: runs to the end of the answer
        ("cut [2 abc def", [(2, "abc def")], "cut abc def"),
        ("[1 a [b c] d", [(1, "a [b c] d")], "a [b c] d"),
        # stray closing brackets outside markers are literal
        ("] x [1 a ] ] b", [(1, "a")], "] x a ] b"),
        ("[[1 x]]", [(1, "x")], "[x]"),
        # empty markers (citation style)
        ("Paris [1]. [ 2 ] and [3], x [4] , y", [(1, ""), (2, ""), (3, ""), (4, "")], "Paris. and, x , y"),
        # no markers; whitespace tidy keeps line breaks
        ("  no markers \t here \n second  line ", [], "no markers here\nsecond line"),
        ("", [], ""),
    ],
)
def test_parse_quoted_edge_cases(answer, expected, plain):
    spans, got_plain = parse_quoted(answer)
    assert [(s.source_k, s.text) for s in spans] == expected
    assert [s.span_no for s in spans] == list(range(1, len(spans) + 1))
    assert got_plain == plain
    for s in spans:  # offsets cover the whole marker
        assert answer[s.start] == "["
        assert s.closed == (answer[s.end - 1] == "]")


def test_parse_quoted_offsets_and_none():
    answer = "The [ 2 Rams ] won [1 17-13 ] in [3 1995"
    spans, _ = parse_quoted(answer)
    assert [answer[s.start : s.end] for s in spans] == ["[ 2 Rams ]", "[1 17-13 ]", "[3 1995"]
    assert spans[-1] == QuotedSpan(3, 3, "1995", 33, len(answer), closed=False)
    assert parse_quoted(None) == ([], "")


def test_normalise_rules_and_offsets():
    text = "The Rams\u2019  new\u00a0stadium \u2013 \u201cTWA\u201d Dome\u00ad, Cafe\u0301 \ufb01ne"
    norm, starts, ends = normalise(text)
    assert norm == "the rams' new stadium - \"twa\" dome, café fine"
    assert len(norm) == len(starts) == len(ends)
    # the accent cluster maps back to both original characters; the ligature to its one character
    i = norm.index("é")
    assert text[starts[i] : ends[i]] == "e\u0301"
    j = norm.index("fi")
    assert text[starts[j] : ends[j + 1]] == "\ufb01"
    assert normalise("  \n ") == ("", [], [])


# ---------------------------------------------------------------- real human QuoteSum answers


def test_parser_agrees_with_official_regex_on_human_summaries(quotesum):
    """On well-formed markup the lenient parser finds exactly the official regexes' spans."""
    answers, _, _ = quotesum
    for answer in answers["answer"]:
        spans, plain = parse_quoted(answer)
        strict = [(int(m.group(1)), m.group(2).strip()) for m in OFFICIAL_STRICT.finditer(answer)]
        loose = [(int(m.group(1)), m.group(2).strip()) for m in OFFICIAL_LOOSE.finditer(answer)]
        assert [(s.source_k, s.text) for s in spans] == strict == loose
        # answer_plain agrees with the scorer's strip_attribution_tokens up to whitespace
        assert plain.split() == OFFICIAL_STRICT.sub(r"\2", answer).split()


def test_human_quotesum_verbatim_rate(quotesum, checked):
    answers, passages, _ = quotesum
    out, spans = checked
    fid = quote_fidelity(spans, out)
    print("\nhuman QuoteSum dev quote fidelity:", json.dumps(fid, indent=1))
    print(spans.group_by("status", "field").len().sort("len", descending=True))
    assert fid["n_spans"] == 1130 and fid["n_answers"] == 265 and fid["share_answers_without_spans"] == 0
    # Measured 1,125 / 1,130 = 99.56% verbatim, 99.82% after repair. Every miss is explained below,
    # so anything lower is a checker regression, not the data.
    assert fid["share_verbatim"] >= 0.995
    assert fid["share_verbatim_after_repair"] >= 0.998
    assert fid["n_bad_source"] == 0 and fid["n_empty"] == 0

    # Why the rest is not verbatim: all are "<title> :<optional text prefix>" (an annotation artifact).
    text = dict(zip(passages["passage_id"], passages["text"]))
    title = dict(zip(passages["passage_id"], passages["title"]))
    raw = {}  # the span as the annotator wrote it
    for qid, answer in zip(answers["qid"], answers["answer"]):
        for s in parse_quoted(answer)[0]:
            raw[(qid, s.span_no)] = s.text
    misses = spans.filter(pl.col("status") != "verbatim")
    for r in misses.iter_rows(named=True):
        written = raw[(r["qid"], r["span_no"])]
        print(f"  {r['status']:9} sim={r['similarity']} {r['qid']} k={r['source_k']}: {written[:90]!r}")
        head, sep, tail = written.partition(" :")
        assert sep and head == title[r["passage_id"]]
        assert tail.strip() in text[r["passage_id"]]
        if r["status"] == "repaired":  # the trailing " :" was dropped, the title re-anchored
            assert not tail.strip() and r["text"] == head

    # What normalisation buys: byte-exact vs verbatim after normalisation, and title quotes.
    verb = spans.filter(pl.col("verbatim"))
    exact = sum(
        raw[(q, n)] in (text[p] if f == "text" else title[p])
        for q, n, p, f in zip(verb["qid"], verb["span_no"], verb["passage_id"], verb["field"])
    )
    print(f"  byte-exact {exact}, only after normalisation {verb.height - exact}, "
          f"in title {int((verb['field'] == 'title').sum())}")
    assert verb.height - exact == 5  # 4 NBSP in the source, 1 case ("Blastocyst" / "blastocyst")
    assert (verb["field"] == "title").sum() == 75


def test_offsets_highlight_the_quote(quotesum, checked):
    """start/end index the original passage field, and the highlighted text normalises to the span."""
    _, passages, _ = quotesum
    _, spans = checked
    fields = {"text": dict(zip(passages["passage_id"], passages["text"])),
              "title": dict(zip(passages["passage_id"], passages["title"]))}
    anchored = spans.filter(pl.col("start") >= 0)
    assert anchored.height == 1128
    for r in anchored.iter_rows(named=True):
        src = fields[r["field"]][r["passage_id"]]
        assert 0 <= r["start"] < r["end"] <= len(src)
        assert normalise(src[r["start"] : r["end"]])[0] == normalise(r["text"])[0]
    assert (spans.filter(pl.col("start") < 0)["status"] == "unmarked").all()


def test_marker_offsets_slice_the_markers(quotesum, checked):
    """On every human summary, answer[marker_start:marker_end] is the span_no-th marker as written:
    markers in order, not overlapping, each one parsing alone to the same source and (unless repaired)
    the same text; a nested and an unclosed marker too."""
    answers, _, _ = quotesum
    _, spans = checked
    text = dict(zip(answers["qid"], answers["answer"]))
    for qid, rows in spans.sort("qid", "span_no").group_by("qid", maintain_order=True):
        answer, end = text[qid[0]], 0
        assert rows["span_no"].to_list() == list(range(1, rows.height + 1))
        for r in rows.iter_rows(named=True):
            assert end <= r["marker_start"] < r["marker_end"] <= len(answer)
            end = r["marker_end"]
            (alone,), _ = parse_quoted(answer[r["marker_start"] : r["marker_end"]])
            assert alone.source_k == r["source_k"]
            assert r["status"] == "repaired" or alone.text == r["text"]
    nested = "Intro [1 a [2 b] c] then [2 cut off"
    _, spans = check_answers(pl.DataFrame({"qid": ["n"], "answer": [nested], "passage_ids": [["x", "y"]]}),
                             pl.DataFrame({"passage_id": ["x", "y"], "text": ["a b c", "cut off"]}),
                             progress=False)
    assert [nested[s:e] for s, e in zip(spans["marker_start"], spans["marker_end"])] == [
        "[1 a [2 b] c]", "[2 cut off"]


def test_repaired_answers_are_canonical(quotesum, checked):
    """repaired_answer keeps verbatim/repaired spans as `[ k text ]` (strict official regex) and the
    unmarked ones as free text; answer_plain is the repaired answer without markers."""
    out, spans = checked
    kept = spans.filter(pl.col("status").is_in(["verbatim", "repaired"]))
    n_official = sum(len(OFFICIAL_STRICT.findall(a)) for a in out["repaired_answer"])
    assert n_official == kept.height
    for a, plain in zip(out["repaired_answer"], out["answer_plain"]):
        assert parse_quoted(a)[1] == plain
    row = out.filter(pl.col("qid") == "PAQ_val_1074_1").row(0, named=True)
    assert "[ 1 2011 Australian Football International Cup ]" in row["repaired_answer"]
    assert "Cup :" not in row["repaired_answer"]


def test_repair_of_perturbed_human_quotes(quotesum, checked):
    """Real spans with one character deleted (a typical copy slip) are re-anchored where the verbatim
    span was; spans cited against another question's passage are not (no false repairs)."""
    _, passages, _ = quotesum
    _, spans = checked
    rng = random.Random(0)
    base = spans.filter((pl.col("status") == "verbatim") & (pl.col("field") == "text")
                        & (pl.col("text").str.len_chars() >= 30))
    rows, expect = [], {}
    for i, r in enumerate(base.iter_rows(named=True)):
        t = r["text"]
        cut = rng.randrange(5, len(t) - 5)
        qid = f"del{i}"
        rows.append({"qid": qid, "answer": f"x [1 {t[:cut] + t[cut + 1:]}] y", "passage_ids": [r["passage_id"]]})
        expect[qid] = (r["start"], r["end"])
    pids = passages["passage_id"].to_list()
    for i, r in enumerate(base.iter_rows(named=True)):  # same span, a passage of another question
        q = r["passage_id"].split(":")[0]
        other = next(p for p in rng.sample(pids, 20) if p.split(":")[0] != q)
        rows.append({"qid": f"far{i}", "answer": f"[1 {r['text']}]", "passage_ids": [other]})
    _, got = check_answers(pl.DataFrame(rows), passages, progress=False)
    dels = got.filter(pl.col("qid").str.starts_with("del"))
    far = got.filter(pl.col("qid").str.starts_with("far"))
    same_place = sum(expect[q] == (s, e) for q, s, e in zip(dels["qid"], dels["start"], dels["end"]))
    overlap = sum(s < expect[q][1] and e > expect[q][0] for q, s, e in zip(dels["qid"], dels["start"], dels["end"]))
    print(f"\n1-char deletions: {dels.height} spans, repaired {int((dels['status'] == 'repaired').sum())}, "
          f"same offsets {same_place}; cross-question: {far['status'].value_counts().rows()}")
    assert dels.height > 500
    assert (dels["status"] == "repaired").all()
    assert (dels["similarity"] >= 0.9).all()
    # measured 554 / 555: the other starts mid-word ("aced the ...") and is widened to "faced the ..."
    assert same_place >= 0.99 * dels.height
    assert overlap == dels.height
    assert (far["status"] == "unmarked").mean() >= 0.99


# ---------------------------------------------------------------- check_answers on real passages


def test_check_answers_statuses_on_real_passages(wiki):
    rams, navy = "81a0bc6d593f76d9", "29942cfd64305678"
    answer = (
        # verbatim with a straight apostrophe and "--"-free ASCII hyphen for the passage's ’ and –
        "[1 The Rams' new stadium was not ready] when they arrived; "
        "they won [ 1 a 28-17 victory against the Carolina Panthers ]. "
        # case change at a sentence start still verbatim
        "[2 during the First War of Schleswig of 1848-1851] "
        # a quote of the title (not in the text)
        "the [1 History of the St. Louis Rams] "
        # a copy slip: one word dropped -> repaired
        "and [2 the Danish Navy halted all German trade in the North and Baltic Seas]; "
        # made up -> unmarked; bad source numbers; empty marker
        "[1 the Rams moved to Los Angeles in 2016] [3 nonsense] [0 zero] [1]."
    )
    answers = pl.DataFrame({"qid": ["q1"], "answer": [answer], "passage_ids": [[rams, navy]], "style": ["quoted"]})
    out, spans = check_answers(answers, wiki, progress=False)
    assert spans["status"].to_list() == [
        "verbatim", "verbatim", "verbatim", "verbatim", "repaired", "unmarked", "bad_source", "bad_source", "empty"
    ]
    assert spans["verbatim"].to_list() == [True] * 4 + [False] * 5
    assert spans["passage_id"].to_list()[:6] == [rams, rams, navy, rams, navy, rams]
    assert spans["passage_id"][6] is None
    text = dict(zip(wiki["passage_id"], wiki["text"]))
    r0, r1, r2, r3, r4 = spans.head(5).iter_rows(named=True)
    assert text[rams][r0["start"] : r0["end"]] == "The Rams\u2019 new stadium was not ready"
    assert text[rams][r1["start"] : r1["end"]] == "a 28\u201317 victory against the Carolina Panthers"
    assert text[navy][r2["start"] : r2["end"]] == "During the First War of Schleswig of 1848\u20131851"
    assert (r3["field"], r3["start"], r3["end"]) == ("title", 0, len("History of the St. Louis Rams"))
    assert r4["text"] == "the Danish Navy halted all German maritime trade in the North and Baltic Seas"
    assert text[navy][r4["start"] : r4["end"]] == r4["text"] and 0.9 <= r4["similarity"] < 1
    assert (spans.filter(~pl.col("status").is_in(["verbatim", "repaired"]))["start"] == -1).all()
    # marker_start/marker_end slice each marker, as written, out of the answer the model wrote
    markers = [answer[s:e] for s, e in zip(spans["marker_start"], spans["marker_end"])]
    assert markers == [
        "[1 The Rams' new stadium was not ready]",
        "[ 1 a 28-17 victory against the Carolina Panthers ]",
        "[2 during the First War of Schleswig of 1848-1851]",
        "[1 History of the St. Louis Rams]",
        "[2 the Danish Navy halted all German trade in the North and Baltic Seas]",
        "[1 the Rams moved to Los Angeles in 2016]",
        "[3 nonsense]",  # bad_source
        "[0 zero]",  # bad_source
        "[1]",  # empty
    ]
    assert spans["marker_start"].dtype == pl.Int32 == spans["marker_end"].dtype

    row = out.row(0, named=True)
    assert row["style"] == "quoted" and row["answer"] == answer  # input columns passed through
    ra = row["repaired_answer"]
    assert "[ 2 the Danish Navy halted all German maritime trade in the North and Baltic Seas ]" in ra
    assert "[ 1 The Rams' new stadium was not ready ]" in ra
    assert ra.endswith("the Rams moved to Los Angeles in 2016 nonsense zero.")
    assert [int(m.group(1)) for m in OFFICIAL_STRICT.finditer(ra)] == [1, 1, 2, 1, 2]
    assert row["answer_plain"].startswith("The Rams' new stadium was not ready when they arrived;")
    assert "[" not in row["answer_plain"]

    fid = quote_fidelity(spans, out)
    assert fid["n_spans"] == 9
    assert fid["share_verbatim"] == pytest.approx(4 / 9)
    assert fid["share_verbatim_after_repair"] == pytest.approx(5 / 9)
    assert fid["share_unmarked"] == pytest.approx(4 / 9)
    assert fid["share_bad_source"] == pytest.approx(2 / 9)
    assert fid["share_empty"] == pytest.approx(1 / 9)

    # threshold 1.0 disables repair; a looser one still cannot reach the made-up span
    _, strict = check_answers(answers, wiki, repair_threshold=1.0, progress=False)
    assert strict["status"][4] == "unmarked"
    _, loose = check_answers(answers, wiki, repair_threshold=0.8, progress=False)
    assert loose["status"][5] == "unmarked"


def test_check_answers_without_markers_and_nulls(wiki):
    answers = pl.DataFrame(
        {"qid": ["a", "b"], "answer": ["Plain  text, no quotes.", None], "passage_ids": [["81a0bc6d593f76d9"], None]},
        schema={"qid": pl.String, "answer": pl.String, "passage_ids": pl.List(pl.String)},
    )
    out, spans = check_answers(answers, wiki, progress=False)
    assert spans.height == 0 and "status" in spans.columns
    assert out["answer_plain"].to_list() == ["Plain text, no quotes.", ""]
    assert out["repaired_answer"].to_list() == ["Plain text, no quotes.", ""]
    fid = quote_fidelity(spans, out)
    assert fid["n_spans"] == 0 and fid["share_verbatim"] is None
    assert fid["share_answers_without_spans"] == 1.0


def test_check_answers_bad_input(wiki):
    ok = {"qid": ["a"], "answer": ["[1 x]"], "passage_ids": [["81a0bc6d593f76d9"]]}
    with pytest.raises(InputError, match="not in the passages table.*nope"):
        check_answers(pl.DataFrame({**ok, "passage_ids": [["nope"]]}), wiki, progress=False)
    with pytest.raises(InputError, match="one row per qid"):
        check_answers(pl.DataFrame({k: v * 2 for k, v in ok.items()}), wiki, progress=False)
    with pytest.raises(InputError, match="repair_threshold"):
        check_answers(pl.DataFrame(ok), wiki, repair_threshold=0, progress=False)
    clash = pl.concat([wiki, wiki.head(1).with_columns(pl.lit("other").alias("text"))])
    with pytest.raises(InputError, match="twice"):
        check_answers(pl.DataFrame(ok), clash, progress=False)
    with pytest.raises(ValueError, match="missing column"):
        check_answers(pl.DataFrame({"qid": ["a"]}), wiki, progress=False)


def test_fidelity_by_qid(checked):
    _, spans = checked
    per = fidelity_by_qid(spans)
    assert per.height == 265
    assert per["n_spans"].sum() == 1130
    row = per.filter(pl.col("qid") == "PAQ_val_1074_1").row(0, named=True)
    assert row["n_repaired"] == 2
    assert row["share_verbatim_after_repair"] == 1.0
    assert row["share_verbatim"] == pytest.approx((row["n_spans"] - 2) / row["n_spans"])
