"""Growth of retrieval with corpus size: synthetic corpora of 125k .. 1M (2M) passages built
from the shipped passages and vectors, each phase measured in its own process.

    nice -n 10 python bench/bench_scale.py                       # 125k, 250k, 500k, 1M
    nice -n 10 python bench/bench_scale.py --sizes 125000,2000000 --lucene-max 250000

Synthetic corpus of n passages: row i is shipped passage i mod 10,116 under a new id `s<i>`, its text
suffixed with " (copy <i // 10116>)" so copies differ for BM25; its vector is that passage's shipped
MiniLM vector plus Gaussian noise (sigma 0.05 per dimension), renormalised, written straight to a float32
memmap in chunks (never a whole-corpus array in RAM). Queries: 512 shipped vectors plus stronger noise.

Phases (each a child process that reports its own time and peak RSS, getrusage ru_maxrss):
    corpus    write the JSONL corpus, read it with clarify's load_corpus, write the Arrow text store
    lucene    Lucene BM25 build (index/bm25.py build_lucene), up to --lucene-max passages
    build     FAISS build per index type from the memmap (time, peak RSS, file size)
    open      open time and anonymous / file-backed RSS, memory-mapped (IO_FLAG_MMAP_IFC) vs read whole
    search    latency per query at batch 1, 8, 512; recall@100 against Flat
    lookup    the text store: open, 1,000 random ids looked up
    cache     the shared search cache: per-call time with 200 cached batches in memory
    pss       proportional set size (/proc/PID/smaps_rollup) of one vs two processes that open the same
              index memory-mapped and scan it (Flat: a search touches every page), and the same read whole

Output: bench/results/scale.json (every measurement, the CPU model, the log-log slopes of time and
memory against n, and their extrapolation to 21,015,324 passages, marked as estimates).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FULL_WIKI = 21_015_324  # passages in DPR's psgs_w100.tsv (Karpukhin et al. 2020)
DIM = 384
TYPES = {  # name -> index_factory string ({nlist}: 4·sqrt(n), as clarify's default)
    "flat": "Flat",
    "sq8": "SQ8",
    "ivf-sq8": "IVF{nlist},SQ8",
    # 96 sub-quantizers of 4 bits: 48 bytes a vector, as PQ48 (8 bits) but trained in seconds (8-bit PQ
    # training did not finish in 2 minutes on 2,000 vectors on this shared 2-core machine)
    "ivf-pq": "IVF{nlist},PQ96x4",
    "hnsw": "HNSW32",
}
NOISE, QUERY_NOISE = 0.02, 0.03  # per dimension: |noise| ≈ 0.39 and 0.59 of a unit vector
BATCHES = (1, 8, 512)


# ------------------------------------------------------------------------------------------- helpers
def rss() -> dict:
    """This process' resident memory now, anonymous and file-backed (MB), from /proc/self/status."""
    out = {}
    for line in open("/proc/self/status"):
        key = line.split(":")[0]
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(line.split()[1]) / 1024
    return out


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_model() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} CPUs)"
    return platform.processor()


def nlist_for(n: int) -> int:
    return int(4 * np.sqrt(n))


def factory_for(kind: str, n: int) -> str:
    return TYPES[kind].replace("{nlist}", str(nlist_for(n)))


def base():
    from clarify.index.corpus import load_corpus
    from clarify.index.default import default_corpus_files

    passages = load_corpus(default_corpus_files()).passages
    vectors = np.load(REPO / "data" / "wiki" / "all-MiniLM-L6-v2.embeddings.npy", mmap_mode="r")
    assert vectors.shape[0] == passages.height
    return passages, vectors


def corpus_dir(work: Path, n: int) -> Path:
    return work / f"n{n}"


