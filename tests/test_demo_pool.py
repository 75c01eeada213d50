"""The official demo pool (docs/running-toc.md#the-whole-asqa-dev-set). A user's official-layout ASQA.json (`{"train": …, "dev": …}`) gives the
clarification demos from its train split (run_toc.py:23-41, :52 `dsp.knn(train)`, :191 `cur_demos =
train.copy()`) and `--limit 0` answers every dev question; the shipped dev-only file keeps dev[500:].

No real train split is here (data/asqa/SOURCE.md): the test file's train split is the shipped dev rows
500..947 under new sample ids, its dev split dev rows 0..5. A scripted engine and the stand-in index
(tests/toc_fakes.py) keep it fast."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from clarify.batch import config
from clarify.batch.cli import build_parser
from clarify.batch.cli.commands import _overrides
from clarify.batch.run.pipeline import run
from clarify.batch.run.resources import load_questions, open_resources, pool_of, prepare
from clarify.batch.toc.demos import KnnPool
from clarify.batch.toc.tree import normalize
from clarify.errors import InputError
from clarify.eval import datasets
from clarify.files import sha256
from clarify.local_llm.scripted import ScriptedEngine
from tests.test_toc import make_responder
from tests.toc_fakes import FakeIndex

N_DEV = 6


def _shipped() -> dict:
    return json.loads(datasets.get("asqa").default_path().read_text(encoding="utf-8"))["dev"]


@pytest.fixture
def asqa_file(tmp_path) -> Path:
    """ASQA.json in the official layout: train = shipped dev rows 500..947 renamed, dev = rows 0..N_DEV-1."""
    rows = list(_shipped().items())
    data = {"train": {f"train-{sid}": ex for sid, ex in rows[500:]}, "dev": dict(rows[:N_DEV])}
    path = tmp_path / "ASQA.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _cli_cfg(*argv: str) -> config.RunConfig:
    """The config `clarify run ARGV` builds (batch/cli/commands.py cmd_run)."""
    args = build_parser().parse_args(["run", *argv])
    return config.load(args.config, _overrides(args))


def test_a_train_split_is_the_default_pool_and_limit_0_is_every_dev_question(asqa_file):
    cfg = _cli_cfg("--dataset", "asqa", "--questions", str(asqa_file), "--limit", "0", "--out", "x")
    assert cfg.demo_pool == "auto"
    pool = pool_of(cfg)
    assert (pool.spec, pool.split, pool.path, pool.from_questions, pool.fallback) == (
        "asqa:train", "train", asqa_file, False, "")
    demos = pool.demos()
    assert len(demos) == 448 and all(d.demo_id.startswith("train-") for d in demos)
    questions, gold = load_questions(cfg)
    assert questions["qid"].to_list() == list(_shipped())[:N_DEV]
    # named explicitly, or from another file, the same pool
    named = _cli_cfg("--questions", str(asqa_file), "--demo-pool", f"asqa:train@{asqa_file}", "--out", "x")
    assert pool_of(named).demos() == demos
    # an explicit limit over the whole dev split is no overlap either
    assert load_questions(config.load(None, {"questions": str(asqa_file), "limit": N_DEV}))[0].height == N_DEV


def test_train_demos_are_a_direct_knn_over_the_same_vectors(asqa_file, tmp_path):
    """The pool embeds every train question once (cached by the pool's checksum); a prompt's demos are the
    5 nearest train questions by inner product of the normalised vectors, nearest last (run_toc.py:52-55),
    as a FAISS flat inner-product search over the same vectors (dsp.knn's search) finds them."""
    import faiss

    cfg = config.load(None, {"questions": str(asqa_file), "limit": 0, "answer_style": "free"})
    index = FakeIndex()
    prep = prepare(cfg, index=index, engine_factory=lambda c: ScriptedEngine("s", make_responder()))
    questions = prep.questions
    res = open_resources(prep, tmp_path / "cache")
    pool = res.demos
    assert [d.demo_id for d in pool.items] == [d.demo_id for d in pool_of(cfg).demos()]
    vectors = index.encoder.encode([d.question for d in pool.items])
    np.testing.assert_allclose(pool.vectors, vectors, atol=1e-6)

    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    qvecs = index.encoder.encode(questions["question"].to_list())
    picked = pool.select(qvecs, questions["question"].to_list(), 5)
    scores, _ = flat.search(qvecs, 5 + 1)
    for q, qv, top, got in zip(questions["question"], qvecs, scores, picked):
        sims = np.round(vectors @ qv, 5)
        # direct: highest rounded score first, ties in pool order (batch/toc/demos.py KnnPool: rankings must not
        # depend on float noise), a demo with the query's own question never; shown nearest last
        order = sorted(range(len(sims)), key=lambda j: (-sims[j], j))
        direct = [pool.items[j] for j in order if normalize(pool.items[j].question) != normalize(q)][:5]
        assert [d.demo_id for d in got] == [d.demo_id for d in direct][::-1]
        assert all(d.demo_id.startswith("train-") for d in got)
        # FAISS finds the same similarities (it orders ties its own way; the test questions are not in train)
        np.testing.assert_allclose(sorted(sims[[pool.items.index(d) for d in got]]), sorted(top[:5]), atol=1e-5)

    # the vectors are cached: a second pool over the same questions embeds nothing
    def no_embed(texts):
        raise AssertionError("embedded again")

    again = KnnPool(pool.items, no_embed, name="asqa-demos", encoder_id=index.encoder.name)
    np.testing.assert_array_equal(again.vectors, pool.vectors)


def test_the_documented_run_over_every_dev_question_runs_with_train_demos(asqa_file, tmp_path, capsys):
    """`clarify run --dataset asqa --questions ASQA.json --limit 0`: every dev question, train demos in
    every clarification prompt, the pool pinned in config.json and inputs.json, said in one line."""
    out = tmp_path / "run"
    cfg = _small_trees(_cli_cfg("--dataset", "asqa", "--questions", str(asqa_file), "--limit", "0",
                                  "--answer-style", "free", "--out", str(out)))
    summary = run(cfg, out, engine_factory=lambda c: ScriptedEngine("s", make_responder()), index=FakeIndex(),
                  progress=True)
    assert summary.n_questions == N_DEV
    assert json.loads((out / "config.json").read_text())["demo_pool"] == "asqa:train"
    pinned = json.loads((out / "inputs.json").read_text())["demo_pool"]
    assert pinned == {"spec": "asqa:train", "path": str(asqa_file), "sha256": sha256(asqa_file), "demos": 448}
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("demo pool")]
    assert line == [f"demo pool asqa:train: 448 demos from the train split of {asqa_file}; limit 0: {N_DEV} "
                    f"questions"]
    calls = pl.read_parquet(out / "llm_calls.parquet").filter(pl.col("step") == "clarify")
    train_q = {d.question for d in datasets.get("asqa").demos("train", path=asqa_file)}
    for prompt in calls["prompt"]:
        shown = [q for q in train_q if f"Question: {q}\n\nDisambiguations:\nDQ" in prompt]
        assert len(shown) == 5, prompt[:300]
    assert set(calls["qid"]) == set(list(_shipped())[:N_DEV])
    # a changed file is a changed input: the run refuses to resume over it
    data = json.loads(asqa_file.read_text())
    data["train"].popitem()
    asqa_file.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"inputs of this run changed since it started: demo_pool .*ASQA.json changed"):
        run(cfg, out, engine_factory=lambda c: ScriptedEngine("s", make_responder()), index=FakeIndex(),
            progress=False)


