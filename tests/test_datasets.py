"""Datasets as adapters (eval/datasets/): the registry, a dataset added by one module, QuoteSum's given
sources built in one place, ASQA's own demo-pool check. Scripted engine and the stand-in index (fast)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl
import pytest

from clarify.batch import config
from clarify.batch.pipeline import score
from clarify.batch.resources import load_questions
from clarify.errors import InputError
from clarify.eval import datasets
from clarify.eval.datasets import Dataset


def test_registry_lists_the_shipped_datasets_and_refuses_an_unknown_one():
    assert {"asqa", "quotesum", "jsonl"} <= set(datasets.names())
    assert set(datasets.names(with_gold=True)) >= {"asqa", "quotesum"}
    assert "jsonl" not in datasets.names(with_gold=True)
    assert datasets.get("quotesum").default_path().name == "dev.jsonl"
    assert datasets.get("jsonl").default_path() is None
    with pytest.raises(InputError, match=r"unknown dataset 'ambigqa'; known: asqa, quotesum, jsonl"):
        datasets.get("ambigqa")
    with pytest.raises(InputError, match=r"field 'dataset'\): unknown value 'ambigqa'; choose one of"):
        config.load(None, {"dataset": "ambigqa"})
    with pytest.raises(InputError, match="dataset 'jsonl' needs a questions file"):
        config.load(None, {"dataset": "jsonl"})


# --- a dataset added by one module: this one, registered by the fixture below --------------------------


class Toy(Dataset):
    """JSONL of {qid, question, answers}: a question is answered when its answer holds a gold answer."""

    name = "toy"
    has_gold = True

    def load(self, path, *, split="dev"):
        rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
        questions = pl.DataFrame([{"qid": r["qid"], "question": r["question"], "dataset": self.name} for r in rows])
        gold = pl.DataFrame([{"qid": r["qid"], "answers": r["answers"]} for r in rows])
        return questions, gold

    def score(self, predictions, gold, *, nodes=None, reader=None):
        answers = dict(zip(gold["qid"], gold["answers"]))
        return pl.DataFrame([{"qid": q, "hit": 100.0 * any(a.lower() in (p or "").lower() for a in answers[q])}
                             for q, p in zip(predictions["qid"], predictions["answer"])])


@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        {"qid": "t0", "question": "Who has the highest goals in world football?", "answers": ["Pelé", "Messi"]},
        {"qid": "t1", "question": "When did the last world cup take place?", "answers": ["2022"]},
        {"qid": "t2", "question": "Who wrote Hamlet?", "answers": ["Shakespeare"]})))
    datasets.register(Toy())
    yield path
    datasets.unregister("toy")


def test_a_registered_dataset_flows_through_questions_and_scoring(toy):
    cfg = config.load(None, {"dataset": "toy", "questions": str(toy), "offset": 1, "limit": 2})
    questions, gold = load_questions(cfg)
    assert questions["qid"].to_list() == ["t1", "t2"] and gold.height == 3
    ds = datasets.get(cfg.dataset)
    assert ds.given_sources(questions) == {}  # searched, like ASQA
    answers = pl.DataFrame({"qid": ["t1", "t2"], "answer": ["In 2022, in Qatar.", "Marlowe."]})
    scores, metrics, _notes = score(ds, answers, pl.DataFrame(), gold)
    assert dict(zip(scores["qid"], scores["value"])) == {"t1": 100.0, "t2": 0.0}
    assert metrics == {"hit": 50.0}


def test_a_registered_dataset_runs_end_to_end_and_is_evaluated(toy, tmp_path):
    from clarify.eval.cli import evaluate
    from tests.test_reliability import _run

    cfg = config.load(None, {"dataset": "toy", "questions": str(toy), "limit": 2, "answer_style": "free",
                             "toc.max_expansions": 3})
    summary = _run(cfg, tmp_path / "r")
    assert summary["dataset"] == "toy" and summary["n_questions"] == 2 and "hit" in summary["metrics"]
    scores = pl.read_parquet(tmp_path / "r" / "scores.parquet")
    assert scores["metric"].unique().to_list() == ["hit"] and scores.height == 2
    args = argparse.Namespace(dataset="toy", predictions=tmp_path / "r", gold=toy, split="dev", reader=None,
                              limit=None, only_predicted=False, canonical_markers=False, out=None)
    per_q, summ, _ = evaluate(args)
    assert per_q["qid"].to_list() == ["t0", "t1"]
    assert summ.filter(pl.col("metric") == "hit")["value"].item() == summary["metrics"]["hit"]


# --- QuoteSum: its own numbered sources, one builder for runs and demos ----------------------------------


def test_quotesum_given_sources_are_numbered_once_for_runs_and_demos():
    from clarify.batch.toc.demos import load_quotesum_demos

    cfg = config.load(None, {"dataset": "quotesum", "limit": 0})
    questions, gold = load_questions(cfg)
    assert questions.height == 91 and gold is not None
    assert not datasets.get("quotesum").builds_trees
    given = datasets.get(cfg.dataset).given_sources(questions)
    first = questions.row(0, named=True)
    assert [p.passage_id for p in given[first["qid"]]] == [f"{first['qid']}:s{k}"
                                                           for k in range(1, len(first["sources"]) + 1)]
    assert [(p.title, p.text) for p in given[first["qid"]]] == list(zip(first["titles"], first["sources"]))
    demos = load_quotesum_demos()
    assert demos
    for demo in demos:  # a demo's sources are exactly that question's given sources in a QuoteSum run
        assert list(demo.sources) == given[demo.demo_id]


# --- ASQA: its own check of a run's slice -----------------------------------------------------------------


def _select(ds, overrides: dict, questions):
    """`Dataset.select` as a run calls it: with the config's resolved demo pool (batch/resources.py)."""
    from clarify.batch.toc.demos import resolve_pool

    cfg = config.load(None, overrides)
    return ds.select(cfg, questions, resolve_pool(cfg))


