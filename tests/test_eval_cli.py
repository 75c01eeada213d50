"""`clarify eval` end to end: official files, run directories, subsets, and bad input."""

from __future__ import annotations

import json

import polars as pl
import pytest

from clarify.batch.cli import main
from tests.fixtures_eval import ASQA_DEV, FLARE_PREDICTIONS, QUOTESUM_DEV
from tests.run_fixtures import write_run


def _summary(out) -> dict:
    return {r["metric"]: r for r in pl.read_parquet(out / "summary.parquet").iter_rows(named=True)}


def test_flare_file_with_limit_reproduces_published_numbers(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["eval", "--dataset", "asqa", "--predictions", str(FLARE_PREDICTIONS), "--limit", "500",
               "--out", str(out)])
    assert rc == 0
    cap = capsys.readouterr()
    assert "500 question(s) scored; 448 gold question(s) had no prediction and were not scored" in cap.err
    assert "str_em" in cap.out and "40.750" in cap.out
    s = _summary(out)
    assert s["str_em"]["value"] == pytest.approx(40.75, abs=5e-3)
    assert s["length"]["value"] == pytest.approx(136.802)
    assert s["rouge_l"]["value"] == pytest.approx(27.63, abs=0.05)
    assert s["d_f1"]["value"] is None and "no QA reader" in s["d_f1"]["note"]
    assert s["missing_predictions"]["value"] == 0
    per_q = pl.read_parquet(out / "per_question.parquet")
    assert per_q.height == 500 and per_q["qid"].to_list() == list(json.loads(FLARE_PREDICTIONS.read_text()))[:500]
    scores = pl.read_parquet(out / "scores.parquet")
    assert scores.columns == ["qid", "metric", "value"] and scores.height == 1500
    assert (out / "summary.txt").read_text().startswith("dataset: asqa")


def test_limit_takes_the_first_predicted_questions(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", "--dataset", "asqa", "--predictions", str(FLARE_PREDICTIONS), "--limit", "3",
                 "--out", str(out)]) == 0
    assert "3 question(s) scored; 945 gold question(s)" in capsys.readouterr().err
    assert pl.read_parquet(out / "per_question.parquet").height == 3


