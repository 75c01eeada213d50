"""The outputs of a run at full size: `clarify report`, its first screen in a browser, `clarify show`.

    .venv/bin/python bench/bench_report.py --run RUN --copies 42 [--before REV] [--write report_size]

A finished run's tables are copied `--copies` times under new question and passage ids (tests/fixtures_report.py `rekey`: the
same trees, answers, spans and passage texts, so a 12-question run of the embedded model becomes 504
questions whose report has what a real 500-question run's has, passages included: each question keeps its
own). Then, on that run: `clarify report` (seconds, MB), the report's first screen in headless chromium
(tests/cdp.py: the load event's end and the first frame after it, by the page's clock), and
`clarify show RUN QID` (seconds) for a question in the middle. `--before REV`: the same, first with the
clarify of commit REV (git archive into a temporary folder, on PYTHONPATH), in the same bench run.
`--write NAME` writes bench/results/NAME.json (docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from provenance import provenance, write_results  # noqa: E402

sys.path.insert(0, str(REPO))  # the tests package: its at-size run copier and its chromium driver
from tests.fixtures_report import rekey  # noqa: E402

CLARIFY = [sys.executable, "-m", "clarify.batch.cli"]
def _timed(cmd: list[str], env: dict | None = None) -> float:
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return time.perf_counter() - t


BROWSER_STARTS = 3  # chromium that exits while starting (seen here: its pipe closed before the first reply)


def first_screen(page: Path) -> dict | None:
    """The page's first screen in headless chromium (tests/cdp.py first_screen_ms). A browser that dies
    before it answers is started again, up to BROWSER_STARTS times, and the starts are counted: what is
    timed is the page, never the browser's start."""
    from tests.cdp import CHROMIUM, Browser

    if CHROMIUM is None:
        return None
    for start in range(1, BROWSER_STARTS + 1):
        with tempfile.TemporaryDirectory() as tmp:
            browser = Browser(Path(tmp))
            try:
                return {**browser.first_screen_ms(page.resolve().as_uri()), "browser_starts": start}
            except OSError as exc:  # BrokenPipeError: chromium is gone
                if start == BROWSER_STARTS:
                    raise RuntimeError(f"chromium exited {BROWSER_STARTS} times while starting: {exc}; its "
                                       f"stderr: {browser.stderr_lines[-5:]}") from None
            finally:
                browser.close()
    return None


def checkout(rev: str, into: Path) -> dict:
    """The environment that runs the clarify of commit `rev` (its tree unpacked into `into`/clarify)."""
    (into / "clarify").mkdir(parents=True)
    tar = subprocess.run(["git", "archive", rev], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into / "clarify")], input=tar, check=True)
    return {**os.environ, "PYTHONPATH": str(into)}


def measure(run: Path, env: dict | None = None, page: Path | None = None) -> dict:
    page = page or run.parent / "report.html"
    out = {"questions": pl.read_parquet(run / "questions.parquet").height}
    out["report_s"] = round(_timed([*CLARIFY, "report", str(run), "--out", str(page)], env), 2)
    out["report_mb"] = round(page.stat().st_size / 2**20, 2)
    out["first_screen_ms"] = first_screen(page)
    qids = pl.read_parquet(run / "questions.parquet")["qid"]
    out["show_s"] = round(_timed([*CLARIFY, "show", str(run), "--", qids[len(qids) // 2]], env), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a finished run directory")
    ap.add_argument("--copies", type=int, default=42, help="copies of its questions (42 x 12 = 504)")
    ap.add_argument("--before", metavar="REV", help="measure the clarify of commit REV first")
    ap.add_argument("--write", metavar="NAME", help="write bench/results/NAME.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        big = rekey(args.run.resolve(), Path(tmp) / "run", args.copies)
        arms = {}
        if args.before:
            arms[f"before ({args.before})"] = measure(big, checkout(args.before, Path(tmp) / "before"))
        arms["now"] = measure(big)
        result = {"provenance": provenance(), "run": str(args.run), "copies": args.copies, "arms": arms}
    print(json.dumps(result, indent=1))
    if args.write:
        write_results(args.write, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
