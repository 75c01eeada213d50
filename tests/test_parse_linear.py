"""Model output and prediction files are untrusted input: every parser and regex that reads them runs
in linear time or under a stated cap (docs/reproducibility.md#untrusted-model-output); JSONL lines are read up to a stated length.

Each pathological input runs under a time limit (`within`, signal.alarm: the test fails instead of
hanging). The limits are generous for a slow shared 2-core CPU, where the fixed code takes
milliseconds (quote repair: ~2-3 s at its budget); the old code's time on the same machine is given
with each. Every rewritten pattern is checked against the old one, copied here, on random short inputs
(where the old one is fast) and on the shipped QuoteSum summaries.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import random
import re
import signal
import tracemalloc
from pathlib import Path

import polars as pl
import pytest

from clarify.batch.run.pipeline import _add_quote_notes
from clarify.batch.toc import format as fmt
from clarify.batch.toc import quotes
from clarify.errors import InputError
from clarify.eval import quotesum
from clarify.jsonl import MAX_LINE_BYTES, iter_jsonl

DATA = Path(__file__).resolve().parents[1] / "data"


@contextlib.contextmanager
def within(seconds: int):
    """Fail the test when the block runs longer than `seconds` (SIGALRM interrupts Python code and re's
    matching loop alike)."""

    def expire(signum, frame):
        raise TimeoutError(f"took more than {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _random_strings(alphabet: list[str], n: int, max_len: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(max_len + 1))) for _ in range(n)]


@pytest.fixture(scope="module")
def summaries() -> list[str]:
    """The 265 human QuoteSum dev summaries: real `[ k span ]` markup."""
    return [json.loads(line)["summary"] for line in (DATA / "quotesum" / "dev.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- the old patterns (reference)

OLD_DQ = re.compile(r"^\s*(?:[-*•]\s*)?\**DQ\s*(\d*)\s*\**\s*[:.)]\s*(.*)$", re.IGNORECASE)
OLD_DA = re.compile(r"^\s*(?:[-*•]\s*)?\**DA\s*(\d*)\s*\**\s*[:.)]\s*(.*)$", re.IGNORECASE)
OLD_ANSWER = re.compile(r"^\s*Answer\s*:", re.IGNORECASE)
OLD_LOOSE = re.compile(r"\[ ?([1-9]) +([^\[\]]*?) ?\]")


def old_clean_long_answer(completion: str) -> str:
    text = completion.strip()
    text = re.sub(r"^\s*Answer\s*:\s*", "", text, flags=re.IGNORECASE)
    text = re.split(r"\n\s*(?:---|Question\s*:|Context\s*:)", text, maxsplit=1)[0]
    return " ".join(text.split())


def old_tidy(text: str) -> str:
    text = re.sub(r"[^\S\n]*\x00(?=[,.;:!?)])", "", text).replace("\x00", "")
    lines = [re.sub(r"[^\S\n]+", " ", line).strip() for line in text.split("\n")]
    return "\n".join(lines).strip()


def old_canonical_markers(text: str) -> str:
    return OLD_LOOSE.sub(lambda m: f"[ {m.group(1)} {m.group(2).strip()} ]", text)


def old_parse(s: str, i: int, inside: bool) -> tuple[list, int, bool]:
    """batch/toc/quotes.py `_parse` as it was: recursive, one level per nested marker."""
    parts: list = []
    buf: list[str] = []
    depth = 0
    n = len(s)
    while i < n:
        c = s[i]
        if c == "[":
            m = quotes._OPEN.match(s, i)
            if m:
                if buf:
                    parts.append("".join(buf))
                    buf = []
                sub, j, closed = old_parse(s, m.end(), True)
                parts.append(quotes._Node(int(m.group(1)), i, j, closed, sub))
                i = j
                continue
            if inside:
                depth += 1
        elif c == "]" and inside:
            if depth == 0:
                if buf:
                    parts.append("".join(buf))
                return parts, i + 1, True
            depth -= 1
        buf.append(c)
        i += 1
    if buf:
        parts.append("".join(buf))
    return parts, n, False


def old_flat(node) -> str:
    return "".join(p if isinstance(p, str) else old_flat(p) for p in node.parts)


def old_spans(answer: str) -> list[tuple]:
    parts, _, _ = old_parse(answer, 0, False)
    return [(p.k, old_flat(p).strip(), p.start, p.end, p.closed) for p in parts if isinstance(p, quotes._Node)]


# ---------------------------------------------------------------- same results as the old patterns

LINE_ALPHABET = ["D", "Q", "A", "d", "q", "a", " ", "  ", "\t", "\n", "1", "2", "*", "-", "•", ":", ".", ")",
                 "x", "DQ", "DA", "Answer", "nswer"]


def _groups(m):
    return None if m is None else (m.span(), m.groups())


def test_dq_da_answer_patterns_match_the_old_ones():
    lines = _random_strings(LINE_ALPHABET, 20_000, 10, seed=1)
    lines += ["DQ 1: who?", "**DQ 2** : what", " - DA1) a; b", "* *DQ:x", "DQ 12 ** . q", "Answer :", "  answer:x"]
    for line in lines:
        for old, new in ((OLD_DQ, fmt._DQ), (OLD_DA, fmt._DA), (OLD_ANSWER, fmt._ANSWER)):
            assert _groups(new.match(line)) == _groups(old.match(line)), (old.pattern, line)


def test_official_split_patterns_match_the_official_ones():
    # toc/utils.py:37-38 splits on `DQ\s*\d*:` / `DA\s*\d*:`; format.py's possessive forms split the same
    lines = _random_strings(LINE_ALPHABET, 20_000, 10, seed=2)
    lines += ["[1] DQ 2: a", "DQ12  : q DQ 3: r", "xDA:y", "DA 1 1: z"]
    for line in lines:
        for plain, new in ((r"DQ\s*\d*:", fmt._OFFICIAL_DQ), (r"DA\s*\d*:", fmt._OFFICIAL_DA)):
            assert new.split(line) == re.split(plain, line), (plain, line)


def test_clean_long_answer_matches_the_old_one():
    texts = _random_strings([" ", "\n", "\t", "---", "--", "Question", "Context", "Answer", ":", "x", "y z", "\r"],
                            20_000, 12, seed=2)
    for text in texts:
        assert fmt.clean_long_answer(text) == old_clean_long_answer(text), repr(text)


def test_tidy_matches_the_old_one():
    for text in _random_strings([" ", "\t", "\n", "\x00", ",", ".", ")", "x", "\u00a0"], 20_000, 12, seed=3):
        assert quotes._tidy(text) == old_tidy(text), repr(text)


def test_canonical_markers_match_the_old_ones(summaries):
    texts = _random_strings(["[", "]", " ", "  ", "1", "0", "x", "\n", "[ 1 ", "[1 "], 20_000, 12, seed=4)
    for text in texts + summaries:
        assert quotesum.canonical_markers(text) == old_canonical_markers(text), repr(text)


def test_quote_parser_matches_the_old_recursive_one(summaries):
    texts = _random_strings(["[", "]", " ", "1", "2", "x", "[1 ", "[ 2 ", "[12", "\n"], 20_000, 14, seed=5)
    for text in texts + summaries:
        spans, _ = quotes.parse_quoted(text)
        assert [(s.source_k, s.text, s.start, s.end, s.closed) for s in spans] == old_spans(text), repr(text)


# ---------------------------------------------------------------- pathological model output


@pytest.mark.parametrize("label", ["DQ", "DA"])
def test_label_line_of_16k_spaces(label):
    # old: "DQ" + 3,200 spaces + "x" 50 s (cubic: 0.9 s at 800, 6.9 s at 1,600); 16,000 was killed at 60 s
    with within(5):
        parsed = fmt.parse_disambiguations(label + " " * 16_000 + "x")
        assert parsed.pairs == [] and parsed.notes == ["no DQ/DA lines"]
        spaced = fmt.parse_disambiguations(f"DQ 1{' ' * 20_000}: who?\nDA 1 :{' ' * 20_000}a; b")
    assert [(p.question, p.answers) for p in spaced.pairs] == [("who?", ("a", "b"))]


def test_clean_long_answer_on_40k_blank_lines():
    # old: 19 s for 40,000 newlines, 6.6 s for 20,000 "\n " (every newline rescanned the blanks after it)
    with within(5):
        assert fmt.clean_long_answer("a" + "\n" * 40_000 + "b") == "a b"
        assert fmt.clean_long_answer("a" + "\n " * 20_000 + "Question: b") == "a"


def test_canonical_markers_on_80k_spaces():
    # old: 15 s for "[ 1" + 40,000 spaces, 92 s for 80,000 (quadratic)
    with within(5):
        assert quotesum.canonical_markers("[ 1" + " " * 80_000) == "[ 1" + " " * 80_000
        assert quotesum.canonical_markers("[1" + " " * 80_000 + "x]") == "[ 1 x ]"


def test_tidy_on_100k_spaces():
    # old: 11 s for 40,000 spaces, 54 s for 100,000 (quadratic); the blanks before an empty marker that
    # punctuation follows go with it
    answer = " " * 100_000 + "x" + " " * 100_000 + "[1]. y" + " " * 100_000
    with within(5):
        assert quotes.parse_quoted(answer) == ([quotes.QuotedSpan(1, 1, "", 200_001, 200_004)], "x. y")


@pytest.mark.parametrize("closed", [False, True])
def test_5000_nested_markers(closed):
    # old: RecursionError (from ~1,000 nested markers on), so finalize never finished
    answer = "[1 " * 5_000 + "x" + ("]" * 5_000 if closed else "")
    with within(5):
        spans, plain = quotes.parse_quoted(answer)
        assert [(s.source_k, s.text, s.start, s.end, s.closed) for s in spans] == [(1, "x", 0, len(answer), closed)]
        assert plain == "x"
        answers = pl.DataFrame([{"qid": "q", "answer": answer, "passage_ids": ["p"]}])
        out, rows = quotes.check_answers(answers, pl.DataFrame({"passage_id": ["p"], "text": ["a x b"]}), progress=False)
    assert rows["status"].to_list() == ["verbatim"] and out["repaired_answer"][0] == "[ 1 x ]"


def test_source_numbers_past_the_int32_column():
    # old: int() refused 5,000 digits (ValueError); 11 digits overflowed the spans table's Int32 column
    answer = f"[{'9' * 5_000} a] [99999999999 b] [0000000002 c]"
    spans, _ = quotes.parse_quoted(answer)
    assert [s.source_k for s in spans] == [quotes.K_MAX, quotes.K_MAX, 2]
    answers = pl.DataFrame([{"qid": "q", "answer": answer, "passage_ids": ["p", "p"]}])
    _, rows = quotes.check_answers(answers, pl.DataFrame({"passage_id": ["p"], "text": ["a b c"]}), progress=False)
    assert rows["status"].to_list() == ["bad_source", "bad_source", "verbatim"]


# ---------------------------------------------------------------- quote repair's work budget


@pytest.fixture(scope="module")
def long_passage() -> dict:
    """A 3,093-character passage of the shipped Wikipedia sample."""
    with open(DATA / "wiki" / "passages.jsonl") as f:
        return next(p for p in map(json.loads, f) if len(p["text"]) == 3093)


def _paraphrased(text: str) -> str:
    # every third word of 4+ letters reversed: the same characters (the cheap bound stays high), not the text
    words = text.split(" ")
    return " ".join(w[::-1] if i % 3 == 1 and len(w) > 3 else w for i, w in enumerate(words))


def _shuffled(text: str) -> str:
    words = text.split(" ")
    random.Random(0).shuffle(words)
    return " ".join(words)


@pytest.mark.parametrize("alter", [_paraphrased, _shuffled])
def test_repair_of_a_long_altered_quote_stops_at_its_budget(long_passage, alter):
    # old: the paraphrased 1,091-character quote was killed at 200 s, the shuffled one at 600 s
    quote = alter(long_passage["text"][1000:2091])
    answers = pl.DataFrame([{"qid": "q", "answer": f"x [1 {quote}] y", "passage_ids": [long_passage["id"]]}])
    passages = pl.DataFrame([{k: long_passage[k] for k in ("title", "text")} | {"passage_id": long_passage["id"]}])
    with within(30):  # ~2-3 s here
        out, spans = quotes.check_answers(answers, passages, progress=False)
    assert spans["status"].to_list() == ["unmarked"]
    assert out["quote_note"].to_list() == [
        f"quote repair of span 1 stopped at its work budget ({quotes.REPAIR_BUDGET:,} character steps): left unmarked"]


def test_repair_budget_keeps_the_best_window_found_so_far():
    text = ("First the Rams won the game against the Titans 16 to 23 in Atlanta. "
            "Then the Rams won the game against the Titan 23 to 16 in Atlanta.")
    quote = "the Rams won the game against the Titans 23 to 16 in Atlanta"
    passages = pl.DataFrame({"passage_id": ["p"], "title": ["Super Bowl"], "text": [text]})
    answers = pl.DataFrame([{"qid": "q", "answer": f"[1 {quote}]", "passage_ids": ["p"]}])
    targets = [quotes._Target.of("text", text), quotes._Target.of("title", "Super Bowl")]
    full = quotes._best_window(quotes.normalise(quote)[0], targets, 0.9, budget=10**12).work

    def check(budget):
        out, spans = quotes.check_answers(answers, passages, repair_budget=budget, progress=False)
        return spans["text"][0], spans["status"][0], out["quote_note"][0]

    # the whole search: the one-letter slip wins over the swapped numbers (whose characters match better)
    assert check(full) == ("the Rams won the game against the Titan 23 to 16 in Atlanta", "repaired", None)
    # one step less: the window the search held when the budget ran out, and a note
    text_, status, note = check(full - 1)
    assert (text_, status) == ("the Rams won the game against the Titans 16 to 23 in Atlanta", "repaired")
    assert note.endswith("kept the best window found so far")
    assert check(1)[1:] == ("unmarked", "quote repair of span 1 stopped at its work budget (1 character "
                                        "steps): left unmarked")
    with pytest.raises(InputError, match="repair_budget"):
        check(0)


def test_quote_notes_join_the_answer_calls_parse_error():
    calls = pl.DataFrame({"qid": ["a", "a", "b", "c"], "step": ["clarify", "answer", "answer", "answer"],
                          "parse_error": ["no DQ/DA lines", None, "empty answer", None]})
    answers = pl.DataFrame({"qid": ["a", "b", "c"], "quote_note": ["n1", "n2", None]})
    got = _add_quote_notes(calls, answers)
    assert got.columns == calls.columns
    assert got["parse_error"].to_list() == ["no DQ/DA lines", "n1", "empty answer; n2", None]


# ---------------------------------------------------------------- JSONL lines


def test_over_long_line_is_named_by_file_and_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"id": 1}\n{"t": "' + b"a" * 5_000 + b'"}\n{"id": 3}\n{"id": 4}')
    with pytest.raises(InputError, match=r"x.jsonl:2: line too long \(more than 1,000 bytes\)"):
        list(iter_jsonl(p, max_line_bytes=1_000))
    problems = []
    rows = list(iter_jsonl(p, max_line_bytes=1_000, on_error=problems.append))
    assert rows == [(1, {"id": 1}), (3, {"id": 3}), (4, {"id": 4})]
    assert [(q.line, q.kind) for q in problems] == [(2, "too_long")]
    # the limit is on the bytes before the newline: exactly max_line_bytes is fine, with or without "\n"
    q = tmp_path / "edge.jsonl"
    q.write_bytes(b'{"a": "xx"}\n{"a": "xxx"}')
    assert [n for n, _ in iter_jsonl(q, max_line_bytes=12)] == [1, 2]
    with pytest.raises(InputError, match="edge.jsonl:2: line too long"):
        list(iter_jsonl(q, max_line_bytes=11))
    assert MAX_LINE_BYTES == 64 * 2**20


def test_gz_bomb_line_is_skipped_in_bounded_memory(tmp_path):
    # 100 MiB of one line in a ~100 KB .gz: the old reader held the whole line (and its decoded copy)
    g = tmp_path / "bomb.jsonl.gz"
    with gzip.open(g, "wb", compresslevel=1) as f:
        f.write(b'{"t": "')
        for _ in range(100):
            f.write(b" " * 2**20)
        f.write(b'"}\n{"id": 2}\n')
    problems = []
    tracemalloc.start()
    try:
        with within(60):
            rows = list(iter_jsonl(g, max_line_bytes=2**20, on_error=problems.append))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows == [(2, {"id": 2})] and [(q.line, q.kind) for q in problems] == [(1, "too_long")]
    assert peak < 16 * 2**20, f"peak {peak:,} bytes"


def test_json_nested_too_deeply_or_huge_numbers_are_bad_lines(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b"[" * 100_000 + b"\n" + b'{"n": ' + b"1" * 5_000 + b"}\n" + b'{"id": 3}\n')
    problems = []
    assert list(iter_jsonl(p, on_error=problems.append)) == [(3, {"id": 3})]
    assert [(q.line, q.kind) for q in problems] == [(1, "bad_json"), (2, "bad_json")]
    assert "nested too deeply" in problems[0].message and "4300 digits" in problems[1].message


# ---------------------------------------------------------------- every reader of model output, every shape

SHAPES = {  # 40k-character inputs built from the pieces that the patterns above repeat or backtrack over
    "spaces": " " * 40_000,
    "newlines": "\n" * 40_000,
    "blank lines": "\n \t" * 13_333,
    "label then spaces": "DQ" + " " * 40_000,
    "mid-line labels": "[1] DQ " * 6_000,
    "label soup": "DQ DA 1 " * 5_000,
    "label lines": "DQ 1 x\nDA 1 y\n" * 3_000,
    "label digits": "DQ" + "1" * 40_000,
    "bullet stars digits": "- " + "*" * 13_000 + "DQ" + "1" * 13_000 + " " * 13_000,
    "open markers": "[ 1 " * 10_000,
    "marker then spaces": "[ 1" + " " * 40_000,
    "glued markers": "[1" * 20_000,
    "closing brackets": "]" * 40_000,
    "brackets": "[ ]" * 13_333,
    "question labels": "\nQuestion " * 4_000,
    "answer label": "Answer" + " " * 40_000,
    "words": "the true false a an " * 2_000,
}
READERS = {
    "parse_disambiguations": lambda s: fmt.parse_disambiguations(s, "length"),
    "parse_disambiguations official": lambda s: fmt.parse_disambiguations(s, "length", "official"),
    "parse_verdict": fmt.parse_verdict,
    "clean_long_answer": fmt.clean_long_answer,
    "parse_quoted": quotes.parse_quoted,
    "canonical_markers": quotesum.canonical_markers,
    "strip_markers": quotesum.strip_markers,
    "quoted_sources": quotesum.quoted_sources,
    "normalise": quotes.normalise,
}


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_of_model_output_on_every_shape(reader):
    # old, 20 s limit per call: parse_disambiguations > 20 s on "label then spaces" (4.6 s on "bullet stars
    # digits"), clean_long_answer > 20 s on "newlines" and "blank lines", parse_quoted > 20 s on
    # "spaces", "label then spaces" and "answer label" (its _tidy) and RecursionError on "open markers",
    # canonical_markers 15 s on "marker then spaces". Now at most ~1 s per reader for all shapes.
    with within(10):
        for shape in SHAPES.values():
            READERS[reader](shape)
            READERS[reader]("x" + shape + "] y")
