"""The demo's time estimate against the ToC time it estimates (batch/cli/demo_sizing.py `probe_speed`,
`Probe.toc_s`; console.RunProgress re-estimates once the first tree is done).

On the demo's own settings (embedded model and index, ASQA dev, quoted answers, both decoding constraints),
in one process as `clarify demo` does: start the engine, run the demo's probe (and the throughput probe it
replaced, 4 prompts of ~700 tokens with 24 output tokens after a one-prompt warm-up, at its 0.9 ToC/probe
ratio, for comparison), estimate the ToC time of N questions, run ToC on them in a fresh run directory, and
compare the estimate and the re-estimate with the ToC time the run took (summary.json `toc_s_last_session`).
Also ToC's work mix (computed LLM calls per question, prompt and output tokens per call, the running
batch's mean), what the probe's shape and `toc_concurrency` rest on.

    .venv/bin/python bench/bench_estimate.py --questions 3          # the demo's minimum size

Prints the CPU and a table; writes bench/results/estimate.json (one entry per run, appended).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from provenance import cpu_model, provenance  # bench/ is on sys.path when a script here runs

RESULTS = Path(__file__).resolve().parent / "results" / "estimate.json"


def old_probe(engine) -> float:
    """The probe the demo used before: tokens/s of 4 prompts of ~700 tokens, 24 output tokens, after a
    one-prompt warm-up."""
    from clarify.batch.cli.demo_sizing import probe_speed

    return probe_speed(engine, prompt_tokens=720, output_tokens=24, batch=4, warmup=1, rounds=1).tokens_per_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=3, help="ASQA dev questions to run (default 3)")
    ap.add_argument("--work", help="run directory (default: a fresh temporary one)")
    args = ap.parse_args()

    from clarify import console

    cpu = cpu_model()
    print(f"CPU: {cpu}", flush=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-estimate-")) / "run"
    with console.session(work.parent / "logs", "bench-estimate"):  # library logs and bars into a log, as the demo
        return measure(args, work, cpu)


def measure(args: argparse.Namespace, work: Path, cpu: str) -> int:
    import polars as pl

    from clarify import console
    from clarify.batch import config
    from clarify.batch.cli import demo_sizing
    from clarify.batch.run.pipeline import run
    from clarify.batch.run.records import EngineUsage
    from clarify.batch.run.resources import engine_for
    from clarify.index import ensure_default_index

    cfg = config.load(None, {"dataset": "asqa", "limit": args.questions, "answer_style": "quoted",
                             "index": str(ensure_default_index()), **demo_sizing.DEMO_CONSTRAINTS})
    from clarify.batch.toc.constraints import clarify_grammar
    from clarify.batch.toc.settings import TreeSettings

    tree = TreeSettings.of(cfg)
    t0 = time.perf_counter()
    engine = engine_for(cfg.model, tree)
    start_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    probe = demo_sizing.probe_speed(engine, grammar=clarify_grammar(tree))
    probe_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    probed_old = old_probe(engine)
    old_probe_s = time.perf_counter() - t0
    per_q = config.tokens_per_question(cfg)
    estimate = probe.toc_s(args.questions)
    estimate_old = args.questions * per_q / (0.9 * probed_old)  # the old demo: ToC at 0.9 x the probe
    print(f"probe: a ToC call {probe.single_s:.2f} s alone, {probe.batch} at once {probe.batch_s:.2f} s "
          f"({probe.tokens_per_s:,.0f} tok/s; {probe_s:.1f} s in all; the old probe {probed_old:,.0f} tok/s) -> ToC "
          f"of {args.questions} questions expected ~{estimate:.0f} s (old probe: ~{estimate_old:.0f} s)", flush=True)

    displays = []

    class Recorded(console.RunProgress):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            displays.append(self)

    console.RunProgress = Recorded
    summary = run(cfg, work, estimate_s=estimate)
    toc_s = summary.toc_s_last_session
    reestimate = displays[-1].reestimate_s if displays else None
    calls = pl.read_parquet(work / "llm_calls.parquet").filter(~pl.col("cached"))
    tokens = int(calls["prompt_tokens"].sum() + calls["output_tokens"].sum())
    use = summary.engine_usage_last_session or EngineUsage()
    row = {
        "cpu": cpu, "engine": summary.engine and summary.engine.to_json(), "questions": args.questions, "engine_start_s": round(start_s, 1),
        "probe": {"single_s": round(probe.single_s, 3), "batch_s": round(probe.batch_s, 3),
                  "tokens_per_s": round(probe.tokens_per_s, 1), "seconds": round(probe_s, 1),
                  "shape": {"prompt_tokens": demo_sizing.TOC_PROMPT_TOKENS, "output_tokens": demo_sizing.TOC_OUTPUT_TOKENS,
                            "batch": demo_sizing.PROBE_BATCH, "warmup": demo_sizing.PROBE_WARMUP},
                  "toc_concurrency": round(demo_sizing.toc_concurrency(args.questions), 2)},
        "old_probe": {"tokens_per_s": round(probed_old, 1), "seconds": round(old_probe_s, 1)},
        "estimate_s": round(estimate, 1), "estimate_old_probe_s": round(estimate_old, 1),
        "reestimate_s": round(reestimate, 1) if reestimate else None,
        "first_tree_s": round(displays[-1].first_tree_s, 1) if displays and displays[-1].first_tree_s else None,
        "toc_s": toc_s,
        "estimate_over_actual": round(estimate / toc_s, 3),
        "estimate_old_probe_over_actual": round(estimate_old / toc_s, 3),
        "reestimate_over_actual": round(reestimate / toc_s, 3) if reestimate else None,
        "toc_tokens_per_s": round(tokens / toc_s, 1),
        "mix": {"computed_calls": calls.height, "calls_per_question": round(calls.height / args.questions, 2),
                "tokens_per_question": round(tokens / args.questions),
                "assumed_tokens_per_question": per_q,
                "prompt_tokens_per_call": round(calls["prompt_tokens"].mean(), 1) if calls.height else None,
                "output_tokens_per_call": round(calls["output_tokens"].mean(), 1) if calls.height else None,
                "running_mean": use.running_mean, "running_p90": use.running_p90},
        "command": " ".join(["python", *sys.argv]),
    }
    print(f"\n{'':<28}{'seconds':>9}{'/ actual':>10}")
    for name, value in (("estimate (probe)", estimate), ("estimate (old probe)", estimate_old),
                        ("re-estimate (first tree)", reestimate), ("ToC took", toc_s)):
        if value:
            print(f"{name:<28}{value:>9.0f}{value / toc_s:>10.2f}")
    print(f"ToC {tokens / toc_s:,.0f} tok/s, {calls.height / args.questions:.1f} computed calls and "
          f"{tokens / args.questions:,.0f} tokens/question (assumed {per_q:,}); per computed call "
          f"{row['mix']['prompt_tokens_per_call']} prompt + {row['mix']['output_tokens_per_call']} output tokens; "
          f"running batch mean {use.running_mean} (toc_concurrency: {demo_sizing.toc_concurrency(args.questions):.2f})")
    old = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"runs": []}
    old["provenance"] = provenance()  # the latest run's; each row keeps its own cpu and command
    old["runs"].append(row)
    RESULTS.write_text(json.dumps(old, indent=1) + "\n")
    print(f"written: {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
