"""The real CPU engine's speed through clarify, the clarify of an earlier commit against this one, in one run.

    .venv/bin/python bench/bench_engine_ab.py --before REV [--now REV] [--questions 8] [--repeats 2] [--write NAME]

Each arm runs `clarify run --limit N --constrain-format --constrain-quotes` into a fresh run directory
(every request computed by the engine: no cache), the arms alternating (before, now, before, now, ...) so
that a slower minute of a shared machine falls on both. Reported per arm: the engine's tokens/s of the run
(summary.json `engine_tokens_per_s`: prompt + output tokens over the engine's generate seconds), the run's
wall seconds, tokens and LLM calls; and the ratio of the medians, now / before. The clarify of REV runs from
`git archive` of it on PYTHONPATH (bench/bench_report.py `checkout`); so does the `--now` one when given
(else this working tree: keep it still while the bench runs). The trees of the two arms can differ
(bfloat16 batches of different composition round differently), so compare tokens/s, not tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from bench_report import CLARIFY, checkout  # noqa: E402
from provenance import provenance, write_results  # noqa: E402

sys.path.insert(0, str(REPO.parent))
from clarify.batch.run.records import RunSummary  # noqa: E402


def one(out: Path, questions: int, env: dict | None) -> dict:
    cmd = [*CLARIFY, "run", "--dataset", "asqa", "--limit", str(questions), "--constrain-format",
           "--constrain-quotes", "--no-progress", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    s = RunSummary.read(out / "summary.json", "the run did not finish")
    return {"engine_tokens_per_s": s.engine_tokens_per_s, "wall_s": s.wall_s_last_session,
            "tokens": s.tokens.prompt + s.tokens.output, "llm_calls": s.llm_calls}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, metavar="REV", help="the earlier commit")
    ap.add_argument("--now", metavar="REV", help="the later commit (default: this working tree)")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2, help="runs per arm, alternating")
    ap.add_argument("--write", metavar="NAME", help="write bench/results/NAME.json")
    args = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {"before": [], "now": []}
    with tempfile.TemporaryDirectory() as tmp:
        env = checkout(args.before, Path(tmp) / "before")
        now_env = checkout(args.now, Path(tmp) / "now") if args.now else None
        for i in range(args.repeats):
            for arm, arm_env in (("before", env), ("now", now_env)):
                got = one(Path(tmp) / f"{arm}-{i}", args.questions, arm_env)
                runs[arm].append(got)
                print(f"{arm} #{i + 1}: {got}", flush=True)
    med = {arm: statistics.median(r["engine_tokens_per_s"] for r in rs) for arm, rs in runs.items()}
    result = {"provenance": provenance(), "before": args.before, "now": args.now or "working tree",
              "questions": args.questions,
              "arms": {f"{arm} #{i + 1}": r for arm, rs in runs.items() for i, r in enumerate(rs)},
              "median_tokens_per_s": med, "ratio_now_over_before": round(med["now"] / med["before"], 3)}
    print(json.dumps(result, indent=1))
    if args.write:
        write_results(args.write, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
