"""Parsing model output: disambiguation lines and verification verdicts.

Never raises on model output: every oddity is returned as a note, recorded in `llm_calls.parse_error`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

# What the default parser reads, and how it relates to the official one (docs/fidelity.md#the-differences,
# the row "clarification parsing").
#
# The official parser (toc/utils.py:25-46 parse_disambig, transcribed in `official_pairs` below) splits the
# field on "\n", pairs line i with line i+1 (i = 0, 2, 4, ...), keeps the pair when line i *contains* "DQ"
# and line i+1 contains "DA" anywhere, and takes as the text what follows the first `DQ\s*\d*:` /
# `DA\s*\d*:` of the line, up to the next one. The default parser yields every pair the official one
# yields, with the same text, and adds pairs only from lines the official one drops: a label written
# `DQ 1.` or `- **DQ 1**)`, and a DA after a missing or extra line (paired with the nearest preceding DQ),
# so one bad line costs one pair, not every pair after it. `toc.parsing = "official"` yields exactly the
# official function's pairs.
#
# Model output is untrusted input: a completion can hold one line of ~16k spaces (SmolLM2 has a
# 64-space token). Every pattern here runs in linear time: between the label and the separator the
# quantifiers are possessive (`*+`, Python 3.11 re), so adjacent `\s*` never trade characters back and
# forth (the plain `DQ\s*(\d*)\s*\**\s*[:.)]` backtracked cubically: 50 s for "DQ" + 3,200 spaces).
# They match exactly what the plain quantifiers matched: each run they consume is maximal and the
# next item cannot start with the characters it gave back (tests/test_parse_linear.py compares them
# on random lines).
_DQ = re.compile(r"^\s*+(?:[-*•]\s*+)?\**+DQ\s*+(\d*+)\s*+\**+\s*+[:.)]\s*+(.*)$", re.IGNORECASE)
_DA = re.compile(r"^\s*+(?:[-*•]\s*+)?\**+DA\s*+(\d*+)\s*+\**+\s*+[:.)]\s*+(.*)$", re.IGNORECASE)
_ANSWER = re.compile(r"^\s*+Answer\s*+:", re.IGNORECASE)
# toc/utils.py:37-38: `re.split(r'DQ\s*\d*:', line)[1]`; possessive, which matches the same (giving back
# a blank cannot let `\d*` or ":" match it).
_OFFICIAL_DQ = re.compile(r"DQ\s*+\d*+:")
_OFFICIAL_DA = re.compile(r"DA\s*+\d*+:")
# dsp's template ends the `disambig` field at the next field's prefix (dsp/templates/template_v2.py:157-165).
_NEXT_FIELD = "\nAnswer:"


@dataclass(frozen=True)
class Disambiguation:
    question: str
    answers: tuple[str, ...]  # the DA's short answers, split on ';' (split_answers)
    # The DA line's text as written (toc/utils.py:38: the text after `DA i:`, stripped): the string the
    # official code compares, matches and shows whole (run_toc.py:94-123, toc/pruning.py:10-11 and :46 of
    # toc/templates/load.py, toc/tree.py:34). "" when the pair is built from its answers (demos): `da`.
    text: str = ""

    @property
    def da(self) -> str:
        """The whole DA string: as written, else the answers joined."""
        return self.text or da_text(self.answers)


@dataclass
class Parsed:
    pairs: list[Disambiguation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def error(self) -> str | None:
        return "; ".join(self.notes) if self.notes else None


def split_answers(text: str) -> tuple[str, ...]:
    """`DA i:` holds short answers separated by ';' (ToC prompt format guide)."""
    parts = [p.strip().strip('"').strip() for p in text.split(";")]
    return tuple(p for p in parts if p)


def da_text(answers: tuple[str, ...] | list[str]) -> str:
    """A DA line's text from its short answers (a demo's, toc/utils.py:18 make_str_disambig)."""
    return "; ".join(answers)


class Parsing(StrEnum):
    """toc.parsing: every pair the official parser finds plus those of the lines it drops, or exactly its pairs."""

    CLARIFY = "clarify"
    OFFICIAL = "official"


def disambig_fields(completion: str) -> tuple[str, str | None]:
    """The completion's `disambig` and `answer` fields as dsp's template extracts them
    (dsp/templates/template_v2.py:144 strips the completion, :157-169 ends `disambig` at "\nAnswer:",
    :173-175 keeps the rest, stripped, as `answer`); `answer` is None when there is no "\nAnswer:"."""
    raw = completion.strip()
    cut = raw.find(_NEXT_FIELD)
    if cut < 0:
        return raw, None
    return raw[:cut].strip(), raw[cut + len(_NEXT_FIELD):].strip()


def _official_lines(text: str) -> list[tuple[int, str, str]]:
    """toc/utils.py:25-46 parse_disambig, line by line, with the index of each pair's DQ line."""
    lines = text.split("\n")  # :26
    first = 1 if lines[0] == "" else 0  # :27-28 drop a leading empty line
    out = []
    for i in range(first, len(lines), 2):  # :30 lines i and i+1 (counted after the dropped line)
        if i + 1 >= len(lines):  # :31-32
            continue
        if "DQ" not in lines[i] or "DA" not in lines[i + 1]:  # :34-35 (the assert fails; :43-44 skip)
            continue
        q = _OFFICIAL_DQ.split(lines[i], maxsplit=2)  # :37, [1]: between the first label and the next
        a = _OFFICIAL_DA.split(lines[i + 1], maxsplit=2)  # :38
        if len(q) < 2 or len(a) < 2:  # no `DQ\s*\d*:` (e.g. "DQ 1."): IndexError, skipped (:43-44)
            continue
        out.append((i, q[1].strip(), a[1].strip()))  # :39-41
    return out


