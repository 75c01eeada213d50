"""A long run at the largest size the shipped data allows, as a user runs it, watched from outside.

    .venv/bin/python bench/bench_atsize.py session NAME --out RUN [--stop-after-s S] -- RUN_ARGS...
    .venv/bin/python bench/bench_atsize.py finish NAME --out RUN

`session` runs `.venv/bin/clarify run RUN_ARGS --out RUN` once (a first start or a resume: the run decides),
with its terminal output in RUN.sessions/N.log, and samples it every SAMPLE_S seconds from outside: the
clarify process tree's resident memory and CPU seconds, the machine's CPU seconds (what the rest of the
machine took: a shared machine is flagged, never hidden), the run directory's and the completion cache's
size and the cache's rows. `--stop-after-s`: stop the run with SIGINT after S seconds, as Ctrl-C would (it
resumes with the same command). Each session is appended to bench/results/atsize.json under NAME.

The run itself keeps its own samples in RUN/logs/progress.jsonl (console.py RunProgress `record`: trees
finished, engine requests and tokens of the session, the driver's memory, every 30 s). `finish`, after the
last session, reads them and checks what must hold at size:
- the engine does not slow down: tokens/s over the last tenth of the run's ToC time with the engine's batch
  full (requests in flight at least FULL of the most the run held; after that the run drains: fewer trees
  left than the engine holds, a batch that shrinks with them) within 15 % of the median of every such
  30-s interval;
  intervals in which the rest of the machine took more than a quarter of a core are left out (counted);
- the driver does not grow: resident memory at the end of the ToC loop within 10 % of the first sample
  after warm-up (the first tenth of the trees);
- nothing is computed twice: the engine requests finished in all sessions add up to the rows of the
  completion cache (a request finished before a stop and asked again after it would be one more);
and times the outputs (bench/bench_report.py `measure`): `clarify report` (seconds, MB), the report's first
screen in headless chromium, `clarify show RUN QID`; and `clarify eval` on the run. The verdicts and figures go into atsize.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from bench_report import measure  # noqa: E402

sys.path.insert(0, str(REPO.parent))
from provenance import cpu_model, provenance  # noqa: E402

from clarify.batch.config.load import load as load_config  # noqa: E402
from clarify.batch.run.records import RunSummary  # noqa: E402
from clarify.console import read_progress  # noqa: E402

RESULTS = REPO / "bench" / "results" / "atsize.json"
# the clarify of this checkout, by the interpreter running the bench (PYTHONPATH may point at another checkout)
CLARIFY = [sys.executable, "-m", "clarify.batch.cli"]
SAMPLE_S = 30.0
OTHERS_MAX_CORES = 0.25  # an interval in which the rest of the machine took more is flagged as shared
TAIL, DECAY_MAX, GROWTH_MAX = 0.10, 0.15, 0.10
FULL = 0.9  # an interval whose requests in flight fall below this share of the run's most is the drain
# fewer 30-s intervals before the drain than this and a run is too short to say whether its engine slows
# down (a QuoteSum run: one request a question, all in flight at once, done in two minutes): no verdict
MIN_STEADY = 10


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def cache_rows(run: Path) -> int | None:
    """Rows of the run's completion cache (read-only; the run may be writing it)."""
    db = run / "cache" / "completions.sqlite"
    if not db.exists():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as con:
            return con.execute("SELECT COUNT(*) FROM completions").fetchone()[0]
    except sqlite3.Error:
        return None


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def sample(proc: psutil.Process, run: Path, t0: float) -> dict:
    rss = cpu = 0.0
    for p in _tree(proc):
        try:
            rss += p.memory_info().rss
            t = p.cpu_times()
            cpu += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    machine = psutil.cpu_times()
    return {"elapsed_s": round(time.monotonic() - t0, 1), "time": round(time.time(), 1),
            "tree_rss_mb": round(rss / 2**20, 1), "tree_cpu_s": round(cpu, 2),
            "machine_busy_s": round(machine.user + machine.nice + machine.system + machine.irq + machine.softirq, 2),
            "run_dir_mb": round(_du(run) / 2**20, 2), "cache_mb": round(_du(run / "cache") / 2**20, 2),
            "cache_rows": cache_rows(run)}


def _shown(run: Path) -> str:
    """The run's path as the results file records it: relative to the checkout when inside it (runs/NAME), so
    the file names no folder of the machine it was measured on."""
    try:
        return run.relative_to(REPO).as_posix()
    except ValueError:
        return str(run)


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": {}}


