"""A MODEL, not a measurement: a finished run replayed through the real scheduler and tree program against a
GPU-speed engine simulator (local_llm/replay.py), to project what the GPU would do with clarify's host work.

    .venv/bin/python bench/bench_simulate.py --run RUN [--copies 80] [--gpu h100-llama-8b] [--write]

The trees of RUN are driven again (its frozen config, its index, the continuous scheduler) with every
request answered from RUN's completion cache after a modelled latency: the engine steps on a virtual
clock (`GpuModel.step_s`: a roofline of the GPU, parameters and sources in local_llm/replay.py GPU_MODELS),
the host's work between engine calls is measured on this machine and added to the same clock. Arms, in
this one process:

    in-process    the engine core in clarify's process (today's setting on CUDA,
                  VLLM_ENABLE_V1_MULTIPROCESSING=0): the GPU waits while the host works
    overlapped    the engine core in its own process (vLLM V1's default): the GPU steps on while the
                  host works, and waits only when it has nothing to do
    before        in-process, with the host's work as it was before the query-vector memo and the indexed
                  demo removal (index/dense.py QueryMemo, batch/toc/match.py AnswerIndex switched off)

`--copies N` replays N copies of RUN's questions under new question ids (the same trees, so the same cached
completions): 80 copies of a 12-question run are 960 questions and ~19,000 calls, the size of ASQA dev.
Each arm reports the engine's busy time (the engine-only time of this work), the projected wall time, the
engine's busy share and the host's share. The projection is only as good as the GPU model: it is an
estimate, marked so in every output.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from bench_host import before_host_cuts, replay_engine  # noqa: E402
from provenance import provenance, write_results  # noqa: E402

MODEL_NOTE = ("ESTIMATE: a model, not a measurement. Engine time is simulated (local_llm/replay.py GpuModel, a "
              "roofline with stated assumptions); host time is measured on this CPU.")


def drive(run_dir: Path, cfg, copies: int, gpu, *, overlap: bool, prefix_share: float) -> dict:
    """The run's trees (`copies` times) through the continuous scheduler against the simulator."""
    import polars as pl

    from clarify.batch.run.resources import open_resources, prepare
    from clarify.batch.run.scheduler import run_continuous
    from clarify.batch.toc.settings import TreeSettings
    from clarify.batch.toc.tree import Tree

    engine = replay_engine(run_dir, cfg, gpu=gpu, overlap=overlap, prefix_cached_share=prefix_share)
    prep = prepare(cfg, engine_factory=lambda c: engine)
    questions = pl.read_parquet(run_dir / "questions.parquet")
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        res = open_resources(prep, Path(tmp))
        res.engine.close()
        # the simulator takes the completion cache's place: copies ask for byte-identical requests, which a
        # cache in front would answer itself (its cost, ~0.1 ms per call, is in bench_host's results)
        res = dataclasses.replace(res, engine=engine)
        trees = [Tree.new(f"{q}#{c}" if c else q, text, verify=cfg.toc.verify)
                 for c in range(copies) for q, text in zip(questions["qid"], questions["question"])]
        engine.start_clock()
        t0 = time.perf_counter()
        stats = run_continuous(trees, res, TreeSettings.of(cfg))
        real = time.perf_counter() - t0
    s = engine.sim
    host_real = real - engine.own_s  # what this machine spent outside the simulator (the host's work)
    return {
        "questions": len(trees), "llm_calls": s.requests, "engine_steps": s.steps,
        "engine_busy_s (engine-only time)": round(s.busy_s, 2),
        "projected_wall_s": round(s.wall_s, 2),
        "engine_busy_share": round(s.busy_s / s.wall_s, 4) if s.wall_s else None,
        "host_s (measured)": round(host_real, 2),
        "host_share_of_wall": round(min(1.0, host_real / s.wall_s), 4) if s.wall_s else None,
        "host_ms_per_call": round(1000 * host_real / max(1, s.requests), 2),
        "wall_over_engine_only": round(s.wall_s / s.busy_s, 4) if s.busy_s else None,
        "running_mean": s.as_dict()["running_mean"],
        "prefill_tokens": s.prefill_tokens, "output_tokens": s.output_tokens,
        "trees": stats.trees,
    }


def main(argv: list[str] | None = None) -> int:
    from clarify.batch import config
    from clarify.batch.run.records import RunSummary
    from clarify.local_llm.replay import GPU_MODELS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, type=Path, help="a finished run directory")
    ap.add_argument("--copies", type=int, default=1, help="replay the run's questions this many times")
    ap.add_argument("--gpu", default="h100-llama-8b", choices=sorted(GPU_MODELS))
    ap.add_argument("--arms", default="in-process,overlapped,before")
    ap.add_argument("--write", default=None, help="write bench/results/<NAME>.json")
    args = ap.parse_args(argv)
    run_dir = args.run.resolve()
    cfg = config.load(run_dir / "config.json")
    gpu = GPU_MODELS[args.gpu]()
    summary = RunSummary.read(run_dir / "summary.json", "give a finished run")
    # vLLM's prefix cache served this share of the run's prompt tokens (summary.json): the simulator
    # prefills only the rest
    use = summary.engine_usage_last_session
    prefix = (use.prefix_cached_share if use else None) or 0.0
    out = {"provenance": provenance(argv), "note": MODEL_NOTE, "gpu_model": dataclasses.asdict(gpu),
           "kv_cache_tokens": gpu.kv_tokens(), "run": str(run_dir), "copies": args.copies,
           "prefix_cached_share": prefix, "arms": {}}
    for arm in args.arms.split(","):
        ctx = before_host_cuts() if arm == "before" else contextlib.nullcontext()
        with ctx:
            got = drive(run_dir, cfg, args.copies, gpu, overlap=arm == "overlapped", prefix_share=prefix)
        out["arms"][arm] = got
        print(f"[{arm}] {got['questions']} questions, {got['llm_calls']} calls: engine-only "
              f"{got['engine_busy_s (engine-only time)']} s, projected wall {got['projected_wall_s']} s, engine busy "
              f"{got['engine_busy_share']:.1%}, host {got['host_ms_per_call']} ms/call (ESTIMATE)", flush=True)
    print(json.dumps(out, indent=1))
    if args.write:
        write_results(args.write, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
