"""BM25 over a Lucene index with Pyserini (adapter module: starts the JVM, imports pyserini).

Building (`build_lucene`): each passage becomes one JsonCollection document
`{"id", "contents": '"title"\\ntext'}`; the documents are written as JSONL files in a collection folder,
streamed from the passage store one Arrow batch at a time (Polars builds `contents` and writes the JSON),
and Anserini's own collection indexer builds the index from them (`io.anserini.index.IndexCollection`,
run as Pyserini documents it: `python -m pyserini.index.lucene -collection JsonCollection -input DIR
-index DIR -generator DefaultLuceneDocumentGenerator -threads N -storeRaw`,
https://github.com/castorini/pyserini/blob/master/docs/usage-index.md), with the raw JSON stored as
Pyserini's prebuilt indexes store it, so `doc(id).raw()` gives the passage back. It runs in a child
process whose JVM gets the build's heap (a heap is fixed when a JVM starts: index/jvm.py) and as many
indexing threads as the machine has CPUs; each thread indexes whole files, so there are at least as
many files as threads. Lucene's RAM buffer (`-memoryBuffer`, Anserini's default 4 GB) is set to half the
heap. Pyserini's indexers report success even when they indexed 0 documents
(docs/architecture.md#pyserini-indexes-nothing-without-contents): afterwards we
count the documents in the index and fail if they differ.

`build_lucene_inprocess` is the former path (pyjnius, Anserini's SimpleIndexer in this process, one
`json.dumps` a document), kept as the reference the collection indexer is tested and measured against
(tests/test_index_build.py, bench/bench_build.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
from tqdm.auto import tqdm

from clarify.errors import InputError
from clarify.index.corpus import split_contents
from clarify.index.jvm import start_jvm
from clarify.index.search import check_k, check_queries, hits_frame
from clarify.schemas import PASSAGES


def default_threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def join_contents(title: str, text: str) -> str:
    """Lucene `contents` in the DPR-Wikipedia convention: `"Title"\\ntext` (inner quotes doubled), so stored
    documents split back into (title, text) exactly like prebuilt DPR indexes (corpus.split_contents)."""
    return '"' + title.replace('"', '""') + '"\n' + text if title else text


def is_lucene_dir(path: Path) -> bool:
    return Path(path).is_dir() and any(Path(path).glob("segments_*"))


DOCS_PER_FILE = 500_000  # JsonCollection file size cap (a thread indexes whole files)


def build_threads() -> int:
    """Indexing threads for a build: every CPU this process may use."""
    return max(1, len(os.sched_getaffinity(0)))


def passage_batches(passages, rows: int = 65536):
    """Passages [passage_id, title, text] as DataFrames of at most `rows`: from a DataFrame, or from a
    PassageStore's record batches (index/textstore.py, memory-mapped: nothing else is read)."""
    if isinstance(passages, pl.DataFrame):
        for start in range(0, passages.height, rows):
            yield passages.slice(start, rows)
        return
    for i in range(passages.reader.num_record_batches):
        yield pl.from_arrow(passages.reader.get_batch(i)).cast(PASSAGES)


def contents_expr() -> pl.Expr:
    """`join_contents` as a Polars expression over [title, text]."""
    return (pl.when(pl.col("title") != "")
            .then(pl.lit('"') + pl.col("title").str.replace_all('"', '""', literal=True) + pl.lit('"\n')
                  + pl.col("text"))
            .otherwise(pl.col("text")))


