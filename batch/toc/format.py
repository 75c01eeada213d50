"""The layout of Tree of Clarifications' requests and replies, declared once: labels, rendering, stop strings,
parser and grammar side by side. Every other module reads the layout from here.

    labels        the fields of the clarification template (`Context:`, `Question:`, `Disambiguations:`,
                  `Answer:`), the DQ/DA line labels, the part separator, the quoted and verification fields
    rendering     DQ/DA lines, numbered passages, the format guide, a demo and a query of each template
                  (batch/toc/prompts.py puts its wording around them)
    stop strings  where a clarification and a final answer end (CLARIFY_STOP, ANSWER_STOP)
    parser        completions back into DQ/DA pairs (the official pairing and clarify's), verdicts, the long
                  answer (`parse_disambiguations`, `official_pairs`, `parse_verdict`, `clean_long_answer`)
    grammar       the EBNF of a clarification (`format_grammar`, `[toc] constrain_format`)

The layout is the official one: the template's fields and prefixes (gankim/tree-of-clarifications
toc/templates/load.py:15-26 `Context:\n`, `Question:`, `Disambiguations:\n`, `Answer:`; the `DQ i:` / `DA i:`
lines of :11-12), rendered as dsp renders a template (dsp/templates/template_v2.py:98 `prefix + value`,
:115 "Follow the following format.", :233 parts joined by `\n\n---\n\n`), the DQ/DA lines of
toc/utils.py:12-22 make_str_disambig, parsed as toc/utils.py:25-46 parse_disambig parses them. The wording
around them is ours (batch/toc/prompts.py). batch/toc/fingerprint.py pins all of it with each run.

Never raises on model output: every oddity is returned as a note, recorded in `llm_calls.parse_error`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from clarify.schemas import Passage

# -- labels --------------------------------------------------------------------------------------------
# The clarification template's field prefixes (toc/templates/load.py:15-26). A field is written
# `prefix + separator + value` (dsp/templates/template_v2.py:98): "\n" after Context and Disambiguations, " "
# after the others.
CONTEXT, QUESTION, DISAMBIGUATIONS, ANSWER = "Context:", "Question:", "Disambiguations:", "Answer:"
# The DQ/DA line labels (toc/templates/load.py:11-12, toc/utils.py:16-20): `DQ i: question`, `DA i: answers`.
DQ, DA = "DQ", "DA"
DA_SEPARATOR = ";"  # between a DA line's short answers (toc/templates/load.py:12 "separated by semi-colon (;)")
PART = "---"  # dsp joins a prompt's parts with a line of it (dsp/templates/template_v2.py:233)
SEP = f"\n\n{PART}\n\n"
# The quoted (SEMQA) answer's fields: numbered sources, and the tree's readings as a guide.
SOURCES, READINGS = "Sources:", "Readings to cover:"
# The verification's fields (toc/templates/load.py:43-46 `Context: `, `Question: `, `Proposed Answer: `), our
# closing line, and the verdicts its decoding is constrained to (batch/toc/program.py `choices`).
PROPOSED_ANSWER, VERDICT_FIELD = "Proposed Answer:", "True or False:"
VERDICTS = ("True", "False")


def label(kind: str, i: int | str) -> str:
    """`DQ i:` / `DA i:` (toc/utils.py:16-20)."""
    return f"{kind} {i}:"


# -- stop strings ----------------------------------------------------------------------------------------
# The clarification's long answer is not used (ToC appendix): stop before it, or before a new part or demo the
# model starts, to save tokens. The final answer ends where a new part, demo, context or source list would
# begin. (A model's own stop strings, [model] stop, are added to these by batch/toc/program.py.)
CLARIFY_STOP = (f"\n{ANSWER}", f"\n{PART}", f"\n{QUESTION}")
ANSWER_STOP = (f"\n{PART}", f"\n{QUESTION}", f"\n{CONTEXT}", f"\n{SOURCES}")


# -- rendering -----------------------------------------------------------------------------------------
FORMAT_GUIDE = f"""Follow the following format.

{CONTEXT}
${{sources that may contain relevant content}}

{QUESTION} ${{ambiguous question to be disambiguated}}

{DISAMBIGUATIONS}
${{the disambiguated pairs of questions and answers, one per line}}
{label(DQ, "i")} ${{(i)-th disambiguated question that clarifies the ambiguous question}}
{label(DA, "i")} ${{short factoid answers to the (i)-th question, separated by semicolons (;), often 1 to 5 words}}

