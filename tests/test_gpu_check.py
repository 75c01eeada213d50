"""bench/gpu_check.py, the prepared GPU check (docs/engines.md#the-prepared-gpu-check), on a machine without a GPU: `--dry-run` checks
every step's arguments against the bench scripts' own parsers and runs `clarify doctor`, writing nothing;
the summary turns the steps' result files into the targets (fed here with files in the steps' formats)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_dry_run_checks_the_plan_and_writes_nothing(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    for step in ("doctor", "engine", "toc", "invariant"):
        assert f"  {step} " in text
    assert "--batch-invariant" in text and "--questions 48" in text
    assert "every step's arguments parse; nothing measured" in text
    assert not out.exists()
    # without --dry-run and without a GPU: refused in one line, still nothing written
    if '"device": "cpu"' in text:
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--out", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "no CUDA device here" in proc.stderr and not out.exists()


def test_a_renamed_flag_fails_the_plan(tmp_path):
    gc = _module()
    steps = gc.plan(tmp_path)
    bad = [gc.Step("toc", "bench/bench_sched.py", ("--questionz", "48"), "x.json", 1)]
    try:
        gc.check_arguments(bad)
    except SystemExit as exc:
        assert "step toc: bench/bench_sched.py refuses its arguments" in str(exc)
    else:
        raise AssertionError("a wrong flag passed")
    gc.check_arguments(steps)  # the real plan parses


def test_the_summary_compares_the_steps_results_with_the_targets(tmp_path):
    gc = _module()
    toc = {"runs": {"48": {"ratios": {"continuous_over_ceiling_tokens_per_s": 0.86,
                                      "continuous_over_sequential_tokens_per_s": 14.2},
                           "arms": {"continuous": {"wall_s": 40.0}}}}}
    inv = {"runs": {"48": {"arms": {"continuous": {"wall_s": 52.0}, "waves": {"tables_equal_first_arm": True}}}}}
    (tmp_path / "gpu_toc.json").write_text(json.dumps(toc))
    (tmp_path / "gpu_toc_invariant.json").write_text(json.dumps(inv))
    (tmp_path / "gpu_engine.json").write_text(json.dumps({"speedup": 31.5}))
    s = gc.summarize(tmp_path, {"device": "cuda"}, {})
    assert s["measured"]["batch_invariant_wall_ratio"] == 1.3 and s["measured"]["engine_batched_over_one_at_a_time"] == 31.5
    assert s["met"] == {"continuous_over_ceiling": True, "continuous_over_sequential": False,
                        "batch_invariant_cost": True, "batch_invariant_identical": True}
    assert gc.summarize(tmp_path / "none", {}, {})["met"]["continuous_over_ceiling"] is None  # nothing measured