# ------------------------------------------------------------------------------------------- phases
def phase_corpus(work: Path, n: int) -> dict:
    import polars as pl

    from clarify.index.corpus import load_corpus
    from clarify.index.textstore import write_store

    d = corpus_dir(work, n)
    d.mkdir(parents=True, exist_ok=True)
    passages, vectors = base()
    b = passages.height
    rng = np.random.default_rng(n)
    t0 = time.perf_counter()
    emb = np.lib.format.open_memmap(d / "vectors.npy", mode="w+", dtype=np.float32, shape=(n, DIM))
    chunk = 100_000
    with open(d / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for start in range(0, n, chunk):
            rows = np.arange(start, min(n, start + chunk))
            src = rows % b
            v = np.asarray(vectors[src]) + NOISE * rng.standard_normal((len(rows), DIM)).astype(np.float32)
            emb[start : start + len(rows)] = v / np.linalg.norm(v, axis=1, keepdims=True)
            part = passages[src.tolist()].with_columns(
                pl.Series("id", [f"s{i}" for i in rows]),
                pl.col("text") + pl.Series([f" (copy {i // b})" for i in rows]))
            fh.write(part.select("id", "title", "text").write_ndjson())
    emb.flush()
    del emb
    write_s = time.perf_counter() - t0
    queries = np.asarray(vectors[rng.choice(b, 512, replace=False)])
    queries = queries + QUERY_NOISE * rng.standard_normal(queries.shape).astype(np.float32)
    np.save(d / "queries.npy", (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32))
    t0 = time.perf_counter()
    read = load_corpus([d / "corpus.jsonl"]).passages
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    write_store(read, d)
    store_s = time.perf_counter() - t0
    return {"write_s": round(write_s, 2), "read_s": round(read_s, 2), "store_write_s": round(store_s, 2),
            "jsonl_mb": round((d / "corpus.jsonl").stat().st_size / 2**20, 1),
            "store_mb": round(sum((d / f).stat().st_size for f in ("passages.arrow", "passage_ids.npy",
                                                                      "passage_rows.npy")) / 2**20, 1)}


def phase_lucene(work: Path, n: int) -> dict:
    from clarify.index.bm25 import build_lucene
    from clarify.index.textstore import PassageStore

    d = corpus_dir(work, n)
    passages = PassageStore(d).all()
    out = d / "lucene"
    t0 = time.perf_counter()
    stats = build_lucene(passages, out, threads=2)
    return {"build_s": round(time.perf_counter() - t0, 2), "documents": stats["documents"],
            "size_mb": round(sum(p.stat().st_size for p in out.iterdir()) / 2**20, 1)}


def phase_build(work: Path, n: int, kind: str) -> dict:
    import faiss

    from clarify.index.dense import build_faiss, set_threads

    set_threads(None)
    d = corpus_dir(work, n)
    emb = np.load(d / "vectors.npy", mmap_mode="r")
    nl = nlist_for(n)
    t0 = time.perf_counter()
    # training sample: 40 rows per IVF list (FAISS's minimum is 39) — at 21M with 18k lists that is 730k
    index, facts = build_faiss(emb, factory_for(kind, n), train_size=min(n, max(40 * nl, 50_000)),
                               nprobe=None, ef_search=None)
    build_s = time.perf_counter() - t0
    path = d / f"faiss-{kind}"
    path.mkdir(exist_ok=True)
    faiss.write_index(index, str(path / "index"))
    with open(path / "docid", "w") as fh:
        fh.writelines(f"s{i}\n" for i in range(n))
    return {"build_s": round(build_s, 2), "size_mb": round((path / "index").stat().st_size / 2**20, 1), **facts}


def phase_open(work: Path, n: int, kind: str, mmap: bool) -> dict:
    from clarify.index.dense import DenseIndex

    d = corpus_dir(work, n)
    before = rss()
    t0 = time.perf_counter()
    idx = DenseIndex(d / f"faiss-{kind}", mmap=mmap)
    open_s = time.perf_counter() - t0
    after_open = rss()
    q = np.load(d / "queries.npy")[:8]
    idx.index.search(q, 100)
    after_search = rss()
    return {"open_s": round(open_s, 3), "mapped": idx.mapped,
            "anon_mb_after_open": round(after_open["RssAnon"] - before["RssAnon"], 1),
            "file_mb_after_open": round(after_open["RssFile"] - before["RssFile"], 1),
            "anon_mb_after_search": round(after_search["RssAnon"] - before["RssAnon"], 1),
            "file_mb_after_search": round(after_search["RssFile"] - before["RssFile"], 1)}


def phase_search(work: Path, n: int, kind: str) -> dict:
    from clarify.index.dense import DenseIndex, default_nprobe, set_search_parameters

    d = corpus_dir(work, n)
    q = np.load(d / "queries.npy")
    truth_file = d / "truth100.npy"
    if kind == "flat" or not truth_file.is_file():
        flat = DenseIndex(d / "faiss-flat")
        _, truth = flat.index.search(q, 100)
        np.save(truth_file, truth)
    truth = np.load(truth_file)
    idx = DenseIndex(d / f"faiss-{kind}")
    settings = [{}]
    if "nlist" in idx.params:
        p = default_nprobe(idx.params["nlist"])
        settings = [{"nprobe": p}, {"nprobe": 4 * p}]
    elif "efSearch" in idx.params:
        settings = [{"efSearch": 128}, {"efSearch": 256}]
    out = []
    for s in settings:
        set_search_parameters(idx.index, nprobe=s.get("nprobe"), ef_search=s.get("efSearch"))
        row = {"params": s}
        idx.index.search(q[:8], 100)  # warm
        for batch in BATCHES:
            reps = max(1, 64 // batch)  # 64 queries at batch 1 and 8, all 512 at batch 512
            t0 = time.perf_counter()
            for r in range(reps):
                _, found = idx.index.search(q[r * batch : (r + 1) * batch], 100)
            row[f"ms_per_query_b{batch}"] = round(1000 * (time.perf_counter() - t0) / (reps * batch), 3)
        row["recall100_vs_flat"] = round(float(np.mean([len(set(a) & set(b)) / 100 for a, b in zip(found, truth)])), 4)
        out.append(row)
    return {"settings": out}


def phase_lookup(work: Path, n: int) -> dict:
    from clarify.index.textstore import PassageStore

    d = corpus_dir(work, n)
    before = rss()
    t0 = time.perf_counter()
    store = PassageStore(d)
    open_s = time.perf_counter() - t0
    ids = [f"s{i}" for i in np.random.default_rng(1).choice(n, 1000, replace=False)]
    store.lookup(ids[:10])  # first call: polars/pyarrow set-up
    t0 = time.perf_counter()
    got = store.lookup(ids)
    lookup_s = time.perf_counter() - t0
    assert got["passage_id"].to_list() == ids
    after = rss()
    return {"open_s": round(open_s, 4), "lookup_1000_ms": round(1000 * lookup_s, 2),
            "anon_mb": round(after["RssAnon"] - before["RssAnon"], 1),
            "file_mb": round(after["RssFile"] - before["RssFile"], 1)}


def phase_cache(work: Path, n: int) -> dict:
    import polars as pl

    from clarify.batch.run.search_cache import CachingSearcher
    from clarify.index.search import hits_frame

    class Inner:
        name = "synthetic"

        def search(self, queries, k):
            qs = queries["query"].to_list()
            return hits_frame(queries["qid"].to_list(), [[f"s{hash(x) % n}-{r}" for r in range(k)] for x in qs],
                              [[1.0 / (j + 1) for j in range(k)] for _ in qs], "bm25")

    folder = corpus_dir(work, n) / "search_cache"
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    cache = CachingSearcher(Inner(), folder, {"bench": n})
    times = []
    for call in range(200):  # 200 batches of 8 new queries + 8 known ones
        q = pl.DataFrame({"qid": [str(i) for i in range(16)],
                          "query": [f"q{call}-{i}" for i in range(8)] + [f"q{max(0, call - 1)}-{i}" for i in range(8)]})
        t0 = time.perf_counter()
        cache.search(q, 100)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for call in range(200):  # every query known: answered from memory
        cache.search(pl.DataFrame({"qid": ["0"], "query": [f"q{call}-0"]}), 100)
    warm = (time.perf_counter() - t0) / 200
    return {"ms_first_20_calls": round(1000 * float(np.mean(times[:20])), 2),
            "ms_last_20_calls": round(1000 * float(np.mean(times[-20:])), 2),
            "ms_per_warm_call_200_files": round(1000 * warm, 3)}


def phase_hold(work: Path, n: int, kind: str, mmap: bool) -> None:
    """Open an index, scan it once, print 'ready', wait for a line on stdin (the pss phase reads us)."""
    from clarify.index.dense import DenseIndex

    d = corpus_dir(work, n)
    idx = DenseIndex(d / f"faiss-{kind}", mmap=mmap)
    idx.index.search(np.load(d / "queries.npy")[:8], 100)
    print("ready", flush=True)
    sys.stdin.readline()


def pss_of(pid: int) -> dict:
    out = {}
    for line in open(f"/proc/{pid}/smaps_rollup"):
        parts = line.split()
        if parts[0] in ("Rss:", "Pss:", "Pss_Anon:", "Pss_File:"):
            out[parts[0].rstrip(":")] = round(int(parts[1]) / 1024, 1)
    return out


def phase_pss(work: Path, n: int, kind: str) -> dict:
    result = {}
    for mmap in (True, False):
        for count in (1, 2):
            procs = [subprocess.Popen([sys.executable, __file__, "--child", "hold", "--n", str(n), "--kind", kind,
                                       "--mmap", str(int(mmap)), "--work", str(work)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=child_env()) for _ in range(count)]
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            result[f"{'mmap' if mmap else 'read'}_{count}proc"] = [pss_of(p.pid) for p in procs]
            for p in procs:
                p.stdin.write("\n")
                p.stdin.flush()
                p.wait()
    result["index_mb"] = round((corpus_dir(work, n) / f"faiss-{kind}" / "index").stat().st_size / 2**20, 1)
    return result


PHASES = {"corpus": phase_corpus, "lucene": phase_lucene, "build": phase_build, "open": phase_open,
          "search": phase_search, "lookup": phase_lookup, "cache": phase_cache, "hold": phase_hold}


# ------------------------------------------------------------------------------------------- driver
def child_env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # one FAISS thread: per-core figures, stable on a shared 2-core machine (index/dense.py set_threads)
    env.setdefault("CLARIFY_FAISS_THREADS", "1")
    return env


def run_child(work: Path, phase: str, n: int, **kw) -> dict:
    args = [sys.executable, __file__, "--child", phase, "--n", str(n), "--work", str(work)]
    for k, v in kw.items():
        args += [f"--{k}", str(int(v) if isinstance(v, bool) else v)]
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=child_env())
    if proc.returncode:
        print(proc.stderr[-3000:], file=sys.stderr)
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    return out


def slope(ns: list[int], ys: list[float]) -> float | None:
    """Least-squares slope of log y against log n (1.0: linear growth)."""
    pts = [(np.log(n), np.log(y)) for n, y in zip(ns, ys) if y and y > 0]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    return round(float(np.polyfit(x, y, 1)[0]), 3)


def extrapolate(ns: list[int], ys: list[float]) -> float | None:
    """y at FULL_WIKI from the log-log fit (an estimate)."""
    pts = [(np.log(n), np.log(y)) for n, y in zip(ns, ys) if y and y > 0]
    if len(pts) < 2:
        return None
    x, y = np.array(pts).T
    a, b = np.polyfit(x, y, 1)
    return round(float(np.exp(b + a * np.log(FULL_WIKI))), 3)


def fits(results: dict) -> dict:
    """Slopes and 21M estimates of each series that has at least two sizes."""
    series: dict[str, dict[int, float]] = {}
    for n_str, r in results.items():
        n = int(n_str)

        def put(name, value, n=n):
            if isinstance(value, int | float):
                series.setdefault(name, {})[n] = value

        for k in ("read_s", "store_write_s", "store_mb", "peak_rss_mb"):
            put(f"corpus.{k}", (r.get("corpus") or {}).get(k))
        for k in ("build_s", "size_mb", "peak_rss_mb"):
            put(f"lucene.{k}", (r.get("lucene") or {}).get(k))
        for kind, b in (r.get("build") or {}).items():
            for k in ("build_s", "size_mb", "peak_rss_mb"):
                put(f"faiss.{kind}.{k}", b.get(k))
        for key, o in (r.get("open") or {}).items():
            for k in ("open_s", "anon_mb_after_search", "peak_rss_mb"):
                put(f"open.{key}.{k}", o.get(k))
        for kind, s in (r.get("search") or {}).items():
            for i, row in enumerate(s.get("settings", [])):
                for b in BATCHES:
                    put(f"search.{kind}.{i}.ms_per_query_b{b}", row.get(f"ms_per_query_b{b}"))
                put(f"search.{kind}.{i}.recall100", row.get("recall100_vs_flat"))
        for k in ("lookup_1000_ms", "open_s", "anon_mb"):
            put(f"lookup.{k}", (r.get("lookup") or {}).get(k))
    out = {}
    for name, pts in sorted(series.items()):
        ns = sorted(pts)
        if len(ns) >= 2:
            out[name] = {"sizes": ns, "values": [pts[n] for n in ns], "loglog_slope": slope(ns, [pts[n] for n in ns]),
                         "estimate_21M": extrapolate(ns, [pts[n] for n in ns])}
    return out


def markdown(doc: dict) -> str:
    """The README's tables from a scale.json."""
    res = doc["results"]
    ns = sorted(int(n) for n in res)
    lines = [f"CPU: {doc['cpu']}, FAISS {doc['faiss']}, {doc.get('faiss_threads', '?')} FAISS thread(s); "
             f"times in s, memory in MB, latency in ms per query (k = 100).", "",
             "| passages | " + " | ".join(f"{n:,}" for n in ns) + " |", "| --- |" + " --- |" * len(ns)]

    def row(label, get):
        vals = []
        for n in ns:
            try:
                v = get(res[str(n)])
            except (KeyError, IndexError, TypeError):
                v = None
            vals.append("–" if v is None else str(v))
        lines.append(f"| {label} | " + " | ".join(vals) + " |")

    row("corpus read (load_corpus) s / peak RSS", lambda r: f"{r['corpus']['read_s']} / {r['corpus']['peak_rss_mb']:.0f}")
    row("text store write s / MB", lambda r: f"{r['corpus']['store_write_s']} / {r['corpus']['store_mb']}")
    row("Lucene build s / MB / peak RSS", lambda r: f"{r['lucene']['build_s']} / {r['lucene']['size_mb']} / "
                                                    f"{r['lucene']['peak_rss_mb']:.0f}")
    for kind in doc["types"]:
        row(f"{kind}: build s / MB / peak RSS", lambda r, k=kind: f"{r['build'][k]['build_s']} / "
            f"{r['build'][k]['size_mb']} / {r['build'][k]['peak_rss_mb']:.0f}")
        row(f"{kind}: open s mmap / read", lambda r, k=kind: f"{r['open'][k + '-mmap']['open_s']} / "
            f"{r['open'][k + '-read']['open_s']}")
        row(f"{kind}: anon RSS after search, mmap / read", lambda r, k=kind: f"{r['open'][k + '-mmap']['anon_mb_after_search']}"
            f" / {r['open'][k + '-read']['anon_mb_after_search']}")
        for i in (0, 1):
            row(f"{kind}: ms/q b1 / b8 / b512, recall@100" + (" (4× nprobe/2× ef)" if i else ""),
                lambda r, k=kind, i=i: "{} / {} / {}, {}".format(*(r['search'][k]['settings'][i][f] for f in (
                    "ms_per_query_b1", "ms_per_query_b8", "ms_per_query_b512", "recall100_vs_flat"))))
    row("text store: open s / 1,000 lookups ms", lambda r: f"{r['lookup']['open_s']} / {r['lookup']['lookup_1000_ms']}")
    row("search cache: ms per call, first / last 20 of 200", lambda r: f"{r['cache']['ms_first_20_calls']} / "
                                                                      f"{r['cache']['ms_last_20_calls']}")
    lines += ["", "| PSS of the index process (MB) | one process | each of two | two together |", "| --- | --- | --- | --- |"]
    for n in ns:
        pss = res[str(n)].get("pss")
        if not pss:
            continue
        for how in ("mmap", "read"):
            one, two = pss[f"{how}_1proc"][0]["Pss"], [p["Pss"] for p in pss[f"{how}_2proc"]]
            lines.append(f"| {n:,}, Flat {pss['index_mb']} MB, {'memory-mapped' if how == 'mmap' else 'read whole'} "
                         f"| {one} | {' / '.join(map(str, two))} | {round(sum(two), 1)} |")
    lines += ["", "| series | slope | at 21M (estimate) |", "| --- | --- | --- |"]
    for name, f in doc.get("fits", {}).items():
        if any(name.startswith(p) for p in FIT_ROWS):
            lines.append(f"| {name} | {f['loglog_slope']} | {f['estimate_21M']} |")
    return "\n".join(lines)


FIT_ROWS = ("corpus.read_s", "corpus.store_mb", "lucene.build_s", "lucene.size_mb", "faiss.flat.size_mb",
            "faiss.ivf-sq8.build_s", "faiss.ivf-sq8.size_mb", "faiss.ivf-pq.build_s", "faiss.ivf-pq.size_mb",
            "open.ivf-sq8-mmap.open_s", "open.ivf-sq8-mmap.anon_mb_after_search", "open.ivf-pq-mmap.open_s",
            "open.ivf-sq8-read.anon_mb_after_search", "open.flat-mmap.anon_mb_after_search",
            "open.flat-read.anon_mb_after_search", "search.flat.0.ms_per_query_b8", "search.ivf-sq8.0.ms_per_query_b8",
            "search.ivf-pq.0.ms_per_query_b8", "lookup.lookup_1000_ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="125000,250000,500000,1000000")
    ap.add_argument("--types", default="flat,sq8,ivf-sq8,ivf-pq,hnsw")
    ap.add_argument("--hnsw-max", type=int, default=125_000, help="build HNSW up to this size (slow on 2 cores)")
    ap.add_argument("--lucene-max", type=int, default=250_000, help="build Lucene up to this size")
    ap.add_argument("--pss-kind", default="flat", help="index type of the PSS measurement (at the largest size)")
    ap.add_argument("--work", default="/tmp/clarify-scale")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "scale.json"))
    ap.add_argument("--keep", action="store_true", help="keep the synthetic corpora")
    ap.add_argument("--markdown", action="store_true", help="print the README tables of --out and stop")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--kind", help=argparse.SUPPRESS)
    ap.add_argument("--mmap", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    work = Path(a.work)
    if a.markdown:
        print(markdown(json.loads(Path(a.out).read_text())))
        return 0
    if a.child:
        kw = {}
        if a.child in ("build", "open", "search", "hold"):
            kw["kind"] = a.kind
        if a.child in ("open", "hold"):
            kw["mmap"] = bool(a.mmap)
        out = PHASES[a.child](work, a.n, **kw)
        if a.child != "hold":
            out["peak_rss_mb"] = round(peak_mb(), 1)
            print(json.dumps(out))
        return 0

    sizes = [int(s) for s in a.sizes.split(",")]
    types = a.types.split(",")
    cpu = cpu_model()
    print(f"CPU: {cpu}", flush=True)
    import faiss

    doc = {"cpu": cpu, "faiss": faiss.__version__, "faiss_threads": child_env()["CLARIFY_FAISS_THREADS"],
           "load_average_at_start": os.getloadavg(), "dim": DIM, "noise": NOISE, "query_noise": QUERY_NOISE,
           "types": {k: TYPES[k] for k in types}, "command": " ".join(sys.argv), "results": {}}
    out_path = Path(a.out)
    for n in sizes:
        r = doc["results"][str(n)] = {}
        t_size = time.perf_counter()
        print(f"== {n:,} passages", flush=True)
        r["corpus"] = run_child(work, "corpus", n)
        print("  corpus", r["corpus"], flush=True)
        if n <= a.lucene_max:
            r["lucene"] = run_child(work, "lucene", n)
            print("  lucene", r["lucene"], flush=True)
        r["build"], r["open"], r["search"] = {}, {}, {}
        for kind in ["flat"] + [t for t in types if t != "flat"]:
            if kind == "hnsw" and n > a.hnsw_max:
                continue
            r["build"][kind] = run_child(work, "build", n, kind=kind)
            print(f"  build {kind}", r["build"][kind], flush=True)
            if "error" in r["build"][kind]:
                continue
            for mmap in (True, False):
                key = f"{kind}-{'mmap' if mmap else 'read'}"
                r["open"][key] = run_child(work, "open", n, kind=kind, mmap=mmap)
                print(f"  open {key}", r["open"][key], flush=True)
            r["search"][kind] = run_child(work, "search", n, kind=kind)
            print(f"  search {kind}", r["search"][kind], flush=True)
        r["lookup"] = run_child(work, "lookup", n)
        r["cache"] = run_child(work, "cache", n)
        print("  lookup", r["lookup"], "cache", r["cache"], flush=True)
        if n == max(sizes):
            r["pss"] = phase_pss(work, n, a.pss_kind)
            print("  pss", r["pss"], flush=True)
        r["size_wall_s"] = round(time.perf_counter() - t_size, 1)
        doc["fits"] = fits(doc["results"])
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(doc, indent=1) + "\n")  # after each size: a partial run keeps its numbers
        if not a.keep:
            import shutil

            for p in sorted(corpus_dir(work, n).glob("*")):
                if p.name != "vectors.npy" or n != max(sizes):
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
    print(json.dumps(doc["fits"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
