"""Answer matching inside the tree: does a passage hold an answer, how alike are two answers.

The tree decides with these which passages are exhausted, which demos are left out, which passage is a
verification's evidence and (toc.answer_passages_from = "nodes") which passages the answer gets. Two
rules, chosen by `toc.matching` (batch/config/schema.py):

- "dsp" (default): the official code's, from the dsp it ships (gankim/tree-of-clarifications):
  `passage_has_answers` (dsp/primitives/demonstrate.py:129-134) normalises passage and answers with
  dsp's `normalize_text` (dsp/utils/metrics.py:33-49: NFD, lower-case, ASCII punctuation deleted,
  articles dropped), tokenises both with DPR's SimpleTokenizer (dsp/utils/dpr.py:144-183, 219-224: a
  run of letters, digits and marks is a token, every other visible character is a token of its own) and
  looks for the answer's tokens as a contiguous run of the passage's (dsp/utils/dpr.py:186-194). So "16"
  is in "2015–16" (the en dash is not ASCII punctuation: it splits), and an answer that normalises to
  nothing ("", "The", "a") is in every passage. `F1` (dsp/utils/metrics.py:15-18, 60-79) is SQuAD's token
  F1 over `normalize_text`, except that two answers without tokens score 0.
- "squad" (clarify's earlier choice, docs/fidelity.md): the ASQA/SQuAD normalisation of the metrics (normalize.py
  `has_answer`: whole whitespace tokens, an empty answer is in no passage; `token_f1`: two empties 1.0).

The metrics (STR-EM, Answer-F1, retrieval coverage) never use the "dsp" rule: they keep their own official
scorers' definitions (normalize.py).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache
from itertools import groupby

from clarify import normalize

_ASCII_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def dsp_normalize_text(s: str) -> str:
    """dsp/utils/metrics.py:33-49 normalize_text: NFD, then white_space_fix(remove_articles(remove_punc(lower)))."""
    s = unicodedata.normalize("NFD", s).lower().translate(_ASCII_PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _kind(ch: str) -> str:
    """The class of a character in DPR's SimpleTokenizer (dsp/utils/dpr.py:145-146): "w" for
    `[\\p{L}\\p{N}\\p{M}]` (joined into runs), "" for `\\p{Z}` and `\\p{C}` (skipped), else "p" (one token each)."""
    major = unicodedata.category(ch)[0]
    return "w" if major in "LNM" else "" if major in "ZC" else "p"


def dpr_tokens(text: str) -> tuple[str, ...]:
    """dsp/utils/dpr.py:219-224 DPR_normalize: NFD, SimpleTokenizer (`(ALPHA_NUM+)|(NON_WS)`, :153-183), each
    token lower-cased (`words(uncased=True)`, :40-49)."""
    out: list[str] = []
    for kind, run in groupby(unicodedata.normalize("NFD", text), key=_kind):
        if kind == "w":
            out.append("".join(run).lower())
        elif kind == "p":
            out.extend(ch.lower() for ch in run)
    return tuple(out)


@lru_cache(maxsize=8192)
def _passage_tokens(passage: str) -> str:
    """The passage's tokens (dsp/primitives/demonstrate.py:133, dsp/utils/dpr.py:187), space-joined and
    space-framed: tokens never hold a space (\\p{Z} is skipped), so a run of tokens is a substring test."""
    return f" {' '.join(dpr_tokens(dsp_normalize_text(passage)))} "


def dsp_has_answers(passage: str, answers: Sequence[str]) -> bool:
    """dsp `passage_has_answers(passage, answers)` (dsp/primitives/demonstrate.py:129-134 → dsp/utils/dpr.py
    has_answer, :186-194): any answer's tokens occur as a contiguous run of the passage's. An answer with no
    token is found in every passage (`range(0, len(text) + 1)` compares `[] == []`)."""
    hay = None
    for ans in answers:
        toks = dpr_tokens(dsp_normalize_text(ans))
        if not toks:
            return True
        hay = hay or _passage_tokens(passage)
        if f" {' '.join(toks)} " in hay:
            return True
    return False


@lru_cache(maxsize=1 << 16)
def _f1_tokens(s: str) -> tuple[Counter, int]:
    """An answer's `normalize_text` tokens (split on whitespace) and their count, computed once per answer:
    official demo removal compares every DA found with every demo DA of the pool (4,353 train questions,
    program.py removed_by), so the demos' answers recur in every expansion."""
    toks = dsp_normalize_text(s).split()
    return Counter(toks), len(toks)


