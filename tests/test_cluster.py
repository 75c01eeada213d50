"""Ray scale-out (batch/run/cluster.py, docs/scale.md) on this machine: a local Ray cluster, the real engine (vLLM
on CPU, the embedded model) in each worker, bound to its own core, and the real embedded index.

- 2 workers on 4 questions build the same tables as one process replaying their union cache (with both
  decoding constraints on (the DQ/DA format, verbatim quotes): the grammars travel in each request to the workers' engines);
- a worker actor killed mid-run: its chunk is requeued and redone, no chunk is answered twice;
- the driver SIGKILLed after its first part: the same command (with another worker count) resumes from
  the written chunks and builds the same tables.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from clarify.batch import config
from clarify.batch.run.cluster import chunks_of
from clarify.batch.run.pipeline import run
from clarify.batch.run.rundir import Run
from tests.run_fixtures import SMALL, same_tables, small_toml

pytestmark = pytest.mark.integration


def _cfg(**over):
    return config.load(None, {"answer_style": "free", **SMALL, **over})


def test_chunks_keep_question_order():
    assert chunks_of(list("abcdefg"), 3) == [["a", "b", "c"], ["d", "e", "f"], ["g"]]
    assert chunks_of([], 3) == []


# Every test that connects to Ray does it in a child process: Ray puts its own fatal-signal handlers into
# the process it connects (faulthandler, absl's, an alternate signal stack), and this pytest process runs a
# JVM (the index tests) that needs its own — it segfaulted in the index tests after in-process cluster
# tests, even with the handlers put back (batch/run/cluster.py _fatal_signal_handlers_kept).
DRIVER = """
import json, sys
from clarify.batch import config
from clarify.batch.run.pipeline import run
cfg = config.load(None, json.loads(sys.argv[1]))
{hook}
summary = run(cfg, sys.argv[2], progress=False{on_part})
print(json.dumps({{"summary": summary and summary.to_json(){extra}}}))
"""


def _drive(overrides: dict, out: Path, hook: str = "", on_part: str = "", extra: str = "") -> dict:
    """`run` in a child process (the driver), as the CLI would, with a test hook; its last stdout line."""
    code = DRIVER.format(hook=hook, on_part=on_part, extra=extra)
    proc = subprocess.run([sys.executable, "-c", code, json.dumps({"answer_style": "free", **SMALL, **overrides}),
                           str(out)], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Constrained decoding (batch/toc/constraints.py) on the workers: the DQ/DA grammar and quoted spans as runs of
# their source's words; every run of the 2-worker tables below uses these settings.
CONSTRAINED = {"answer_style": "quoted", "toc.constrain_format": True, "answer.constrain_quotes": True}
CONSTRAINED_TOML = ('answer_style = "quoted"\n[answer]\nconstrain_quotes = true\n', "constrain_format = true\n")


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, default_index):
    """4 ASQA questions on 2 Ray workers (cores 0 and 1), chunks of 2, both constraints on."""
    out = tmp_path_factory.mktemp("cluster") / "two"
    got = _drive({"limit": 4, "index": str(default_index), "cluster.workers": 2, "cluster.chunk_questions": 2,
                  **CONSTRAINED}, out)
    return out, got["summary"]


def test_two_workers_equal_one_process_replaying_their_caches(two_workers, tmp_path, default_local_index,
                                                               llm_engine):
    out, summary = two_workers
    c = summary["cluster"]
    assert summary["n_questions"] == 4 and c["workers"] == 2 and c["chunks"] == 2 and c["requeued"] == 0
    assert summary["constraints"] == {"format": True, "quotes": True}
    # the workers decoded under the grammars: every quote they wrote is verbatim (the checker ran after)
    assert summary["quote_fidelity"]["n_spans"] == summary["quote_fidelity"]["n_verbatim"]
    parts = Run.open(out).parts()
    qids = pl.read_parquet(out / "questions.parquet")["qid"].to_list()
    assert sorted(p.ran_on.qids for p in parts) == sorted(chunks_of(qids, 2))
    # both workers took chunks, each wrote its own cache file; every question is in exactly one part
    assert {p.ran_on.worker for p in parts} == {0, 1}
    assert sorted(q for p in parts for q in p.ran_on.qids) == sorted(qids)
    caches = sorted(p.name for p in (out / "cache").glob("*.sqlite"))
    assert caches == ["worker-00.sqlite", "worker-01.sqlite"]
    assert summary["cached_calls"] < summary["llm_calls"]  # the workers computed
    assert {w["slot"] for w in c["per_worker"]} == {0, 1} and sum(w["trees"] for w in c["per_worker"]) == 4

    # one process, the union of the workers' caches: no engine work, the same tables
    replay = tmp_path / "replay"
    replay.mkdir()
    shutil.copytree(out / "cache", replay / "cache")
    prompts = llm_engine.stats.prompts
    one = run(_cfg(limit=4, **CONSTRAINED), replay, engine_factory=lambda c: llm_engine, index=default_local_index,
              progress=False)
    assert llm_engine.stats.prompts == prompts and one.cached_calls == one.llm_calls
    same_tables(out, replay)


def test_a_killed_worker_has_its_chunk_redone_once(tmp_path, default_index):
    """Kill the actor of a chunk in flight right after the first part is written: the chunks it held go
    back to the queue, a new actor takes the slot, every question ends in exactly one part."""
    hook = """
