"""Cold-start encoding of the embedded corpus: the previous chunked encoding vs batches cut by token count.

The embedded index's build is dominated by MiniLM encoding ~10k passages (docs/results.md). On a
random subset of the shipped corpus, in one process and with one loaded encoder (so the numbers are a
ratio on this machine, whatever else runs on it), each arm encodes the same passages; the arms run in
alternating order, `--repeats` times each, and the best time of each counts: wall seconds, and this
process's CPU seconds (with OMP_WAIT_POLICY=PASSIVE idle threads do not spin, so CPU time is the work
done, and stays comparable when other processes share the cores). Every arm's vectors are
compared with the baseline's: the largest absolute difference and, for the first ASQA dev questions,
whether the top-k passages are the same. `padding_overhead` (tokens computed / tokens held - 1) is
computed from the token counts, without timing: it is the share of work the batching wastes.

    python bench/bench_encode.py --passages 1000 --repeats 2 --previous-batch-sizes 64 --batch-sizes 64,32,16

Writes bench/results/encode.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as `clarify index build` (index/cli.py)

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from clarify.index.corpus import load_corpus  # noqa: E402
from clarify.index.default import default_corpus_files  # noqa: E402
from clarify.index.dense import Encoder, encode_to_memmap, passage_texts  # noqa: E402


def previous(encoder: Encoder, passages: pl.DataFrame, path: Path, batch_size: int) -> np.ndarray:
    """The earlier encoding: corpus order, chunks of 512 (each sorted by sentence-transformers)."""
    emb = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(passages.height, encoder.dim))
    for start in range(0, passages.height, 512):
        part = passages.slice(start, 512)
        emb[start : start + part.height] = encoder.encode(passage_texts(part), batch_size=batch_size)
    emb.flush()
    return np.asarray(emb)


def current(encoder: Encoder, passages: pl.DataFrame, path: Path, batch_size: int) -> np.ndarray:
    encoder.batch_size = batch_size
    return np.asarray(encode_to_memmap(encoder, passages, path, progress=False))


def padding(lengths: np.ndarray, chars: np.ndarray, scheme: str, batch_size: int) -> float:
    """Tokens computed / tokens held - 1 for a batching scheme (deterministic, no timing)."""
    if scheme == "previous":  # corpus-order chunks of 512, each sorted by characters (sentence-transformers)
        chunks = [np.arange(s, min(len(lengths), s + 512)) for s in range(0, len(lengths), 512)]
        batches = [c[np.argsort(-chars[c])][s : s + batch_size] for c in chunks for s in range(0, len(c), batch_size)]
    else:
        order = np.argsort(-lengths, kind="stable")
        batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    return float(sum(lengths[b].max() * len(b) for b in batches) / lengths.sum() - 1)


def top_k(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :k]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-sizes", default="64", help="comma-separated batch sizes for the new order")
    ap.add_argument("--previous-batch-sizes", default="64",
                    help="comma-separated batch sizes for the previous order (64: what it used; the first is the baseline)")
    ap.add_argument("--queries", type=int, default=50, help="first ASQA dev questions for the top-k check")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "encode.json")
    args = ap.parse_args()

    corpus = load_corpus(default_corpus_files()).passages
    rng = np.random.default_rng(0)
    passages = corpus[np.sort(rng.choice(corpus.height, size=min(args.passages, corpus.height), replace=False))]
    encoder = Encoder()
    import torch

    asqa = json.loads((Path(__file__).resolve().parent.parent / "data" / "asqa" / "dev.json").read_text())
    questions = [ex["ambiguous_question"] for ex in list(asqa["dev"].values())[: args.queries]]
    qvecs = encoder.encode(questions)
    encoder.encode(passage_texts(passages.head(64)))  # warm-up: first-call set-up is not counted

    arms = [(f"previous b{b}", b, previous) for b in map(int, args.previous_batch_sizes.split(","))]
    arms += [(f"by-tokens b{b}", b, current) for b in map(int, args.batch_sizes.split(","))]
    baseline = arms[0][0]
    best: dict[str, float] = {}  # wall seconds
    best_cpu: dict[str, float] = {}  # CPU seconds of this process: what the encoding costs, whatever else runs
    vectors: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for name, batch, fn in arms if rep % 2 == 0 else arms[::-1]:
                t0, c0 = time.perf_counter(), time.process_time()
                vectors[name] = fn(encoder, passages, Path(tmp) / "e.npy", batch)
                took, cpu = time.perf_counter() - t0, time.process_time() - c0
                best[name] = min(best.get(name, took), took)
                best_cpu[name] = min(best_cpu.get(name, cpu), cpu)
                print(f"rep {rep} {name:<22} {took:7.2f} s wall {cpu:7.2f} s CPU", file=sys.stderr, flush=True)
    base = vectors[baseline]
    base_top = top_k(base, qvecs, args.k)
    texts = passage_texts(passages)
    lengths, chars = encoder.token_lengths(texts), np.array([len(t) for t in texts])
    rows = []
    for name, batch, fn in arms:
        v = vectors[name]
        scheme = "previous" if fn is previous else "by-tokens"
        rows.append({"arm": name, "padding_overhead": round(padding(lengths, chars, scheme, batch), 4), "best_wall_s": round(best[name], 2), "best_cpu_s": round(best_cpu[name], 2),
                     "passages_per_wall_s": round(passages.height / best[name], 1),
                     "wall_speedup_vs_baseline": round(best[baseline] / best[name], 3),
                     "cpu_speedup_vs_baseline": round(best_cpu[baseline] / best_cpu[name], 3),
                     "max_abs_diff": float(np.abs(v - base).max()),
                     "same_top_k": bool((top_k(v, qvecs, args.k) == base_top).all())})
    result = {"baseline": baseline, "passages": passages.height, "repeats": args.repeats, "k": args.k, "queries": len(questions),
              "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
              "loadavg_1m": round(os.getloadavg()[0], 2), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "arms": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
