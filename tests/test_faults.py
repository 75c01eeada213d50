"""Named fault points (clarify/faults.py): a process kills itself at an exact state, so crash tests
never race a timer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

SCRIPT = """
from clarify import faults
for name in ["cache-commit", "part-done:1", "cache-commit", "cache-commit"]:
    print(name, flush=True)
    faults.point(name)
print("end", flush=True)
"""


@pytest.mark.parametrize(("spec", "printed", "killed"), [
    (None, 5, False),                                     # unarmed: nothing happens
    ("cache-commit", 1, True),                            # the first commit
    ("cache-commit after part-done:1", 3, True),          # the first commit once part 1 is written
    ("cache-commit after part-done:2", 5, False),         # never reached
])
def test_kill_point_is_exact(spec, printed, killed):
    env = {"PYTHONPATH": ":".join(sys.path)}
    if spec:
        env["CLARIFY_KILL_AT"] = spec
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert len(proc.stdout.split()) == printed
    assert proc.returncode == (-signal.SIGKILL if killed else 0)


# --- a run killed at every stage finishes, calls nothing twice and writes what an uninterrupted run
# writes. Scripted engine and the stand-in index in a subprocess: the kill is real (SIGKILL),
# the model is not. The same property with the real engine: test_toc_real.py (SIGKILL mid-run).

RUN = """
import sys
from clarify.batch import config
from clarify.batch.run.pipeline import run
from clarify.local_llm.engine import request_key
from clarify.local_llm.scripted import ScriptedEngine
from tests.test_toc import make_responder
from tests.toc_fakes import FakeIndex

out, questions, sent = sys.argv[1:4]

class Logged(ScriptedEngine):
    # every request that reaches the engine, in every session: a request answered twice shows here
    def generate(self, prompts, params):
        with open(sent, "a") as fh:
            fh.writelines(request_key(self.model_id, p, gp) + "\\n" for p, gp in zip(prompts, params))
        return super().generate(prompts, params)

cfg = config.load(None, {"dataset": "jsonl", "questions": questions, "answer_style": "quoted",
                         "toc.max_expansions": 3})
run(cfg, out, engine_factory=lambda c: Logged("scripted", make_responder()), index=FakeIndex(200),
    progress=False, restart="--restart" in sys.argv, part_trees=1)
"""
TABLES = ("nodes", "hits", "llm_calls", "answers", "spans", "passages", "scores")


def _session(out, questions, sent, kill=None, *extra):
    import os

    env = {**os.environ, "PYTHONPATH": ":".join(sys.path)}
    env.pop("CLARIFY_KILL_AT", None)
    if kill:
        env["CLARIFY_KILL_AT"] = kill
    return subprocess.run([sys.executable, "-c", RUN, str(out), str(questions), str(sent), *extra], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """Questions file and the tables of one uninterrupted run."""
    import json

    d = tmp_path_factory.mktemp("clean")
    q = d / "questions.jsonl"
    q.write_text("".join(json.dumps({"qid": f"q{i}", "question": t}) + "\n" for i, t in enumerate(
        ["Who has the highest goals in world football?", "When did the last world cup take place?"])))
    proc = _session(d / "run", q, d / "sent.txt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return q, d / "run"


@pytest.mark.parametrize("kills", [
    ["freeze"],                                    # config pinned, inputs not yet
    ["cache-commit"],                              # completions committed, no tree written
    ["part-tmp:1"],                                # the first finished tree in its temp folder, not renamed
    ["part-done:1"],                               # part 1 renamed into place
    ["cache-commit after part-done:1", "part-tmp:2"],  # killed twice, in two sessions
    ["final-tables"],                              # final tables written, summary not
])
def test_killed_at_every_stage_finishes_like_an_uninterrupted_run(tmp_path, clean_run, kills):
    import polars as pl

    q, clean = clean_run
    out, sent = tmp_path / "run", tmp_path / "sent.txt"
    for kill in kills:
        proc = _session(out, q, sent, kill)
        assert proc.returncode == -signal.SIGKILL, (kill, proc.stderr[-2000:])
        assert not (out / "summary.json").exists()
    proc = _session(out, q, sent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in TABLES:
        a, b = pl.read_parquet(clean / f"{name}.parquet"), pl.read_parquet(out / f"{name}.parquet")
        assert a.drop("cached", strict=False).equals(b.drop("cached", strict=False)), name
    keys = sent.read_text().split()
    assert len(keys) == len(set(keys)) > 0  # no request reached the engine twice, across all sessions
    assert not list(out.rglob("*.tmp*")) and not list(out.glob(".parts.trash*"))


def test_restart_killed_midway_then_plain_rerun(tmp_path, clean_run):
    import polars as pl

    q, clean = clean_run
    out, sent = tmp_path / "run", tmp_path / "sent.txt"
    assert _session(out, q, sent).returncode == 0
    proc = _session(out, q, sent, "restart-cleared", "--restart")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert not (out / "summary.json").exists() and not (out / "parts").exists()
    assert _session(out, q, sent).returncode == 0  # no checkpoint left: a fresh start, all from the cache
    for name in TABLES:
        a, b = pl.read_parquet(clean / f"{name}.parquet"), pl.read_parquet(out / f"{name}.parquet")
        assert a.drop("cached", strict=False).equals(b.drop("cached", strict=False)), name
    keys = sent.read_text().split()
    assert len(keys) == len(set(keys))


# --- stopped by a signal: SIGINT, SIGTERM and SIGHUP reach Python (the JVM runs with -Xrs), the
# finished trees are written, the cache is committed, one line says what happened, the exit status is
# 128 + the signal; the same command resumes with no request made twice. The real `clarify` command line,
# the real index (JVM: BM25), the scripted engine logging every request; the signal is sent at an exact
# state (CLARIFY_KILL_SIGNAL, clarify/faults.py). With the real engine: test_toc_real.py.

CLI = """
import sys
from clarify.batch import cli
from clarify.batch.run import resources
from clarify.local_llm.engine import request_key
from clarify.local_llm.scripted import ScriptedEngine
from tests.test_toc import make_responder

