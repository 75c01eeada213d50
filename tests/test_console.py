"""Quiet by default, everything kept (docs/running-toc.md#what-the-terminal-shows): library logs, warnings and native output go to the log
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
    from clarify.batch.run.pipeline import note_run
    from clarify.batch.run.records import RunSummary

    console._notes.clear()
    note_run(RunSummary(llm_calls=100, parse_errors=40, prompts_too_long=2), RunConfig().model)
    words = " ".join(console.notes())
    assert "2 prompt(s) were longer than the model's context" in words
    assert "38% of the model's completions (38 of 100) did not parse cleanly" in words
    console._notes.clear()
    note_run(RunSummary(llm_calls=100, parse_errors=5, prompts_too_long=0), RunConfig().model)
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
    from clarify.batch.run.pipeline import run
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
    assert f"ToC {summary.n_questions}/{summary.n_questions} questions" in err
    assert f"{summary.llm_calls - summary.cached_calls} LLM calls" in err
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


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _simulate(display: console.RunProgress, clock: FakeClock, seconds: float, total: int) -> None:
    """A run of `total` trees over `seconds`: the engine reports every 0.25 s, trees finish in bursts (three
    at a time, as the continuous scheduler's often do), the last ones together at the end."""
    finish_at = sorted({round(seconds * (i // 3 * 3 + 3) / (total + 2), 2) for i in range(total)})
    done = 0
    while clock.now - 1000.0 < seconds:
        clock.now += 0.25
        display.engine_update(1, 40, running=5)
        while done < total and finish_at and clock.now - 1000.0 >= finish_at[0]:
            finish_at.pop(0)
            for _ in range(min(3, total - done)):
                display.tree_done(running=4)
                done += 1
    while done < total:
        display.tree_done(running=0)
        done += 1
    display.close()


def test_progress_in_a_log_is_a_plain_line_at_most_every_10_s():
    """Not a terminal (a redirect, CI, nohup): plain lines, one per ~30 s or 5 % of the questions, never two
    within 10 s, each with questions finished, calls, tokens/s and an ETA; no bar redraws (\\r)."""
    import io

    clock, log = FakeClock(), io.StringIO()
    display = console.RunProgress(20, expected_tokens=20 * 1500, stream=log, clock=clock)
    assert not display.live
    _simulate(display, clock, 600.0, 20)
    text = log.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and all(line.startswith("ToC ") for line in lines)
    assert 600 / 30 <= len(lines) <= 600 / 10 + 1  # at least every 30 s, at most one per 10 s (+ the last)
    assert "ETA ~" in lines[1] and "LLM calls" in lines[1] and "160 tok/s" in lines[1]
    assert lines[-1].startswith("ToC 20/20 questions (100%)") and "10.0 min elapsed" in lines[-1]
    assert len(set(lines)) == len(lines)  # the last line is not said twice
    shares = [int(line.split("(")[1].split("%")[0]) for line in lines]
    assert shares == sorted(shares)


def test_progress_on_a_terminal_is_the_live_bar():
    import io

    clock, tty = FakeClock(), io.StringIO()
    display = console.RunProgress(4, expected_tokens=4000, stream=tty, clock=clock, is_live=True)
    _simulate(display, clock, 20.0, 4)
    assert "\r" in tty.getvalue() and "ToC 4/4 questions" in tty.getvalue()


def test_the_first_tree_re_estimates_the_toc_time():
    """The demo's estimate is re-estimated from the run's own speed once the first tree is done: 1,000 of
    the expected 3,000 tokens in 20 s is 50 tok/s, so ~60 s in all."""
    import io

    clock, log = FakeClock(), io.StringIO()
    display = console.RunProgress(3, expected_tokens=3000, stream=log, clock=clock, estimate_s=120.0)
    clock.now += 20
    display.engine_update(5, 1000)
    display.tree_done()
    clock.now += 1
    display.tree_done()  # said once
    display.close()
    said = [line for line in log.getvalue().splitlines() if "re-estimated" in line]
    assert said == ["ToC re-estimated after the first tree (20 s, 50 tok/s): ~60 s in all (the probe's estimate: "
                    "~2.0 min)"]
    assert display.reestimate_s == 60.0


SESSION_BARS = textwrap.dedent("""
    import os, sys
    from tqdm import tqdm
    from tqdm.auto import tqdm as auto_tqdm  # imported before the session, as the CLI has
    from clarify import console

    with console.session(sys.argv[1], "test"):
        for _ in tqdm(range(3), desc="library bar"):  # a library's bar: tqdm's own defaults
            pass
        for _ in auto_tqdm(range(3), desc="auto bar"):  # transformers' GGUF conversion's kind
            pass
        for _ in tqdm(range(3), desc="own bar", disable=False):  # clarify's own say for themselves
            pass
        print("TQDM_DISABLE in the session:", os.environ.get("TQDM_DISABLE"), file=sys.stderr)
    print("TQDM_DISABLE after:", os.environ.get("TQDM_DISABLE"), file=sys.stderr)
""")


def test_a_session_into_a_log_draws_no_library_bars(tmp_path):
    """stderr a pipe (a log): a library's tqdm bar (vLLM's, transformers' GGUF conversion) draws nothing."""
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.run([sys.executable, "-c", SESSION_BARS, str(tmp_path / "logs")], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "library bar" not in proc.stderr and "auto bar" not in proc.stderr and "own bar" in proc.stderr
    assert "TQDM_DISABLE in the session: 1" in proc.stderr and "TQDM_DISABLE after: None" in proc.stderr


def test_a_redirected_run_logs_at_most_one_progress_line_per_10_s(tmp_path, monkeypatch, capsys):
    """`clarify run` with stderr not a terminal (capsys): the scripted engine takes 3 s of a fake clock per
    request, so ToC runs for minutes of that clock; its log holds plain progress lines, at most one per 10 s
    of the run (and the last), and no bar redraw."""
    from clarify.batch.run.pipeline import run
    from clarify.local_llm.scripted import ScriptedEngine
    from tests.test_toc import _run_cfg, make_responder
    from tests.toc_fakes import FakeIndex

    clock = FakeClock()
    monkeypatch.setattr(console, "monotonic", clock)

    class Slow(ScriptedEngine):
        on_progress = None

        def generate(self, prompts, params):
            out = super().generate(prompts, params)
            clock.now += 3.0 * len(out)
            if self.on_progress:
                self.on_progress(len(out), sum(c.prompt_tokens + c.output_tokens for c in out))
            return out

    engine = Slow("scripted", make_responder())
    start = clock.now
    summary = run(_run_cfg(tmp_path, limit=6), tmp_path / "r", engine_factory=lambda _c: engine, index=FakeIndex())
    took = clock.now - start
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("ToC ")]
    assert took > 60 and "\r" not in err
    assert 2 <= len(lines) <= took / 10 + 1
    assert lines[-1].startswith("ToC 6/6 questions (100%)") and f"{summary.llm_calls - summary.cached_calls} LLM calls" in lines[-1]
    # the same session as data in the run directory: a sample per 30 s of the run's clock and one at the end
    samples = [json.loads(line) for line in (tmp_path / "r" / "logs" / "progress.jsonl").read_text().splitlines()]
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(samples, samples[1:])]
    assert len(samples) >= 3 and samples[0]["elapsed_s"] == 0  # the scripted engine answers in batches: gaps vary
    assert all(g >= 30 for g in gaps[:-1]) and gaps[-1] >= 0 and len(samples) <= took / 30 + 2
    assert [s["finished"] for s in samples] == sorted(s["finished"] for s in samples)
    assert samples[-1]["finished"] == samples[-1]["total"] == 6
    assert samples[-1]["calls"] == summary.llm_calls - summary.cached_calls
    assert samples[-1]["tokens"] > 0 and samples[-1]["rss_mb"] > 0


def test_the_eta_counts_calls_at_their_recent_rate():
    """With an expected call count, the ETA is the calls left at the rate of the last 30 s: the start, when
    the engine takes every tree's first prompt and no call finishes for half a minute, is not held against
    the rest of the run."""
    import io

    clock, log = FakeClock(), io.StringIO()
    display = console.RunProgress(4, expected_calls=400, expected_tokens=10**9, stream=log, clock=clock,
                                  estimate_s=200.0)
    clock.now += 30  # the start: nothing finishes
    for _ in range(30):  # then 3 calls a second
        clock.now += 1
        display.engine_update(3, 100)
    assert display.calls == 90 and display.call_rate() == 3.0
    assert display.eta_s() == (400 - 90) / 3.0
    display.tree_done()
    assert display.reestimate_s == 60 + (400 - 90) / 3.0
    assert "ETA ~" in display.status()