def official_pairs(completion: str) -> list[tuple[str, str]]:
    """The official run's (question, DA text) pairs for a clarification completion: parse_disambig on the
    `disambig` field, and on the `answer` field up to a second "Answer:" when that gives none
    (run_toc.py:222-225)."""
    field_, answer = disambig_fields(completion)
    pairs = [(q, a) for _, q, a in _official_lines(field_)]
    if not pairs and answer is not None:
        pairs = [(q, a) for _, q, a in _official_lines(answer.split(_NEXT_FIELD)[0])]
    return pairs


def _label(line: str) -> tuple[str, str] | None:
    """("DQ" | "DA", the text after the label) for a line the default parser reads as a label line: a label
    at the line's start, also bulleted, bold or with "." / ")" (`- **DQ 1**.`), else the first official
    label anywhere in it (`[1] DQ 2: ...`, split as toc/utils.py:37-38 splits); None for other lines."""
    if m := _DQ.match(line):
        return "DQ", m.group(2)
    if m := _DA.match(line):
        return "DA", m.group(2)
    q, a = _OFFICIAL_DQ.search(line), _OFFICIAL_DA.search(line)
    if q is None and a is None:
        return None
    kind, pattern = ("DQ", _OFFICIAL_DQ) if a is None or (q is not None and q.start() < a.start()) else ("DA", _OFFICIAL_DA)
    return kind, pattern.split(line, maxsplit=2)[1]