class Logged(ScriptedEngine):  # every request that reaches the engine, in every session
    def generate(self, prompts, params):
        with open(sys.argv[1], "a") as fh:
            fh.writelines(request_key(self.model_id, p, gp) + "\\n" for p, gp in zip(prompts, params))
        return super().generate(prompts, params)

resources.engine_for = lambda model, tree, **kw: Logged("scripted", make_responder())
sys.exit(cli.main(sys.argv[2:]))
"""


def _cli_session(sent, argv, kill=None, sig=None):
    import os

    env = {**os.environ, "PYTHONPATH": ":".join(sys.path)}
    env.pop("CLARIFY_KILL_AT", None)
    if kill:
        env.update(CLARIFY_KILL_AT=kill, CLARIFY_KILL_SIGNAL=sig)
    return subprocess.run([sys.executable, "-c", CLI, str(sent), *argv], env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.integration
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_stops_the_run_in_one_line_and_it_resumes(tmp_path, clean_run, default_index, sig):
    q, _ = clean_run
    out, sent = tmp_path / "run", tmp_path / "sent.txt"
    argv = ["run", "--dataset", "jsonl", "--questions", str(q), "--index", str(default_index), "--out", str(out),
            "--answer-style", "quoted", "--no-progress", "--part-trees", "1"]
    proc = _cli_session(sent, argv, "part-done:1", sig)
    number = signal.Signals[sig].value
    assert proc.returncode == 128 + number, proc.stderr[-3000:]
    # one line: what stopped it, how far it got, the command that resumes it
    assert proc.stderr.strip().splitlines() == [
        f"clarify run: stopped by {sig}: 1 of 2 trees written (1 part); resume with: clarify {' '.join(argv)}"]
    assert (out / "parts" / "0001").exists() and not (out / "summary.json").exists()
    # the cache holds every completion the stopped session got: none is asked for again
    asked = set(sent.read_text().split())
    proc = _cli_session(sent, argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = sent.read_text().split()
    assert len(keys) == len(set(keys)) > len(asked)
    assert json.loads((out / "summary.json").read_text())["n_questions"] == 2


def test_stop_signals_raise_stopped_and_wait_for_a_deferred_block():
    """In process: each signal raises Stopped (a KeyboardInterrupt) with its exit status; inside
    `deferred()` it waits for the block's end; the handlers before `handled()` come back."""
    import os

    from clarify import stops

    before = signal.getsignal(signal.SIGTERM)
    for sig in stops.SIGNALS:
        with stops.handled():
            with pytest.raises(stops.Stopped) as got:
                os.kill(os.getpid(), sig)
                for _ in range(100):  # the handler runs at the next bytecode boundaries
                    pass
            assert got.value.signum == sig and got.value.exit_code == 128 + sig
        with stops.handled():
            reached = []
            with pytest.raises(stops.Stopped):
                with stops.deferred():
                    os.kill(os.getpid(), sig)
                    for _ in range(100):
                        pass
                    reached.append("end of block")
            assert reached == ["end of block"]
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.integration
def test_the_jvm_leaves_ctrl_c_to_python():
    """Without -Xrs HotSpot took SIGINT and exited the process (130 in 0.36 s) with no KeyboardInterrupt
    and no `finally` (measured on main 2548218); with it, Python gets the signal.

    The script installs Python's own SIGINT handler before the JVM starts: a suite started with `&` from
    a script (no job control) inherits SIGINT ignored, Python then installs none, and the child slept
    through the signal (a fresh-clone run started that way: SigIgn 0x7 in /proc/PID/status). The JVM
    starts after it, so without -Xrs it still replaces the handler and this test fails."""
    import os

    script = ("import signal, time\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from clarify.index.jvm import start_jvm\nstart_jvm()\nimport jnius\n"
              "jnius.autoclass('java.lang.System').currentTimeMillis()\n"
              "try:\n    print('ready', flush=True)\n    time.sleep(120)\n"
              "except KeyboardInterrupt:\n    print('KeyboardInterrupt', flush=True)\n"
              "finally:\n    print('finally', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ":".join(sys.path)})
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert rest.split() == ["KeyboardInterrupt", "finally"] and proc.returncode == 0
