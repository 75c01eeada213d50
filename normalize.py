"""Answer normalisation and token overlap, exactly as each official scorer does it.

Two scorers, two normalisations (they differ in how punctuation is handled):

- ASQA / SQuAD / AmbigQA: `normalize_answer` — lower-case, *delete* punctuation, replace the articles
  a/an/the by a space, collapse whitespace. Source: google-research/language
  `language/asqa/scoring.py::normalize_answer` (the same function as the SQuAD v2 evaluation script and
  shmsw25/AmbigQA `ambigqa_evaluate_script.py::normalize_answer`).
- QuoteSum / SEMQA: `normalize_answer_quotesum` — lower-case, *replace* punctuation by a space, then drop
  articles and collapse whitespace. Source: google-research-datasets/QuoteSum
  `evals/scorers.py::normalize_answer`. ("U.S." → "u s" here, but "us" under the ASQA rule.)

At the top, below eval/ and index/: the metrics (eval/), retrieval's AC@k (index/coverage.py) and the tree's
"squad" answer matching (batch/toc/match.py) share it, and index/ imports nothing of eval/ (tests/test_layout.py).
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
# str.translate tables: delete vs. replace-by-space (same character set: string.punctuation).
_DELETE_PUNCT = str.maketrans("", "", string.punctuation)
_SPACE_PUNCT = str.maketrans(string.punctuation, " " * len(string.punctuation))


def normalize_answer(s: str) -> str:
    """ASQA/SQuAD normalisation: lower → remove punctuation → articles to ' ' → single spaces.

    Order as in asqa/scoring.py::normalize_answer: white_space_fix(remove_articles(remove_punc(lower(s)))).
    """
    s = s.lower().translate(_DELETE_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def normalize_answer_quotesum(s: str) -> str:
    """QuoteSum normalisation: lower → punctuation to ' ' → articles to ' ' → single spaces.

    Order as in QuoteSum evals/scorers.py::normalize_answer.
    """
    s = s.lower().translate(_SPACE_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def token_f1(gold: str, pred: str) -> float:
    """SQuAD-style token F1 in [0, 1] between two raw strings (both normalised with `normalize_answer`).

    asqa/scoring.py::_compute_f1: if either side has no tokens, 1 when both are empty else 0;
    otherwise P = common/|pred|, R = common/|gold|, F1 = 2PR/(P+R) (0 when nothing is shared).
    """
    gold_toks = normalize_answer(gold).split() if gold else []
    pred_toks = normalize_answer(pred).split() if pred else []
    if not gold_toks or not pred_toks:
        return float(gold_toks == pred_toks)
    num_same = sum((Counter(gold_toks) & Counter(pred_toks)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_toks)
    recall = num_same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def exact_match(gold: str, pred: str) -> float:
    """1.0 when the two strings are equal after `normalize_answer` (asqa/scoring.py::_compute_exact)."""
    return float(normalize_answer(gold) == normalize_answer(pred))


def holds_answer(normalized_text: str, normalized_answers) -> bool:
    """Whole-token match: any (non-empty) normalised answer occurs as whole tokens in the normalised text
    (" ans " in " text "). The "answer in text" of retrieval coverage (index/coverage.py), and of the tree
    only under toc.matching = "squad": by default the tree matches as the official code's dsp does
    (batch/toc/match.py: NFD, DPR's tokens, an empty answer in every passage). ASQA's STR-EM is a plain
    substring test instead (`exact_presence`, the official scorer's definition)."""
    hay = f" {normalized_text} "
    return any(a and f" {a} " in hay for a in normalized_answers)


def has_answer(text: str, answers) -> bool:
    """`holds_answer` on raw text and answers (both normalised here)."""
    return holds_answer(normalize_answer(text), [normalize_answer(a) for a in answers])


def exact_presence(short_answers: list[str], context: str) -> bool:
    """True when any normalised short answer is a substring of the normalised context.

    asqa/scoring.py::_exact_presence (the building block of STR-EM). Note: plain substring, so an empty
    normalised short answer (e.g. "The") is present in every context, as in the official scorer.
    """
    n_context = normalize_answer(context)
    return any(normalize_answer(a) in n_context for a in short_answers)


def prf_tokens(target_tokens: list[str], prediction_tokens: list[str]) -> tuple[float, float, float]:
    """(F1, recall, precision) of two token lists with QuoteSum's empty-side conventions.

    QuoteSum evals/scorers.py::_f1_scorer.score:
      both empty → (1, 1, 1); target empty only → (0, 1, 0); prediction empty only → (0, 0, 1);
      nothing shared → (0, 0, 0); else P = common/|pred|, R = common/|target|, F1 = 2PR/(P+R).
    """
    if not target_tokens and not prediction_tokens:
        return 1.0, 1.0, 1.0
    if not target_tokens:
        return 0.0, 1.0, 0.0
    if not prediction_tokens:
        return 0.0, 0.0, 1.0
    num_same = sum((Counter(prediction_tokens) & Counter(target_tokens)).values())
    if num_same == 0:
        return 0.0, 0.0, 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(target_tokens)
    return 2 * precision * recall / (precision + recall), recall, precision
