"""Local Wikipedia index: corpus -> Parquet, BM25 (Pyserini/Lucene), dense (sentence-transformers +
FAISS), hybrid RRF fusion, reranking, AC@k. Heavy libraries load only when a searcher is used.

    from clarify.index import open_index, ensure_default_index
    idx = open_index(ensure_default_index())
    hits = idx.searcher("rerank").search(queries, k=5)   # queries [qid, query] -> hits
"""

from clarify.index.build import BuildOptions, build_index
from clarify.index.corpus import load_corpus, read_passages
from clarify.index.coverage import answer_coverage, coverage_table, normalize_answer
from clarify.index.default import default_corpus_files, default_index_dir, ensure_default_index
from clarify.index.local import LocalIndex, open_index
from clarify.index.search import RRF_K, Searcher, rrf_fuse

__all__ = [
    "RRF_K",
    "BuildOptions",
    "LocalIndex",
    "Searcher",
    "answer_coverage",
    "build_index",
    "coverage_table",
    "default_corpus_files",
    "default_index_dir",
    "ensure_default_index",
    "load_corpus",
    "normalize_answer",
    "open_index",
    "read_passages",
    "rrf_fuse",
]
