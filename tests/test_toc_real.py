"""Tree of Clarifications with the REAL engine (vLLM on CPU, embedded SmolLM2) and the REAL embedded
index (Lucene BM25 + FAISS + rerank): batching, equivalence with the per-question loop, a SIGKILLed
run resumed, a quoted run with a spans table, and QuoteSum mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from clarify import schemas
from clarify.batch import config
from clarify.batch.pipeline import load_questions, nodes_table, open_resources, run
from clarify.batch.tree import Tree
from clarify.batch.waves import run_sequential, run_waves

pytestmark = pytest.mark.integration

SMALL = {"toc.max_expansions": 3, "toc.clarify_max_tokens": 96, "toc.answer_max_tokens": 96,
         "toc.n_demos": 3}


class CountingEngine:
    """Wraps the real engine to count generate calls and prompts (the engine itself is untouched)."""

    def __init__(self, inner):
        self.inner, self.model_id = inner, inner.model_id
        self.calls, self.prompts = 0, 0

    def generate(self, prompts, params):
        self.calls += 1
        self.prompts += len(prompts)
        return self.inner.generate(prompts, params)


def test_real_waves_batch_and_equal_per_question_loop(tmp_path, default_local_index, llm_engine):
    cfg = config.load(None, {"limit": 3, "answer_style": "free", **SMALL})
    questions, _ = load_questions(cfg)
    counting = CountingEngine(llm_engine)
    res = open_resources(cfg, questions, tmp_path / "cache", engine_factory=lambda c: counting, index=default_local_index)
    trees = [Tree.new(q, text) for q, text in zip(questions["qid"], questions["question"])]
    rec = run_waves(trees, res, cfg, progress=False)
    calls = pl.DataFrame(rec.llm_calls)
    waves = calls.filter(pl.col("step") == "clarify")["wave"].n_unique()
    # every step of every question in one generate per wave and step: ≤ 2 per wave + 1 for the answers
    assert counting.calls <= 2 * waves + 1
    # a byte-identical request (a re-expansion after a restart with nothing exhausted since, siblings'
    # identical verifications) is computed once: the cache answers the repeats (dsp's cache, officially)
    assert counting.prompts == calls.filter(~pl.col("cached"))["call_id"].n_unique()
    assert calls.height > counting.calls
    assert (calls.filter(pl.col("step") == "clarify")["completion"].str.len_chars() > 0).all()
    assert len(rec.answers) == 3 and all(a["answer"] for a in rec.answers)

    # the per-question loop, same engine and cache: identical trees and answers, all from the cache
    seq_trees = [Tree.new(q, text) for q, text in zip(questions["qid"], questions["question"])]
    res2 = open_resources(cfg, questions, tmp_path / "cache", engine_factory=lambda c: counting, index=default_local_index)
    before = counting.prompts
    rec2 = run_sequential(seq_trees, res2, cfg)
    assert counting.prompts == before  # zero model calls: every completion came from the cache
    assert nodes_table(trees).equals(nodes_table(seq_trees))
    assert pl.DataFrame(rec.answers).sort("qid").equals(pl.DataFrame(rec2.answers).sort("qid"))
    assert res2.engine.stats.hits == len(rec2.llm_calls) and res2.engine.stats.engine_calls == 0


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "clarify.batch.cli", *args]


def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path, default_index):
    """A real `clarify run` is SIGKILLed after its first wave; the same command finishes it. Then an
    uninterrupted run over the same completions (its cache seeded from the killed run's) must write
    exactly the same tables: nothing lost, nothing duplicated."""
    # every expansion a new request (toc.restart_resample): with the default, a small model's fruitless
    # root is re-expanded from the cache, and the kill below waits for a wave that reaches the engine
    flags = ["--dataset", "asqa", "--limit", "3", "--answer-style", "free", "--index", str(default_index),
             "--config", str(_small_toml(tmp_path, "restart_resample = true\n")), "--no-progress"]
    killed = tmp_path / "killed"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # The run kills itself at an exact state (clarify/faults.py): in the middle of wave 2, right after its
    # first batch of completions reached the cache, before the wave's checkpoint exists. No timing race.
    kill_env = dict(env, CLARIFY_KILL_AT="cache-commit after wave-done:1")
    proc = subprocess.run(_cli("run", *flags, "--out", str(killed)), env=kill_env, capture_output=True,
                          timeout=900)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert (killed / "waves" / "0001").exists() and not (killed / "waves" / "0002").exists()
    assert not (killed / "summary.json").exists()
    waves_before = {p.name: p.stat().st_mtime_ns for p in (killed / "waves").iterdir() if p.name.isdigit()}
    cached_before = _cache_rows(killed / "cache")

    subprocess.run(_cli("run", *flags, "--out", str(killed)), env=env, check=True, capture_output=True)
    summary = json.loads((killed / "summary.json").read_text())
    # finished waves were kept as they were; the killed wave was redone from the cache where it could be
    assert all((killed / "waves" / name).stat().st_mtime_ns == m for name, m in waves_before.items())
    assert summary["waves"] > len(waves_before)
    assert summary["cached_calls"] >= cached_before - sum(
        pl.read_parquet(killed / "waves" / n / "llm_calls.parquet").height for n in waves_before) > 0
    # total wall time = the killed session's finished waves + the whole resumed session
    first_s = json.loads((killed / "waves" / max(waves_before) / "state.json").read_text())["run_s"]
    assert first_s > 0
    assert summary["wall_s_total"] == pytest.approx(first_s + summary["wall_s_last_session"], abs=0.02)

    clean = tmp_path / "clean"
    clean.mkdir()
    subprocess.run(["cp", "-r", str(killed / "cache"), str(clean / "cache")], check=True)
    subprocess.run(_cli("run", *flags, "--out", str(clean)), env=env, check=True, capture_output=True)
    for name in ("nodes", "hits", "answers", "spans", "passages", "scores"):
        a, b = pl.read_parquet(killed / f"{name}.parquet"), pl.read_parquet(clean / f"{name}.parquet")
        assert a.equals(b), name
    a = pl.read_parquet(killed / "llm_calls.parquet").drop("cached")
    b = pl.read_parquet(clean / "llm_calls.parquet").drop("cached")
    assert a.equals(b)
    # no call recorded twice (two nodes may send one identical request, e.g. same-answer verifications)
    assert a.select("qid", "node_id", "step", "wave").n_unique() == a.height
    clean_summary = json.loads((clean / "summary.json").read_text())
    assert clean_summary["cached_calls"] == b.height
    assert clean_summary["wall_s_total"] == pytest.approx(clean_summary["wall_s_last_session"], abs=0.02)


def _cache_rows(cache_dir: Path) -> int:
    import sqlite3

    db = cache_dir / "completions.sqlite"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
            return con.execute("SELECT COUNT(*) FROM completions").fetchone()[0]
    except sqlite3.OperationalError:  # table not created yet
        return 0


def _small_toml(tmp_path: Path, extra: str = "") -> Path:
    p = tmp_path / "small.toml"
    p.write_text("[toc]\n" + "".join(f"{k.split('.')[1]} = {v}\n" for k, v in SMALL.items()) + extra)
    return p


def test_quoted_asqa_and_quotesum_runs_make_spans(tmp_path, default_local_index, llm_engine):
    cfg = config.load(None, {"limit": 2, "answer_style": "quoted", **SMALL})
    s = run(cfg, tmp_path / "asqa", engine_factory=lambda c: llm_engine, index=default_local_index, progress=False)
    spans = schemas.check(pl.read_parquet(tmp_path / "asqa" / "spans.parquet"), "spans")
    answers = schemas.check(pl.read_parquet(tmp_path / "asqa" / "answers.parquet"), "answers")
    assert answers.height == 2 and s["quote_fidelity"]["n_spans"] == spans.height
    assert set(spans["status"].to_list()) <= {"verbatim", "repaired", "unmarked", "bad_source", "empty"}
    assert "rougeLsum" in " ".join(s["metrics"]) or s["metrics"]

    cfg = config.load(None, {"dataset": "quotesum", "limit": 3, "answer_style": "quoted", **SMALL})
    s = run(cfg, tmp_path / "qs", engine_factory=lambda c: llm_engine, index=default_local_index, progress=False)
    calls = pl.read_parquet(tmp_path / "qs" / "llm_calls.parquet")
    assert calls["step"].to_list() == ["answer"] * 3  # no retrieval, no tree
    assert pl.read_parquet(tmp_path / "qs" / "hits.parquet").height == 0
    answers = pl.read_parquet(tmp_path / "qs" / "answers.parquet")
    assert all(len(p) >= 2 for p in answers["passage_ids"])  # the question's own sources
    assert any("sem" in k.lower() for k in s["metrics"])
    hits = pl.read_parquet(tmp_path / "qs" / "hits.parquet")
    assert hits.height == 0 and set(schemas.HITS) <= set(hits.columns)  # typed, though empty

    # both runs, the treeless QuoteSum one included, render in one report with their quotes
    from clarify.batch.report import write_report

    html = write_report([tmp_path / "asqa", tmp_path / "qs"], tmp_path / "report.html").read_text()
    for qid in answers["qid"].to_list():
        assert qid in html
