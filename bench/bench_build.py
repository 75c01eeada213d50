"""Index build throughput and memory vs corpus size: corpus read, Lucene build, encoding.

    nice -n 10 python bench/bench_build.py                          # 125k, 250k, 500k, 1M; 2k encoded
    nice -n 10 python bench/bench_build.py --sizes 125000 --old-max 125000 --encode 1000

Synthetic corpus of n passages in DPR's psgs_w100.tsv layout (id, text, title): row i is shipped passage
i mod 10,116 under the id `s<i>`, its text suffixed with " (copy <i // 10116>)" so copies differ for BM25
(as bench/bench_scale.py makes its corpora), written by Polars in chunks.

Phases (each a child process that reports its time and peak RSS, getrusage ru_maxrss of itself and of
its children: the Lucene build's JVM runs in a child):
    read        index/corpus.py read_corpus_into: the TSV streamed into the passage store
    lucene      index/bm25.py build_lucene: JsonCollection files from the store + Anserini's
                IndexCollection in a child JVM, 2 threads (this machine's CPUs)
    lucene-old  the former path, build_lucene_inprocess (pyjnius, SimpleIndexer), up to --old-max
    encode      `clarify index build --no-bm25` of the first --encode passages, 1 and 2 worker processes
                (encoding time from the manifest)
    kill        the same build killed with SIGKILL once half of its chunks are written, then resumed:
                the resumed build's encoding time vs the uninterrupted one's

Output: bench/results/build.json (every measurement, the CPU) and a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from bench_scale import cpu_model  # noqa: E402

FULL_WIKI = 21_015_324  # passages in DPR's psgs_w100.tsv
ENCODE_CHUNK = 128  # checkpoint chunk of the encoding phases


def peak() -> dict:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"peak_rss_mb": round(own, 1), "peak_rss_children_mb": round(kids, 1)}


def tsv_path(work: Path, n: int) -> Path:
    return work / f"n{n}" / "psgs.tsv"


# -------------------------------------------------------------------------------------------- phases
def phase_make(work: Path, n: int) -> dict:
    import polars as pl

    from clarify.index.corpus import read_passages
    from clarify.index.default import default_corpus_files

    base = read_passages(default_corpus_files())
    b = base.height
    path = tsv_path(work, n)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("id\ttext\ttitle\n")
        for start in range(0, n, 100_000):
            rows = pl.int_range(start, min(n, start + 100_000), eager=True)
            part = base[(rows % b).to_list()].with_columns(
                ("s" + rows.cast(pl.String)).alias("id"),
                pl.col("text") + " (copy " + (rows // b).cast(pl.String) + ")")
            part = part.with_columns(('"' + pl.col("text").str.replace_all('"', '""', literal=True) + '"')
                                     .alias("text"), pl.col("title").str.replace_all("\t", " "))
            fh.write("".join(f"{i}\t{t}\t{ti}\n" for i, t, ti in part.select("id", "text", "title").iter_rows()))
    return {"tsv_mb": round(path.stat().st_size / 2**20, 1)}


def phase_read(work: Path, n: int) -> dict:
    from clarify.index.corpus import read_corpus_into

    out = work / f"n{n}" / "store"
    out.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    read = read_corpus_into([tsv_path(work, n)], out)
    s = time.perf_counter() - t0
    assert read.count == n
    return {"read_s": round(s, 2), "psg_per_s": round(n / s)}


def phase_lucene(work: Path, n: int, old: bool = False) -> dict:
    import shutil

    from clarify.index.bm25 import build_lucene, build_lucene_inprocess
    from clarify.index.textstore import PassageStore

    store = PassageStore(work / f"n{n}" / "store")
    out = work / f"n{n}" / ("lucene-old" if old else "lucene")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    stats = build_lucene_inprocess(store.all(), out, threads=2) if old else build_lucene(store, out, threads=2)
    s = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return {"build_s": round(s, 2), "psg_per_s": round(n / s), "documents": stats["documents"],
            **{k: stats[k] for k in ("write_s", "index_s", "heap") if k in stats}}


def _encode_env(work: Path) -> dict:
    return {**os.environ, "CLARIFY_HOME": str(work / "home"), "CLARIFY_ENCODE_CHUNK": str(ENCODE_CHUNK),
            "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _encode_corpus(work: Path, n: int) -> Path:
    path = work / f"encode{n}.tsv"
    if not path.exists():
        with open(tsv_path(work, 125_000), encoding="utf-8") as src, open(path, "w", encoding="utf-8") as dst:
            for i, line in enumerate(src):
                if i > n:
                    break
                dst.write(line)
    return path


def _build_cmd(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "clarify.batch.cli", "index", "build", "--corpus", str(corpus), "--out", str(out),
            "--no-bm25", "--force", *extra]


def _encode_facts(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())["dense"]["embeddings"]


def phase_encode(work: Path, n: int, processes: int = 1) -> dict:
    import shutil

    out = work / f"enc-p{processes}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run(_build_cmd(_encode_corpus(work, n), out, "--processes", str(processes)), check=True,
                   env=_encode_env(work), capture_output=True)
    wall = time.perf_counter() - t0
    facts = _encode_facts(out)
    return {"processes": processes, "encode_s": facts["encode_only_s"], "psg_per_s": round(n / facts["encode_only_s"], 1),
            "build_wall_s": round(wall, 1)}


def phase_kill(work: Path, n: int) -> dict:
    import shutil

    out = work / "enc-kill"
    ckpt = work / ".enc-kill.encoding"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    chunks = -(-n // ENCODE_CHUNK)
    corpus = _encode_corpus(work, n)
    t0 = time.perf_counter()
    proc = subprocess.Popen(_build_cmd(corpus, out), env=_encode_env(work), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    while len(list(ckpt.glob("chunk-*.npy"))) < chunks // 2 and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_wall = time.perf_counter() - t0
    done = len(list(ckpt.glob("chunk-*.npy")))
    t0 = time.perf_counter()
    subprocess.run(_build_cmd(corpus, out), check=True, env=_encode_env(work), capture_output=True)
    facts = _encode_facts(out)
    return {"chunks": chunks, "chunks_at_kill": done, "killed_after_s": round(killed_wall, 1),
            "resumed_encode_s": facts["encode_only_s"], "resumed_wall_s": round(time.perf_counter() - t0, 1)}


PHASES = {"make": phase_make, "read": phase_read, "lucene": phase_lucene, "encode": phase_encode, "kill": phase_kill}


# -------------------------------------------------------------------------------------------- driver
def run_child(work: Path, phase: str, n: int, **kw) -> dict:
    args = [sys.executable, __file__, "--child", phase, "--n", str(n), "--work", str(work)]
    for k, v in kw.items():
        args += [f"--{k}", str(int(v) if isinstance(v, bool) else v)]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    print(phase, n, kw, out, file=sys.stderr, flush=True)
    return out


def markdown(doc: dict) -> str:
    lines = [f"CPU: {doc['cpu']}", "",
             "| passages | corpus read s (psg/s) / peak RSS MB | Lucene build s (psg/s) / peak RSS MB (build + JVM) "
             "| former in-process Lucene s (psg/s) / peak RSS MB |",
             "| ---: | --- | --- | --- |"]
    for n, r in doc["sizes"].items():
        rd, lu, old = r.get("read", {}), r.get("lucene", {}), r.get("lucene_old")
        lines.append(
            f"| {int(n):,} | {rd.get('read_s')} ({rd.get('psg_per_s')}) / {rd.get('peak_rss_mb')} "
            f"| {lu.get('build_s')} ({lu.get('psg_per_s')}) / {lu.get('peak_rss_mb')} + {lu.get('peak_rss_children_mb')} "
            f"| " + (f"{old['build_s']} ({old['psg_per_s']}) / {old['peak_rss_mb']}" if old else "not run") + " |")
    enc = doc.get("encode", {})
    if enc:
        lines += ["", "| encoding | passages | s | passages/s |", "| --- | ---: | ---: | ---: |"]
        for key, r in enc.items():
            if key.startswith("p"):
                lines.append(f"| {r['processes']} process(es) | {doc['encode_n']:,} | {r['encode_s']} | {r['psg_per_s']} |")
        k = enc.get("kill")
        if k:
            lines.append(f"| killed (SIGKILL) at {k['chunks_at_kill']}/{k['chunks']} chunks, resumed | "
                         f"{doc['encode_n']:,} | {k['resumed_encode_s']} | resumed / uninterrupted = "
                         f"{k['resumed_encode_s'] / enc['p1']['encode_s']:.0%} |")
    return "\n".join(lines)


def estimates(doc: dict, *, cores: int = 64, gpus: int = 8, gpu_rate: float = 5000.0) -> str:
    """21M passages from the largest measured size (linear in n: the fitted slopes below), on `cores` cores
    and `gpus` GPUs. Every line is an estimate; the GPU rate is an assumption (no GPU was measured)."""
    import numpy as np

    here = max(1, os.cpu_count() or 1)
    ns = sorted(int(n) for n in doc["sizes"])
    big = doc["sizes"][str(ns[-1])]

    def slope(phase: str, key: str) -> str:
        pts = [(n, doc["sizes"][str(n)].get(phase, {}).get(key)) for n in ns]
        pts = [(n, y) for n, y in pts if y]
        if len(pts) < 2:
            return "–"
        return f"{np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)[0]:.2f}"

    lines = ["| phase (21,015,324 passages) | basis | estimate |", "| --- | --- | --- |"]
    rd, lu = big.get("read", {}), big.get("lucene", {})
    if rd.get("psg_per_s"):
        lines.append(f"| corpus read (one process) | {rd['psg_per_s']:,} psg/s at {ns[-1]:,}; time slope "
                     f"{slope('read', 'read_s')}, RSS slope {slope('read', 'peak_rss_mb')} | "
                     f"{FULL_WIKI / rd['psg_per_s'] / 60:.0f} min |")
    if lu.get("psg_per_s"):
        per_thread = lu["psg_per_s"] / here
        lines.append(f"| Lucene, these {here} cores | {lu['psg_per_s']:,} psg/s at {ns[-1]:,}; time slope "
                     f"{slope('lucene', 'build_s')} (linear assumed) | {FULL_WIKI / lu['psg_per_s'] / 60:.0f} min |")
        lines.append(f"| Lucene, {cores} threads | {per_thread:,.0f} psg/s per thread; threads scale linearly "
                     f"(assumed; segment merges and the disk make it a lower bound) | "
                     f"≥ {FULL_WIKI / (per_thread * cores) / 60:.1f} min |")
    enc = (doc.get("encode") or {}).get("p1")
    if enc and enc.get("psg_per_s"):
        per_core = enc["psg_per_s"] / here
        lines.append(f"| encoding, {cores} CPU cores | {per_core:.1f} psg/s per core ({here} cores, 1 process); "
                     f"cores scale linearly (assumed) | {FULL_WIKI / (per_core * cores) / 3600:.1f} h |")
    lines.append(f"| encoding, {gpus} GPUs | {gpu_rate:,.0f} psg/s per GPU: an assumption, not measured | "
                 f"{FULL_WIKI / (gpu_rate * gpus) / 60:.0f} min |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="125000,250000,500000,1000000")
    ap.add_argument("--old-max", type=int, default=250_000, help="largest size for the former Lucene path")
    ap.add_argument("--encode", type=int, default=2000, help="passages encoded (0: skip the encoding phases)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/clarify-bench-build"))
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "build.json")
    ap.add_argument("--render", type=Path, nargs="*", help="print the tables of these result files (merged)")
    ap.add_argument("--child")
    ap.add_argument("--n", type=int)
    ap.add_argument("--old", type=int, default=0)
    ap.add_argument("--processes", type=int, default=1)
    args = ap.parse_args()
    if args.render:
        doc = json.loads(args.render[0].read_text())
        for extra in args.render[1:]:
            more = json.loads(extra.read_text())
            doc["sizes"].update(more.get("sizes", {}))
            doc["encode"] = more.get("encode") or doc.get("encode")
            doc["encode_n"] = more.get("encode_n") or doc.get("encode_n")
        print(markdown(doc) + "\n\n" + estimates(doc))
        return 0
    if args.child:
        kw = {"old": bool(args.old)} if args.child == "lucene" else (
            {"processes": args.processes} if args.child == "encode" else {})
        result = PHASES[args.child](args.work, args.n, **kw)
        print(json.dumps({**result, **peak()}))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    doc = {"cpu": cpu_model(), "load_average_at_start": os.getloadavg(), "command": " ".join(sys.argv),
           "sizes": {}, "encode_n": args.encode}
    for n in sizes:
        r = doc["sizes"][str(n)] = {}
        r["make"] = run_child(args.work, "make", n)
        r["read"] = run_child(args.work, "read", n)
        r["lucene"] = run_child(args.work, "lucene", n)
        if n <= args.old_max:
            r["lucene_old"] = run_child(args.work, "lucene", n, old=True)
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    if args.encode:
        if 125_000 not in sizes:
            run_child(args.work, "make", 125_000)
        doc["encode"] = {"p1": run_child(args.work, "encode", args.encode, processes=1),
                         "p2": run_child(args.work, "encode", args.encode, processes=2),
                         "kill": run_child(args.work, "kill", args.encode)}
    doc["load_average_at_end"] = os.getloadavg()
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
