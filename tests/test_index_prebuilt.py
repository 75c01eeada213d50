"""Pyserini's prebuilt layouts (docs/retrieval.md#full-english-wikipedia-with-pyserinis-prebuilt-indexes) used as they are. Small indexes written by Pyserini's own tools
(Anserini's collection indexer with stored raw JSON as in `wikipedia-dpr-100w`; Pyserini's FAISS writer,
`index` + `docid`) and tiny DPR encoders built here (tests/prebuilt_layouts.py); searched like Pyserini
searches them, refused with one clear error when a part is wrong. The ToC run on them end to end, with the
real engine, is tests/test_toc_prebuilt.py (it sorts after the index tests: the engine loads in-process
where the other real-engine tests load it)."""

from __future__ import annotations

import os

import polars as pl
import pytest

from clarify.batch import config
from clarify.errors import InputError
from clarify.index import open_index
from tests.prebuilt_layouts import build_layouts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    return build_layouts(tmp_path_factory.mktemp("prebuilt"), n=200)


QUERIES = pl.DataFrame({"qid": ["a", "b", "c"], "query": ["who played fred and george weasley",
                                                          "when was the first iphone released",
                                                          "who voiced darth vader"]})


def test_dpr_faiss_and_lucene_search_as_pyserini_searches_them(layouts):
    """Our dense search over Pyserini's FAISS directory with the DPR question encoder (pooler output,
    inner product) ranks like Pyserini's own FaissSearcher + DprQueryEncoder; the passage text comes
    back from Lucene's stored raw JSON, title and text split as the corpus has them."""
    from tests.prebuilt_layouts import pyserini_dense_hits

    idx = open_index(layouts["lucene"], faiss_dir=layouts["faiss"], encoder=str(layouts["query_encoder"]))
    assert idx.encoder.kind == "dpr-question" and not idx.encoder.normalized and idx.encoder.dim == 24
    assert idx.dense_index.mapped and idx.dense_index.docids.ids.dtype.kind == "S"
    ours = idx.searcher("dense").search(QUERIES, 10)
    theirs = pyserini_dense_hits(layouts["faiss"], layouts["query_encoder"], QUERIES["query"].to_list(), 10)
    for qid, hits in zip(QUERIES["qid"], theirs):
        mine = ours.filter(pl.col("qid") == qid)
        assert mine["passage_id"].to_list() == [d for d, _ in hits]
        assert mine["score"].to_list() == pytest.approx([s for _, s in hits], abs=1e-3)
    by_id = {r["id"]: r for r in layouts["rows"]}
    got = idx.passage_lookup(ours["passage_id"].to_list()[:5])
    assert [(r["title"], r["text"]) for r in got.iter_rows(named=True)] == [
        (by_id[p]["title"], by_id[p]["text"]) for p in got["passage_id"]]


def test_a_bad_part_is_one_clear_error_naming_its_path(layouts, tmp_path):
    lucene, faiss_dir, q = layouts["lucene"], layouts["faiss"], str(layouts["query_encoder"])
    (tmp_path / "empty").mkdir()
    cases = [
        ({"faiss_dir": tmp_path / "missing", "encoder": q}, tmp_path / "missing", "FAISS index directory not found"),
        ({"faiss_dir": lucene, "encoder": q}, lucene, "'index' and 'docid' missing"),
        ({"faiss_dir": faiss_dir}, faiss_dir / "index", "gives 384-d vectors but the FAISS index holds 24-d"),
        ({"faiss_dir": faiss_dir, "encoder": str(layouts["context_encoder"])}, layouts["context_encoder"],
         "DPR context \\(passage\\) encoder"),
        ({"faiss_dir": faiss_dir, "encoder": str(tmp_path / "empty")}, tmp_path / "empty", "not an encoder folder"),
        ({"faiss_dir": faiss_dir, "encoder": str(tmp_path / "nope")}, tmp_path / "nope", "encoder directory not found"),
    ]
    for kw, path, words in cases:
        with pytest.raises(InputError, match=words) as err:
            open_index(lucene, **kw)
        assert err.value.path == str(path), (kw, err.value)


def test_bm25_only_index_reranks_its_bm25_candidates(layouts):
    """A prebuilt Lucene index without a dense part: `bm25` works, and `rerank` (the run default) rescores
    the BM25 top candidates with the query encoder's cosine over their text; hybrid/dense say what to do."""
    idx = open_index(layouts["lucene"])
    assert not idx.has_dense
    bm25 = idx.searcher("bm25").search(QUERIES, 20)
    rerank = idx.searcher("rerank", candidates=20)
    assert rerank.name == "rerank:dense-cosine:all-MiniLM-L6-v2(bm25(k1=0.9,b=0.4))"
    top = rerank.search(QUERIES, 5)
    for qid in QUERIES["qid"]:
        cands = set(bm25.filter(pl.col("qid") == qid)["passage_id"])
        got = top.filter(pl.col("qid") == qid)
        assert got.height == 5 and set(got["passage_id"]) <= cands
        assert got["score"].is_sorted(descending=True)
    assert top.filter(pl.col("qid") == "a")["passage_id"][0] in {"835a5e016d63bf15", "1887ad0e839abb35"}
    with pytest.raises(InputError, match="no dense \\(FAISS\\) part: use the searcher bm25"):
        idx.searcher("hybrid")


def test_run_refuses_a_bad_faiss_index_before_it_writes_anything(layouts, tmp_path):
    from clarify.batch.run.pipeline import run

    cfg = config.load(None, {"limit": 1, "index": str(layouts["lucene"]),
                             "retrieval.faiss_index": str(tmp_path / "missing"),
                             "retrieval.encoder": str(layouts["query_encoder"])})
    with pytest.raises(InputError, match="FAISS index directory not found"):
        run(cfg, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_a_worker_opens_exactly_what_the_driver_pinned(layouts, tmp_path):
    """What a Ray worker does (batch/run/cluster.py Worker): open the index, FAISS folder and encoder from the
    driver's inputs.json, refused when this node's copy has another fingerprint."""
    import dataclasses
    import shutil

    from clarify.batch.run.resources import open_run_index, prepare

    cfg = config.load(None, {"limit": 1, "index": str(layouts["lucene"]),
                             "retrieval.faiss_index": str(layouts["faiss"]),
                             "retrieval.encoder": str(layouts["query_encoder"])})
    pins = prepare(cfg, engine_factory=lambda c: None).inputs
    assert set(pins) >= {"index", "faiss_index", "encoder"}
    # the worker's own config says nothing about the FAISS folder: the pins decide
    bare = config.load(None, {"limit": 1, "index": str(layouts["lucene"])})
    idx = open_run_index(bare.index, bare.retrieval, pins)
    assert idx.dense_dir == layouts["faiss"] and idx.encoder_spec == str(layouts["query_encoder"])
    other = tmp_path / "faiss"
    shutil.copytree(layouts["faiss"], other)
    st = (other / "docid").stat()  # another node's copy that is not the same file (its count still agrees)
    os.utime(other / "docid", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    moved = {**pins, "faiss_index": dataclasses.replace(pins["faiss_index"], path=str(other))}
    with pytest.raises(InputError, match="faiss index differs from the one the driver pinned"):
        open_run_index(bare.index, bare.retrieval, moved)