def save(data: dict) -> None:
    """The results file, its `provenance` that of the latest session or finish (each session keeps its own)."""
    data["provenance"] = provenance()
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")


def session(name: str, run: Path, run_args: list[str], stop_after_s: float | None) -> int:
    logs = run.parent / f"{run.name}.sessions"
    logs.mkdir(parents=True, exist_ok=True)
    data = load()
    shown = _shown(run)
    entry = data["runs"].setdefault(name, {"out": shown, "run_args": run_args, "sessions": []})
    n = len(entry["sessions"]) + 1
    cmd = [*CLARIFY, "run", *run_args, "--out", str(run)]
    record = {"session": n, "command": " ".join(["clarify", "run", *run_args, "--out", shown]),
              "provenance": provenance(), "cpu": cpu_model(),
              "cache_rows_before": cache_rows(run), "samples": []}
    print(f"session {n} of {name}: {' '.join(cmd)}  (log {logs / f'{n}.log'})", flush=True)
    t0 = time.monotonic()
    with open(logs / f"{n}.log", "w") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    proc = psutil.Process(child.pid)
    stopped = threading.Event()

    def watch() -> None:
        while not stopped.wait(SAMPLE_S):
            s = sample(proc, run, t0)
            record["samples"].append(s)
            print(f"  {s['elapsed_s']:>8.0f} s  rss {s['tree_rss_mb']:.0f} MB  cache {s['cache_rows']} rows "
                  f"{s['cache_mb']:.0f} MB  run dir {s['run_dir_mb']:.0f} MB", flush=True)
            if stop_after_s is not None and s["elapsed_s"] >= stop_after_s and child.poll() is None:
                child.send_signal(signal.SIGINT)
                record["stopped_by"] = "SIGINT"

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        rc = child.wait()
    except KeyboardInterrupt:  # Ctrl-C here goes to the run too (same process group); wait for it to stop
        rc = child.wait()
        record["stopped_by"] = "SIGINT"
    stopped.set()
    watcher.join()
    record.update(exit_code=rc, wall_s=round(time.monotonic() - t0, 1), cache_rows_after=cache_rows(run),
                  finished=(run / "summary.json").exists())
    data = load()  # another session may have written meanwhile: append to what is there now
    data["runs"].setdefault(name, entry)["sessions"].append(record)
    save(data)
    print(f"session {n}: exit {rc} after {record['wall_s']:.0f} s; finished: {record['finished']}")
    return rc


def _shared(outside: list[dict], t_from: float, t_to: float) -> bool:
    """Whether the rest of the machine took more than OTHERS_MAX_CORES cores between two wall times,
    from the outside samples (machine CPU seconds less the run's own)."""
    inside = [s for s in outside if t_from - SAMPLE_S <= s["time"] <= t_to + SAMPLE_S]
    if len(inside) < 2:
        return False
    a, b = inside[0], inside[-1]
    others = (b["machine_busy_s"] - a["machine_busy_s"]) - (b["tree_cpu_s"] - a["tree_cpu_s"])
    return others / max(b["time"] - a["time"], 1e-9) > OTHERS_MAX_CORES


