"""Datasets as adapters (eval/datasets/): the registry, a dataset added by one module, QuoteSum's given
sources built in one place, ASQA's own demo-pool check. Scripted engine and the stand-in index (fast)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import polars as pl
import pytest

from clarify.batch import config
from clarify.batch.run.pipeline import score
from clarify.batch.run.resources import load_questions
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
    assert summary.dataset == "toy" and summary.n_questions == 2 and "hit" in summary.metrics
    scores = pl.read_parquet(tmp_path / "r" / "scores.parquet")
    assert scores["metric"].unique().to_list() == ["hit"] and scores.height == 2
    args = argparse.Namespace(dataset="toy", predictions=tmp_path / "r", gold=toy, split="dev", reader=None,
                              limit=None, only_predicted=False, canonical_markers=False, out=None)
    per_q, summ, _ = evaluate(args)
    assert per_q["qid"].to_list() == ["t0", "t1"]
    assert summ.filter(pl.col("metric") == "hit")["value"].item() == summary.metrics["hit"]


# --- QuoteSum: its own numbered sources, one builder for runs and demos ----------------------------------


def test_quotesum_given_sources_are_numbered_once_for_runs_and_demos():
    cfg = config.load(None, {"dataset": "quotesum", "limit": 0})
    questions, gold = load_questions(cfg)
    assert questions.height == 91 and gold is not None
    assert not datasets.get("quotesum").builds_trees
    given = datasets.get(cfg.dataset).given_sources(questions)
    first = questions.row(0, named=True)
    assert [p.passage_id for p in given[first["qid"]]] == [f"{first['qid']}:s{k}"
                                                           for k in range(1, len(first["sources"]) + 1)]
    assert [(p.title, p.text) for p in given[first["qid"]]] == list(zip(first["titles"], first["sources"]))
    demos = datasets.get("quotesum").demos()
    assert demos
    for demo in demos:  # a demo's sources are exactly that question's given sources in a QuoteSum run
        assert list(demo.sources) == given[demo.demo_id]


# --- ASQA: its own check of a run's slice -----------------------------------------------------------------


def _select(ds, overrides: dict, questions):
    """`Dataset.select` as a run calls it: with the config's resolved demo pool (batch/run/resources.py)."""
    from clarify.batch.run.resources import pool_of

    cfg = config.load(None, overrides)
    return ds.select(questions, pool_of(cfg), offset=cfg.offset, limit=cfg.limit)


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


# --- Demos: each dataset reads its demo pools with the reader of its questions and gold -------------------


def _error(call) -> str:
    with pytest.raises(InputError) as err:
        call()
    return str(err.value)


_ASQA_OK = {"ambiguous_question": "Who won?", "annotations": [{"long_answer": "A won in 1990; B in 1994."}],
            "qa_pairs": [{"question": "Who won in 1990?", "short_answers": ["A", "A team"]},
                         {"question": "Who won in 1994?", "short_answers": ["B"]}]}


@pytest.mark.parametrize("content, says", [
    ('{"dev": {\n "q1": {,}\n}}', r"bad\.json:2: bad JSON"),
    ({"dev": ["q1"]}, r"\(field 'dev'\): split 'dev' is a JSON list"),
    ({"dev": {"q1": "Who won?"}}, r"\(field 'dev\.q1'\): an ASQA instance must be an object"),
    ({"dev": {"q1": {k: v for k, v in _ASQA_OK.items() if k != "annotations"}}},
     r"\(field 'dev\.q1'\): ASQA instance lacks 'annotations'"),
    ({"dev": {"q1": {**_ASQA_OK, "qa_pairs": [{"question": "Who?", "short_answers": "A"}]}}},
     r"\(field 'dev\.q1\.qa_pairs\[0\]'\): qa_pair without a short_answers list"),
])
def test_a_bad_asqa_file_is_one_error_for_gold_and_for_demos(tmp_path, content, says):
    """The eval side (load_asqa), the dataset's demos and a run's demo pool read an ASQA file with one reader,
    so a malformed instance is the same error whichever reads it first."""
    import re

    from clarify.asqa_file import load_asqa
    from clarify.batch.run.resources import pool_of

    path = tmp_path / "bad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    gold = _error(lambda: load_asqa(path))
    assert re.search(says, gold) and gold.startswith(str(path)), gold
    assert _error(lambda: datasets.get("asqa").demos(path=path)) == gold
    pool = pool_of(config.load(None, {"demo_pool": f"asqa:dev@{path}"}))
    assert _error(pool.demos) == gold


