"""The metrics' names, declared once: each is a column of a scorer's per-question table (eval/asqa.py,
eval/quotesum.py), a `metric` of scores.parquet and of summary.json's `metrics` (eval/summary.py), and a card
of the report's headline (batch/report/html.py). A member equals its string, so the tables and JSON hold
the plain name."""

from __future__ import annotations

from enum import StrEnum


class Metric(StrEnum):
    """In the order the report's headline shows them."""

    ROUGE_L = "rouge_l"
    STR_EM = "str_em"
    ANSWER_F1 = "answer_f1"
    D_F1 = "d_f1"
    DR = "dr"
    SEM_F1 = "sem_f1"
    SEM_REC = "sem_rec"
    SEMQA = "semqa"
    ROUGE1 = "rouge1"
    ROUGE2 = "rouge2"
    QA_EM = "qa_em"
    QA_HIT = "qa_hit"
    LENGTH = "length"
    MISSING_PREDICTIONS = "missing_predictions"


# Each metric in words (the report's cards and tables); a metric without words keeps its name.
WORDS = {
    Metric.ROUGE_L: "ROUGE-L", Metric.STR_EM: "STR-EM", Metric.ANSWER_F1: "Answer-F1", Metric.D_F1: "Disambig-F1",
    Metric.DR: "DR (sqrt Disambig-F1 x ROUGE-L)", Metric.SEM_F1: "Sem-F1", Metric.SEM_REC: "Sem-Rec",
    Metric.SEMQA: "SEMQA (sqrt Sem-F1 x ROUGE-L)", Metric.ROUGE1: "ROUGE-1", Metric.ROUGE2: "ROUGE-2",
    Metric.QA_EM: "QA exact match", Metric.QA_HIT: "QA hit", Metric.LENGTH: "answer length (words)",
    Metric.MISSING_PREDICTIONS: "questions without an answer",
}