import ray
killed = []
def kill_one(pool):
    if not killed and pool.busy_slots():
        slot = pool.busy_slots()[0]
        ray.kill(pool.actors[slot], no_restart=True)
        killed.append(slot)
"""
    out = tmp_path / "faulty"
    got = _drive({"limit": 4, "offset": 6, "index": str(default_index), "cluster.workers": 2,
                  "cluster.chunk_questions": 1}, out, hook=hook, on_part=", on_part=kill_one",
                 extra=', "killed": killed')
    summary, killed = got["summary"], got["killed"]
    assert killed, "no chunk was in flight after the first part"
    c = summary["cluster"]
    assert 1 <= c["requeued"] <= 2 and c["restarts"] == 1 and c["chunks"] == 4  # a worker holds ≤ 2 chunks
    parts = Run.open(out).parts()
    qids = [q for p in parts for q in p.ran_on.qids]
    assert len(parts) == 4 and len(qids) == len(set(qids)) == 4  # no chunk answered twice
    calls = pl.read_parquet(out / "llm_calls.parquet")
    assert calls.select("qid", "node_id", "step", "wave").n_unique() == calls.height
    assert pl.read_parquet(out / "answers.parquet").height == 4


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "clarify.batch.cli", *args]


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_killed_or_stopped_driver_resumes_from_written_chunks(two_workers, tmp_path, default_index, sig):
    """`clarify run --workers 2` SIGKILLs itself (or gets a Ctrl-C: one line, exit 130, no traceback, the
    workers stopped) right after writing part 1 (clarify/faults.py); the same command with
    --workers 1 finishes it: part 1 untouched, only the missing chunks run, and the tables equal the
    uninterrupted 2-worker run's (its caches seeded here, so this costs no engine work)."""
    done, _ = two_workers
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copytree(done / "cache", out / "cache")
    head, toc = CONSTRAINED_TOML
    toml = small_toml(tmp_path / "small.toml", head=head, toc=toc)
    flags = ["--dataset", "asqa", "--limit", "4", "--index", str(default_index), "--config", str(toml),
             "--no-progress", "--chunk-questions", "2", "--out", str(out)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(_cli("run", *flags, "--workers", "2"), capture_output=True, timeout=900,
                          env=dict(env, CLARIFY_KILL_AT="part-done:1", CLARIFY_KILL_SIGNAL=sig))
    if sig == "SIGKILL":
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    else:
        assert proc.returncode == 130, proc.stderr.decode()[-3000:]
        said = proc.stderr.decode()  # the cluster's plan, then one line for the stop: no traceback
        assert "Traceback" not in said and said.strip().splitlines()[-1] == (
            "clarify run: stopped by SIGINT: 2 of 4 trees written (1 part); resume with: clarify run "
            + " ".join([*flags, "--workers", "2"]))
    assert (out / "parts" / "0001").exists() and not (out / "summary.json").exists()
    first = Run.open(out).parts()
    mtime = (out / "parts" / "0001").stat().st_mtime_ns

    proc = subprocess.run(_cli("run", *flags, "--workers", "1"), env=env, capture_output=True, timeout=900)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "parts" / "0001").stat().st_mtime_ns == mtime
    parts = Run.open(out).parts()
    # only the chunks no part held were scheduled again
    assert summary["cluster"]["chunks"] == len(parts) - len(first) and summary["cluster"]["workers"] == 1
    qids = [q for p in parts for q in p.ran_on.qids]
    assert len(qids) == len(set(qids)) == 4
    same_tables(done, out)


