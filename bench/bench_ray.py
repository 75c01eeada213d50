"""One engine vs Ray workers (batch/cluster.py, issue 14) on the same questions, in ONE driver process:
speed as ratios measured in this one run.

    .venv/bin/python bench/bench_ray.py --questions 12 [--arms inproc,ray1,ray2] [--chunk 3]

Arms, each a fresh run directory with its own empty completion caches (every arm computes everything):
    inproc   `clarify run` as usual: one engine in this process, bound to every core
    ray1     one Ray worker bound to every core (what Ray itself costs: actor start, chunk hand-off)
    ray2     two Ray workers, one core each (each engine on its own core: local_llm/hardware.py CoreLock)
Per arm: wall time (engine starts included), engine tokens computed (prompt + output, cache hits
excluded) and tokens/s over the wall, per-worker generate seconds, and whether the tables equal the
first arm's. The same chunks (`--chunk` questions) in both Ray arms.

Writes bench/results/ray.json (and prints it). 2 cores bound what CPU shards can gain: the point of
this bench on CPU is the overhead and the identity of results, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import polars as pl

TABLES = ("nodes", "hits", "answers", "llm_calls")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=12, help="first N ASQA dev questions")
    ap.add_argument("--arms", default="inproc,ray1,ray2")
    ap.add_argument("--chunk", type=int, default=3, help="questions per chunk in the Ray arms")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "ray.json"))
    args = ap.parse_args()

    from clarify.batch import config
    from clarify.batch.pipeline import run
    from clarify.index import ensure_default_index, open_index
    from clarify.local_llm.hardware import cpu_facts, describe

    index = open_index(ensure_default_index())
    print(describe(), flush=True)
    result: dict = {"cpu": cpu_facts(), "questions": args.questions, "chunk": args.chunk, "arms": {}}
    workdir = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    first = None
    for arm in args.arms.split(","):
        workers = {"inproc": 0, "ray1": 1, "ray2": 2}[arm]
        cfg = config.load(None, {"limit": args.questions, "cluster.workers": workers,
                                 "cluster.chunk_questions": args.chunk})
        out = workdir / arm
        t0 = time.perf_counter()
        summary = run(cfg, out, index=index, progress=False)
        wall = time.perf_counter() - t0
        c = summary.get("cluster") or {}
        tokens = c.get("engine_tokens")
        if tokens is None:  # in process: the engine's computed tokens are the llm_calls rows not cached
            calls = pl.read_parquet(out / "llm_calls.parquet").filter(~pl.col("cached"))
            tokens = int(calls["prompt_tokens"].sum() + calls["output_tokens"].sum())
        row = {"wall_s": round(wall, 1), "engine_tokens": tokens, "tokens_per_s_wall": round(tokens / wall, 1),
               "engine_tokens_per_s": summary.get("engine_tokens_per_s"), "dtype": (summary.get("engine") or {}).get("dtype"),
               "per_worker": c.get("per_worker"), "requeued": c.get("requeued")}
        if first is None:
            first = out
        else:
            row["tables_equal_first_arm"] = {
                name: pl.read_parquet(out / f"{name}.parquet").drop("cached", strict=False).equals(
                    pl.read_parquet(first / f"{name}.parquet").drop("cached", strict=False)) for name in TABLES}
        result["arms"][arm] = row
        print(arm, json.dumps(row), flush=True)
    base = result["arms"][args.arms.split(",")[0]]["wall_s"]
    for row in result["arms"].values():
        row["speedup_vs_first"] = round(base / row["wall_s"], 2)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
