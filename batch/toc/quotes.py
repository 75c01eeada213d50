r"""Quoted (SEMQA) answers on the generation side: parse `[k span]` markers, anchor each span in its
source passage, repair near-misses, and report quote fidelity (docs/architecture.md#quoted-answers).

This module is the *checker*; the official *scorer* lives in `clarify.eval.quotesum`.

Marker grammar (generation side, deliberately more lenient than the scorer)
---------------------------------------------------------------------------
A marker opens with `[`, optional whitespace, a source number of one or more ASCII digits, and then
either whitespace or the closing `]`:  `[1 span]`, `[ 1 span ]`, `[12 span]`, `[1]` all open a marker;
`[1span]`, `[1990s fashion]`, `[1, 2]`, `[sic]` do not (they stay literal text), because a digit glued
to a word is far more often text than a marker. The span runs to the matching `]`:

* plain brackets inside a span nest (`[1 he said [sic] so]` quotes `he said [sic] so`);
* a marker inside a span is *flattened* into it: its own marker syntax is removed and its text kept
  (`[1 a [2 b] c]` is one span `a b c` citing source 1; `[1 Paris [3] is]` is `Paris is`), so the
  outer span is checked as one quote of the outer source;
* a marker that is never closed runs to the end of the answer (typical of a generation cut off by
  `max_tokens`); `QuotedSpan.closed` is then False;
* a `]` outside any marker is literal text; nothing ever raises on malformed brackets;
* a marker with no text (`[1]`, `[ 2 ]`: citation style, no quote) is an *empty* span;
* a source number of more than ten significant digits, or above 2**31-1, reads as K_MAX = 2**31-1
  (no such source: `bad_source`).

Parsing is one pass with an explicit stack (no recursion), linear in the answer's length.

Relation to the official QuoteSum regexes (google-research-datasets/QuoteSum `evals/scorers.py` uses
`\[ ([1-9]) ([^\[\]]*) \]`; a looser form is `\[ ?(\d) ([^\[\]]*) ?\]`, docs/architecture.md#quoted-answers): on well-formed
markup -- one digit 1-9, one space around it, no brackets in the span -- this parser finds exactly the
same spans with the same text (tested on all 265 human QuoteSum dev summaries). It additionally
accepts any amount of inner whitespace, multi-digit source numbers (a prompt may number more than 9
passages; the scorer cannot see those, and `check_answers` flags k > K as `bad_source`), empty
markers, brackets inside spans and unclosed markers. `check_answers` re-renders every kept span in
the canonical QuoteSum form `[ k text ]` (brackets inside the quoted text become parentheses there), so
the repaired answer is readable by the strict official regex (for k <= 9).

Normalisation used to decide "verbatim" (`normalise`)
-----------------------------------------------------
Applied to both the span and the passage, with a map back to original character offsets:
1. Unicode NFKC per character cluster (a base character plus its combining marks), so ligatures,
   full-width forms, NBSP, `…` and precomposed/decomposed accents compare equal;
2. curly/low/prime single quotes (‘ ’ ‚ ‛ ′ ʼ) -> `'`; double ones (“ ” „ ‟ ″) -> `"`;
3. hyphens and dashes (‐ ‑ ‒ – — ― −) -> `-`;
4. soft hyphen and zero-width characters are dropped;
5. lower-case (case-insensitive: models re-capitalise quotes at sentence starts, and every SEMQA
   metric lower-cases anyway);
6. every run of whitespace -> one space; leading/trailing whitespace removed.
Punctuation and spacing around punctuation are NOT normalised. A span is *verbatim* when its normalised
text is a substring (no word-boundary requirement) of the normalised passage text, or failing that of
the normalised title (annotators and models quote titles: 75 of 1,130 human QuoteSum spans); the first
occurrence is reported.

Repair (`repair_threshold`, default 0.9)
----------------------------------------
A non-verbatim span is compared with every window of the cited passage's normalised text and title
that starts at a word or punctuation mark (`\w+|[^\w\s]`), ends after one, and whose length can reach
the threshold, by `difflib.SequenceMatcher(None, window, span, autojunk=False).ratio()`
(= 2·matches / total length, on characters). The best window (first one on ties; text before title)
wins; if its ratio >= threshold the span is *repaired*: its text becomes the passage's original
substring at that place. Otherwise it is *unmarked*: markers removed, text kept as
free text. threshold 1.0 disables repair. The search has a work budget per span (REPAIR_BUDGET): when
it runs out, the best window found so far is kept if it reaches the threshold, else the span is
unmarked, and the answer's `quote_note` says so.

Statuses: verbatim | repaired | unmarked | bad_source (k < 1 or k > number of passages: also unmarked)
| empty (a marker with no text: removed).
"""