def test_asqa_demos_are_the_official_demo_strings_and_a_slice_counts_every_instance(tmp_path):
    """make_str_disambig (toc/utils.py:12-23, ambigQA=True): each answered qa_pair → its first short answer;
    the first annotation's long answer. An instance with no answered pair makes no demo but keeps its place."""
    unanswered = {**_ASQA_OK, "qa_pairs": [{"question": "Who won in 1990?", "short_answers": []}]}
    path = tmp_path / "ASQA.json"
    path.write_text(json.dumps({"dev": {"a": _ASQA_OK, "b": unanswered, "c": {**_ASQA_OK, "ambiguous_question": "C?"}}}))
    asqa = datasets.get("asqa")
    demos = asqa.demos(path=path)
    assert [d.demo_id for d in demos] == ["a", "c"]
    assert [(p.question, p.answers) for p in demos[0].pairs] == [("Who won in 1990?", ("A",)), ("Who won in 1994?", ("B",))]
    assert (demos[0].question, demos[0].answer) == ("Who won?", "A won in 1990; B in 1994.")
    assert [d.demo_id for d in asqa.demos(path=path, start=1)] == ["c"]  # "b" is instance 1, though no demo
    assert asqa.demos(path=path, start=1, stop=2) == []
    # the same instances are the eval side's questions, all three of them
    from clarify.asqa_file import load_asqa

    assert load_asqa(path)[0]["qid"].to_list() == ["a", "b", "c"]


def _quotesum_row(qid: str, n: int, **extra) -> str:
    row = {"qid": qid, "question": f"{qid}?", "summary": "[ 1 one ] and [ 2 two ]", "unique_id": f"{qid}-r"}
    row |= {f"source{k}": f"source {k} of {qid}" for k in range(1, n + 1)}
    row |= {f"title{k}": f"T{k}" for k in range(1, n + 1)}
    return json.dumps(row | extra)


@pytest.mark.parametrize("lines, says", [
    ([_quotesum_row("a", 2), "{not json"], r"q\.jsonl:2: bad JSON"),
    ([_quotesum_row("a", 2, summary=None)], r"q\.jsonl:1 \(field 'summary'\): missing or non-string field"),
    ([_quotesum_row("a", 2), _quotesum_row("b", 3, source2="")], r"q\.jsonl:2: sources must be numbered 1\.\.n"),
])
def test_a_bad_quotesum_file_is_one_error_for_gold_and_for_demos(tmp_path, lines, says):
    import re

    from clarify.eval.quotesum import load_quotesum

    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    gold = _error(lambda: load_quotesum(path))
    assert re.search(says, gold), gold
    assert _error(lambda: datasets.get("quotesum").demos(path=path)) == gold


def test_quotesum_demos_read_as_many_sources_as_the_reader_declares(tmp_path, monkeypatch):
    """Demos take a row's sources as `load_quotesum` does, up to eval/quotesum.py MAX_SOURCES (no second
    count of their own): with a ninth source declared, a nine-source row is a nine-source demo."""
    from clarify.eval import quotesum

    path = tmp_path / "q.jsonl"
    path.write_text("\n".join([_quotesum_row("one", 1), _quotesum_row("nine", 9)]) + "\n", encoding="utf-8")
    monkeypatch.setattr(quotesum, "MAX_SOURCES", 9)
    questions, _ = quotesum.load_quotesum(path)
    given = datasets.get("quotesum").given_sources(questions)
    demos = datasets.get("quotesum").demos(path=path)
    assert [d.demo_id for d in demos] == ["nine"]  # a one-source question makes no demo
    assert len(demos[0].sources) == 9 and list(demos[0].sources) == given["nine"]