def checks(run: Path, entry: dict) -> dict:
    sessions = read_progress(run / "logs" / "progress.jsonl")
    # the batch the engine held when the run had trees to spare: the most requests in flight of any sample
    # (the loop admits up to its capacity: batch/run/scheduler.py _StepLoop.limit)
    peak = max((s.running for sess in sessions for s in sess), default=0)
    outside = [s for sess in entry["sessions"] for s in sess["samples"]]
    intervals = []  # (tokens/s, end time, trees finished at the end, shared)
    for sess in sessions:
        for a, b in zip(sess, sess[1:]):
            dt = b.elapsed_s - a.elapsed_s
            if dt <= 0:
                continue
            drain = min(a.running, b.running) < FULL * peak
            intervals.append({"tok_s": (b.tokens - a.tokens) / dt, "dt": dt, "end": b.time,
                              "drain": drain, "shared": _shared(outside, a.time, b.time)})
    steady = [i for i in intervals if not i["drain"]]
    clean = [i for i in steady if not i["shared"]]
    use = clean if len(clean) >= 10 else steady
    median = statistics.median(i["tok_s"] for i in use) if use else None
    toc_s = sum(i["dt"] for i in steady)
    tail, acc = [], 0.0
    for i in reversed(steady):
        if acc >= TAIL * toc_s:
            break
        acc += i["dt"]
        if i in use:
            tail.append(i)
    tail_rate = sum(i["tok_s"] * i["dt"] for i in tail) / sum(i["dt"] for i in tail) if tail else None
    decay = None if not (median and tail_rate) or len(steady) < MIN_STEADY else tail_rate / median - 1
    every = [s for sess in sessions for s in sess]
    total = every[-1].total
    warm = next((s for s in every if s.finished >= TAIL * total and s.rss_mb), None)
    end = next((s for s in reversed(every) if s.rss_mb), None)
    growth = None if not (warm and end) else end.rss_mb / warm.rss_mb - 1
    calls = sum(sess[-1].calls for sess in sessions)
    rows = cache_rows(run)
    return {
        "sessions": len(sessions), "intervals": len(intervals), "drain_intervals": len(intervals) - len(steady),
        "peak_in_flight": peak,
        "shared_intervals_left_out": len(steady) - len(clean) if use is clean else 0,
        "shared_intervals": len(steady) - len(clean),
        "median_tok_s": round(median, 1) if median else None, "last_tenth_tok_s": round(tail_rate, 1) if tail_rate else None,
        "tok_s_change_last_tenth": round(decay, 4) if decay is not None else None,
        "no_decay": None if len(steady) < MIN_STEADY else decay is not None and abs(decay) <= DECAY_MAX,
        "rss_after_warmup_mb": warm.rss_mb if warm else None, "rss_end_mb": end.rss_mb if end else None,
        "rss_growth": round(growth, 4) if growth is not None else None,
        "rss_holds": growth is not None and growth < GROWTH_MAX,
        "engine_requests_all_sessions": calls, "cache_rows": rows,
        "nothing_recomputed": rows is not None and calls == rows,
    }


def series(sessions: list[list]) -> list[dict]:
    """The run's progress record as kept in the results file: per sample, its session, the session's seconds,
    trees finished of total, the engine's tokens/s since the sample before and the driver's memory."""
    out = []
    for n, sess in enumerate(sessions, 1):
        for a, b in zip([None, *sess], sess):
            dt = b.elapsed_s - a.elapsed_s if a else 0.0
            out.append({"session": n, "elapsed_s": round(b.elapsed_s), "finished": b.finished, "total": b.total,
                        "tok_s": round((b.tokens - a.tokens) / dt, 1) if a and dt > 0 else None,
                        "rss_mb": round(b.rss_mb) if b.rss_mb else None})
    return out


def _timed(cmd: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, **kw)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return time.perf_counter() - t, done


def metric_intervals(run: Path) -> dict:
    """Each metric's mean over the run's questions with its 95 % percentile-bootstrap interval (eval/paired.py
    `paired_bootstrap` of the scores against zero: 10,000 resamples, its seed), in points; summary.json's
    headline is the official scorers' bootstrap mid (eval/summary.py), so the two differ in the last digit."""
    import numpy as np
    import polars as pl

    from clarify.batch.report.shape import per_question_metrics
    from clarify.eval.paired import paired_bootstrap

    scores = per_question_metrics(pl.read_parquet(run / "scores.parquet"))
    wide = scores.pivot(on="metric", index="qid", values="value")
    names = [c for c in wide.columns if c != "qid"]
    got = paired_bootstrap(wide.select(names).to_numpy().astype(np.float64))
    return {m: {"n": int(got.n[j]), "mean": round(float(got.mean[j]), 2), "lo": round(float(got.lo[j]), 2),
                "hi": round(float(got.hi[j]), 2)} for j, m in enumerate(names)}


def finish(name: str, run: Path) -> int:
    data = load()
    entry = data["runs"][name]
    summary = RunSummary.read(run / "summary.json", "finish the run first")
    config = load_config(run / "config.json")
    result = {"provenance": provenance(), "checks": checks(run, entry),
              "progress": series(read_progress(run / "logs" / "progress.jsonl"))}
    result["outputs"] = measure(run, page=run.parent / f"{run.name}.report.html")  # report, first screen, show
    s, _ = _timed([*CLARIFY, "eval", "--dataset", config.dataset, "--predictions", str(run)])
    result["eval_s"] = round(s, 2)
    result["metrics_95"] = metric_intervals(run)
    keep = ("n_questions", "metrics", "llm_calls", "wall_s_total", "engine_tokens_per_s", "node_status")
    result["summary"] = {k: getattr(summary, k) for k in keep}
    tokens = summary.tokens.prompt + summary.tokens.output
    result["summary"]["tokens"] = tokens
    result["per_question"] = {
        "tokens": round(tokens / summary.n_questions, 1),
        "seconds": round(summary.wall_s_total / summary.n_questions, 2) if summary.wall_s_total else None}
    data["runs"][name]["finish"] = result
    save(data)
    print(json.dumps(result, indent=1))
    return 0


