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
from clarify.batch.run.pipeline import nodes_table, run
from clarify.batch.run.resources import open_resources, prepare
from clarify.batch.run.scheduler import drive
from clarify.batch.toc.settings import TreeSettings
from clarify.batch.toc.tree import Tree
from tests.run_fixtures import SMALL, same_tables, small_toml
from tests.test_parse_official import check_recorded

pytestmark = pytest.mark.integration


def test_real_schedulers_build_identical_tables_from_one_cache(tmp_path, default_local_index, llm_engine):
    """The continuous driver on vLLM's own step loop, then waves and the per-question loop replayed from
    its completion cache: zero engine work, identical trees and rows."""
    cfg = config.load(None, {"limit": 3, "answer_style": "free", **SMALL})
    prep = prepare(cfg, index=default_local_index, engine_factory=lambda c: llm_engine)
    questions = prep.questions
    stats = llm_engine.stats
    steps, prompts, running, gen_calls = stats.steps, stats.prompts, len(stats.running), stats.calls

    def trees():
        return [Tree.new(q, text) for q, text in zip(questions["qid"], questions["question"])]

    def resources():
        return open_resources(prep, tmp_path / "cache")

    res = resources()
    cont_trees = trees()
    cont = drive("continuous", cont_trees, res, TreeSettings.of(cfg))
    res.engine.flush()
    calls = pl.DataFrame(cont.llm_calls)
    # Every request went through vLLM's step loop, none through `generate`; requests of several trees and
    # steps ran together. A byte-identical request (a re-expansion after a restart with nothing exhausted
    # since, siblings' identical verifications) is computed once: the cache answers the repeats (dsp's
    # cache, officially). Whether a fresh run repeats one depends on the CPU's bf16 kernels (Intel AMX
    # runs did, AMD AVX512 ones did not), so the counts are bounded, not pinned: each model step was
    # driven by one of the driver's step calls, and a call that stepped no model returned a repeat.
    model_steps, cached = stats.steps - steps, calls["cached"].sum()
    assert stats.calls == gen_calls and cont.stats.generate_calls == 0
    assert 0 < model_steps <= cont.stats.step_calls <= model_steps + cached
    assert max(stats.running[running:]) > 1
    assert stats.prompts - prompts == calls.filter(~pl.col("cached"))["call_id"].n_unique()
    # what the model wrote differs between CPUs (it may end its turn at once): every computed call made
    # tokens, and each tree has its answer row
    assert (calls.filter(~pl.col("cached"))["output_tokens"] > 0).all()
    assert sorted(a.qid for a in cont.answers) == sorted(questions["qid"])
    # the real model's clarifications, parsed by the official function and by clarify's default: wherever
    # the official one finds pairs, the default finds the same (tests/test_parse_official.py)
    clar = calls.filter(pl.col("step") == "clarify")
    assert clar.height
    check_recorded(list(zip(clar["completion"], clar["finish_reason"])))

    for name in ("waves", "sequential"):
        before = stats.prompts
        res2 = resources()
        replay_trees = trees()
        rec = drive(name, replay_trees, res2, TreeSettings.of(cfg))
        assert stats.prompts == before, name  # zero model calls: every completion came from the cache
        assert res2.engine.stats.hits == len(rec.llm_calls) and res2.engine.stats.engine_calls == 0
        assert nodes_table(replay_trees).equals(nodes_table(cont_trees)), name
        assert pl.DataFrame(rec.answers).equals(pl.DataFrame(cont.answers)), name
        assert pl.DataFrame(rec.hits).equals(pl.DataFrame(cont.hits)), name
        assert pl.DataFrame(rec.llm_calls).drop("cached").equals(calls.drop("cached")), name


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "clarify.batch.cli", *args]


def _cache_keys(cache_dir: Path) -> set[str]:
    import sqlite3

    with sqlite3.connect(f"file:{cache_dir / 'completions.sqlite'}?mode=ro", uri=True, timeout=5) as con:
        return {k for (k,) in con.execute("SELECT key FROM completions")}


def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path, default_index):
    """A real continuous `clarify run` is SIGKILLed after its first part; the same command finishes it,
    recomputing no completion the killed session had committed. Then an uninterrupted run over the same
    completions (its cache seeded from the killed run's) must write exactly the same tables."""
    # every expansion a new request (toc.restart_resample): with the default, a small model's fruitless
    # root is re-expanded from the cache, and the kill below waits for a commit that follows engine work
    flags = ["--dataset", "asqa", "--limit", "3", "--answer-style", "free", "--index", str(default_index),
             "--config", str(small_toml(tmp_path / "small.toml", toc="restart_resample = true\n")), "--no-progress",
             "--part-trees", "1"]
    killed = tmp_path / "killed"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # The run kills itself at an exact state (clarify/faults.py): one tree written as part 1, right after the
    # next group of completions reached the cache, a tree still in flight. No timing race. Whether part 2
    # is written by then depends on what the model wrote (CPU-dependent): when two trees return their
    # last completion in one engine step, part 1's commit holds both and part 2 follows with nothing
    # new to commit.
    kill_env = dict(env, CLARIFY_KILL_AT="cache-commit after part-done:1")
    proc = subprocess.run(_cli("run", *flags, "--out", str(killed)), env=kill_env, capture_output=True,
                          timeout=900)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    parts = sorted((killed / "parts").iterdir())
    assert parts[0].name == "0001" and len(parts) < 3
    assert not (killed / "summary.json").exists()
    part_mtime = (killed / "parts" / "0001").stat().st_mtime_ns
    committed = _cache_keys(killed / "cache")
    written = set(pl.concat([pl.read_parquet(p / "llm_calls.parquet") for p in parts])["qid"])

    subprocess.run(_cli("run", *flags, "--out", str(killed)), env=env, check=True, capture_output=True)
    summary = json.loads((killed / "summary.json").read_text())
    assert (killed / "parts" / "0001").stat().st_mtime_ns == part_mtime  # a written part is never rewritten
    assert summary["parts"] == 3
    # the unfinished trees replayed from the cache: no completion committed before the kill was computed again
    calls = pl.read_parquet(killed / "llm_calls.parquet")
    replayed = calls.filter(~pl.col("qid").is_in(list(written)))
    assert not set(replayed.filter(~pl.col("cached"))["call_id"]) & committed
    assert replayed["cached"].any()
    # total wall time = the killed session up to its last part + the whole resumed session
    first_s = json.loads((parts[-1] / "state.json").read_text())["run_s"]
    assert first_s > 0
    assert summary["wall_s_total"] == pytest.approx(first_s + summary["wall_s_last_session"], abs=0.02)

    clean = tmp_path / "clean"
    clean.mkdir()
    subprocess.run(["cp", "-r", str(killed / "cache"), str(clean / "cache")], check=True)
    subprocess.run(_cli("run", *flags, "--scheduler", "waves", "--out", str(clean)), env=env, check=True,
                   capture_output=True)
    same_tables(killed, clean)
    # no call recorded twice (two nodes may send one identical request, e.g. same-answer verifications)
    assert calls.select("qid", "node_id", "step", "wave").n_unique() == calls.height
    clean_summary = json.loads((clean / "summary.json").read_text())
    assert clean_summary["cached_calls"] == pl.read_parquet(clean / "llm_calls.parquet").height
    assert clean_summary["wall_s_total"] == pytest.approx(clean_summary["wall_s_last_session"], abs=0.02)



