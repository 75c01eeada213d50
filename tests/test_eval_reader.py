"""Disambig-F1 reader: SQuAD 2.0 post-processing by hand, and the code path with a real transformers model."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from clarify.errors import InputError
from clarify.eval.asqa import GOLD_SCHEMA, score_asqa
from clarify.eval.reader import ExtractiveReader, best_answer
from clarify.eval.summary import summarize

CONTEXT = "Paris is in France"
# token offsets of a feature: [CLS] q [SEP] Paris is in France [SEP]; None = not context
OFFS = [None, None, None, (0, 5), (6, 8), (9, 11), (12, 18), None]


def _logits(**at):
    v = np.zeros(len(OFFS))
    for i, x in at.items():
        v[int(i[1:])] = x
    return v


def test_best_answer_picks_the_best_span_inside_the_context():
    start, end = _logits(t3=5.0, t6=1.0), _logits(t3=1.0, t6=4.0)
    # candidates: (3,3)=6, (3,6)=9, (6,6)=5; null = 0 → "Paris is in France"
    assert best_answer([start], [end], [OFFS], CONTEXT) == "Paris is in France"
    assert best_answer([start], [end], [OFFS], CONTEXT, max_answer_length=3) == "Paris"  # 4-token span too long


def test_best_answer_null_threshold_is_strict():
    start, end = _logits(t0=3.0, t3=2.0), _logits(t0=3.0, t3=4.0)
    # null 6 vs best span 6: null − best = 0, not > 0 → the span wins (utils_qa: score_diff > threshold)
    assert best_answer([start], [end], [OFFS], CONTEXT) == "Paris"
    start[0] = 3.5  # null 6.5 > 6 → no answer
    assert best_answer([start], [end], [OFFS], CONTEXT) == ""
    assert best_answer([start], [end], [OFFS], CONTEXT, null_score_diff_threshold=1.0) == "Paris"


def test_best_answer_null_score_is_the_minimum_over_features():
    f1 = (_logits(t0=5.0, t3=1.0), _logits(t0=5.0, t3=1.0))  # null 10, span 2
    f2 = (_logits(t0=0.5, t6=2.0), _logits(t0=0.5, t6=2.0))  # null 1, span 4
    assert best_answer([f1[0], f2[0]], [f1[1], f2[1]], [OFFS, OFFS], CONTEXT) == "France"
    assert best_answer([f1[0]], [f1[1]], [OFFS], CONTEXT) == ""


@pytest.mark.integration
def test_real_model_reader_hand_checked(paris_reader_dir):
    reader = ExtractiveReader(paris_reader_dir, progress=False)
    long_ctx = "word " * 600 + "The capital is Paris."  # > 384 tokens: several features, Paris in the last
    answers = reader(["Where?", "Where?", "Where?", "Where?"],
                     ["It was held in PARIS, France.", "No city here.", long_ctx, ""])
    assert answers == ["PARIS", "", "Paris", ""]


@pytest.mark.integration
def test_disambig_f1_with_a_real_reader(paris_reader_dir):
    gold = pl.DataFrame(
        [
            {"qid": "q1", "pair_no": 0, "dq": "Which city first?", "short_answers": ["Paris, France", "Paris"],
             "long_answers": ["Paris then Lyon."]},
            {"qid": "q1", "pair_no": 1, "dq": "Which city second?", "short_answers": ["Lyon"],
             "long_answers": ["Paris then Lyon."]},
            {"qid": "q2", "pair_no": 0, "dq": "Which capital?", "short_answers": ["Paris, France"],
             "long_answers": ["Paris."]},
            {"qid": "q3", "pair_no": 0, "dq": "Which river?", "short_answers": ["Seine"],
             "long_answers": ["The Seine."]},
        ],
        schema=GOLD_SCHEMA,
    )
    preds = pl.DataFrame({"qid": ["q1", "q2", "q3"],
                          "answer": ["It moved from Paris to Lyon.", "The capital is Paris.", "A river."]})
    per_q = score_asqa(preds, gold, reader=str(paris_reader_dir), progress=False)
    rows = {r["qid"]: r for r in per_q.iter_rows(named=True)}
    # the reader answers "Paris" whenever the context has it, else "" (see the fixture)
    assert rows["q1"]["d_f1"] == pytest.approx(50.0)  # pair 1: max(F1 vs "Paris, France", "Paris") = 1; pair 2: 0
    assert rows["q1"]["qa_em"] == pytest.approx(50.0) and rows["q1"]["qa_hit"] == 0.0
    assert rows["q2"]["d_f1"] == pytest.approx(100 * 2 / 3)  # "Paris" vs "Paris, France"
    assert rows["q2"]["qa_em"] == 0.0
    assert rows["q3"]["d_f1"] == 0.0  # no answer vs "Seine"
    summary = {r["metric"]: r["value"] for r in summarize(per_q).iter_rows(named=True)}
    assert summary["d_f1"] == pytest.approx((50 + 200 / 3 + 0) / 3)
    assert summary["dr"] == pytest.approx(math.sqrt(summary["d_f1"] * summary["rouge_l"]))


def test_reader_directory_errors(tmp_path):
    with pytest.raises(InputError, match="not a model directory"):
        ExtractiveReader(tmp_path)