def write_collection(passages, folder: Path, *, files: int) -> int:
    """Write passages as JsonCollection JSONL files `docs-NNNNN.jsonl` in `folder`, rows split evenly over
    `files` files, one batch in memory at a time; returns the documents written."""
    n = passages.height if isinstance(passages, pl.DataFrame) else len(passages)
    per = max(1, -(-n // max(1, files)))
    folder.mkdir(parents=True, exist_ok=True)
    written, fh, part = 0, None, -1
    try:
        for batch in passage_batches(passages):
            docs = batch.select(pl.col("passage_id").alias("id"), contents_expr().alias("contents"))
            while docs.height:
                if written // per != part:
                    if fh is not None:
                        fh.close()
                    part = written // per
                    fh = open(folder / f"docs-{part:05d}.jsonl", "wb")
                take = min(docs.height, per - written % per)
                docs.slice(0, take).write_ndjson(fh)
                docs, written = docs.slice(take), written + take
    finally:
        if fh is not None:
            fh.close()
    return written


def build_lucene(passages, out_dir: Path, *, threads: int | None = None, heap: str | None = None,
                 work: Path | None = None) -> dict:
    """Index passages (a PassageStore or a DataFrame [passage_id, title, text]) into a new Lucene index at
    out_dir with Anserini's IndexCollection in a child process (module docstring); return its stats.
    `threads`: indexing threads (default: this machine's CPUs); `heap`: the child JVM's -Xmx (default
    index/jvm.py `default_heap`); `work`: where the JSONL collection is written (removed afterwards)."""
    from clarify.index.jvm import default_heap, heap_mb

    out_dir = Path(out_dir)
    threads = threads or build_threads()
    heap = heap or default_heap()
    n = passages.height if isinstance(passages, pl.DataFrame) else len(passages)
    coll = Path(work or out_dir.parent / f"{out_dir.name}.collection")
    t0 = time.perf_counter()
    write_collection(passages, coll, files=max(threads, -(-n // DOCS_PER_FILE)))
    write_s = time.perf_counter() - t0
    log = out_dir.parent / f"{out_dir.name}.log"
    args = ["-collection", "JsonCollection", "-input", str(coll), "-index", str(out_dir),
            "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads), "-storeRaw",
            "-memoryBuffer", str(max(256, heap_mb(heap) // 2))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.setdefault("OPENAI_API_KEY", "unused")
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.run([sys.executable, "-m", "clarify.index.jvm", "--heap", heap, "pyserini.index.lucene",
                               *args], stdout=fh, stderr=subprocess.STDOUT, env=env)
    index_s = time.perf_counter() - t0
    shutil.rmtree(coll, ignore_errors=True)
    tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
    if proc.returncode != 0 or not is_lucene_dir(out_dir):
        raise RuntimeError(f"Anserini's IndexCollection failed (exit {proc.returncode}); the end of its log "
                           f"{log}:\n{tail}")
    log.unlink(missing_ok=True)
    stats = _stats(out_dir, n)
    return stats | {"threads": threads, "heap": heap, "write_s": round(write_s, 3), "index_s": round(index_s, 3)}


def _stats(out_dir: Path, n: int) -> dict:
    start_jvm()
    from pyserini.index.lucene import LuceneIndexReader

    stats = LuceneIndexReader(str(out_dir)).stats()
    if int(stats["documents"]) != n:
        raise RuntimeError(f"Lucene indexed {stats['documents']} documents but the corpus has {n} passages "
                           f"(index at {out_dir})")
    return {k: int(v) for k, v in stats.items()}


def build_lucene_inprocess(passages: pl.DataFrame, out_dir: Path, *, threads: int | None = None,
                           batch: int = 5000) -> dict:
    """The former path (module docstring): passages [passage_id, title, text] indexed in this process by
    Anserini's SimpleIndexer through pyjnius."""
    start_jvm()
    from pyserini.index.lucene import LuceneIndexer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    threads = threads or default_threads()
    indexer = LuceneIndexer(str(out_dir), args=["-index", str(out_dir), "-storeRaw"], threads=threads)
    n = passages.height
    with tqdm(total=n, desc="lucene index", unit="psg") as bar:
        for start in range(0, n, batch):
            part = passages.slice(start, batch)
            docs = [
                json.dumps({"id": pid, "contents": join_contents(title, text)}, ensure_ascii=False)
                for pid, title, text in part.iter_rows()
            ]
            indexer.add_batch_raw(docs)
            bar.update(part.height)
    indexer.close()
    return _stats(out_dir, n)


class LuceneStore:
    """An opened Lucene index: BM25 search and stored-document lookup."""

    def __init__(self, directory: Path):
        directory = Path(directory)
        if not is_lucene_dir(directory):
            raise InputError("not a Lucene index directory (no segments_* file)", path=str(directory))
        start_jvm()
        from pyserini.search.lucene import LuceneSearcher

        self.dir = directory
        self.searcher = LuceneSearcher(str(directory))
        self.num_docs = int(self.searcher.num_docs)

    def passages(self, passage_ids: list[str], *, threads: int | None = None) -> pl.DataFrame:
        """Stored documents -> passages [passage_id, title, text] in the given order; InputError for unknown ids."""
        docs = self.searcher.batch_doc(list(passage_ids), threads or default_threads()) if passage_ids else {}
        rows = {"passage_id": [], "title": [], "text": []}
        for pid in passage_ids:
            doc = docs.get(pid)
            if doc is None:
                raise InputError(f"unknown passage id '{pid}' (not in the Lucene index)", path=str(self.dir))
            title, text = _doc_fields(doc)
            rows["passage_id"].append(pid)
            rows["title"].append(title)
            rows["text"].append(text)
        return pl.DataFrame(rows, schema=PASSAGES)

    def all_passages(self) -> pl.DataFrame:
        """Every stored document as passages (a full scan: fine for small indexes, slow for 21M)."""
        from pyserini.index.lucene import LuceneIndexReader

        reader = LuceneIndexReader(str(self.dir))
        ids = [reader.convert_internal_docid_to_collection_docid(i) for i in
               tqdm(range(self.num_docs), desc="read stored ids", unit="doc", disable=self.num_docs < 50000 or None)]
        return self.passages(ids)


def _doc_fields(doc) -> tuple[str, str]:
    raw = doc.raw()
    if raw:
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            return "", raw
        if "text" in obj:
            return obj.get("title") or "", obj["text"]
        contents = obj.get("contents") or ""
        title, text = split_contents(contents)
        if not title and "title" in obj:
            title = obj["title"]
        return title, text
    contents = doc.contents()
    if contents is None:
        raise InputError("the Lucene index stores neither raw documents nor contents (rebuild with -storeRaw)")
    return split_contents(contents)


class BM25Searcher:
    """Pyserini `batch_search` with threads. search(queries [qid, query], k) -> hits (retriever "bm25").

    BM25 parameters default to Anserini's (k1=0.9, b=0.4). Empty queries get no hits.
    """

    retriever = "bm25"

    def __init__(self, store: LuceneStore, *, threads: int | None = None, k1: float = 0.9, b: float = 0.4,
                 batch: int = 2000):
        self.store, self.threads, self.batch = store, threads or default_threads(), batch
        self.store.searcher.set_bm25(k1, b)
        self.name = f"bm25(k1={k1},b={b})"

    def search(self, queries: pl.DataFrame, k: int) -> pl.DataFrame:
        queries, k = check_queries(queries), check_k(k)
        texts = queries["query"].to_list()
        pids: list[list[str]] = [[] for _ in texts]
        scores: list[list[float]] = [[] for _ in texts]
        todo = [i for i, t in enumerate(texts) if t.strip()]
        for start in tqdm(range(0, len(todo), self.batch), desc="bm25 search", unit="batch",
                          disable=len(todo) <= self.batch or None):
            rows = todo[start : start + self.batch]
            res = self.store.searcher.batch_search([texts[i] for i in rows], [str(i) for i in rows],
                                                   k=int(k), threads=self.threads)
            for i in rows:
                hits = res.get(str(i), [])
                pids[i] = [h.docid for h in hits]
                scores[i] = [float(h.score) for h in hits]
        return hits_frame(queries["qid"].to_list(), pids, scores, self.retriever)
