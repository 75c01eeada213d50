"""Wave scheduler vs the per-question loop (the official code's way), on the same engine, index and
questions, in ONE process run; plus the raw engine throughput when all the run's prompts go into one
`generate`. Speed is reported as ratios measured in this one run (timings on 2 shared cores are noisy).

    .venv/bin/python bench/bench_toc.py --questions 8 [--model smollm2-135m-instruct] [--max-expansions 15]

Writes bench/results/toc.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import polars as pl


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--max-expansions", type=int, default=15)
    ap.add_argument("--answer-style", default="free", choices=["free", "quoted"])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "toc.json"))
    args = ap.parse_args()

    from clarify.batch import config
    from clarify.batch.pipeline import load_questions, nodes_table, open_resources
    from clarify.batch.tree import Tree
    from clarify.batch.waves import run_sequential, run_waves
    from clarify.index import ensure_default_index, open_index
    from clarify.local_llm.engine import GenParams
    from clarify.local_llm.vllm_engine import get_engine

    cfg = config.load(None, {"limit": args.questions, "answer_style": args.answer_style,
                             "model.model": args.model, "toc.max_expansions": args.max_expansions})
    questions, _ = load_questions(cfg)
    index = open_index(ensure_default_index())
    engine = get_engine(args.model, max_model_len=cfg.model.max_model_len)
    # warm-up: JIT of the JVM searcher, encoder and engine, so neither arm pays start-up costs
    index.searcher(cfg.retrieval.searcher).search(pl.DataFrame({"qid": ["w"], "query": ["warm up"]}), k=5)
    engine.generate(["Say hello."], [GenParams(max_tokens=8)])

    def fresh_trees():
        return [Tree.new(q, text) for q, text in zip(questions["qid"], questions["question"])]

    def resources():
        # the raw engine, no completion cache: both arms really generate every completion
        import tempfile

        return open_resources(cfg, questions, Path(tempfile.mkdtemp()), engine_factory=lambda c: engine, index=index)

    res = resources()
    res.engine = engine
    t0 = time.perf_counter()
    waves_trees = fresh_trees()
    rec_w = run_waves(waves_trees, res, cfg, progress=True)
    t_waves = time.perf_counter() - t0

    res = resources()
    res.engine = engine
    t0 = time.perf_counter()
    seq_trees = fresh_trees()
    rec_s = run_sequential(seq_trees, res, cfg)
    t_seq = time.perf_counter() - t0

    # the whole wave run's prompts in one generate: the engine's ceiling for this workload
    calls = pl.DataFrame(rec_w.llm_calls)
    prompts = calls["prompt"].to_list()
    params = []
    for step in calls["step"].to_list():
        if step == "clarify":
            params.append(GenParams(temperature=cfg.toc.temperature, max_tokens=cfg.toc.clarify_max_tokens, seed=1))
        elif step == "verify":
            params.append(GenParams(max_tokens=cfg.toc.verify_max_tokens, choices=("True", "False")))
        else:
            params.append(GenParams(max_tokens=cfg.toc.answer_max_tokens))
    t0 = time.perf_counter()
    comps = engine.generate(prompts, params)
    t_one = time.perf_counter() - t0
    tok_one = sum(c.prompt_tokens + c.output_tokens for c in comps)

    def tokens(rec):
        return sum(c["prompt_tokens"] + c["output_tokens"] for c in rec.llm_calls)

    same_trees = sum(nodes_table([a]).equals(nodes_table([b])) for a, b in zip(waves_trees, seq_trees))
    result = {
        "model": engine.model_id, "questions": questions.height, "max_expansions": args.max_expansions,
        "waves": {"wall_s": round(t_waves, 2), "llm_calls": len(rec_w.llm_calls), "tokens": tokens(rec_w),
                  "tokens_per_s": round(tokens(rec_w) / t_waves, 1),
                  "seconds": {k: round(v, 2) for k, v in rec_w.seconds.items()},
                  "retrieval_share": round(rec_w.seconds["retrieval"] / t_waves, 4),
                  "generate_calls": int(calls.select(pl.struct("wave", "step").n_unique()).item())},
        "per_question": {"wall_s": round(t_seq, 2), "llm_calls": len(rec_s.llm_calls), "tokens": tokens(rec_s),
                         "tokens_per_s": round(tokens(rec_s) / t_seq, 1),
                         "seconds": {k: round(v, 2) for k, v in rec_s.seconds.items()},
                         "retrieval_share": round(rec_s.seconds["retrieval"] / t_seq, 4)},
        "one_generate": {"prompts": len(prompts), "wall_s": round(t_one, 2), "tokens": tok_one,
                         "tokens_per_s": round(tok_one / t_one, 1)},
        "ratios": {
            "per_question_over_waves_wall": round(t_seq / t_waves, 2),
            "waves_over_per_question_tokens_per_s": round((tokens(rec_w) / t_waves) / (tokens(rec_s) / t_seq), 2),
            "one_generate_over_waves_tokens_per_s": round((tok_one / t_one) / (tokens(rec_w) / t_waves), 2),
        },
        "identical_trees_waves_vs_loop": f"{same_trees}/{questions.height}",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
