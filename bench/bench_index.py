"""Benchmark the local index on the embedded corpus (≈10k shipped Wikipedia passages).

Measures: index build time (full default build, from its manifest, plus a fresh BM25-only build),
queries/s at k=100 for bm25 / dense / hybrid / rerank with 1,000 queries (ASQA dev disambiguated
questions), and the AC@k table (ToC appendix B.1) for the first 500 ASQA dev questions.
Writes bench/results/index.json.

    .venv/bin/python bench/bench_index.py
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # never runs vLLM: docs/architecture.md#omp_wait_policypassive-outside-vllm
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import polars as pl  # noqa: E402

from clarify.asqa_file import load_asqa  # noqa: E402
from clarify.index import build_index, default_corpus_files, ensure_default_index, open_index  # noqa: E402
from clarify.index.coverage import answer_coverage, coverage_table, retrieval_inputs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
ASQA = REPO / "data" / "asqa" / "dev.json"
KINDS = ("bm25", "dense", "hybrid", "rerank")


def dq_queries(n: int = 1000) -> pl.DataFrame:
    """The first n disambiguated questions of ASQA dev (the kind of query ToC sends)."""
    data = json.loads(ASQA.read_text(encoding="utf-8"))["dev"]
    rows = [(f"{sid}:{i}", pair["question"]) for sid, ex in data.items() for i, pair in enumerate(ex["qa_pairs"])]
    return pl.DataFrame(rows[:n], schema={"qid": pl.String, "query": pl.String}, orient="row")


def main() -> None:
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                 "load_avg_start": os.getloadavg()}}
    t0 = time.perf_counter()
    path = ensure_default_index()
    results["ensure_default_index_s"] = round(time.perf_counter() - t0, 2)
    idx = open_index(path)
    m = idx.manifest
    results["default_index"] = {"path": str(path), "passages": m.passages.count, "build_timings_s": m.timings,
                                "build_total_s": round(sum(m.timings.values()), 1),
                                "encoder": m.dense.encoder_name, "faiss": m.dense.faiss_class}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        build_index(default_corpus_files(), Path(tmp) / "bm25only", dense=False)
        results["fresh_bm25_build_s"] = round(time.perf_counter() - t0, 2)

    queries = dq_queries(1000)
    warm = queries.head(50)
    speed = {}
    for kind in KINDS:
        searcher = idx.searcher(kind, candidates=100)
        searcher.search(warm, 100)  # JIT / model warm-up
        t0 = time.perf_counter()
        hits = searcher.search(queries, 100)
        dt = time.perf_counter() - t0
        speed[kind] = {"searcher": searcher.name, "queries": queries.height, "k": 100, "seconds": round(dt, 2),
                       "queries_per_s": round(queries.height / dt, 1), "hits": hits.height}
        print(f"{kind:7s} {speed[kind]['queries_per_s']:8.1f} q/s  ({searcher.name})", flush=True)
    results["search_k100"] = speed

    aq, gold = retrieval_inputs(*load_asqa(ASQA), first=500)
    per_q = []
    for kind in KINDS:
        hits = idx.searcher(kind, candidates=100).search(aq, 100)
        per_q.append(answer_coverage(hits, idx.passages, gold, [5, 10, 20, 100]).with_columns(pl.lit(kind).alias("retriever")))
    table = coverage_table(pl.concat(per_q))
    wide = table.pivot(on="k", index="retriever", values="ac", sort_columns=True)
    with pl.Config(float_precision=1):
        print(f"AC@k (%), first 500 ASQA dev questions, {gold.height} qa_pairs")
        print(wide)
    results["ac_at_k"] = {"questions": 500, "qa_pairs": gold.height,
                          "table": {r: {f"AC@{k}": round(v, 2) for k, v in zip(table.filter(pl.col("retriever") == r)["k"],
                                                                                 table.filter(pl.col("retriever") == r)["ac"])}
                                    for r in KINDS}}
    results["machine"]["load_avg_end"] = os.getloadavg()
    out = REPO / "bench" / "results" / "index.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
