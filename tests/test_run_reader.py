"""The one run-directory reader (batch/run/rundir.py Run.open): what a run wrote comes back checked, and
damage is named by file and column."""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest

from clarify import schemas
from clarify.batch import config
from clarify.batch.run.rundir import TABLE_SCHEMAS, Run
from clarify.errors import InputError
from tests.fixtures_llm import write_fake_model
from tests.test_reliability import QS, _cfg, _questions, _run


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reader")
    cfg = _cfg(_questions(tmp, *QS), answer_style="quoted")
    summary = _run(cfg, tmp / "run", part_trees=1)
    return cfg, summary, tmp / "run"


def test_a_finished_run_reads_back_as_written(finished):
    cfg, summary, path = finished
    run = Run.open(path)
    # the frozen config names the demo pool used, never "auto" (it is resolved when the run starts); the rest is the config given
    assert run.config == dataclasses.replace(cfg, demo_pool="asqa:dev[500:]") and run.finished and run.summary == summary
    assert run.name == "run" and run.missing == []
    for name, schema in TABLE_SCHEMAS.items():
        df = run.table(name)
        schemas.check(df, schema)
        assert df.equals(pl.read_parquet(path / f"{name}.parquet"))
    assert run.questions["qid"].to_list() == ["q0", "q1"] and run.nodes.height > 2
    parts = run.parts()
    assert len(parts) == 2 and sorted(t["qid"] for p in parts for t in p.trees) == ["q0", "q1"]
    # the frozen config.json is itself a config file: the same run settings again
    assert config.load(path / "config.json") == run.config


def test_an_unfinished_run_has_no_summary_and_lists_what_is_missing(finished, tmp_path):
    cfg, _, _ = finished
    _run(cfg, tmp_path / "r", stop_after_parts=1, part_trees=1)
    run = Run.open(tmp_path / "r")
    assert not run.finished and run.summary is None
    assert "answers.parquet" in run.missing and "questions.parquet" not in run.missing
    assert run.answers.height == 0 and run.answers.schema == schemas.empty("answers").schema
    with pytest.raises(InputError, match="has no answers.parquet"):
        run.table("answers", required=True)
    assert len(run.parts()) == 1


def test_damage_is_named_by_file_and_column(finished, tmp_path):
    import shutil

    _, _, path = finished
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    pl.read_parquet(copy / "spans.parquet").drop("source_k").write_parquet(copy / "spans.parquet")
    with pytest.raises(InputError) as exc:
        Run.open(copy).table("spans")
    assert exc.value.path == str(copy / "spans.parquet") and exc.value.field == "source_k"
    (copy / "nodes.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="cannot read Parquet") as exc:
        Run.open(copy).table("nodes")
    assert exc.value.path == str(copy / "nodes.parquet")
    (copy / "summary.json").write_text('{"name": ')
    with pytest.raises(InputError, match="damaged") as exc:
        Run.open(copy)
    assert exc.value.path == str(copy / "summary.json")
    (copy / "config.json").write_text(json.dumps({"limit": -3}))
    with pytest.raises(InputError, match="limit"):
        Run.open(copy)
    with pytest.raises(InputError, match="config.json is missing"):
        Run.open(tmp_path)
    with pytest.raises(InputError, match="no such folder"):
        Run.open(tmp_path / "nope")


def test_the_reranker_is_part_of_the_frozen_config_and_pinned(finished, tmp_path):
    """The cross-encoder changes every ranking: it is a setting of the frozen config (not an environment
    variable), checked before anything loads, and its files pinned in inputs.json like the model's."""
    cfg, _, path = finished
    assert json.loads((path / "config.json").read_text())["retrieval"]["cross_encoder"] == ""
    bad = config.load(None, {**{k: v for k, v in cfg.to_dict().items() if k in ("dataset", "questions")},
                             "retrieval.cross_encoder": str(tmp_path / "no-such-model")})
    with pytest.raises(InputError, match="model directory does not exist"):
        _run(bad, tmp_path / "r")
    ce = write_fake_model(tmp_path / "ce", config={"model_type": "bert"})
    cfg_ce = config.load(path / "config.json", {"retrieval.cross_encoder": str(ce)})
    _run(cfg_ce, tmp_path / "r2")  # the fake index ignores the reranker; the run pins it
    assert Run.open(tmp_path / "r2").config.retrieval.cross_encoder == str(ce)
    pinned = json.loads((tmp_path / "r2" / "inputs.json").read_text())["cross_encoder"]
    assert pinned["path"] == str(ce) and len(pinned["fingerprint"]) >= 12
    with pytest.raises(InputError, match="another config"):  # resumed with another reranker: refused
        _run(config.load(path / "config.json"), tmp_path / "r2")
