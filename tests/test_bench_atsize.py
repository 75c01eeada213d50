"""bench/bench_atsize.py's verdicts at size, on a run's progress record as `clarify run` writes it
(console.RunProgress: RUN/logs/progress.jsonl, one ProgressSample a line): the engine's tokens/s in the last
tenth against the median, the driver's memory after warm-up against the end, and the engine requests of all
sessions against the completion cache's rows. Each verdict is checked both ways: it holds, and it fails."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import sys
from pathlib import Path

import pytest

from clarify.console import ProgressSample, read_progress
from clarify.errors import InputError

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_atsize", ROOT / "bench" / "bench_atsize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(tmp_path: Path, sessions: list[list[ProgressSample]], cache_rows: int) -> Path:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "progress.jsonl").write_text(
        "".join(json.dumps(s.to_json()) + "\n" for sess in sessions for s in sess), encoding="utf-8")
    (run / "cache").mkdir()
    with sqlite3.connect(run / "cache" / "completions.sqlite") as con:
        con.execute("CREATE TABLE completions (key TEXT)")
        con.executemany("INSERT INTO completions VALUES (?)", [(str(i),) for i in range(cache_rows)])
    return run


def _session(t0: float, n: int, total: int, done_from: int, done_to: int, tok_s, rss,
             running=lambda i: 8) -> list[ProgressSample]:
    """n samples 30 s apart; trees finished rising from done_from to done_to; tokens at tok_s(i) per second;
    the driver's memory rss(i); requests in flight running(i); one request per 100 tokens."""
    out, tokens = [], 0
    for i in range(n):
        if i:
            tokens += int(tok_s(i) * 30)
        out.append(ProgressSample(time=t0 + 30 * i, elapsed_s=30.0 * i, total=total, tokens=tokens,
                                  finished=done_from + (done_to - done_from) * i // (n - 1),
                                  calls=tokens // 100, running=running(i), rss_mb=rss(i)))
    return out


def test_a_steady_run_in_two_sessions_holds_every_verdict(tmp_path):
    b = _bench()
    a = _session(1000.0, 40, 200, 0, 90, lambda i: 1000.0, lambda i: 1000.0 + i)
    c = _session(5000.0, 40, 200, 90, 200, lambda i: 1000.0, lambda i: 1010.0)
    run = _run(tmp_path, [a, c], cache_rows=a[-1].calls + c[-1].calls)
    assert [len(s) for s in read_progress(run / "logs" / "progress.jsonl")] == [40, 40]
    got = b.checks(run, {"sessions": []})
    assert got["sessions"] == 2 and got["no_decay"] and got["rss_holds"] and got["nothing_recomputed"]
    assert got["median_tok_s"] == pytest.approx(1000.0, rel=0.01)
    assert got["engine_requests_all_sessions"] == got["cache_rows"]


def test_decay_growth_and_a_recomputed_request_each_fail_their_verdict(tmp_path):
    b = _bench()
    # the last tenth at half the speed, the driver growing by half, one request more than the cache holds
    a = _session(1000.0, 60, 300, 0, 300, lambda i: 1000.0 if i < 52 else 500.0, lambda i: 1000.0 + 10 * i)
    run = _run(tmp_path, [a], cache_rows=a[-1].calls - 1)
    got = b.checks(run, {"sessions": []})
    assert not got["no_decay"] and got["tok_s_change_last_tenth"] < -0.15
    assert not got["rss_holds"] and got["rss_growth"] > 0.10
    assert not got["nothing_recomputed"] and got["engine_requests_all_sessions"] == got["cache_rows"] + 1


def test_a_line_cut_short_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "progress.jsonl"
    path.write_text(json.dumps(ProgressSample(elapsed_s=0.0).to_json()) + '\n{"elapsed_s": 3', encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_progress(path)
    assert err.value.line == 2 and str(path) in str(err.value)


def test_the_series_kept_in_the_results_file_follows_the_record(tmp_path):
    b = _bench()
    a = _session(1000.0, 5, 10, 0, 4, lambda i: 600.0, lambda i: 900.0)
    c = _session(2000.0, 4, 10, 4, 10, lambda i: 300.0, lambda i: 950.0)
    run = _run(tmp_path, [a, c], cache_rows=0)
    got = b.series(read_progress(run / "logs" / "progress.jsonl"))
    assert [s["session"] for s in got] == [1] * 5 + [2] * 4
    assert [s["tok_s"] for s in got] == [None, 600.0, 600.0, 600.0, 600.0, None, 300.0, 300.0, 300.0]
    assert got[-1]["finished"] == got[-1]["total"] == 10 and got[-1]["rss_mb"] == 950


def test_the_drain_is_not_taken_for_decay(tmp_path):
    """The batch empties as the last trees finish (requests in flight from 100 down to 10) and tokens/s falls
    with it: that is the drain, left out; the engine at a full batch kept its speed, so no decay."""
    b = _bench()
    running = lambda i: 100 if i < 40 else 100 - 9 * (i - 39)  # noqa: E731
    a = _session(1000.0, 50, 200, 0, 200, lambda i: 10.0 * running(i), lambda i: 1000.0, running)
    run = _run(tmp_path, [a], cache_rows=a[-1].calls)
    got = b.checks(run, {"sessions": []})
    assert got["peak_in_flight"] == 100 and got["drain_intervals"] == 9
    assert got["no_decay"] and abs(got["tok_s_change_last_tenth"]) < 0.05
    slow = _session(1000.0, 50, 200, 0, 200, lambda i: 1000.0 if i < 35 else 500.0, lambda i: 1000.0, running)
    got = b.checks(_run(tmp_path / "slow", [slow], cache_rows=slow[-1].calls), {"sessions": []})
    assert not got["no_decay"]  # slower before the batch empties: decay


def test_a_run_too_short_for_thirty_second_intervals_gets_no_decay_verdict(tmp_path):
    """A QuoteSum run: one request a question, all in flight at once, done in two minutes."""
    b = _bench()
    a = _session(1000.0, 5, 91, 0, 91, lambda i: 0.0 if i < 4 else 4000.0, lambda i: 4000.0)
    run = _run(tmp_path, [a], cache_rows=a[-1].calls)
    got = b.checks(run, {"sessions": []})
    assert got["no_decay"] is None and got["tok_s_change_last_tenth"] is None and got["nothing_recomputed"]