from __future__ import annotations

import difflib
import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

import polars as pl

from clarify import schemas
from clarify.errors import InputError

STATUSES = ("verbatim", "repaired", "unmarked", "bad_source", "empty")
KEPT = ("verbatim", "repaired")  # statuses whose marker survives in the repaired answer

# `[`, optional whitespace, digits, then whitespace or the closing bracket (not consumed).
_OPEN = re.compile(r"\[\s*(\d+)(?=\s|\])\s*")

_CHAR_MAP = {
    **dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u02bc", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f\u2033", '"'),
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
    **dict.fromkeys("\u00ad\u200b\u200c\u200d\u2060\ufeff", ""),
}

# Repair windows start at a word or punctuation mark and end after one (so "date.Stats" can end at
# "date" or "date.").
_TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class QuotedSpan:
    """One `[k span]` marker of an answer.

    span_no: 1-based order of the marker in the answer (outermost markers only);
    source_k: the cited source number as written (at most K_MAX); text: the quoted text (inner markers
    flattened, outer whitespace stripped, inner whitespace as written); start/end: offsets of the whole marker in
    the answer, `answer[start:end]` == `[k ...]` (end = len(answer) when unclosed); closed: whether
    the marker had its `]`.
    """

    span_no: int
    source_k: int
    text: str
    start: int
    end: int
    closed: bool = True


# ---------------------------------------------------------------- parsing


# A source number past the spans table's Int32 column (a model writing thousands of digits) is read as
# this one: no such source exists either way (bad_source), and int() refuses > 4,300 digits.
K_MAX = 2**31 - 1


def _source_number(digits: str) -> int:
    significant = digits.lstrip("0")
    return K_MAX if len(significant) > 10 else min(int(significant or "0"), K_MAX)


@dataclass
class _Node:
    k: int
    start: int
    end: int
    closed: bool
    parts: list  # list[str | _Node]

    def flat(self) -> str:
        # Iterative: markers nested thousands deep are model output too (no recursion limit here).
        out: list[str] = []
        stack = [iter(self.parts)]
        while stack:
            for p in stack[-1]:
                if isinstance(p, str):
                    out.append(p)
                else:
                    stack.append(iter(p.parts))
                    break
            else:
                stack.pop()
        return "".join(out)


class _Open:
    """A marker being parsed (`_parse`'s stack): its parts so far and its plain-bracket depth."""

    __slots__ = ("k", "start", "parts", "buf", "depth")

    def __init__(self, k: int, start: int):
        self.k, self.start, self.parts, self.buf, self.depth = k, start, [], [], 0

    def flush(self) -> None:
        if self.buf:
            self.parts.append("".join(self.buf))
            self.buf = []