def test_sigterm_mid_run_writes_finished_trees_and_resumes(tmp_path, default_index):
    """A real `clarify run` (vLLM, the JVM's BM25) gets SIGTERM right after its first part: it
    cancels what is in flight, commits the cache, prints one line and exits 143; the same command
    finishes it, computing no completion the stopped session got back."""
    argv = ["run", "--dataset", "asqa", "--limit", "2", "--answer-style", "free", "--index", str(default_index),
            "--config", str(small_toml(tmp_path / "small.toml")), "--no-progress", "--part-trees", "1",
            "--out", str(tmp_path / "run")]
    env = dict(os.environ, CLARIFY_KILL_AT="part-done:1", CLARIFY_KILL_SIGNAL="SIGTERM")
    proc = subprocess.run(_cli(*argv), env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"clarify run: stopped by SIGTERM: 1 of 2 trees written (1 part); resume with: clarify {' '.join(argv)}"]
    run_dir = tmp_path / "run"
    assert [p.name for p in (run_dir / "parts").iterdir()] == ["0001"]
    got_back = _cache_keys(run_dir / "cache")  # committed at the stop: what the first part holds and more
    first = pl.read_parquet(run_dir / "parts" / "0001" / "llm_calls.parquet")
    assert set(first["call_id"]) <= got_back

    subprocess.run(_cli(*argv), check=True, capture_output=True)
    calls = pl.read_parquet(run_dir / "llm_calls.parquet")
    second = calls.filter(~pl.col("qid").is_in(first["qid"].to_list()))
    assert not set(second.filter(~pl.col("cached"))["call_id"]) & got_back
    assert json.loads((run_dir / "summary.json").read_text())["parts"] == 2


def test_quoted_asqa_and_quotesum_runs_make_spans(tmp_path, default_local_index, llm_engine):
    cfg = config.load(None, {"limit": 2, "answer_style": "quoted", **SMALL})
    s = run(cfg, tmp_path / "asqa", engine_factory=lambda c: llm_engine, index=default_local_index, progress=False)
    spans = schemas.check(pl.read_parquet(tmp_path / "asqa" / "spans.parquet"), "spans")
    answers = schemas.check(pl.read_parquet(tmp_path / "asqa" / "answers.parquet"), "answers")
    assert answers.height == 2 and s.quote_fidelity.n_spans == spans.height
    assert set(spans["status"].to_list()) <= {"verbatim", "repaired", "unmarked", "bad_source", "empty"}
    assert "rougeLsum" in " ".join(s.metrics) or s.metrics

    cfg = config.load(None, {"dataset": "quotesum", "limit": 3, "answer_style": "quoted", **SMALL})
    s = run(cfg, tmp_path / "qs", engine_factory=lambda c: llm_engine, index=default_local_index, progress=False)
    calls = pl.read_parquet(tmp_path / "qs" / "llm_calls.parquet")
    assert calls["step"].to_list() == ["answer"] * 3  # no retrieval, no tree
    assert pl.read_parquet(tmp_path / "qs" / "hits.parquet").height == 0
    answers = pl.read_parquet(tmp_path / "qs" / "answers.parquet")
    assert all(len(p) >= 2 for p in answers["passage_ids"])  # the question's own sources
    assert any("sem" in k.lower() for k in s.metrics)
    hits = pl.read_parquet(tmp_path / "qs" / "hits.parquet")
    assert hits.height == 0 and set(schemas.HITS) <= set(hits.columns)  # typed, though empty

    # both runs, the treeless QuoteSum one included, render their reports with their quotes (one report of
    # both is refused: runs are compared question by question, and these have different questions)
    from clarify.batch.report.html import write_report
    from clarify.errors import InputError

    html = "".join(write_report([tmp_path / d], tmp_path / f"{d}.html").read_text() for d in ("asqa", "qs"))
    with pytest.raises(InputError, match="cannot be compared question by question"):
        write_report([tmp_path / "asqa", tmp_path / "qs"], tmp_path / "report.html")
    for qid in answers["qid"].to_list():
        assert qid in html
