"""Parsing model output: disambiguation lines and verification verdicts.

Never raises on model output: every oddity is returned as a note, recorded in `llm_calls.parse_error`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The official code splits each line on `DQ\s*\d*:` / `DA\s*\d*:` (toc/utils.py parse_disambig) and
# pairs line i with line i+1. We accept the same labels anywhere at a line start (also bulleted or
# with "." instead of ":"), and pair each DA with the nearest preceding unpaired DQ, so a missing or
# extra line costs one pair, not every pair after it.
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


def parse_disambiguations(completion: str, finish_reason: str = "stop") -> Parsed:
    """`DQ i: question` / `DA i: a; b` lines → pairs. Text after an `Answer:` line is ignored.

    A completion cut at max_tokens (finish_reason "length") may end in a half-written pair: the last
    pair is dropped when its DA line is the completion's last line.
    """
    out = Parsed()
    pending_q: str | None = None
    lines = completion.splitlines()
    last_pair_line = -1
    for i, line in enumerate(lines):
        if _ANSWER.match(line):
            break
        if m := _DQ.match(line):
            if pending_q is not None:
                out.notes.append(f"DQ without DA: {pending_q[:60]!r}")
            pending_q = m.group(2).strip() or None
            if pending_q is None:
                out.notes.append(f"empty DQ on line {i + 1}")
        elif m := _DA.match(line):
            answers = split_answers(m.group(2))
            if pending_q is None:
                out.notes.append(f"DA without DQ on line {i + 1}")
            elif not answers:
                out.notes.append(f"empty DA for {pending_q[:60]!r}")
                pending_q = None
            else:
                out.pairs.append(Disambiguation(pending_q, answers, m.group(2).strip()))
                last_pair_line = i
                pending_q = None
    if pending_q is not None:
        out.notes.append(f"DQ without DA: {pending_q[:60]!r}")
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