def parse_disambiguations(completion: str, finish_reason: str = "stop",
                          parsing: Parsing = Parsing.CLARIFY) -> Parsed:
    """`DQ i: question` / `DA i: a; b` lines → pairs, in the order of their DQ lines.

    parsing "official": exactly the official function's pairs (`official_pairs`). "clarify" (the default):
    those pairs, plus pairs from the lines the official pairing drops (see the comment above), read up to
    an `Answer:` line. A completion cut at max_tokens (finish_reason "length") may end in a half-written
    pair: the last pair is dropped when its DA line is the completion's last line (the official run
    continues such a completion instead, dsp/primitives/predict.py:94-116; clarify does not).
    """
    out = Parsed()
    if parsing == Parsing.OFFICIAL:
        out.pairs = [Disambiguation(q, split_answers(a), a) for q, a in official_pairs(completion)]
        if not out.pairs:
            out.notes.append("no DQ/DA pairs")
        return out
    field_, answer = disambig_fields(completion)
    lines = field_.split("\n")
    official = _official_lines(field_)
    if not official and answer is not None and (fallback := _official_lines(answer.split(_NEXT_FIELD)[0])):
        # run_toc.py:224-225: the pairs written after `Answer:` are the official run's pairs
        out.pairs = [Disambiguation(q, split_answers(a), a) for _, q, a in fallback]
        return out
    taken = {i: (q, a) for i, q, a in official}
    pending: str | None = None  # the last DQ not yet paired
    last_pair_line, answered = -1, False
    i = 0
    while i < len(lines):
        if i in taken:  # the official pair of lines i, i+1, wherever it stands
            if pending is not None:
                out.notes.append(f"DQ without DA: {pending[:60]!r}")
                pending = None
            q, a = taken[i]
            out.pairs.append(Disambiguation(q, split_answers(a), a))
            if not split_answers(a):
                out.notes.append(f"empty DA for {q[:60]!r}")
            last_pair_line = i + 1
            i += 2
            continue
        line = lines[i]
        i += 1
        answered = answered or _ANSWER.match(line) is not None
        if answered:  # what follows an `Answer:` line is the long answer: nothing more is recovered
            continue
        label = _label(line)
        if label is None:
            continue
        kind, text = label[0], label[1].strip()
        if kind == "DQ" and len(both := _OFFICIAL_DA.split(text, maxsplit=1)) == 2:
            # DQ and DA on one line: read as the pair it is (the official code pairs it with the next line)
            if pending is not None:
                out.notes.append(f"DQ without DA: {pending[:60]!r}")
            pending, kind, text = both[0].strip() or None, "DA", both[1].strip()
        if kind == "DQ":
            if pending is not None:
                out.notes.append(f"DQ without DA: {pending[:60]!r}")
            pending = text or None
            if pending is None:
                out.notes.append(f"empty DQ on line {i}")
        else:
            if pending is None:
                out.notes.append(f"DA without DQ on line {i}")
            elif not split_answers(text):
                out.notes.append(f"empty DA for {pending[:60]!r}")
                pending = None
            else:
                out.pairs.append(Disambiguation(pending, split_answers(text), text))
                last_pair_line = i - 1
                pending = None
    if pending is not None:
        out.notes.append(f"DQ without DA: {pending[:60]!r}")
    # pairs are appended in line order, so the last pair written is the last one
    if finish_reason == "length" and out.pairs and last_pair_line == len(lines) - 1:
        dropped = out.pairs.pop()
        out.notes.append(f"cut at max_tokens; dropped last pair {dropped.question[:60]!r}")
    if not out.pairs and not out.notes:
        out.notes.append("no DQ/DA lines")
    return out


def parse_verdict(completion: str) -> tuple[bool, str | None]:
    """True/False verdict. The official code keeps a node when "True" occurs in the completion
    (run_toc.py: `if "True" in ver_completion[0]`); we read the first of the two words that occurs,
    case-insensitive, so "False. True would..." is False. Neither word → not kept, and noted."""
    m = re.search(r"\b(true|false)\b", completion, re.IGNORECASE)
    if m is None:
        return False, f"verdict neither True nor False: {completion[:40]!r}"
    return m.group(1).lower() == "true", None


def clean_long_answer(completion: str) -> str:
    """The final answer step ends its prompt at `Answer:`; drop an echoed label and anything after a
    separator the model may start (a new `---` part or `Question:` demo)."""
    text = completion.strip()
    text = _ECHOED_LABEL.sub("", text, count=1)
    text = _NEXT_PART.split(text, maxsplit=1)[0]
    return " ".join(text.split())


_ECHOED_LABEL = re.compile(r"\A\s*+Answer\s*+:\s*+", re.IGNORECASE)
# A separator at the start of a line, after that line's own blanks. (`\n\s*(?:---|...)` let `\s*`
# run over following blank lines too, re-scanned from every newline: quadratic, 6.9 s on 40k
# characters. The text cut off can only differ by whitespace, which the join above collapses.)
_NEXT_PART = re.compile(r"\n[^\S\n]*+(?:---|Question\s*+:|Context\s*+:)")