def _parse(s: str) -> list:
    """Parse `s` into its parts (str | _Node). Plain `[`..`]` inside a marker nest.

    One pass with an explicit stack of the open markers (stack[0] is the text outside any marker), so
    the depth of nesting costs no recursion: ~1,000 nested `[1 ` used to raise RecursionError.
    """
    stack = [_Open(0, 0)]
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        top = stack[-1]
        if c == "[":
            m = _OPEN.match(s, i)
            if m:
                top.flush()
                stack.append(_Open(_source_number(m.group(1)), i))
                i = m.end()
                continue
            if len(stack) > 1:
                top.depth += 1
        elif c == "]" and len(stack) > 1:
            if top.depth == 0:
                top.flush()
                stack.pop()
                stack[-1].parts.append(_Node(top.k, top.start, i + 1, True, top.parts))
                i += 1
                continue
            top.depth -= 1
        top.buf.append(c)
        i += 1
    while len(stack) > 1:  # never closed: runs to the end of the answer
        top = stack.pop()
        top.flush()
        stack[-1].parts.append(_Node(top.k, top.start, n, False, top.parts))
    stack[0].flush()
    return stack[0].parts


_GAP = "\x00"  # stands for a removed marker with no text, so the space before it can go too
# The blanks before a gap that punctuation follows. The lookbehind starts a match only where a run of
# blanks starts, so each run is scanned once (`[^\S\n]*\x00(?=...)` alone re-scanned the run from each
# of its characters: quadratic, 2.5 s on 40k spaces); leftmost matches start there anyway.
_GAP_BEFORE_PUNCT = re.compile(r"(?<![^\S\n])[^\S\n]*+\x00(?=[,.;:!?)])")
_BLANKS = re.compile(r"[^\S\n]+")


def _tidy(text: str) -> str:
    """Collapse runs of horizontal whitespace to one space, trim every line, drop empty edges; where a
    marker without text was removed just before punctuation, drop the space left before it."""
    text = _GAP_BEFORE_PUNCT.sub("", text).replace(_GAP, "")
    lines = [_BLANKS.sub(" ", line).strip() for line in text.split("\n")]
    return "\n".join(lines).strip()


def _parse_parts(answer: str) -> tuple[list, list[QuotedSpan]]:
    parts = _parse(answer or "")
    spans = []
    for p in parts:
        if isinstance(p, _Node):
            spans.append(QuotedSpan(len(spans) + 1, p.k, p.flat().strip(), p.start, p.end, p.closed))
    return parts, spans


def parse_quoted(answer: str) -> tuple[list[QuotedSpan], str]:
    """Parse the `[k span]` markers of `answer` (grammar in the module docstring).

    Returns (spans in order of appearance, answer_plain): answer_plain is the answer with every
    marker removed and the quoted text kept inline, whitespace tidied (runs of spaces/tabs -> one
    space, lines trimmed; the space before an empty marker followed by punctuation is dropped, so
    "Paris [1]." -> "Paris."). Never raises on malformed markup; None is treated as "".
    """
    parts, spans = _parse_parts(answer)
    it = iter(spans)
    plain = "".join(p if isinstance(p, str) else next(it).text or _GAP for p in parts)
    return spans, _tidy(plain)


# ---------------------------------------------------------------- normalisation and anchoring


def normalise(text: str) -> tuple[str, list[int], list[int]]:
    """Normalise `text` for quote matching (rules 1-6 of the module docstring).

    Returns (normalised, starts, ends): normalised char j comes from text[starts[j]:ends[j]].
    """
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    i, n = 0, len(text)
    while i < n:
        j = i + 1
        while j < n and unicodedata.combining(text[j]):
            j += 1
        for ch in unicodedata.normalize("NFKC", text[i:j]):
            ch = _CHAR_MAP.get(ch, ch)
            if not ch:
                continue
            if ch.isspace():
                if out and out[-1] != " ":
                    out.append(" ")
                    starts.append(i)
                    ends.append(j)
                continue
            for c in ch.lower():
                out.append(c)
                starts.append(i)
                ends.append(j)
        i = j
    if out and out[-1] == " ":
        out.pop()
        starts.pop()
        ends.pop()
    return "".join(out), starts, ends