def test_plan_gives_each_worker_a_gpu_or_a_tensor_parallel_group(monkeypatch):
    """The GPU side of the plan (no GPU here: Ray's view of the cluster is stubbed): one GPU per worker,
    or a STRICT_PACK placement group of tensor_parallel_size one-GPU bundles and vLLM's Ray executor;
    more workers than the GPUs allow is refused; on CPU each worker gets its own cores."""
    import ray
    import ray.util.placement_group  # noqa: F401  (ray.util's attribute of that name is the function)

    pg_mod = sys.modules["ray.util.placement_group"]

    from clarify.batch.run.cluster import _plan
    from clarify.errors import InputError

    def _parts(cfg):  # what the plan reads of a run config
        return cfg.cluster, cfg.model

    made = []
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 8.0, "CPU": 64.0})
    monkeypatch.setattr(pg_mod, "placement_group", lambda bundles, strategy: made.append((bundles, strategy)) or object())
    plan = _plan(*_parts(config.load(None)))
    assert plan.workers == 8 and plan.options[0] == {"num_gpus": 1, "num_cpus": 1} and plan.engine_kwargs == {}
    plan = _plan(*_parts(config.load(None, {"model.tensor_parallel_size": 2})))
    assert plan.workers == 4 and len(made) == 4 and made[0] == ([{"GPU": 1, "CPU": 1}] * 2, "STRICT_PACK")
    assert plan.engine_kwargs == {"ray_worker": True} and plan.options[0]["num_gpus"] == 0
    with pytest.raises(InputError, match="need 10 GPUs; the Ray cluster has 8"):
        _plan(*_parts(config.load(None, {"model.tensor_parallel_size": 2, "cluster.workers": 5})))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    plan = _plan(*_parts(config.load(None, {"cluster.workers": 2})))
    assert plan.cores == [[0], [1]] and plan.options == [{"num_cpus": 1}] * 2
    with pytest.raises(InputError, match="3 workers × 1 cores need 3 CPUs"):
        _plan(*_parts(config.load(None, {"cluster.workers": 3})))


def test_ray_leaves_the_jvms_signal_handlers_alone():
    """Connecting to Ray installs its own SIGSEGV handler (faulthandler, absl) over the JVM's, and the next
    routine fault of the JVM (HotSpot's null checks) kills the process. `_start_ray` puts the handlers
    back (checked in a child process: see DRIVER)."""
    code = """
import ctypes, faulthandler, json, signal
import ray
from clarify.batch.run.cluster import _start_ray
from clarify.batch.config import ClusterConfig
from clarify.index.jvm import start_jvm
libc = ctypes.CDLL(None)
def segv():
    buf = ctypes.create_string_buffer(256)
    assert libc.sigaction(int(signal.SIGSEGV), None, buf) == 0
    return buf.raw[:8].hex()
start_jvm()
before = segv()
start = _start_ray(ClusterConfig())
kept, fh = segv(), faulthandler.is_enabled()
ray.shutdown()
ray.init(num_cpus=1, include_dashboard=False)
print(json.dumps({"before": before, "plain": segv(), "kept": kept, "started": start, "faulthandler": fh}))
ray.shutdown()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["plain"] != got["before"]  # what Ray does on its own
    assert got["started"] and got["kept"] == got["before"] and not got["faulthandler"]
