"""QuoteSum / SEMQA (Schuster et al. 2023): each question comes with its own numbered sources, answered
with `[ k span ]` quotes from them; no index search and no tree (docs/architecture.md#the-index). Scored by the official
QuoteSum metrics (eval/quotesum.py).

`numbered_sources` is the one place a source's passage id `qid:s{k}` is made (a run's given sources,
and the SEMQA demos of batch/toc/demos.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from clarify.eval.datasets import Dataset, register
from clarify.schemas import Passage


def numbered_sources(qid: str, titles: Sequence[str], texts: Sequence[str]) -> list[Passage]:
    """A question's sources as passages `qid:s1`, `qid:s2`, … in order (k = the quote marker's number)."""
    return [Passage(f"{qid}:s{k}", title, text) for k, (title, text) in enumerate(zip(titles, texts), 1)]


class QuoteSum(Dataset):
    name = "quotesum"
    default_file = ("quotesum", "dev.jsonl")
    has_gold = True
    builds_trees = False
    quoted_gold = True

    def load(self, path, *, split: str = "dev"):
        """(questions with `sources`/`titles`, gold); one file per split, so `split` is not used."""
        from clarify.eval.quotesum import load_quotesum

        return load_quotesum(Path(path))

    def given_sources(self, questions) -> dict[str, list[Passage]]:
        return {row["qid"]: numbered_sources(row["qid"], row["titles"], row["sources"])
                for row in questions.iter_rows(named=True)}

    def canonical_markers(self, predictions):
        import polars as pl

        from clarify.eval.quotesum import canonical_markers

        return predictions.with_columns(pl.col("answer").map_elements(canonical_markers, return_dtype=pl.String))

    def score(self, predictions, gold, *, nodes=None, reader=None):
        from clarify.eval.quotesum import score_quotesum

        return score_quotesum(predictions, gold)

    def summarize(self, per_question, gold):
        from clarify.eval.quotesum import summarize_quotesum

        return summarize_quotesum(per_question, gold)


register(QuoteSum())
