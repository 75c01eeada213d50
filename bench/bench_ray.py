"""One engine vs Ray workers (batch/run/cluster.py) on the same questions, in ONE driver process:
speed as ratios measured in this one run.

    .venv/bin/python bench/bench_ray.py --questions 12 [--arms inproc,ray1,ray2,ray1-chunks]

Arms, each a fresh run directory with its own empty completion caches (every arm computes everything):
    inproc       `clarify run` as usual: one engine in this process, bound to every core
    ray1         one Ray worker bound to every core, one chunk of all questions (what Ray itself costs:
                 a process, an engine start, the hand-off)
    ray2         two Ray workers, one core each, one chunk of half the questions each (each engine on
                 its own core: local_llm/hardware.py CoreLock)
    ray1-chunks  ray1 with chunks of a quarter of the questions: the worker admits the next chunk's
                 trees while the last one's finish (batch/run/cluster.py), so small chunks should cost little
Per arm: wall time (engine starts included), engine tokens computed (prompt + output, cache hits
excluded) and tokens/s over the wall, each worker's chunks and tokens, and whether the tables equal the
first arm's (they need not where the dtype is bfloat16: its results depend on the batch's composition;
the tests compare a cluster run with one process replaying its cache instead).

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
    ap.add_argument("--arms", default="inproc,ray1,ray2,ray1-chunks")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "ray.json"))
    args = ap.parse_args()

    from clarify.batch import config
    from clarify.batch.run.pipeline import run
    from clarify.batch.run.records import ClusterWork
    from clarify.index import ensure_default_index, open_index
    from clarify.local_llm.hardware import cpu_facts, describe

    index = open_index(ensure_default_index())
    print(describe(), flush=True)
    result: dict = {"cpu": cpu_facts(), "questions": args.questions, "arms": {}}
    n = args.questions
    arms = {"inproc": (0, n), "ray1": (1, n), "ray2": (2, -(-n // 2)), "ray1-chunks": (1, -(-n // 4))}
    workdir = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    first = None
    for arm in args.arms.split(","):
        workers, chunk = arms[arm]
        cfg = config.load(None, {"limit": n, "cluster.workers": workers, "cluster.chunk_questions": chunk})
        out = workdir / arm
        t0 = time.perf_counter()
        summary = run(cfg, out, index=index, progress=False)
        wall = time.perf_counter() - t0
        c = summary.cluster or ClusterWork()
        tokens = c.engine_tokens
        if tokens is None:  # in process: the engine's computed tokens are the llm_calls rows not cached
            calls = pl.read_parquet(out / "llm_calls.parquet").filter(~pl.col("cached"))
            tokens = int(calls["prompt_tokens"].sum() + calls["output_tokens"].sum())
        row = {"workers": workers, "chunk_questions": chunk, "wall_s": round(wall, 1), "engine_tokens": tokens, "tokens_per_s_wall": round(tokens / wall, 1),
               "engine_tokens_per_s": summary.engine_tokens_per_s, "dtype": summary.engine and summary.engine.dtype,
               "per_worker": c.per_worker and [w.to_json() for w in c.per_worker], "requeued": c.requeued}
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
