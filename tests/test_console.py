"""Quiet by default, everything kept (issue 17): library logs, warnings and native output go to the log
file; the terminal keeps clarify's own lines, its progress display and the notes that matter."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

from clarify import console

# A child process, so descriptors 1 and 2 are real pipes (as on a terminal), not pytest's capture.
SCRIPT = textwrap.dedent("""
    import logging, os, sys, warnings
    from clarify import console

    with console.session(sys.argv[1], "test", verbose=sys.argv[2] == "1") as path:
        logging.getLogger("vllm.engine").info("engine INFO line")
        logging.getLogger("vllm.platform").warning("tcmalloc is not found")
        warnings.warn("a FutureWarning nobody asked for", FutureWarning)
        os.write(2, b"OMP: Info #276: native stderr\\n")
        os.write(1, b"log4j INFO native stdout\\n")
        print("clarify result line")
        print("clarify progress line", file=sys.stderr)
        console.note("reranker", "reranking fell back to dense cosine")
        console.print_notes()
    print("after the session", file=sys.stderr)
    os.write(2, b"native after the session\\n")
""")


def _run(tmp_path, verbose: bool) -> tuple[subprocess.CompletedProcess, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "logs"), "1" if verbose else "0"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (log,) = (tmp_path / "logs").glob("test-*.log")
    return proc, log.read_text()


def test_quiet_session_sends_library_and_native_output_to_the_log(tmp_path):
    proc, log = _run(tmp_path, verbose=False)
    for kept in ("engine INFO line", "tcmalloc is not found", "a FutureWarning nobody asked for",
                 "OMP: Info #276", "log4j INFO native stdout"):
        assert kept in log
        assert kept not in proc.stdout + proc.stderr
    assert proc.stdout.strip() == "clarify result line"
    err = proc.stderr
    assert "clarify progress line" in err
    assert "reranking fell back to dense cosine" in err  # the notes, in words
    assert "2 library warning(s) are in the log (vllm 1, py.warnings 1)" in err
    assert f"log: {tmp_path / 'logs'}" in err
    assert "after the session" in err and "native after the session" in err  # descriptors restored


def test_verbose_session_shows_everything_and_still_keeps_the_log(tmp_path):
    proc, log = _run(tmp_path, verbose=True)
    assert "engine INFO line" in proc.stderr and "engine INFO line" in log
    assert "OMP: Info #276" in proc.stderr  # native output is left on the terminal
    assert "log4j INFO native stdout" in proc.stdout


def test_session_restores_logging_and_records_a_failure(tmp_path):
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        with console.session(tmp_path, "boom"):
            raise RuntimeError("kaputt")
    except RuntimeError:
        pass
    assert root.handlers == handlers and root.level == level and console.log_path() is None
    (log,) = tmp_path.glob("boom-*.log")
    assert "kaputt" in log.read_text() and "Traceback" in log.read_text()


def test_run_progress_reports_calls_tokens_and_an_eta():
    shown = console.RunProgress(4, finished=1, expected_tokens=3000, enabled=False)
    shown.engine_update(3, 0)
    shown.engine_update(0, 1500)
    post = shown.bar.postfix
    assert "0 in flight" in post and "3 LLM calls" in post and "tok/s" in post and "ETA" in post
    shown.tree_done(running=7)
    assert shown.finished == 2 and "7 in flight" in shown.bar.postfix
    shown.close()


def test_run_notes_in_words():
    from clarify.batch.config import RunConfig
    from clarify.batch.pipeline import note_run

    console._notes.clear()
    note_run({"llm_calls": 100, "parse_errors": 40, "prompts_too_long": 2}, RunConfig())
    words = " ".join(console.notes())
    assert "2 prompt(s) were longer than the model's context" in words
    assert "38% of the model's completions (38 of 100) did not parse cleanly" in words
    console._notes.clear()
    note_run({"llm_calls": 100, "parse_errors": 5, "prompts_too_long": 0}, RunConfig())
    assert console.notes() == []
    json.dumps(console.notes())


def test_old_logs_are_pruned(tmp_path):
    for i in range(console.KEEP_LOGS + 5):
        p = tmp_path / f"old-20250101-0000{i:02d}-1.log"  # clarify's own log names (console.log_file_for)
        p.write_text("x")
        os.utime(p, (1000 + i, 1000 + i))
    new = console.log_file_for(tmp_path, "run")
    new.write_text("y")
    kept = sorted(p.name for p in tmp_path.glob("*.log"))
    assert len(kept) == console.KEEP_LOGS and "old-20250101-000000-1.log" not in kept and new.name in kept


def test_run_shows_one_display_fed_by_the_engine(tmp_path, capsys):
    """`clarify run`'s display: the engine reports to it while batches run (VLLMEngine.on_progress);
    the report hook is unset afterwards (the engine is shared in the process)."""
    from clarify.batch.pipeline import run
    from clarify.local_llm.scripted import ScriptedEngine
    from tests.test_toc import _run_cfg, make_responder
    from tests.toc_fakes import FakeIndex

    class Reporting(ScriptedEngine):
        on_progress = None

        def generate(self, prompts, params):
            out = super().generate(prompts, params)
            hooked.append(self.on_progress is not None)
            if self.on_progress:
                self.on_progress(len(out), sum(c.prompt_tokens + c.output_tokens for c in out))
            return out

    hooked: list[bool] = []
    engine = Reporting("scripted", make_responder())
    summary = run(_run_cfg(tmp_path), tmp_path / "r", engine_factory=lambda _c: engine, index=FakeIndex())
    err = capsys.readouterr().err
    assert hooked and all(hooked) and engine.on_progress is None
    assert f"ToC {summary['n_questions']}/{summary['n_questions']} questions" in err
    assert f"{summary['llm_calls'] - summary['cached_calls']} LLM calls" in err
    assert "opening the index, the encoder and the engine…" in err and "checking quotes and scoring…" in err


def test_nothing_to_note_prints_nothing(tmp_path, capsys):
    with console.session(tmp_path, "quiet"):
        console.print_notes()
    assert capsys.readouterr().err == ""


def test_a_message_during_a_step_gets_its_own_line(capsys):
    with console.step("starting the engine"):
        console.say("waiting for CPU core 0: a vLLM engine of pid 1 is using it")
    with console.step("scoring"):
        pass
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "starting the engine…"
    assert lines[1].startswith("waiting for CPU core 0")
    assert lines[2].startswith("starting the engine… ") and lines[2].endswith(" s")
    assert lines[3].startswith("scoring… ") and len(lines) == 4