def test_unknown_ids_reported_and_missing_ids_scored_empty(tmp_path, capsys):
    qids = list(json.loads(ASQA_DEV.read_text())["dev"])[:3]
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps({qids[0]: "An answer.", "not-a-real-id": "x"}))
    gold = tmp_path / "gold.json"  # a 3-question gold file: the default target set is all gold questions
    full = json.loads(ASQA_DEV.read_text())["dev"]
    gold.write_text(json.dumps({"dev": {q: full[q] for q in qids}}))
    out = tmp_path / "out"
    assert main(["eval", "--dataset", "asqa", "--predictions", str(preds), "--gold", str(gold), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "1 predicted id(s) are not in the gold data and were ignored: ['not-a-real-id']" in err
    assert "2 question(s) have no prediction and were scored as empty answers" in err
    per_q = pl.read_parquet(out / "per_question.parquet")
    assert per_q["qid"].to_list() == qids
    assert per_q["missing"].to_list() == [False, True, True]
    assert per_q.filter(pl.col("missing"))["str_em"].to_list() == [0.0, 0.0]
    assert _summary(out)["missing_predictions"]["value"] == 2


def _write_run(path, dataset, answers, questions=None, nodes=None):
    tables = {"answers": answers, "questions": pl.DataFrame({"qid": questions or answers["qid"].to_list()})}
    if nodes is not None:
        tables["nodes"] = nodes
    write_run(path, {"dataset": dataset}, **tables)


def test_asqa_run_directory_with_nodes(tmp_path, capsys):
    dev = json.loads(ASQA_DEV.read_text())["dev"]
    qids = list(dev)[:3]
    gold_answer = dev[qids[0]]["annotations"][0]["long_answer"]
    short = dev[qids[0]]["qa_pairs"][0]["short_answers"]
    answers = pl.DataFrame({"qid": qids[:2], "answer": ["[ 1 x ] quoted", "Nothing useful."],
                            "answer_plain": [gold_answer, None]})
    nodes = pl.DataFrame(
        {"qid": [qids[0], qids[0], qids[1]], "node_id": ["r", "n1", "r"], "depth": [0, 1, 0],
         "status": ["root", "valid", "root"], "answers": [[], short, []]},
        schema_overrides={"depth": pl.Int32},
    )
    run = tmp_path / "run"
    _write_run(run, "asqa", answers, questions=qids, nodes=nodes)
    assert main(["eval", "--dataset", "asqa", "--predictions", str(run)]) == 0
    assert "1 question(s) have no prediction" in capsys.readouterr().err
    per_q = pl.read_parquet(run / "eval" / "per_question.parquet")
    assert per_q["qid"].to_list() == qids
    first = per_q.row(0, named=True)
    assert first["rouge_l"] == pytest.approx(100.0)  # answer_plain (the gold long answer) was scored
    n_pairs = len(dev[qids[0]]["qa_pairs"])
    assert first["answer_f1"] == pytest.approx(100 * 2 * (1 / n_pairs) / (1 + 1 / n_pairs))  # P 1, R 1/n
    assert per_q.row(1, named=True)["answer_f1"] == 0.0  # only a root node
    assert per_q.row(2, named=True)["answer_f1"] is None  # not in nodes.parquet: not computed


def test_quotesum_prediction_fields_and_run_directory(tmp_path, capsys):
    rows = [json.loads(line) for line in QUOTESUM_DEV.read_text().splitlines()]
    first_by_qid = {}
    for r in rows:
        first_by_qid.setdefault(r["qid"], r)
    preds = tmp_path / "p.jsonl"
    preds.write_text("\n".join(json.dumps({"qid": q, "prediction": r["summary"]}) for q, r in first_by_qid.items()))
    out = tmp_path / "o1"
    assert main(["eval", "--dataset", "quotesum", "--predictions", str(preds), "--out", str(out)]) == 0
    s = _summary(out)
    assert s["rouge_l"]["value"] == pytest.approx(100.0) and s["sem_f1"]["value"] == pytest.approx(100.0)
    assert s["semqa"]["value"] == pytest.approx(100.0)
    # the dataset's own `summary` field is accepted too; --only-predicted scores just those
    preds.write_text(json.dumps({"qid": rows[0]["qid"], "summary": rows[0]["summary"]}) + "\n")
    out = tmp_path / "o2"
    assert main(["eval", "--dataset", "quotesum", "--predictions", str(preds), "--only-predicted",
                 "--out", str(out)]) == 0
    assert "1 question(s) scored; 90 gold question(s) had no prediction" in capsys.readouterr().err
    # a run directory, with loosely spaced markers fixed on request
    run = tmp_path / "run"
    answer = rows[0]["summary"].replace("[ ", "[").replace(" ]", "]")
    _write_run(run, "quotesum", pl.DataFrame({"qid": [rows[0]["qid"]], "answer": [answer]}))
    assert main(["eval", "--dataset", "quotesum", "--predictions", str(run), "--out", str(tmp_path / "o3")]) == 0
    assert _summary(tmp_path / "o3")["sem_f1"]["value"] < 100.0  # `[2 x]` is not an official marker
    assert main(["eval", "--dataset", "quotesum", "--predictions", str(run), "--canonical-markers",
                 "--out", str(tmp_path / "o4")]) == 0
    assert _summary(tmp_path / "o4")["sem_f1"]["value"] == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "p.json: file is empty"),
        ('{"a": "x",\n "b": }', "p.json:2: bad JSON"),
        ('{"a": 3}', "p.json (field 'a'): the answer must be a string"),
        ('{"qid": "a", "prediction": "x"}\n{"qid": "b"}', "p.json:2: no answer field"),
        ('{"qid": "a", "answer": "x"}\n{"qid": "a", "answer": "y"}', "p.json:2: qid 'a' given again (first at line 1)"),
        ('{"qid": "a", "answer": "x"}\n{"qid": "b", "answer": "y"', "p.json:2: bad JSON"),
        ("[1, 2]", "p.json:1: expected a JSON object"),
    ],
)
def test_bad_prediction_files_exit_2_with_file_and_line(tmp_path, capsys, content, message):
    p = tmp_path / "p.json"
    p.write_text(content)
    assert main(["eval", "--dataset", "asqa", "--predictions", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_run_directory_errors(tmp_path, capsys):
    run = tmp_path / "run"
    _write_run(run, "quotesum", pl.DataFrame({"qid": ["a"], "answer": ["x"]}))
    assert main(["eval", "--dataset", "asqa", "--predictions", str(run)]) == 2
    assert "a 'quotesum' run, not 'asqa'" in capsys.readouterr().err
    empty = tmp_path / "empty_run"
    empty.mkdir()
    assert main(["eval", "--dataset", "asqa", "--predictions", str(empty)]) == 2
    assert "not a run directory: config.json is missing" in capsys.readouterr().err
    preds = tmp_path / "p.json"
    preds.write_text('{"unknown": "x"}')
    assert main(["eval", "--dataset", "asqa", "--predictions", str(preds), "--out", str(tmp_path / "o")]) == 2
    assert "none of the predicted ids is in the gold data" in capsys.readouterr().err


def test_an_output_folder_that_cannot_be_written_fails_before_scoring(tmp_path, capsys, monkeypatch):
    from clarify.eval.datasets import asqa

    scored = []
    monkeypatch.setattr(asqa.ASQA, "score", lambda self, *a, **k: scored.append(1))
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    rc = main(["eval", "--dataset", "asqa", "--predictions", str(FLARE_PREDICTIONS), "--limit", "3",
               "--out", str(blocker / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot make the output folder" in err and str(blocker / "out") in err
    assert "Traceback" not in err and scored == []  # the scorers never ran
    # bad predictions are reported as before, and no output folder is made beside them
    bad = tmp_path / "p.json"
    bad.write_text("[1, 2]")
    assert main(["eval", "--dataset", "asqa", "--predictions", str(bad)]) == 2
    assert not (tmp_path / "p_eval").exists()


@pytest.mark.parametrize(("dataset", "style"), [("asqa", "free"), ("quotesum", "quoted")])
def test_a_run_and_eval_on_it_write_the_same_scores_and_metrics(tmp_path, dataset, style):
    """`clarify run` and `clarify eval` on that run score through one function (eval/summary.py
    score_predictions): identical scores.parquet, and summary.json's metrics are eval's summary."""
    from clarify.batch import config
    from tests.test_reliability import _run

    cfg = config.load(None, {"dataset": dataset, "limit": 3, "answer_style": style, "toc.max_expansions": 3})
    summary = _run(cfg, tmp_path / "run")
    assert main(["eval", "--dataset", dataset, "--predictions", str(tmp_path / "run")]) == 0
    ran, evaluated = (pl.read_parquet(p / "scores.parquet") for p in (tmp_path / "run", tmp_path / "run" / "eval"))
    assert ran.height and ran.equals(evaluated)
    # metrics only: bookkeeping columns of the per-question table (n_pairs, n_refs ...) are not scores
    per_q = pl.read_parquet(tmp_path / "run" / "eval" / "per_question.parquet")
    assert set(ran["metric"]) < set(per_q.columns) and not {"n_pairs", "n_refs", "n_gold"} & set(ran["metric"])
    assert summary.metrics == {m: r["value"] for m, r in _summary(tmp_path / "run" / "eval").items()}
