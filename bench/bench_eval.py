"""Time the evaluators on the whole shipped dev sets (no QA reader).

- ASQA: all 948 dev questions, predictions = each question's first annotation long answer (one of the
  two references, so ROUGE-L is 100 by construction; the point is the time, which ROUGE dominates);
- QuoteSum: all 265 human answers scored by hold-one-out (264 scorable: one qid has a single answer), and
  the 91 first answers per qid scored with `score_quotesum`.

    .venv/bin/python bench/bench_eval.py          # writes bench/results/eval.json
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> dict:
    from clarify.asqa_file import load_asqa
    from clarify.eval.asqa import score_asqa
    from clarify.eval.quotesum import load_quotesum, score_human_holdout, score_quotesum
    from clarify.eval.rouge import ensure_punkt
    from clarify.eval.summary import summarize

    (_, asqa_gold), t_load_asqa = _timed(lambda: load_asqa(ROOT / "data" / "asqa" / "dev.json"))
    _, t_punkt = _timed(ensure_punkt)
    preds = asqa_gold.group_by("qid", maintain_order=True).agg(pl.col("long_answers").first().list.first().alias("answer"))
    asqa_pq, t_asqa = _timed(lambda: score_asqa(preds, asqa_gold, progress=False))
    asqa_sum, t_asqa_sum = _timed(lambda: summarize(asqa_pq))

    (_, qs_gold), t_load_qs = _timed(lambda: load_quotesum(ROOT / "data" / "quotesum" / "dev.jsonl"))
    holdout, t_holdout = _timed(lambda: score_human_holdout(qs_gold, progress=False))
    first = qs_gold.group_by("qid", maintain_order=True).first().select("qid", pl.col("summary").alias("answer"))
    qs_pq, t_qs = _timed(lambda: score_quotesum(first, qs_gold, progress=False))
    hold_sum = summarize(holdout)

    def vals(summary):
        return {r["metric"]: r["value"] for r in summary.iter_rows(named=True) if r["value"] is not None}

    result = {
        "machine": f"{platform.processor() or platform.machine()}, {platform.python_version()}",
        "asqa": {"questions": asqa_pq.height, "load_s": round(t_load_asqa, 3), "nltk_import_and_punkt_setup_s": round(t_punkt, 3),
                 "score_s": round(t_asqa, 3), "summary_s": round(t_asqa_sum, 3),
                 "questions_per_s": round(asqa_pq.height / t_asqa, 1), "scores": vals(asqa_sum)},
        "quotesum": {"holdout_answers": holdout.height, "load_s": round(t_load_qs, 3),
                     "holdout_score_s": round(t_holdout, 3), "first_answer_questions": qs_pq.height,
                     "first_answer_score_s": round(t_qs, 3), "holdout_scores": vals(hold_sum)},
    }
    out = ROOT / "bench" / "results" / "eval.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
