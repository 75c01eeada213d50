"""ASQA (Stelmakh et al. 2022): ambiguous questions searched in the index, long answers scored by the
official ASQA metrics (eval/asqa.py) plus ToC's Answer-F1 over the tree's nodes.

The few-shot clarification demos come from ASQA dev itself (no train split here: batch/demos.py,
data/asqa/SOURCE.md), so a run may not answer the demo pool's questions (`check_slice`).
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

    def check_slice(self, cfg: Any, questions) -> None:
        """The questions offset..offset+limit-1 must lie outside the demo pool (`cfg.demo_pool`)."""
        from clarify.batch.demos import parse_pool_spec

        _, pool_start, pool_stop = parse_pool_spec(cfg.demo_pool)
        stop = cfg.offset + cfg.limit if cfg.limit else questions.height  # limit 0 = every question
        if cfg.offset < (pool_stop or 10**9) and stop > pool_start:
            raise InputError(f"questions {cfg.offset}..{stop - 1} overlap the demo pool {cfg.demo_pool}; "
                             f"evaluate questions before {pool_start}", field="limit")

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
