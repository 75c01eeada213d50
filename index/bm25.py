"""BM25 over a Lucene index with Pyserini (adapter module: starts the JVM, imports pyserini).

Building: each passage becomes one JsonCollection document `{"id", "contents": '"title"\\ntext'}`
indexed in-process with Anserini's SimpleIndexer, raw JSON stored (`-storeRaw`), so `doc(id).raw()`
gives the passage back. Pyserini's own indexer reports success even when it indexed 0 documents
(FACTS.md): after closing we count the documents in the index and fail if they differ.
"""

from __future__ import annotations

import json
import os
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


def build_lucene(passages: pl.DataFrame, out_dir: Path, *, threads: int | None = None, batch: int = 5000) -> dict:
    """Index passages [passage_id, title, text] into a new Lucene index at out_dir; return its stats."""
    start_jvm()
    from pyserini.index.lucene import LuceneIndexer, LuceneIndexReader

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
    stats = LuceneIndexReader(str(out_dir)).stats()
    if int(stats["documents"]) != n:
        raise RuntimeError(f"Lucene indexed {stats['documents']} documents but the corpus has {n} passages "
                           f"(index at {out_dir})")
    return {k: int(v) for k, v in stats.items()}


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
               tqdm(range(self.num_docs), desc="read stored ids", unit="doc", disable=self.num_docs < 50000)]
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
                          disable=len(todo) <= self.batch):
            rows = todo[start : start + self.batch]
            res = self.store.searcher.batch_search([texts[i] for i in rows], [str(i) for i in rows],
                                                   k=int(k), threads=self.threads)
            for i in rows:
                hits = res.get(str(i), [])
                pids[i] = [h.docid for h in hits]
                scores[i] = [float(h.score) for h in hits]
        return hits_frame(queries["qid"].to_list(), pids, scores, self.retriever)
