"""ASQA (Stelmakh et al. 2022): ambiguous questions searched in the index, long answers scored by the
official ASQA metrics (eval/asqa.py) plus ToC's Answer-F1 over the tree's nodes.

The few-shot clarification demos come from the same file (batch/demos.py): its train split when it has one,
as the official code (run_toc.py:23-41, :191), else dev questions 500..947 (the shipped file has no train
split: data/asqa/SOURCE.md), which a run then does not answer (`select`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clarify.errors import InputError
from clarify.eval.datasets import Dataset, register


class ASQA(Dataset):
    name = "asqa"
    default_file = ("asqa", "dev.json")
    has_gold = True
    # quoted answers keep their `[k span]` markers in `answer`; ASQA's metrics read the marker-free text
    answer_column = "answer_plain"

    def load(self, path, *, split: str = "dev"):
        from clarify.eval.asqa import load_asqa

        return load_asqa(Path(path), split=split)

    def demo_file(self, path):
        return path

    def select(self, cfg: Any, questions):
        """offset..offset+limit-1 outside a demo pool drawn from these same questions (a dev slice of this
        file, batch/demos.py `Pool.from_questions`): an explicit limit that overlaps it is refused; limit 0
        takes every question from offset on that is not a demo (the shipped default: dev 0..499)."""
        from clarify.batch.demos import resolve_pool

        pool = resolve_pool(cfg)
        if not pool.from_questions:
            return super().select(cfg, questions)
        lo, hi = pool.start, min(pool.stop if pool.stop is not None else questions.height, questions.height)
        if cfg.limit:
            stop = cfg.offset + cfg.limit
            if cfg.offset < hi and stop > lo:
                raise InputError(f"questions {cfg.offset}..{stop - 1} overlap the demo pool {pool.spec}; "
                                 f"evaluate questions outside {lo}..{hi - 1}, or give an ASQA file with a train "
                                 f"split (--questions ASQA.json)", field="limit")
            return super().select(cfg, questions)
        keep = [i for i in range(cfg.offset, questions.height) if not lo <= i < hi]
        if not keep:
            raise InputError(f"every question from {cfg.offset} on is in the demo pool {pool.spec}", field="offset")
        return questions[keep]

    def score(self, predictions, gold, *, nodes=None, reader=None):
        """`score_asqa`, joined with ToC's Answer-F1 (`answer_f1`: answer_f1, n_predicted, n_gold) of the
        predicted questions' nodes when there are nodes."""
        import polars as pl

        from clarify.eval.asqa import answer_f1, score_asqa

        per_q = score_asqa(predictions, gold, reader=reader)
        if nodes is not None:
            af1 = answer_f1(nodes.filter(pl.col("qid").is_in(predictions["qid"].to_list())), gold)
            per_q = per_q.join(af1, on="qid", how="left", maintain_order="left")
        return per_q


register(ASQA())