{ANSWER} ${{a detailed answer that explains the readings of the question and answers each, at least three sentences}}"""

QUOTED_FORMAT_GUIDE = f"""Follow the following format.

{SOURCES}
${{numbered sources}}

{QUESTION} ${{the question}}

{ANSWER} ${{an answer whose factual spans are copied verbatim from the sources and marked [k span]}}"""


def shown_da(pair) -> str:
    """The DA string a prompt shows for a pair: a tree's pair as written (`Disambiguation.da`), a demo's pair
    (clarify.fewshot.QAPair: question and short answers, not imported here, so that the parser's fingerprint
    keeps its imports) its short answers joined (toc/utils.py:18 make_str_disambig)."""
    return pair.da if isinstance(pair, Disambiguation) else da_text(pair.answers)


def format_pairs(pairs: Sequence) -> str:
    """`DQ i:` / `DA i:` lines; each DA is the whole string as written (toc/utils.py:12-22 make_str_disambig:
    a demo's first short answer, a tree node's `disambig['answer']`)."""
    lines = []
    for i, p in enumerate(pairs, 1):
        lines.append(f"{label(DQ, i)} {p.question}")
        lines.append(f"{label(DA, i)} {shown_da(p)}")
    return "\n".join(lines)


def format_context(passages: Sequence[Passage]) -> str:
    """Numbered passages `[k] «title | text»` (dsp's passages2text layout, as in the ToC prompts)."""
    return "\n".join(f"[{k}] «{p.title} | {p.text}»" for k, p in enumerate(passages, 1))


def clarify_demo(question: str, pairs: Sequence[Disambiguation], answer: str) -> str:
    """A clarification demo: question, DQ/DA lines, long answer (demos carry no context)."""
    return f"{QUESTION} {question}\n\n{DISAMBIGUATIONS}\n{format_pairs(pairs)}\n\n{ANSWER} {answer}"


def clarify_query(question: str, passages: Sequence[Passage]) -> str:
    """The clarification's query: ends open at `Disambiguations:` (ToC §3.1)."""
    return f"{CONTEXT}\n{format_context(passages)}\n\n{QUESTION} {question}\n\n{DISAMBIGUATIONS}\n"


def answer_query(question: str, pairs: Sequence[Disambiguation], passages: Sequence[Passage]) -> str:
    """The final answer's query: the clarification's with the tree's DQ/DA lines filled in, ending at `Answer:`."""
    return (f"{CONTEXT}\n{format_context(passages)}\n\n{QUESTION} {question}\n\n"
            f"{DISAMBIGUATIONS}\n{format_pairs(pairs)}\n\n{ANSWER}")


def quoted_demo(question: str, sources: Sequence[Passage], answer: str) -> str:
    """A SEMQA demo: numbered sources, question, answer with `[k span]` markers."""
    return f"{SOURCES}\n{format_context(sources)}\n\n{QUESTION} {question}\n\n{ANSWER} {answer}"


def quoted_query(question: str, pairs: Sequence[Disambiguation], passages: Sequence[Passage]) -> str:
    """The quoted answer's query; the tree's DQ/DA lines (if any) as the readings to cover."""
    guide = f"{READINGS}\n{format_pairs(pairs)}\n\n" if pairs else ""
    return f"{SOURCES}\n{format_context(passages)}\n\n{QUESTION} {question}\n\n{guide}{ANSWER}"


def verify_query(context: str, question: str, proposed_answer: str) -> str:
    """The verification's fields (toc/templates/load.py:43-46), then the closing `True or False:`."""
    return (f"{CONTEXT} {context}\n{QUESTION} {question}\n{PROPOSED_ANSWER} {proposed_answer}\n"
            f"{VERDICT_FIELD}")


# -- parser --------------------------------------------------------------------------------------------
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
def _field(prefix: str) -> str:
    """A field prefix as a pattern: its name, blanks, then its colon (`Answer :` too)."""
    return re.escape(prefix.removesuffix(":")) + r"\s*+:"


def _line_label(kind: str) -> re.Pattern:
    """A `kind` (DQ or DA) label line as the default parser reads it: at the line's start, also bulleted,
    bold or closed by "." / ")" (`- **DQ 1**.`); groups: the number, the text."""
    return re.compile(rf"^\s*+(?:[-*•]\s*+)?\**+{re.escape(kind)}\s*+(\d*+)\s*+\**+\s*+[:.)]\s*+(.*)$", re.IGNORECASE)


_DQ, _DA = _line_label(DQ), _line_label(DA)
_ANSWER = re.compile(rf"^\s*+{_field(ANSWER)}", re.IGNORECASE)
# toc/utils.py:37-38: `re.split(r'DQ\s*\d*:', line)[1]`; possessive, which matches the same (giving back
# a blank cannot let `\d*` or ":" match it).
_OFFICIAL_DQ = re.compile(rf"{re.escape(DQ)}\s*+\d*+:")
_OFFICIAL_DA = re.compile(rf"{re.escape(DA)}\s*+\d*+:")
# dsp's template ends the `disambig` field at the next field's prefix (dsp/templates/template_v2.py:157-165).
_NEXT_FIELD = f"\n{ANSWER}"


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
    parts = [p.strip().strip('"').strip() for p in text.split(DA_SEPARATOR)]
    return tuple(p for p in parts if p)


def da_text(answers: tuple[str, ...] | list[str]) -> str:
    """A DA line's text from its short answers (a demo's, toc/utils.py:18 make_str_disambig)."""
    return f"{DA_SEPARATOR} ".join(answers)


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
        if DQ not in lines[i] or DA not in lines[i + 1]:  # :34-35 (the assert fails; :43-44 skip)
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
        return DQ, m.group(2)
    if m := _DA.match(line):
        return DA, m.group(2)
    q, a = _OFFICIAL_DQ.search(line), _OFFICIAL_DA.search(line)
    if q is None and a is None:
        return None
    kind, pattern = (DQ, _OFFICIAL_DQ) if a is None or (q is not None and q.start() < a.start()) else (DA, _OFFICIAL_DA)
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
        if kind == DQ and len(both := _OFFICIAL_DA.split(text, maxsplit=1)) == 2:
            # DQ and DA on one line: read as the pair it is (the official code pairs it with the next line)
            if pending is not None:
                out.notes.append(f"DQ without DA: {pending[:60]!r}")
            pending, kind, text = both[0].strip() or None, DA, both[1].strip()
        if kind == DQ:
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
    m = _VERDICT.search(completion)
    if m is None:
        return False, f"verdict neither {' nor '.join(VERDICTS)}: {completion[:40]!r}"
    return m.group(1).lower() == VERDICTS[0].lower(), None


_VERDICT = re.compile(r"\b(" + "|".join(map(re.escape, VERDICTS)) + r")\b", re.IGNORECASE)


def clean_long_answer(completion: str) -> str:
    """The final answer step ends its prompt at `Answer:`; drop an echoed label and anything after a
    separator the model may start (a new `---` part or `Question:` demo)."""
    text = completion.strip()
    text = _ECHOED_LABEL.sub("", text, count=1)
    text = _NEXT_PART.split(text, maxsplit=1)[0]
    return " ".join(text.split())


_ECHOED_LABEL = re.compile(rf"\A\s*+{_field(ANSWER)}\s*+", re.IGNORECASE)
# A separator at the start of a line, after that line's own blanks. (`\n\s*(?:---|...)` let `\s*`
# run over following blank lines too, re-scanned from every newline: quadratic, 6.9 s on 40k
# characters. The text cut off can only differ by whitespace, which the join above collapses.)
_NEXT_PART = re.compile(rf"\n[^\S\n]*+(?:{re.escape(PART)}|{_field(QUESTION)}|{_field(CONTEXT)})")


# -- grammar ------------------------------------------------------------------------------------------
# The most DQ/DA pairs a constrained clarification may hold, and the longest DQ and DA lines (words), chosen
# so that a whole clarification fits in `[toc] clarify_max_tokens` (256): the small models write every pair
# the grammar allows, and with 10 pairs the tenth always ran past 256 tokens and was cut (a parse error).
# - Pairs: 3, the median number of readings of an ASQA dev question (gold qa_pairs: 2 to 6, mean 3.36); the
#   official demos are such questions with their qa_pairs as DQ/DA lines (run_toc.py:23-41 get_dataset),
#   and ToC's tree adds readings by expanding nodes (run_toc.py:138 --max_nodes 10), not by one long list.
# - Words: 27 per DQ line (99th percentile of ASQA dev's 3,184 gold disambiguated questions) and 9 per DA
#   line (95th percentile of their short answers joined by "; ").
# - Tokens: a pair's `DQ i: ` / `\nDA i: ` / `\n` cost 12 tokens, a word of a gold pair 2.0 at the 95th
#   percentile (SmolLM2 2.00, Gemma 3 1.81; median 1.44 / 1.29), and the end `\n\nAnswer:` 4, so the
#   longest constrained clarification is FORMAT_MAX_TOKENS = 3 * (12 + 36 * 2.0) + 4 = 256 tokens
#   (tests/test_constraints.py checks it against the default clarify_max_tokens and the real tokenizer).
# - Characters: at most FORMAT_MAX_WORD_CHARS = 20 per word (1 of ASQA dev's 49,996 gold DQ/DA words is
#   longer; 99.9th percentile 15): with lines capped in words alone, SmolLM2 glued words into one past the
#   cap until max_tokens (12 % of its clarifications on ASQA dev 0-9, docs/running-toc.md#constrained-decoding). The
#   format grammar is the same string for every request and vLLM compiles it once per engine: 1.3 s with
#   SmolLM2's vocabulary, 3.6 s with Gemma 3's (unbounded words: 0.2 s / 1.4 s).
# Lines in words, not characters: xgrammar expands a bounded repetition into one state per step and precomputes a
# token mask for each, so `[^\n]{0,199}` took 33 s to compile with Gemma 3's 262k-token vocabulary, 40 words
# 0.7 s (docs/running-toc.md#constrained-decoding).
FORMAT_MAX_PAIRS = 3
FORMAT_MAX_DQ, FORMAT_MAX_DA = 27, 9
FORMAT_MAX_WORD_CHARS = 20
FORMAT_PAIR_TOKENS, FORMAT_TOKENS_PER_WORD, FORMAT_END_TOKENS = 12, 2.0, 4
FORMAT_MAX_TOKENS = round(FORMAT_MAX_PAIRS * (FORMAT_PAIR_TOKENS + (FORMAT_MAX_DQ + FORMAT_MAX_DA) * FORMAT_TOKENS_PER_WORD)
                          + FORMAT_END_TOKENS)

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def literal(text: str) -> str:
    """An EBNF string literal of `text` (xgrammar's GBNF escapes; other control characters as \\xHH)."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


@functools.lru_cache(maxsize=8)
def format_grammar(max_pairs: int = FORMAT_MAX_PAIRS) -> str:
    """EBNF of a clarification: `DQ 1: q` NL `DA 1: a` (NL `DQ 2: ...`)... up to `max_pairs`, then the end
    (or `\\n\\nAnswer:`, the next field of the official template, toc/templates/load.py:26, which
    CLARIFY_STOP cuts off). A question and an answer are one non-empty line each; an
    answer starts with a character that `split_answers` keeps (not ';', '"' or a blank)."""
    if max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
    rules = ["root ::= pair1"]
    for i in range(1, max_pairs + 1):
        more = f'"\\n" pair{i + 1} | ' if i < max_pairs else ""
        dq, da, end = literal(f"{label(DQ, i)} "), literal(f"\n{label(DA, i)} "), literal(f"\n\n{ANSWER}")
        rules.append(f"pair{i} ::= {dq} dq {da} da ({more}{end})?")
    # Lines are capped (FORMAT_MAX_DQ / FORMAT_MAX_DA words, single spaces between them): a small model that
    # loops inside one line ("The World Boa, The World Boa, ...") is made to go on to the next field
    # instead of running into max_tokens, where the pair would be lost.
    # Words are capped too (FORMAT_MAX_WORD_CHARS): with the word cap alone, SmolLM2 glued words together
    # past the last one ("a1991AmericanfemalebuddyroadcrimefilmdirectordirectedbyRickey_Jenkins;...") until
    # max_tokens.
    w = FORMAT_MAX_WORD_CHARS - 1
    rules.append(f'dq ::= [^\\n\\t ] [^\\n ]{{0,{w}}} (" " word){{0,{FORMAT_MAX_DQ - 1}}}')
    rules.append(f'da ::= [^\\n\\t {DA_SEPARATOR}"] [^\\n ]{{0,{w}}} (" " word){{0,{FORMAT_MAX_DA - 1}}}')
    rules.append(f'word ::= [^\\n ]{{1,{FORMAT_MAX_WORD_CHARS}}}')
    return "\n".join(rules) + "\n"