def dsp_f1(prediction: str, ground_truth: str) -> float:
    """dsp/utils/metrics.py:60-79 f1_score: token F1 over `normalize_text` (split on whitespace); nothing in
    common, two empty answers included, scores 0 (:67-73: "We don't for uniformity")."""
    (pred, n_pred), (gold, n_gold) = _f1_tokens(prediction), _f1_tokens(ground_truth)
    num_same = 0 if pred.keys().isdisjoint(gold) else sum((pred & gold).values())
    if num_same == 0:
        return 0.0
    precision, recall = num_same / n_pred, num_same / n_gold
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class Matching:
    """One rule: `has_answer(passage, answers)`, `f1(a, b)` (symmetric) and `tokens(a)`, the tokens f1
    compares (two answers with no token in common score 0 unless both have none: `AnswerIndex`)."""

    has_answer: Callable[[str, Sequence[str]], bool]
    f1: Callable[[str, str], float]
    tokens: Callable[[str], Sequence[str]]


def dsp_f1_tokens(s: str) -> Sequence[str]:
    """The tokens `dsp_f1` compares."""
    return tuple(_f1_tokens(s)[0])


def squad_f1_tokens(s: str) -> Sequence[str]:
    """The tokens normalize.py `token_f1` compares."""
    return normalize.normalize_answer(s).split() if s else []


class AnswerIndex:
    """Which of many answers (`answers`) score F1 above a threshold with any of a few others, scoring only
    the pairs that can: the official demo removal compares every DA a clarification found with every DA of
    the demo pool (program.py `removed_by`: 4,353 train questions' pairs per expansion), and nearly all of
    those pairs share no token. Exact for any threshold >= 0: under both rules two answers that share no
    token score 0 (SQuAD's F1, normalize.py `token_f1`; dsp/utils/metrics.py:60-79), except two
    answers with no token at all, which `token_f1` scores 1; so an answer with tokens is scored against
    the answers sharing one of them, an answer without against those without, and every pair left out
    scores 0 (tests/test_toc_matching.py checks it against scoring every pair)."""

    def __init__(self, answers: Sequence[str], match: Matching):
        self.answers, self.match = list(answers), match
        self._by_token: dict[str, list[int]] = {}
        self._empty: list[int] = []
        for i, a in enumerate(self.answers):
            toks = set(match.tokens(a))
            if not toks:
                self._empty.append(i)
            for t in toks:
                self._by_token.setdefault(t, []).append(i)

    def above(self, found: Sequence[str], threshold: float) -> set[int]:
        """Positions in `answers` whose F1 with some answer of `found` is above `threshold` (>= 0)."""
        if threshold < 0:
            raise ValueError(f"threshold must be >= 0 (pairs without a common token score 0), got {threshold}")
        hits: set[int] = set()
        for b in found:
            toks = set(self.match.tokens(b))
            cands = {i for t in toks for i in self._by_token.get(t, ())} if toks else set(self._empty)
            hits.update(i for i in cands - hits if self.match.f1(self.answers[i], b) > threshold)
        return hits


class MatchRule(StrEnum):
    """toc.matching: which rule the tree matches answers by (the module docstring)."""

    DSP = "dsp"
    SQUAD = "squad"


MATCHING = {MatchRule.DSP: Matching(dsp_has_answers, dsp_f1, dsp_f1_tokens),
            MatchRule.SQUAD: Matching(normalize.has_answer, normalize.token_f1, squad_f1_tokens)}
