"""The three schedulers (batch/run/scheduler.py) and the engine's ceiling on the same questions, engine and
index, in ONE process: speed as ratios measured in this one run (timings on shared cores are noisy).

    .venv/bin/python bench/bench_sched.py --questions 12,48 [--arms continuous,waves,sequential,ceiling]

Arms, each with its own empty completion cache and vLLM's prefix cache reset before it:
    sequential   the official per-question loop
    waves        every tree in lockstep, one generate per wave
    continuous   vLLM's step loop, every tree advancing the moment its own request returns
    ceiling      every distinct request the first arm made (same prompts, seeds, stops) in one generate:
                 what the engine does with this work when nothing waits on anything
Per arm: wall time, engine tokens/s (prompt + output computed), engine steps, running batch (mean,
p50, p90), the prefix-cache share of prompt tokens, and the retrieval + embedding share of wall time.
Every arm's tables are compared with the first arm's, and the other schedulers are replayed from the
first arm's cache (no engine call, identical tables). The critical path (the longest tree's chain of
dependent decode steps) bounds what any scheduler can do with few questions; it is reported.

Writes bench/results/sched.json (and prints it).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path

import polars as pl

from clarify import schemas


def critical_path(calls: pl.DataFrame) -> int:
    """The longest tree's chain of dependent engine steps: per tree, the sum over its model requests that
    reached the engine (one per wave and step; a request's prompts run side by side; a cache hit costs
    no step) of the longest completion in tokens (one step each; the prefill step makes the first)."""
    computed = calls.filter(~pl.col("cached"))
    per_request = computed.group_by("qid", "wave", "step").agg(pl.col("output_tokens").max())
    return int(per_request.group_by("qid").agg(pl.col("output_tokens").sum())["output_tokens"].max())


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", default="12,48", help="comma-separated question counts (first N of ASQA dev)")
    ap.add_argument("--arms", default="continuous,waves,sequential,ceiling")
    ap.add_argument("--arms-large", default=None,
                    help="arms for counts above 12 (default: --arms); the per-question loop is slow on CPU")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sched.json"))
    ap.add_argument("--batch-invariant", action="store_true",
                    help="[model] batch_invariant = true (float32 on CPU, vLLM's batch-invariant mode on CUDA)")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)

    from clarify.batch import config
    from clarify.batch.run.pipeline import nodes_table
    from clarify.batch.run.resources import open_resources, prepare
    from clarify.batch.run.scheduler import drive
    from clarify.batch.toc.settings import TreeSettings
    from clarify.batch.toc.tree import Tree
    from clarify.index import ensure_default_index, open_index
    from clarify.local_llm.engine import GenParams
    from clarify.local_llm.vllm_engine import get_engine

    index = open_index(ensure_default_index())
    over = {"model.model": args.model, "model.batch_invariant": args.batch_invariant}
    base = config.load(None, over)
    engine = get_engine(args.model, base.model, progress=False)
    print(f"cpu: {json.dumps(engine.cpu)}  device: {engine.device}  dtype: {engine.dtype}  "
          f"capacity: {engine.capacity()} requests", flush=True)
    # warm-up: JIT of the JVM searcher, the encoder and the engine, so no arm pays start-up costs
    index.searcher(base.retrieval.searcher).search(pl.DataFrame({"qid": ["w"], "query": ["warm up"]}), k=5)
    engine.generate(["Say hello."], [GenParams(max_tokens=8)])

    result: dict = {"model": engine.model_id, "device": engine.device, "dtype": engine.dtype, "cpu": engine.cpu,
                    "capacity": engine.capacity(), "runs": {}}
    for n in [int(x) for x in args.questions.split(",")]:
        cfg = config.load(None, {**over, "limit": n})
        prep = prepare(cfg, index=index, engine_factory=lambda c: engine)
        questions = prep.questions
        arms = (args.arms_large if n > 12 and args.arms_large else args.arms).split(",")

        def trees(questions=questions):
            return [Tree.new(q, text) for q, text in zip(questions["qid"], questions["question"])]

        def resources(cache_dir: Path, prep=prep):
            return open_resources(prep, cache_dir)

        run: dict = {"questions": n, "arms": {}}
        first = None  # (name, cache dir, trees, rows) of the first scheduler arm
        for arm in arms:
            engine._llm.reset_prefix_cache()  # every arm starts with a cold prefix cache
            st = engine.stats
            s0, r0, p0, c0 = st.steps, len(st.running), st.prompt_tokens, st.cached_prompt_tokens
            if arm == "ceiling":
                with sqlite3.connect(first[1] / "completions.sqlite") as db:
                    rows = db.execute("SELECT prompt, params FROM completions").fetchall()
                prompts = [p for p, _ in rows]
                params = [GenParams(**json.loads(p)) for _, p in rows]
                t0 = time.perf_counter()
                comps = engine.generate(prompts, params)
                wall = time.perf_counter() - t0
                tokens = sum(c.prompt_tokens + c.output_tokens for c in comps)
                arm_out = {"requests": len(prompts)}
            else:
                cache_dir = Path(tempfile.mkdtemp(prefix=f"sched-{arm}-"))
                res = resources(cache_dir)
                ts = trees()
                print(f"[{n} questions] {arm} ...", flush=True)
                t0 = time.perf_counter()
                rows = drive(arm, ts, res, TreeSettings.of(cfg))
                wall = time.perf_counter() - t0
                res.engine.close()
                tokens = rows.stats.tokens
                calls = schemas.frame(rows.llm_calls, schemas.LlmCall)
                arm_out = {"llm_calls": calls.height, "requests_computed": int((~calls["cached"]).sum()),
                           "trees": rows.stats.trees,
                           "retrieval_embed_share": round((rows.stats.seconds["retrieval"]
                                                           + rows.stats.seconds["embed"]) / wall, 4),
                           "critical_path_decode_steps": critical_path(calls)}
                if first is None:
                    first = (arm, cache_dir, ts, rows)
                else:  # generated independently: the same tables as the first arm?
                    arm_out["tables_equal_first_arm"] = _same(nodes_table, first, ts, rows)
            running = st.running[r0:]
            prompt = st.prompt_tokens - p0
            arm_out.update({
                "wall_s": round(wall, 2), "tokens": tokens, "tokens_per_s": round(tokens / wall, 1),
                "engine_steps": st.steps - s0,
                "running_mean": round(sum(running) / len(running), 2) if running else None,
                "running_p50": sorted(running)[len(running) // 2] if running else None,
                "running_p90": sorted(running)[int(len(running) * 0.9)] if running else None,
                "prefix_cached_share": round((st.cached_prompt_tokens - c0) / prompt, 4) if prompt else None,
            })
            run["arms"][arm] = arm_out
            print(f"[{n} questions] {arm}: {json.dumps(arm_out)}", flush=True)

        # the other schedulers replayed from the first arm's cache: zero engine work, identical tables
        replay = {}
        for arm in ("continuous", "waves", "sequential"):
            if arm == first[0]:
                continue
            before = engine.stats.prompts
            ts = trees()
            rows = drive(arm, ts, resources(first[1]), TreeSettings.of(cfg))
            replay[arm] = {"engine_prompts": engine.stats.prompts - before,
                           "tables_equal": _same(nodes_table, first, ts, rows)}
        run["replayed_from_first_arm_cache"] = replay
        a = run["arms"]
        tps = {k: v["tokens_per_s"] for k, v in a.items()}
        run["ratios"] = {
            f"{x}_over_{y}_tokens_per_s": round(tps[x] / tps[y], 2)
            for x, y in (("continuous", "ceiling"), ("continuous", "waves"), ("continuous", "sequential"),
                         ("waves", "sequential")) if x in tps and y in tps}
        run["ratios"].update({
            f"{y}_over_{x}_wall": round(a[y]["wall_s"] / a[x]["wall_s"], 2)
            for x, y in (("continuous", "waves"), ("continuous", "sequential")) if x in a and y in a})
        result["runs"][str(n)] = run
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def _same(nodes_table, first, trees, rows) -> bool:
    """Same trees and rows (the `cached` flag aside) as the first arm."""
    _, _, ftrees, frows = first
    return (nodes_table(trees).equals(nodes_table(ftrees))
            and schemas.frame(rows.answers, schemas.TreeAnswer).equals(schemas.frame(frows.answers, schemas.TreeAnswer))
            and schemas.frame(rows.llm_calls, schemas.LlmCall).drop("cached").equals(
                schemas.frame(frows.llm_calls, schemas.LlmCall).drop("cached")))


if __name__ == "__main__":
    main()
