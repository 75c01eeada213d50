"""ASQA metrics (Stelmakh et al. 2022) on Polars tables, as google-research/language `language/asqa` scores them.

Per question (one row per qid, one column per metric, all on a 0–100 scale except `length`):

- `rouge_l`  — rougeLsum F of the prediction vs. the best of the annotations' long answers
               (scoring.py::rouge/_rouge_calculation; see `clarify.eval.rouge.asqa_rouge_l`);
- `str_em`   — share of qa_pairs with any normalised short answer a substring of the normalised
               prediction (scoring.py::str_em/_exact_presence);
- `length`   — words, `len(answer.split())` (scoring.py::compute_len);
- `d_f1`, `qa_em`, `qa_hit` — Disambig-F1: a SQuAD 2.0 reader answers every gold disambiguated question
               with the prediction as context; per pair the max over short answers of token F1 / EM,
               mean over pairs; qa_hit = all pairs EM (scoring.py::score_qa_accuracy). Null when no reader
               is configured — *not computed*, never 0.
DR (= "ovscore", sqrt(D-F1 × ROUGE-L), scoring.py::compute_all_scores) is a corpus-level number and is
computed in `clarify.eval.summary.summarize`.

Also here: ToC's Answer-F1 over tree nodes (`answer_f1`). The one reader of ASQA files (`read_asqa`, and
`load_asqa`: the questions and gold tables scored here) is asqa_file.py. Answer coverage AC@k over retrieval hits
lives in `clarify.index.coverage.answer_coverage` (one implementation; it matches on "title text").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from clarify import schemas
from clarify.errors import InputError
from clarify.eval.io import check_prediction_ids
from clarify.eval.metrics import Metric
from clarify.eval.reader import Reader, as_reader
from clarify.eval.rouge import asqa_rouge_l
from clarify.normalize import exact_match, exact_presence, normalize_answer, token_f1

GOLD_SCHEMA = schemas.ASQA_GOLD

NO_READER = "not computed: no QA reader configured (pass --reader DIR, a SQuAD 2.0 extractive model)"
READER_METRICS = (Metric.D_F1, Metric.QA_EM, Metric.QA_HIT)  # what the reader scores (`qa_scores`); else null


# ---------------------------------------------------------------- per-string metrics


def str_em(prediction: str, pairs_short_answers: Sequence[Sequence[str]]) -> float:
    """STR-EM ×100 of one prediction: mean over qa_pairs of `exact_presence` (scoring.py::str_em)."""
    hits = [exact_presence(list(sa), prediction) for sa in pairs_short_answers]
    return 100.0 * sum(hits) / len(hits)


def answer_length(prediction: str) -> int:
    """Whitespace words (scoring.py::compute_len: len(answer.split()))."""
    return len(prediction.split())


def qa_scores(reader_answers: Sequence[str], pairs_short_answers: Sequence[Sequence[str]]) -> tuple[float, float, float]:
    """(D-F1, QA-EM, QA-Hit) ×100 of one question from the reader's answer to each of its pairs.

    scoring.py::score_qa_accuracy: per pair max over short answers of _compute_f1 / _compute_exact;
    mean over pairs; hit = every pair EM.
    """
    f1s = [max(token_f1(a, p) for a in sa) for p, sa in zip(reader_answers, pairs_short_answers)]
    ems = [max(exact_match(a, p) for a in sa) for p, sa in zip(reader_answers, pairs_short_answers)]
    n = len(f1s)
    return 100.0 * sum(f1s) / n, 100.0 * sum(ems) / n, 100.0 * float(sum(ems) == n)


# ---------------------------------------------------------------- tables


def score_asqa(
    predictions: pl.DataFrame,
    gold: pl.DataFrame,
    reader: Reader | str | Path | None = None,
    *,
    progress: bool = True,
) -> pl.DataFrame:
    """Score long answers against ASQA gold, one row per prediction.

    predictions: [qid, answer] (+ optional `missing` bool, set by the CLI for ids without a prediction;
                 a null answer counts as "").
    gold:        from `load_asqa` (asqa_file.py).
    reader:      None (D-F1 not computed), a model directory, or a callable (questions, contexts) -> answers.
    Returns [qid, rouge_l, str_em, length, d_f1, qa_em, qa_hit, n_pairs, missing]; d_f1/qa_em/qa_hit are
    null when `reader` is None. Raises InputError for qids absent from gold or given twice.
    """
    from tqdm import tqdm

    schemas.check(predictions, "answers", columns=["qid", "answer"])
    check_prediction_ids(predictions, set(gold["qid"].unique().to_list()))
    by_qid = {
        r["qid"]: r
        for r in gold.group_by("qid", maintain_order=True)
        .agg(pl.col("dq"), pl.col("short_answers"), pl.col("long_answers").first())
        .iter_rows(named=True)
    }
    preds = predictions.with_columns(pl.col("answer").fill_null(""))
    missing = preds["missing"].to_list() if "missing" in preds.columns else [False] * preds.height
    rows = []
    for (qid, answer), miss in tqdm(
        zip(preds.select("qid", "answer").iter_rows(), missing),
        # `or None`: tqdm's "draw only on a terminal" (a log would keep every redraw), as each bar of clarify
        total=preds.height, desc="asqa", unit="q", disable=not progress or None,
    ):
        g = by_qid[qid]
        rows.append({
            "qid": qid,
            Metric.ROUGE_L: asqa_rouge_l(answer, g["long_answers"]),
            Metric.STR_EM: str_em(answer, g["short_answers"]),
            Metric.LENGTH: float(answer_length(answer)),
            "n_pairs": len(g["dq"]),
            "missing": bool(miss),
        })
    out = pl.DataFrame(rows, schema={"qid": pl.String, Metric.ROUGE_L: pl.Float64, Metric.STR_EM: pl.Float64,
                                     Metric.LENGTH: pl.Float64, "n_pairs": pl.Int32, "missing": pl.Boolean})
    qa = _reader_scores(preds, by_qid, as_reader(reader))
    return out.join(qa, on="qid", how="left", maintain_order="left").select(
        "qid", Metric.ROUGE_L, Metric.STR_EM, Metric.LENGTH, *READER_METRICS, "n_pairs", "missing"
    )


def _reader_scores(preds: pl.DataFrame, by_qid: dict, reader: Reader | None) -> pl.DataFrame:
    schema = {"qid": pl.String, **dict.fromkeys(READER_METRICS, pl.Float64)}
    if reader is None:
        return pl.DataFrame({"qid": preds["qid"]}).with_columns(
            pl.lit(None, pl.Float64).alias(c) for c in READER_METRICS
        )
    # One reader call for every (question, pair): convert_to_roberta_format.py::qa_format.
    qs, ctxs, owners = [], [], []
    for qid, answer in preds.select("qid", "answer").iter_rows():
        for dq in by_qid[qid]["dq"]:
            qs.append(dq)
            ctxs.append(answer)
            owners.append(qid)
    answers = reader(qs, ctxs)
    if len(answers) != len(qs):
        raise ValueError(f"reader returned {len(answers)} answers for {len(qs)} questions")
    grouped: dict[str, list[str]] = {}
    for qid, a in zip(owners, answers):
        grouped.setdefault(qid, []).append(a or "")
    rows = []
    for qid in preds["qid"]:
        f1, em, hit = qa_scores(grouped[qid], by_qid[qid]["short_answers"])
        rows.append({"qid": qid, **dict(zip(READER_METRICS, (f1, em, hit)))})
    return pl.DataFrame(rows, schema=schema)


# ---------------------------------------------------------------- ToC Answer-F1 and AC@k


def ambigqa_answer_f1(gold_clusters: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    """AmbigQA "F1 answer" in [0, 1] between gold answer clusters and predicted answers.

    shmsw25/AmbigQA `ambigqa_evaluate_script.py::get_f1` with `get_exact_match`: walk gold clusters in
    order and, for each, the predictions in order; a still-free gold cluster and a still-free prediction
    are matched when any alias of the one equals any string of the other after `normalize_answer`
    (greedy, one-to-one). recall = matched / |gold|, precision = matched / |predicted|, F1 = 2PR/(P+R),
    0 when nothing matches. The script asserts both sides non-empty; here an empty prediction set gives 0.
    """
    if not gold_clusters or not predicted:
        return 0.0
    gold_norm = [{normalize_answer(a) for a in c} for c in gold_clusters]
    pred_norm = [{normalize_answer(a) for a in p} for p in predicted]
    used_pred = [False] * len(pred_norm)
    matched = 0
    for g in gold_norm:
        for j, p in enumerate(pred_norm):
            if not used_pred[j] and g & p:
                used_pred[j] = True
                matched += 1
                break
    if matched == 0:
        return 0.0
    recall, precision = matched / len(gold_norm), matched / len(pred_norm)
    return 2 * precision * recall / (precision + recall)


KEPT_STATUSES = schemas.KEPT_STATUSES


def answer_f1(nodes: pl.DataFrame, gold: pl.DataFrame, *, statuses: Sequence[str] = KEPT_STATUSES) -> pl.DataFrame:
    """ToC Answer-F1 per question: how accurately the tree's own disambiguated answers (DA) match gold.

    Definition (ToC, Kim et al. 2023, §4 pruning analysis, which measures it "following Min et al. 2020"):
    the AmbigQA answer F1 (`ambigqa_answer_f1`) between
      predicted = one entry per kept non-root node (depth ≥ 1, status in `statuses`: nodes that passed
                  verification, including those later expanded), in table order; an entry matches when any
                  of the node's `answers` equals an alias;
      gold      = one cluster per ASQA qa_pair, its `short_answers` as aliases.
    ×100. A question present in `nodes` with no kept node scores 0; questions absent from `nodes` are not
    returned.

    nodes: schemas.NODES (reads qid, depth, status, answers). gold: from `load_asqa` (asqa_file.py).
    Returns [qid, answer_f1, n_predicted, n_gold].
    """
    schemas.check(nodes, "nodes", columns=["qid", "depth", "status", "answers"])
    gold_by = {
        r["qid"]: r["short_answers"]
        for r in gold.group_by("qid", maintain_order=True).agg(pl.col("short_answers")).iter_rows(named=True)
    }
    unknown = sorted(set(nodes["qid"].unique().to_list()) - set(gold_by))
    if unknown:
        raise InputError(f"{len(unknown)} node qid(s) not in the gold data, e.g. {unknown[:5]}", field="qid")
    kept = nodes.with_columns(
        pl.col("status").is_in(list(statuses)).and_(pl.col("depth") >= 1).alias("_kept")
    )
    rows = []
    for (qid,), grp in kept.group_by("qid", maintain_order=True):
        pred = [a or [] for a in grp.filter(pl.col("_kept"))["answers"].to_list()]
        rows.append({"qid": qid, Metric.ANSWER_F1: 100.0 * ambigqa_answer_f1(gold_by[qid], pred),
                     "n_predicted": len(pred), "n_gold": len(gold_by[qid])})
    return pl.DataFrame(rows, schema={"qid": pl.String, Metric.ANSWER_F1: pl.Float64,
                                      "n_predicted": pl.Int32, "n_gold": pl.Int32})
