"""QuoteSum / SEMQA (Schuster et al. 2023): each question comes with its own numbered sources, answered
with `[ k span ]` quotes from them; no index search and no tree (docs/architecture.md#the-index). Scored by the official
QuoteSum metrics (eval/quotesum.py).

`numbered_sources` is the one place a source's passage id `qid:s{k}` is made (a run's given sources,
and the SEMQA demos of `QuoteSum.demos`, which batch/toc/demos.py picks per prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from clarify.eval.datasets import DEV, Dataset, register
from clarify.fewshot import QuotedDemo
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

    def load(self, path, *, split: str = DEV):
        """(questions with `sources`/`titles`, gold); one file per split, so `split` is not used."""
        from clarify.eval.quotesum import load_quotesum

        return load_quotesum(Path(path))

    def demos(self, split: str = DEV, *, path=None, start: int = 0, stop: int | None = None) -> list[QuotedDemo]:
        """Questions start..stop-1 of the file (`read_quotesum`, the reader of `load`; one file per split, so
        `split` is not used) as SEMQA demos: each question's first line with at least two sources, its sources
        numbered as a run's given sources (`numbered_sources`) so that the reference's `[ k span ]` markers
        point at them."""
        from clarify.eval.quotesum import read_quotesum

        rows = read_quotesum(path or self.default_path())
        wanted = set(list(dict.fromkeys(r.qid for r in rows))[start:stop])
        demos, seen = [], set()
        for r in rows:
            if r.qid in wanted and r.qid not in seen and len(r.sources) >= 2:
                seen.add(r.qid)
                demos.append(QuotedDemo(r.qid, r.question, tuple(numbered_sources(r.qid, r.titles, r.sources)),
                                        r.summary))
        return demos

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
