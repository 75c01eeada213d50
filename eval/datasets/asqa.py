"""ASQA (Stelmakh et al. 2022): ambiguous questions searched in the index, long answers scored by the
official ASQA metrics (eval/asqa.py) plus ToC's Answer-F1 over the tree's nodes.

The few-shot clarification demos come from the same file, read by the same reader (`demos`; batch/toc/demos.py
picks them per prompt): its train split when it has one, as the official code (run_toc.py:23-41, :191), else dev
questions 500..947 (the shipped file has no train split: data/asqa/SOURCE.md), which a run then does not answer
(`select`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from clarify.asqa_file import SHIPPED
from clarify.errors import InputError
from clarify.eval.datasets import DEV, Dataset, register
from clarify.fewshot import Demo, QAPair

# `demo_pool` specs (batch/toc/demos.py resolves one into the run's concrete pool;
# docs/running-toc.md#the-whole-asqa-dev-set). They live with the ASQA adapter: a spec names a split and slice of an ASQA file.
AUTO = "auto"
SHIPPED_POOL = "asqa:dev[500:]"  # the shipped data has no train split: dev 500..947 are the demos
TRAIN_POOL = "asqa:train"
_SPEC = re.compile(r"asqa:(?P<split>dev|train)(?:\[(?P<start>\d*):(?P<stop>\d*)\])?(?:@(?P<file>.+))?")


@dataclass(frozen=True)
class PoolSpec:
    """A parsed `demo_pool`: `asqa:SPLIT[start:stop]@FILE` (slice and file optional)."""

    split: str
    start: int = 0
    stop: int | None = None
    file: str = ""  # "": the run's own ASQA file


def pool_spec_problem(spec: str) -> str | None:
    """Why `spec` is no `demo_pool` (the config's check), or None."""
    if spec == AUTO or _SPEC.fullmatch(spec.strip()):
        return None
    return (f"unknown demo pool {spec!r}; expected 'auto', 'asqa:train', 'asqa:dev[500:]' or either with "
            f"'@FILE'")


def parse_pool_spec(spec: str) -> PoolSpec:
    """'asqa:dev[500:]' → PoolSpec('dev', 500, None); 'asqa:train@/data/ASQA.json' → PoolSpec('train', 0, None,
    '/data/ASQA.json')."""
    m = _SPEC.fullmatch(spec.strip())
    if not m:
        raise InputError(pool_spec_problem(spec), field="demo_pool")
    return PoolSpec(m["split"], int(m["start"] or 0), int(m["stop"]) if m["stop"] else None, m["file"] or "")


class ASQA(Dataset):
    name = "asqa"
    default_file = SHIPPED
    has_gold = True
    # quoted answers keep their `[k span]` markers in `answer`; ASQA's metrics read the marker-free text
    answer_column = "answer_plain"

    def load(self, path, *, split: str = DEV):
        from clarify.asqa_file import load_asqa

        return load_asqa(Path(path), split=split)

    def demo_file(self, path):
        return path

    def splits(self, path):
        from clarify.asqa_file import asqa_splits

        return asqa_splits(path)

    def demos(self, split: str = DEV, *, path=None, start: int = 0, stop: int | None = None) -> list[Demo]:
        """Instances start..stop-1 of `split` (`read_asqa`, the reader of `load`) as clarification demos, as the
        official code makes them (toc/utils.py:12-23 make_str_disambig, ambigQA=True): each qa_pair with a
        question and a short answer → a DQ with its first short answer, and the first annotation's long answer;
        an instance with no such pair or no annotation makes no demo, but counts in the slice."""
        from clarify.asqa_file import read_asqa

        demos = []
        for inst in read_asqa(path or self.default_path(), split)[start:stop]:
            pairs = tuple(QAPair(p.question, p.answers[:1]) for p in inst.qa_pairs if p.question and p.answers)
            if pairs and inst.long_answers:
                demos.append(Demo(inst.sample_id, inst.question, pairs, inst.long_answers[0]))
        return demos

    def select(self, questions, pool, *, offset: int, limit: int):
        """offset..offset+limit-1 outside a demo pool drawn from these same questions (a dev slice of this
        file, batch/toc/demos.py `Pool.from_questions`): an explicit limit that overlaps it is refused; limit 0
        takes every question from offset on that is not a demo (the shipped default: dev 0..499)."""
        if not pool.from_questions:
            return super().select(questions, pool, offset=offset, limit=limit)
        lo, hi = pool.start, min(pool.stop if pool.stop is not None else questions.height, questions.height)
        if limit:
            stop = offset + limit
            if offset < hi and stop > lo:
                raise InputError(f"questions {offset}..{stop - 1} overlap the demo pool {pool.spec}; "
                                 f"evaluate questions outside {lo}..{hi - 1}, or give an ASQA file with a train "
                                 f"split (--questions ASQA.json)", field="limit")
            return super().select(questions, pool, offset=offset, limit=limit)
        keep = [i for i in range(offset, questions.height) if not lo <= i < hi]
        if not keep:
            raise InputError(f"every question from {offset} on is in the demo pool {pool.spec}", field="offset")
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