def test_asqa_refuses_a_slice_overlapping_the_demo_pool():
    asqa = datasets.get("asqa")
    questions, _ = asqa.load(asqa.default_path())
    for overrides in ({"offset": 490, "limit": 20}, {"offset": 600, "limit": 3}, {"limit": 900}):
        with pytest.raises(InputError, match=r"field 'limit': questions .* overlap the demo pool asqa:dev\[500:\]"):
            _select(asqa, overrides, questions)
    assert _select(asqa, {"offset": 480, "limit": 20}, questions).height == 20  # 480..499
    assert _select(asqa, {"limit": 900, "demo_pool": "asqa:dev[900:]"}, questions).height == 900
    with pytest.raises(InputError, match="overlap the demo pool"):  # and the run asks the adapter
        load_questions(config.load(None, {"offset": 490, "limit": 20}))


def test_limit_0_answers_every_asqa_question_outside_the_demo_pool(tmp_path):
    """`--limit 0` on the shipped dev-only file is dev 0..499 (the default pool is dev 500..947);
    with a pool inside the file, the questions on both sides of it; from an offset inside the pool, none."""
    asqa = datasets.get("asqa")
    questions, _ = asqa.load(asqa.default_path())
    got = load_questions(config.load(None, {"limit": 0}))[0]
    assert got["qid"].to_list() == questions["qid"][:500].to_list()
    got = _select(asqa, {"limit": 0, "offset": 100, "demo_pool": "asqa:dev[200:848]"}, questions)
    assert got["qid"].to_list() == questions["qid"][100:200].to_list() + questions["qid"][848:].to_list()
    with pytest.raises(InputError, match=r"field 'offset': every question from 600 on is in the demo pool"):
        _select(asqa, {"limit": 0, "offset": 600}, questions)
    # a pool from another file or split never overlaps the run's questions
    copy = tmp_path / "other.json"
    copy.write_bytes(Path(asqa.default_path()).read_bytes())
    other = {"limit": 0, "demo_pool": f"asqa:dev[0:]@{copy}"}
    assert _select(asqa, other, questions).height == 948