@dataclass(frozen=True)
class _Target:
    """A passage field (text or title) prepared for matching."""

    field: str
    original: str
    norm: str
    starts: list[int]
    ends: list[int]
    tokens: list[tuple[int, int]]  # [start, end) of each word or punctuation mark of `norm`

    @classmethod
    def of(cls, field: str, original: str) -> _Target:
        norm, starts, ends = normalise(original)
        tokens = [(m.start(), m.end()) for m in _TOKEN.finditer(norm)]
        return cls(field, original, norm, starts, ends, tokens)

    def offsets(self, i: int, j: int) -> tuple[int, int]:
        """Original [start, end) of normalised [i, j)."""
        return self.starts[i], self.ends[j - 1]


def _find_verbatim(span_norm: str, targets: list[_Target]) -> tuple[_Target, int, int] | None:
    for t in targets:
        pos = t.norm.find(span_norm)
        if pos >= 0:
            return t, pos, pos + len(span_norm)
    return None


# Quote repair's work budget per span, in steps: each character a candidate window grows by costs
# SCAN_STEPS (a dict update in Python, about as slow as that many of difflib's character comparisons),
# each similarity computed costs len(window) × len(span) (the cells difflib's matching may compare).
# Work, not seconds, so every machine repairs alike. Real spans stay far below: QuoteSum dev's human
# summaries and their one-character slips (tests/test_quotes.py) use at most ~21 million, a span cited
# against an unrelated passage included; a paraphrased or shuffled ~1,000-character quote of a
# 3,000-character passage asks for billions (minutes). When the budget runs out the best window found
# so far is kept if it reaches the threshold (else the span is unmarked) and the answer gets a note
# (`check_answers`: quote_note). 100 million steps take about 2 s on one slow core.
REPAIR_BUDGET = 100_000_000
SCAN_STEPS = 20


@dataclass(frozen=True)
class _Search:
    """What `_best_window` found: the best window (ratio, target, start, end) or None; `work` spent
    (REPAIR_BUDGET's unit) and whether the budget ran out before the search was complete."""

    best: tuple[float, _Target, int, int] | None
    work: int
    gave_up: bool


def _best_window(span_norm: str, targets: list[_Target], threshold: float, budget: int = REPAIR_BUDGET) -> _Search:
    """Best token window over all targets by difflib ratio (None if none reaches `threshold`), within
    `budget` units of work."""
    m = len(span_norm)
    # ratio = 2M/(a+b) <= 2·min(a,b)/(a+b): windows outside [lo, hi] chars cannot reach the threshold.
    lo = math.ceil(m * threshold / (2 - threshold))
    hi = math.floor(m * (2 - threshold) / threshold)
    sm = difflib.SequenceMatcher(None, autojunk=False)
    sm.set_seq2(span_norm)
    want = Counter(span_norm)
    work = 0
    candidates = []  # (upper bound of the ratio, text order, target, start, end)
    for t in targets:
        norm, toks = t.norm, t.tokens
        for a, (s0, _) in enumerate(toks):
            if len(norm) - s0 < lo:
                break
            # Character-multiset overlap of window and span, grown with the window: the same upper
            # bound as SequenceMatcher.quick_ratio, in O(1) per added character.
            have: dict[str, int] = {}
            inter, pos = 0, s0
            for b in range(a, len(toks)):
                e = toks[b][1]
                length = e - s0
                if length > hi:
                    break
                cost = (e - pos) * SCAN_STEPS
                if work + cost > budget:
                    return _Search(None, work, True)
                work += cost
                for c in norm[pos:e]:
                    h = have.get(c, 0)
                    if h < want[c]:
                        inter += 1
                    have[c] = h + 1
                pos = e
                bound = 2 * inter / (m + length)
                if length >= lo and bound >= threshold:
                    candidates.append((bound, len(candidates), t, s0, e))
    # Best first: exact ratios in order of decreasing bound, until no bound can beat the best.
    candidates.sort(key=lambda c: (-c[0], c[1]))
    best = None  # (ratio, text order, target, start, end)
    gave_up = False
    for bound, order, t, s0, e in candidates:
        if best is not None and bound < best[0]:
            break
        cost = (e - s0) * m
        if work + cost > budget:
            gave_up = True
            break
        work += cost
        sm.set_seq1(t.norm[s0:e])
        r = sm.ratio()
        if r >= threshold and (best is None or r > best[0] or (r == best[0] and order < best[1])):
            best = (r, order, t, s0, e)
    if best is None:
        return _Search(None, work, gave_up)
    r, _, t, s0, e = best
    return _Search((r, t, s0, e), work, gave_up)


