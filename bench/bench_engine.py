"""Engine speed on this machine, in one process: bfloat16 vs float32 side by side, and batched vs
one-at-a-time generation in the dtype that `dtype = "auto"` resolves to here.

Prints the CPU capability (torch's checks, local_llm/hardware.py) and the resolved dtype first. For each
dtype arm: 32 prompts from data/examples/prompts.jsonl through ONE `generate` call (greedy, same
max_tokens), tokens/s counted as prompt + output and as output only. An arm whose short probe predicts
more than --arm-budget-s seconds (bfloat16 on an AVX2-only CPU, where it is emulated) is skipped, and
the report says so with the prediction. Then, in the resolved dtype, the same prompts one call each:
the batched/sequential ratio. The batched run goes first, so any prefix-cache benefit goes to the
one-at-a-time run: the ratio is, if anything, understated. Writes bench/results/engine.json.

    .venv/bin/python bench/bench_engine.py [--model NAME_OR_DIR] [--n 32] [--max-tokens 64]

`--threads` measures instead whether the engine uses the cores it is given (vLLM-CPU
logs "Reducing Torch threads from 2 to 1" and skips torch.set_num_threads after binding its OpenMP
threads, vllm/utils/torch_utils.py and vllm/v1/worker/cpu_worker.py): the same batched run in one fresh
process per thread setting (OMP_NUM_THREADS unset / 1 / all cores, VLLM_CPU_OMP_THREADS_BIND all cores
/ one core), alternated `--repeats` times; writes bench/results/engine_threads.json.

    .venv/bin/python bench/bench_engine.py --threads [--n 32] [--max-tokens 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rate(comps, seconds: float) -> dict:
    prompt = sum(c.prompt_tokens for c in comps)
    output = sum(c.output_tokens for c in comps)
    return {"seconds": round(seconds, 3), "prompt_tokens": prompt, "output_tokens": output,
            "tokens_per_s": round((prompt + output) / seconds, 1), "output_tokens_per_s": round(output / seconds, 1)}


def thread_arms() -> dict[str, dict[str, str]]:
    """Environment of each thread arm (a fresh process each: OpenMP reads these at start-up)."""
    from clarify.local_llm.hardware import affinity

    cores = sorted(affinity())
    return {
        "default": {},
        "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"},
        f"OMP_NUM_THREADS={len(cores)}": {"OMP_NUM_THREADS": str(len(cores))},
        f"bind core {cores[0]} only": {"VLLM_CPU_OMP_THREADS_BIND": str(cores[0])},
    }


def one_arm(args) -> int:
    """Child of --threads: one batched generate in the resolved dtype; one JSON line on stdout."""
    import torch

    from clarify.local_llm.engine import GenParams
    from clarify.local_llm.vllm_engine import get_engine

    prompts = _prompts(args)
    params = GenParams(temperature=0.0, max_tokens=args.max_tokens)
    t0 = time.perf_counter()
    engine = get_engine(args.model, progress=False)
    load_s = time.perf_counter() - t0
    engine.generate(["Warm-up: say one word."], [params])
    t0 = time.perf_counter()
    out = engine.generate(prompts, [params] * len(prompts))
    row = {"engine_load_s": round(load_s, 2), "dtype": engine.dtype, "torch_threads": torch.get_num_threads(),
           **_rate(out, time.perf_counter() - t0)}
    print(json.dumps(row), flush=True)
    return 0


def threads(args) -> int:
    """Each thread arm in its own process, alternating, `--repeats` times; best tokens/s per arm."""
    arms = thread_arms()
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for rep in range(args.repeats):
        for name, env in arms.items() if rep % 2 == 0 else reversed(arms.items()):
            child_env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")}
            cmd = [sys.executable, __file__, "--one-arm", "--model", args.model, "--prompts", args.prompts,
                   "--n", str(args.n), "--max-tokens", str(args.max_tokens)]
            try:
                proc = subprocess.run(cmd, env=child_env | env, capture_output=True, text=True,
                                      timeout=args.arm_timeout_s)
            except subprocess.TimeoutExpired:
                print(f"{name}: no result within {args.arm_timeout_s:.0f} s (a busy machine?)", file=sys.stderr)
                return 1
            if proc.returncode != 0:
                print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                return 1
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            runs[name].append(row)
            print(f"rep {rep} {name:<24} {row['tokens_per_s']:7.1f} tok/s (torch threads {row['torch_threads']})")
    best = {name: max(rows, key=lambda r: r["tokens_per_s"]) for name, rows in runs.items()}
    base = best["default"]["tokens_per_s"]
    result = {"prompts": args.n, "max_tokens": args.max_tokens, "repeats": args.repeats,
              "arms": {name: {"env": arms[name], "best": row, "vs_default": round(row["tokens_per_s"] / base, 3),
                              "runs": runs[name]} for name, row in best.items()},
              "machine": {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)},
              "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out = Path(args.out or ROOT / "bench" / "results" / "engine_threads.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, arm in result["arms"].items():
        print(f"{name:<24} {arm['best']['tokens_per_s']:7.1f} tok/s = {arm['vs_default']:.2f}x default")
    print(f"-> {out}")
    return 0


def _prompts(args) -> list[str]:
    from clarify.local_llm.cli import read_prompts

    rows = read_prompts(args.prompts)
    prompts = [p for _, p in rows][: args.n]
    while len(prompts) < args.n:  # a short file is cycled, with a suffix so prompts stay distinct
        prompts.append(f"{rows[len(prompts) % len(rows)][1]} (#{len(prompts)})")
    return prompts


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", default=str(ROOT / "data" / "examples" / "prompts.jsonl"))
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--arm-budget-s", type=float, default=180, help="skip a dtype arm predicted to take longer")
    ap.add_argument("--threads", action="store_true", help="thread-setting arms instead (see above)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of the --threads arms")
    ap.add_argument("--arm-timeout-s", type=float, default=900, help="give up on a --threads arm after this")
    ap.add_argument("--one-arm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help="default: bench/results/engine.json (engine_threads.json with --threads)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.one_arm:
        return one_arm(args)
    if args.threads:
        return threads(args)

    from tqdm import tqdm

    from clarify.local_llm.engine import GenParams
    from clarify.local_llm.hardware import cpu_facts, describe
    from clarify.local_llm.models import config_dtype, resolve_model
    from clarify.local_llm.settings import Ask, dtype_for
    from clarify.local_llm.vllm_engine import device_facts, get_engine

    prompts = _prompts(args)
    params = GenParams(temperature=0.0, max_tokens=args.max_tokens)
    dev = device_facts()  # the settings table's device: CPU capability, or the GPU's compute capability
    device = dev.kind
    facts = cpu_facts() if device == "cpu" else None
    resolved = dtype_for(dev, Ask(model_dtype=config_dtype(resolve_model(args.model))))
    print(describe() if facts else f"device {dev.label()}")
    print(f"dtype 'auto' resolves to {resolved} here")

    arms: dict[str, dict] = {}
    texts: dict[str, list[str]] = {}
    engine_of = {}
    for dtype in ("bfloat16", "float32") if device == "cpu" else (resolved,):  # a GPU: no float32 arm
        t0 = time.perf_counter()
        engine = engine_of[dtype] = get_engine(args.model, dtype=dtype, progress=False)
        load_s = time.perf_counter() - t0
        engine.generate(["Warm-up: say one word."], [params])  # the first call pays one-off set-up
        t0 = time.perf_counter()
        probe = engine.generate(prompts[:2], [GenParams(temperature=0.0, max_tokens=16)] * 2)
        probe_rate = sum(c.prompt_tokens + c.output_tokens for c in probe) / (time.perf_counter() - t0)
        # the whole arm's tokens, estimated from the probe's prompt lengths
        est_tokens = len(prompts) * (sum(c.prompt_tokens for c in probe) / 2 + args.max_tokens)
        predicted = est_tokens / probe_rate
        if predicted > args.arm_budget_s:
            arms[dtype] = {"skipped": f"predicted {predicted:.0f} s > budget {args.arm_budget_s:.0f} s "
                                      f"(probe {probe_rate:.0f} tok/s)", "engine_load_s": round(load_s, 2)}
            print(f"{dtype:>9}: SKIPPED, {arms[dtype]['skipped']}")
            continue
        t0 = time.perf_counter()
        out = engine.generate(prompts, [params] * len(prompts))
        arms[dtype] = {"model_id": engine.model_id, "engine_load_s": round(load_s, 2), **_rate(out, time.perf_counter() - t0)}
        texts[dtype] = [c.text for c in out]
        a = arms[dtype]
        print(f"{dtype:>9}: {a['prompt_tokens'] + a['output_tokens']:6d} tokens in {a['seconds']:7.2f} s = "
              f"{a['tokens_per_s']:7.1f} tok/s (output only {a['output_tokens_per_s']:.1f} tok/s)")

    engine = engine_of[resolved if resolved in engine_of else "float32"]
    batched = arms.get(engine.dtype, {})
    single = []
    t0 = time.perf_counter()
    for p in tqdm(prompts, desc=f"one at a time ({engine.dtype})", unit="prompt"):
        single.extend(engine.generate([p], [params]))
    single_rate = _rate(single, time.perf_counter() - t0)
    same = sum(a == b.text for a, b in zip(texts.get(engine.dtype, []), single))

    ratio_dtype = None
    if "tokens_per_s" in arms.get("bfloat16", {}) and "tokens_per_s" in arms.get("float32", {}):
        ratio_dtype = round(arms["float32"]["tokens_per_s"] / arms["bfloat16"]["tokens_per_s"], 2)
    result = {
        "cpu": facts, "device": device, "resolved_dtype": resolved,
        "settings": {k: v for k, v in engine.settings.items() if k != "model"},
        "env": {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
                                               "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")},
        "prompts": len(prompts), "max_tokens": args.max_tokens,
        "dtype_arms": arms, "float32_over_bfloat16": ratio_dtype,
        "batched": batched, "one_at_a_time": single_rate,
        "speedup": round(batched["output_tokens_per_s"] / single_rate["output_tokens_per_s"], 2) if batched else None,
        "identical_texts_batched_vs_alone": same,
        "machine": {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out = Path(args.out or ROOT / "bench" / "results" / "engine.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)

    if ratio_dtype:
        print(f"float32 / bfloat16 tokens/s: {ratio_dtype:.2f}x")
    print(f"one at a time ({len(prompts)} calls, {engine.dtype}): {single_rate['output_tokens_per_s']:.1f} output tok/s")
    if batched:
        print(f"batched / one at a time: {result['speedup']:.2f}x (identical texts: {same}/{len(prompts)}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