def markdown(doc: dict) -> str:
    """docs/results.md's section (bench/results_doc.py): each run's sessions, then what `finish` found."""
    out = []
    for name, entry in doc["runs"].items():
        out += [f"**{name}**: `clarify run {' '.join(entry['run_args'])} --out RUN`", "",
                "| session | date | commit | wall s | stopped by | exit | cache rows before → after | finished |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for s in entry["sessions"]:
            prov = s["provenance"]
            out.append(f"| {s['session']} | {prov['date']} | {prov['commit']} | {s['wall_s']:.0f} | "
                       f"{s.get('stopped_by', '')} | {s['exit_code']} | {s['cache_rows_before']} → "
                       f"{s['cache_rows_after']} | {'yes' if s['finished'] else 'no'} |")
        fin = entry.get("finish")
        if not fin:
            out += ["", "Not finished yet: `finish` has not run; the checks and the outputs' times come when it has.", ""]
            continue
        c, o = fin["checks"], fin["outputs"]
        out += ["", "| what must hold | measured | holds |", "| --- | --- | --- |",
                "| tokens/s, last tenth vs median of 30-s intervals at a full batch | "
                + (f"{c['last_tenth_tok_s']} vs {c['median_tok_s']} ({c['tok_s_change_last_tenth']:+.1%}; "
                   f"{c['drain_intervals']} of {c['intervals']} intervals the drain, left out; "
                   f"{c['shared_intervals']} shared) | {c['no_decay']} |"
                   if c["no_decay"] is not None else
                   f"too short to judge: {c['intervals'] - c['drain_intervals']} of {c['intervals']} intervals at a "
                   f"full batch, {MIN_STEADY} needed | – |"),
                f"| driver memory, end vs after warm-up | {c['rss_end_mb']} vs {c['rss_after_warmup_mb']} MB "
                f"({c['rss_growth']:+.1%}) | {c['rss_holds']} |",
                f"| engine requests in all sessions = cache rows | {c['engine_requests_all_sessions']} = {c['cache_rows']} "
                f"| {c['nothing_recomputed']} |",
                f"| `clarify report` < 60 s, < 10 MB, first screen < 2 s | {o['report_s']} s, {o['report_mb']} MB, "
                f"{o['first_screen_ms'] and round(o['first_screen_ms']['first_frame_ms'])} ms | "
                f"{o['report_s'] < 60 and o['report_mb'] < 10 and bool(o['first_screen_ms']) and o['first_screen_ms']['first_frame_ms'] < 2000} |",
                f"| `clarify show` < 2 s, `clarify eval` < 60 s | {o['show_s']} s, {fin['eval_s']} s | "
                f"{o['show_s'] < 2 and fin['eval_s'] < 60} |", "",
                "| metric | n | mean | 95 % interval |", "| --- | --- | --- | --- |"]
        out += [f"| {m} | {v['n']} | {v['mean']} | {v['lo']} – {v['hi']} |" for m, v in fin["metrics_95"].items()]
        pq = fin["per_question"]
        out += ["", f"Per question: {pq['tokens']} tokens, {pq['seconds']} s; engine {c['median_tok_s'] or '–'} tokens/s "
                    f"(median at a full batch; {fin['summary']['engine_tokens_per_s']} over its last session).", ""]
    return "\n".join(out).rstrip("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("session")
    a.add_argument("name")
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--stop-after-s", type=float)
    b = sub.add_parser("finish")
    b.add_argument("name")
    b.add_argument("--out", type=Path, required=True)
    argv = sys.argv[1:] if argv is None else argv
    run_args = argv[argv.index("--") + 1:] if "--" in argv else []  # what follows `--` is clarify run's
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.cmd == "session":
        if not run_args:
            ap.error("session: the run's arguments follow `--`")
        return session(args.name, args.out.absolute(), run_args, args.stop_after_s)
    return finish(args.name, args.out.absolute())


if __name__ == "__main__":
    sys.exit(main())