def _render(text: str) -> str:
    # The official regex forbids brackets inside a span: keep the repaired answer parseable.
    return text.replace("[", "(").replace("]", ")")


def check_answers(
    answers: pl.DataFrame,
    passages: pl.DataFrame,
    *,
    repair_threshold: float = 0.9,
    repair_budget: int = REPAIR_BUDGET,
    progress: bool = True,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Anchor every quoted span of every answer in its cited passage; repair or unmark the others.

    answers: qid (unique), answer (with markers; null = ""), passage_ids (list[str]; passage_ids[k-1]
    is the passage numbered k in the prompt; null = []); other columns are passed through.
    passages: passage_id, title, text (title may be null).

    Returns (answers, spans):
    * answers: the input columns plus `repaired_answer` (verbatim and repaired spans re-rendered as
      `[ k text ]`, repaired ones with the passage's substring; unmarked/bad_source spans as free
      text; empty markers removed) and `answer_plain` (repaired_answer without markers, tidied;
      replaces an existing answer_plain column) and `quote_note` (null, or why a span's check is
      incomplete: its repair ran out of `repair_budget`, REPAIR_BUDGET; the pipeline adds it to the
      answer's llm_calls.parse_error);
    * spans: schemas.SPANS, one row per outer marker of `answer` (qid, span_no, source_k, passage_id,
      text, start, end, verbatim, status, `field` ("text" | "title": which passage field start/end
      index; null when not anchored), `similarity` (1.0 verbatim, the difflib ratio when repaired,
      null otherwise), marker_start/marker_end). text is the span as written, or the passage substring
      when repaired; start/end are offsets in the original passage field, -1 when not anchored;
      passage_id is null for bad_source; `answer[marker_start:marker_end]` is the marker as written
      (`QuotedSpan.start/end`; the pipeline keeps that text as answers.answer_raw).
    Raises InputError for duplicate qids, unknown passage ids, conflicting duplicate passages, or a
    threshold outside (0, 1]; schemas.SchemaError for missing columns.
    """
    from tqdm.auto import tqdm

    if not 0 < repair_threshold <= 1:
        raise InputError(f"must be in (0, 1], got {repair_threshold}", field="repair_threshold")
    if repair_budget < 1:
        raise InputError(f"must be a positive number of character steps, got {repair_budget}", field="repair_budget")
    schemas.check(answers, "answers", columns=["qid", "answer", "passage_ids"])
    schemas.check(passages, "passages", columns=["passage_id", "text"])
    dup = answers["qid"].filter(answers["qid"].is_duplicated()).unique().to_list()
    if dup:
        raise InputError(f"answers must have one row per qid; duplicated: {dup[:5]}", field="qid")
    by_id = _cited_passages(answers, passages)
    prepared: dict[str, list[_Target]] = {}

    def targets(pid: str) -> list[_Target]:
        if pid not in prepared:
            title, text = by_id[pid]
            prepared[pid] = [_Target.of("text", text), _Target.of("title", title)]
        return prepared[pid]

    rows: list[dict] = []
    repaired_answers: list[str] = []
    plains: list[str] = []
    notes: list[str | None] = []
    for qid, answer, pids in tqdm(
        zip(answers["qid"], answers["answer"], answers["passage_ids"]),
        total=answers.height, desc="check quotes", disable=not progress or None, leave=False,
    ):
        pids = list(pids) if pids is not None else []
        missing = [p for p in pids if p and p not in by_id]
        if missing:
            raise InputError(f"qid {qid!r} cites passage ids not in the passages table: {missing[:5]}",
                             field="passage_ids")
        marked, plain, answer_notes = _check_answer(qid, answer or "", pids, targets, rows,
                                                    repair_threshold, repair_budget)
        repaired_answers.append(marked)
        plains.append(plain)
        notes.append("; ".join(answer_notes) or None)

    spans_df = pl.DataFrame(rows, schema=schemas.SPANS)
    out = answers.with_columns(
        pl.Series("repaired_answer", repaired_answers, dtype=pl.String),
        pl.Series("answer_plain", plains, dtype=pl.String),
        pl.Series("quote_note", notes, dtype=pl.String),
    )
    return out, spans_df


def _cited_passages(answers: pl.DataFrame, passages: pl.DataFrame) -> dict[str, tuple[str, str]]:
    """passage_id -> (title, text) of the passages the answers cite (the table may be a whole corpus);
    InputError for one id given twice with different title/text."""
    cited = answers["passage_ids"].explode().drop_nulls().unique().implode()
    passages = passages.filter(pl.col("passage_id").is_in(cited))
    titles = passages["title"] if "title" in passages.columns else pl.Series([None] * passages.height)
    by_id: dict[str, tuple[str, str]] = {}
    for pid, title, text in zip(passages["passage_id"], titles, passages["text"]):
        entry = (title or "", text or "")
        if pid in by_id and by_id[pid] != entry:
            raise InputError(f"passage {pid!r} appears twice with different title/text", field="passage_id")
        by_id[pid] = entry
    return by_id


def _check_answer(qid, answer: str, pids: list[str], targets, rows: list[dict], threshold: float,
                  budget: int) -> tuple[str, str, list[str]]:
    """One answer's spans checked (their rows appended to `rows`): the answer re-rendered with its kept
    markers, the same without markers, and the notes of repairs that ran out of budget."""
    parts, spans = _parse_parts(answer)
    out_marked: list[str] = []
    out_plain: list[str] = []
    answer_notes: list[str] = []
    it = iter(spans)
    for p in parts:
        if isinstance(p, str):
            out_marked.append(p)
            out_plain.append(p)
            continue
        sp = next(it)
        row, note = _check_span(sp, pids, targets, threshold, budget)
        row["qid"] = qid
        if note:
            answer_notes.append(note)
        rows.append(row)
        if row["status"] in KEPT:
            out_marked.append(f"[ {sp.source_k} {_render(row['text'])} ]")
        else:
            out_marked.append(row["text"] or _GAP)
        out_plain.append(row["text"] or _GAP)
    return _tidy("".join(out_marked)), _tidy("".join(out_plain)), answer_notes


def _check_span(sp: QuotedSpan, pids: list[str], targets, threshold: float, budget: int) -> tuple[dict, str | None]:
    """The span's row (schemas.SPANS less qid) and a note when its repair ran out of budget."""
    row = {"span_no": sp.span_no, "source_k": sp.source_k, "passage_id": None, "text": sp.text,
           "start": -1, "end": -1, "verbatim": False, "field": None, "similarity": None,
           "marker_start": sp.start, "marker_end": sp.end}
    if not 1 <= sp.source_k <= len(pids) or not pids[sp.source_k - 1]:
        return {**row, "status": "bad_source"}, None
    pid = pids[sp.source_k - 1]
    row["passage_id"] = pid
    span_norm = normalise(sp.text)[0]
    if not span_norm:
        return {**row, "status": "empty"}, None
    tg = targets(pid)
    hit = _find_verbatim(span_norm, tg)
    if hit is not None:
        t, i, j = hit
        start, end = t.offsets(i, j)
        return {**row, "start": start, "end": end, "verbatim": True, "field": t.field,
                "similarity": 1.0, "status": "verbatim"}, None
    if threshold >= 1:
        return {**row, "status": "unmarked"}, None
    found = _best_window(span_norm, tg, threshold, budget)
    note = None
    if found.gave_up:
        note = (f"quote repair of span {sp.span_no} stopped at its work budget ({budget:,} character steps): "
                + ("kept the best window found so far" if found.best else "left unmarked"))
    if found.best is None:
        return {**row, "status": "unmarked"}, note
    r, t, i, j = found.best
    start, end = t.offsets(i, j)
    return {**row, "text": t.original[start:end], "start": start, "end": end, "field": t.field,
            "similarity": r, "status": "repaired"}, note


# ---------------------------------------------------------------- fidelity


def fidelity_by_qid(spans: pl.DataFrame) -> pl.DataFrame:
    """Per answer: qid, n_spans, n_<status> for each status, share_verbatim,
    share_verbatim_after_repair (verbatim + repaired). Input: a spans table (qid, status)."""
    schemas.check(spans, "spans", columns=["qid", "status"])
    counts = [(pl.col("status") == s).sum().cast(pl.Int64).alias(f"n_{s}") for s in STATUSES]
    return (
        spans.group_by("qid", maintain_order=True)
        .agg(pl.len().cast(pl.Int64).alias("n_spans"), *counts)
        .with_columns(
            (pl.col("n_verbatim") / pl.col("n_spans")).alias("share_verbatim"),
            ((pl.col("n_verbatim") + pl.col("n_repaired")) / pl.col("n_spans"))
            .alias("share_verbatim_after_repair"),
        )
    )


def quote_fidelity(spans: pl.DataFrame, answers: pl.DataFrame | None = None) -> dict:
    """Quote fidelity of a run (micro-averaged over spans). Input: a spans table (qid, status).

    Keys: n_spans, n_<status> for every status, n_answers_with_spans, and shares of all spans:
    share_verbatim (verbatim as generated), share_verbatim_after_repair (verbatim + repaired),
    share_repaired, share_unmarked (markers removed: unmarked + bad_source + empty, i.e.
    1 - after_repair), share_bad_source (cites a source number that does not exist), share_empty.
    Shares are None when there are no spans. With `answers` (qid column): also n_answers and
    share_answers_without_spans (answers with no marker at all). Per answer: `fidelity_by_qid`.
    """
    schemas.check(spans, "spans", columns=["qid", "status"])
    n = spans.height
    counts = {s: int((spans["status"] == s).sum()) for s in STATUSES}
    unknown = set(spans["status"].unique().to_list()) - set(STATUSES)
    if unknown:
        raise InputError(f"unknown span status(es) {sorted(map(str, unknown))}", field="status")

    def share(x: int) -> float | None:
        return x / n if n else None

    out: dict = {"n_spans": n, **{f"n_{s}": c for s, c in counts.items()},
                 "n_answers_with_spans": spans["qid"].n_unique()}
    out.update(
        share_verbatim=share(counts["verbatim"]),
        share_verbatim_after_repair=share(counts["verbatim"] + counts["repaired"]),
        share_repaired=share(counts["repaired"]),
        share_unmarked=share(counts["unmarked"] + counts["bad_source"] + counts["empty"]),
        share_bad_source=share(counts["bad_source"]),
        share_empty=share(counts["empty"]),
    )
    if answers is not None:
        n_ans = answers["qid"].n_unique()
        with_spans = answers["qid"].is_in(spans["qid"].unique().implode()).sum()
        out["n_answers"] = n_ans
        out["share_answers_without_spans"] = (n_ans - int(with_spans)) / n_ans if n_ans else None
    return out
