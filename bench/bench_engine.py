"""Batched vs one-at-a-time generation on the embedded model, in one process.

Runs 32 prompts from data/examples/prompts.jsonl through ONE `generate` call, then the same prompts
one call each (same params: greedy, same max_tokens), and prints output tokens/s of both and the
ratio. The batched run goes first, so any prefix-cache benefit goes to the one-at-a-time run: the
ratio is, if anything, understated. Writes bench/results/engine.json.

    .venv/bin/python bench/bench_engine.py [--model NAME_OR_DIR] [--n 32] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompts", default=str(ROOT / "data" / "examples" / "prompts.jsonl"))
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine.json"))
    args = ap.parse_args(argv)

    from tqdm import tqdm

    from clarify.local_llm.cli import read_prompts
    from clarify.local_llm.engine import GenParams
    from clarify.local_llm.vllm_engine import get_engine

    rows = read_prompts(args.prompts)
    prompts = [p for _, p in rows][: args.n]
    while len(prompts) < args.n:  # a short file is cycled, with a suffix so prompts stay distinct
        prompts.append(f"{rows[len(prompts) % len(rows)][1]} (#{len(prompts)})")
    params = GenParams(temperature=0.0, max_tokens=args.max_tokens)

    t0 = time.perf_counter()
    engine = get_engine(args.model, progress=False)
    load_s = time.perf_counter() - t0
    engine.generate(["Warm-up: say one word."], [params])  # first call pays one-off set-up

    t0 = time.perf_counter()
    batched = engine.generate(prompts, [params] * len(prompts))
    batched_s = time.perf_counter() - t0
    batched_tokens = sum(c.output_tokens for c in batched)

    single = []
    t0 = time.perf_counter()
    for p in tqdm(prompts, desc="one at a time", unit="prompt"):
        single.extend(engine.generate([p], [params]))
    single_s = time.perf_counter() - t0
    single_tokens = sum(c.output_tokens for c in single)

    batched_tps = batched_tokens / batched_s
    single_tps = single_tokens / single_s
    same = sum(a.text == b.text for a, b in zip(batched, single))
    result = {
        "model_id": engine.model_id,
        "device": engine.device,
        "settings": {k: v for k, v in engine.settings.items() if k != "model"},
        "env": {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE")},
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "engine_load_s": round(load_s, 2),
        "batched": {"seconds": round(batched_s, 3), "output_tokens": batched_tokens, "tokens_per_s": round(batched_tps, 1)},
        "one_at_a_time": {"seconds": round(single_s, 3), "output_tokens": single_tokens, "tokens_per_s": round(single_tps, 1)},
        "speedup": round(batched_tps / single_tps, 2),
        "identical_texts": same,
        "machine": {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2), "python": platform.python_version()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)

    print(f"model {engine.model_id} on {engine.device}, {len(prompts)} prompts, greedy, max_tokens={args.max_tokens}")
    print(f"batched (1 call):      {batched_tokens:6d} tokens in {batched_s:7.2f} s = {batched_tps:7.1f} tokens/s")
    print(f"one at a time ({len(prompts)} calls): {single_tokens:6d} tokens in {single_s:7.2f} s = {single_tps:7.1f} tokens/s")
    print(f"speed-up: {batched_tps / single_tps:.2f}x  (identical texts: {same}/{len(prompts)}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