def _small_trees(cfg: config.RunConfig) -> config.RunConfig:
    """A small tree keeps the test fast; nothing else differs from the command line's config."""
    import dataclasses

    return dataclasses.replace(cfg, toc=dataclasses.replace(cfg.toc, max_expansions=2))


def test_a_file_without_a_train_split_falls_back_to_dev_500_with_the_message(tmp_path, capsys):
    path = tmp_path / "dev-only.json"
    path.write_text(json.dumps({"dev": dict(list(_shipped().items())[:510])}), encoding="utf-8")
    cfg = config.load(None, {"questions": str(path), "limit": 0, "answer_style": "free", "toc.max_expansions": 1})
    pool = pool_of(cfg)
    assert (pool.spec, pool.from_questions, pool.fallback) == ("asqa:dev[500:]", True, "dev-only.json has no train split")
    assert [d.demo_id for d in pool.demos()] == list(_shipped())[500:510]
    questions, _ = load_questions(cfg)
    assert questions.height == 500  # dev 0..499: every question outside the pool
    # a pool naming a train split that the file lacks is refused before anything runs
    with pytest.raises(InputError, match="no split 'train'"):
        pool_of(config.load(None, {"questions": str(path), "demo_pool": "asqa:train"})).demos()

    out = tmp_path / "run"  # from offset 497: the 3 questions before the pool, so the run is short
    cfg = config.load(None, {"questions": str(path), "offset": 497, "limit": 0, "answer_style": "free",
                             "toc.max_expansions": 1})
    summary = run(cfg, out, engine_factory=lambda c: ScriptedEngine("s", make_responder()), index=FakeIndex(),
                  progress=True)
    assert summary.n_questions == 3
    assert json.loads((out / "config.json").read_text())["demo_pool"] == "asqa:dev[500:]"
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("demo pool")]
    assert line == [f"demo pool asqa:dev[500:] (dev-only.json has no train split): 10 demos from the dev split of "
                    f"{path}; limit 0: 3 questions outside the pool"]
    # a pool with no demo in it is refused before the run directory is touched
    with pytest.raises(InputError, match="the demo pool asqa:dev\\[900:\\] holds no demos"):
        run(config.load(None, {"questions": str(path), "limit": 3, "demo_pool": "asqa:dev[900:]"}),
            tmp_path / "empty", engine_factory=lambda c: ScriptedEngine("s", make_responder()), index=FakeIndex(),
            progress=False)
    assert not (tmp_path / "empty").exists()


def test_the_shipped_default_is_unchanged():
    cfg = config.load(None)
    pool = pool_of(cfg)
    shipped = datasets.get("asqa").default_path()
    assert (pool.spec, pool.path, pool.from_questions, pool.fallback) == ("asqa:dev[500:]", shipped, True, "")
    assert [d.demo_id for d in pool.demos()] == list(_shipped())[500:]
    assert load_questions(config.load(None, {"limit": 0}))[0].height == 500
    # a non-ASQA dataset takes its demos from the shipped ASQA dev set, never from its own file
    qs = pool_of(config.load(None, {"dataset": "quotesum"}))
    assert (qs.spec, qs.path, qs.from_questions) == ("asqa:dev[500:]", shipped, False)
