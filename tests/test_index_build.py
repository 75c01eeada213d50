"""Building, rebuilding and reopening real indexes (Lucene via Pyserini, FAISS) on a small shipped slice."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import polars as pl
import pytest

from clarify.errors import InputError
from clarify.index import build_index, open_index, read_passages
from clarify.schemas import check

from .fixtures_index import write_small_corpus

pytestmark = pytest.mark.integration


def _queries(passages: pl.DataFrame, n: int = 40) -> pl.DataFrame:
    sample = passages.sample(n, seed=7)
    return pl.DataFrame({"qid": sample["passage_id"], "query": sample["text"].str.slice(0, 120)})


def test_manifest_describes_the_build(small_index, small_corpus):
    manifest = json.loads((small_index / "manifest.json").read_text())
    assert manifest["passages"]["count"] == 300 and manifest["bm25"]["documents"] == 300
    assert manifest["dense"]["vectors"] == 300 and manifest["dense"]["dim"] == 384
    assert manifest["dense"]["faiss_class"] == "IndexFlatIP" and manifest["dense"]["encoder_name"] == "all-MiniLM-L6-v2"
    assert manifest["corpus"][0]["name"] == small_corpus.name and len(manifest["corpus"][0]["sha256"]) == 64
    idx = open_index(small_index)
    assert idx.verify() == []
    emb = np.load(small_index / "dense" / "embeddings.npy", mmap_mode="r")
    assert emb.dtype == np.float32 and emb.shape == (300, 384)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)
    assert (small_index / "dense" / "docid").read_text().splitlines() == idx.passages["passage_id"].to_list()
    assert idx.passages.equals(read_passages(small_corpus))


def test_rebuild_is_noop_and_change_is_detected(tmp_path):
    corpus = write_small_corpus(tmp_path / "c.jsonl", n_core=60, n_random=0)
    out = build_index([corpus], tmp_path / "idx", dense=False)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    t0 = time.perf_counter()
    assert build_index([corpus], out, dense=False) == out
    assert time.perf_counter() - t0 < 2.0 and (out / "manifest.json").stat().st_mtime_ns == stamp
    with open(corpus, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "new-1", "title": "Zanzibar", "text": "Quetzalcoatl visited Zanzibar."}) + "\n")
    with pytest.raises(InputError, match="corpus file 'c.jsonl' changed"):
        build_index([corpus], out, dense=False)
    with pytest.raises(InputError, match="setting 'dense' changed"):
        build_index([write_small_corpus(tmp_path / "c.jsonl", n_core=60, n_random=0)], out, dense=True)
    with open(corpus, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "new-1", "title": "Zanzibar", "text": "Quetzalcoatl visited Zanzibar."}) + "\n")
    build_index([corpus], out, dense=False, force=True)
    idx = open_index(out)
    assert idx.manifest.passages.count == 61 and idx.manifest.bm25.documents == 61
    hits = idx.searcher("bm25").search(pl.DataFrame({"qid": ["z"], "query": ["Quetzalcoatl"]}), 3)
    assert hits["passage_id"].to_list() == ["new-1"]
    assert not list(tmp_path.glob(".idx.building-*")) and not list(tmp_path.glob(".idx.old-*"))


def test_refuses_to_overwrite_foreign_directory(tmp_path, small_corpus):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    with pytest.raises(InputError, match="not a clarify index; refusing"):
        build_index([small_corpus], tmp_path / "mine", dense=False)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"
    assert not list(tmp_path.glob(".mine.lock"))  # the build lock is not left behind


def test_build_lock_serialises_and_leaves_nothing(tmp_path):
    import threading

    from clarify.index.lock import build_lock

    order = []

    def hold(name):
        with build_lock(tmp_path / "idx"):
            order.append(f"{name}+")
            time.sleep(0.2)
            order.append(f"{name}-")

    threads = [threading.Thread(target=hold, args=(n,)) for n in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pairs = [(order[i], order[i + 1]) for i in range(0, 6, 2)]
    assert all(a[0] == b[0] and a[1] + b[1] == "+-" for a, b in pairs)  # never two holders at once
    assert not list(tmp_path.glob(".idx.lock"))


def test_bad_corpus_fails_before_indexing(tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": "a", "text": "fine"}\n{"id": "b", "text": ""}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"bad.jsonl:2 \(field 'text'\): passage text is empty"):
        build_index([corpus], tmp_path / "idx", dense=False)
    assert not (tmp_path / "idx").exists()
    out = build_index([corpus], tmp_path / "idx", dense=False, skip_bad=True)
    m = open_index(out).manifest
    assert m.passages.count == 1 and m.passages.skipped == {"empty_text": 1}


def test_reopen_gives_identical_hits(small_index):
    a, b = open_index(small_index), open_index(small_index)
    queries = _queries(a.passages)
    for kind in ("bm25", "dense", "hybrid", "rerank"):
        ha, hb = a.searcher(kind).search(queries, 10), b.searcher(kind).search(queries, 10)
        check(ha, "hits")
        assert ha.height == 400 and ha.equals(hb), kind


def test_prebuilt_pyserini_dirs_open_as_they_are(small_index, tmp_path):
    """Our lucene/ and dense/ folders are plain Pyserini layouts: open them without our manifest."""
    shutil.copytree(small_index / "lucene", tmp_path / "lucene")
    shutil.copytree(small_index / "dense", tmp_path / "faiss")
    (tmp_path / "faiss" / "embeddings.npy").unlink()  # Pyserini's FAISS dirs have only index + docid
    ours, theirs = open_index(small_index), open_index(tmp_path / "lucene", faiss_dir=tmp_path / "faiss")
    ids = ours.passages["passage_id"].to_list()[::-7]
    assert theirs.passage_lookup(ids).equals(ours.passage_lookup(ids))  # text from the stored documents
    queries = _queries(ours.passages)
    for kind in ("bm25", "dense", "rerank"):
        assert theirs.searcher(kind).search(queries, 10).equals(ours.searcher(kind).search(queries, 10)), kind
    with pytest.raises(InputError, match="unknown passage id"):
        theirs.passage_lookup(["no-such-id"])


def test_opens_dpr_style_lucene_index(tmp_path):
    """A Lucene index made by Pyserini's own indexer with DPR-style `"Title"\\ntext` contents."""
    from clarify.index.jvm import start_jvm

    start_jvm()
    from pyserini.index.lucene import LuceneIndexer

    d = tmp_path / "dpr"
    ix = LuceneIndexer(str(d), args=["-index", str(d), "-storeRaw"], threads=1)
    ix.add_batch_raw([json.dumps({"id": "1", "contents": '"Aaron"\nAaron is a prophet, high priest.'}),
                      json.dumps({"id": "2", "contents": '"Zebra"\nZebras are African equines.'})])
    ix.close()
    idx = open_index(d)
    assert idx.passage_lookup(["2", "1"]).rows() == [("2", "Zebra", "Zebras are African equines."),
                                                     ("1", "Aaron", "Aaron is a prophet, high priest.")]
    hits = idx.searcher("bm25").search(pl.DataFrame({"qid": ["q"], "query": ["equines"]}), 5)
    assert hits["passage_id"].to_list() == ["2"]
    assert idx.passages.height == 2
    with pytest.raises(InputError, match="no dense"):
        idx.searcher("dense")


@pytest.mark.parametrize("kind, opts, min_overlap", [
    ("ivf", {"nlist": 16, "nprobe": 16}, 1.0),  # every list probed: must equal exact search
    ("ivf", {"nlist": 16, "nprobe": 4}, 0.5),
    ("hnsw", {"hnsw_m": 16}, 0.95),
])
def test_approximate_faiss_kinds(small_index, kind, opts, min_overlap):
    """IVF / HNSW over the small index's memmapped embeddings, against its exact (flat) search."""
    from clarify.index.dense import build_faiss

    idx = open_index(small_index)
    emb = np.load(small_index / "dense" / "embeddings.npy", mmap_mode="r")
    index, _ = build_faiss(emb, kind, **opts)
    queries = _queries(idx.passages)
    qv = idx.encoder.encode(queries["query"].to_list())
    _, rows = index.search(qv, 10)
    _, truth = idx.dense_index.index.search(qv, 10)
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, truth)])
    assert overlap >= min_overlap, overlap  # recall@10 against exact search


def test_build_with_hnsw_option(tmp_path):
    corpus = write_small_corpus(tmp_path / "c.jsonl", n_core=60, n_random=0)
    idx = open_index(build_index([corpus], tmp_path / "hnsw", bm25=False, faiss="hnsw", hnsw_m=8))
    assert idx.manifest.dense.faiss_class == "IndexHNSWFlat" and idx.manifest.bm25 is None
    assert idx.manifest.dense.faiss_params == {"M": 8, "efSearch": 128}
    queries = _queries(idx.passages, 10)
    top = idx.searcher("dense").search(queries, 1)
    assert (top["qid"] == top["passage_id"]).mean() >= 0.9


def test_cross_encoder_rerank_path(small_index, tmp_path):
    """The cross-encoder branch with a real sentence-transformers CrossEncoder. No PyPI package ships a
    trained cross-encoder (docs/architecture.md#no-cross-encoder-or-squad-reader-on-pypi), so this one is MiniLM with a freshly initialised scoring head: the
    test checks the plumbing (which pairs are scored, ordering, naming), not ranking quality."""
    import torch
    from sentence_transformers import CrossEncoder

    from clarify.index.dense import passage_texts, resolve_encoder_path

    torch.manual_seed(0)
    model_dir = tmp_path / "tiny-ce"
    CrossEncoder(str(resolve_encoder_path("default")[1]), num_labels=1, device="cpu").save_pretrained(str(model_dir))
    idx = open_index(small_index)
    rerank = idx.searcher("rerank", candidates=20, cross_encoder=str(model_dir))
    assert rerank.name == "rerank:cross-encoder:tiny-ce"
    queries = _queries(idx.passages, 3)
    top = rerank.search(queries, 5)
    check(top, "hits")
    fused = idx.searcher("hybrid", candidates=20).fused(queries, depth=20)  # BM25 top-20 ∪ dense top-20
    q0 = queries["qid"][0]
    cands = fused.filter(pl.col("qid") == q0)["passage_id"].to_list()
    texts = passage_texts(idx.passage_lookup(cands))
    scores = CrossEncoder(str(model_dir), device="cpu", max_length=512).predict([(queries["query"][0], t) for t in texts])
    want = [cands[i] for i in np.argsort(-np.asarray(scores), kind="stable")[:5]]
    assert top.filter(pl.col("qid") == q0)["passage_id"].to_list() == want
    with pytest.raises(InputError, match="cross-encoder must be a local model directory"):
        idx.searcher("rerank", cross_encoder=str(tmp_path / "nope"))


def test_batches_by_token_count_keep_vectors_and_top_k(small_index):
    """The build cuts its batches by token count (index/dense.py encode_to_memmap); rows stay
    in corpus order and equal encoding in corpus order (batches of mixed lengths) up to float rounding."""
    from clarify.index.dense import passage_texts

    idx = open_index(small_index)
    stored = np.load(small_index / "dense" / "embeddings.npy")
    texts = passage_texts(idx.passages)
    mixed = np.concatenate([idx.encoder.encode(texts[i : i + 64]) for i in range(0, len(texts), 64)])
    lengths = idx.encoder.token_lengths(texts)
    assert lengths.min() >= 3 and lengths.max() <= idx.encoder.model.max_seq_length
    assert np.abs(stored - mixed).max() < 1e-5
    queries = idx.encoder.encode(_queries(idx.passages)["query"].to_list())
    top = lambda v: np.argsort(-(queries @ v.T), axis=1, kind="stable")[:, :10]  # noqa: E731
    assert (top(stored) == top(mixed)).all()


def test_an_index_being_read_is_not_rebuilt_under_its_reader(tmp_path):
    """`build --force` replaced an index folder while a run read it: now a process that has
    the index open holds a shared lock on its folder, and the rebuild is refused, saying why, before
    any work; once the reader is gone it goes ahead."""
    import gc

    corpus = write_small_corpus(tmp_path / "c.jsonl", n_core=40, n_random=0)
    out = build_index([corpus], tmp_path / "idx", dense=False)
    reader = open_index(out)
    with open(corpus, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "new-1", "title": "Zanzibar", "text": "Quetzalcoatl visited Zanzibar."}) + "\n")
    with pytest.raises(InputError, match="being read by a running clarify process"):
        build_index([corpus], out, dense=False, force=True)
    assert reader.manifest.passages.count == 40 and not list(tmp_path.glob(".idx.building-*"))
    del reader
    gc.collect()
    build_index([corpus], out, dense=False, force=True)
    assert open_index(out).manifest.passages.count == 41


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stopped_rebuild_says_so_in_one_line_and_keeps_the_old_index(tmp_path, sig):
    """`clarify index build --force` stopped by a signal with the new index complete but not yet in place
    (clarify/faults.py `index-built`): one line, exit 128 + the signal, no build folder left, the old
    index as it was."""
    import os
    import signal
    import subprocess
    import sys

    corpus = write_small_corpus(tmp_path / "c.jsonl", n_core=30, n_random=0)
    out = build_index([corpus], tmp_path / "idx", dense=False)
    before = (out / "manifest.json").read_bytes()
    with open(corpus, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "new-1", "title": "Zanzibar", "text": "Quetzalcoatl visited Zanzibar."}) + "\n")
    argv = ["index", "build", "--corpus", str(corpus), "--out", str(out), "--no-dense", "--force"]
    env = {**os.environ, "CLARIFY_KILL_AT": "index-built", "CLARIFY_KILL_SIGNAL": sig}
    proc = subprocess.run([sys.executable, "-m", "clarify.batch.cli", *argv], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 128 + signal.Signals[sig].value, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"clarify index build: stopped by {sig}; nothing kept, run again: clarify {' '.join(argv)}")
    assert "Traceback" not in proc.stderr
    assert (out / "manifest.json").read_bytes() == before and not list(tmp_path.glob(".idx.*"))


def test_a_dpr_layout_tsv_corpus_builds(tmp_path):
    """DPR's psgs_w100.tsv layout (header id, text, title; text quoted) builds BM25 + dense."""
    rows = read_passages(write_small_corpus(tmp_path / "c.jsonl", n_core=30, n_random=10))
    with open(tmp_path / "psgs_w100.tsv", "w", encoding="utf-8") as fh:
        fh.write("id\ttext\ttitle\n")
        for pid, title, text in rows.iter_rows():
            fh.write(f"{pid}\t\"{text.replace(chr(34), chr(34) * 2)}\"\t{title}\n")
    out = build_index([tmp_path / "psgs_w100.tsv"], tmp_path / "idx")
    idx = open_index(out)
    assert idx.manifest.passages.count == 40 and idx.manifest.bm25.documents == 40
    assert idx.manifest.dense.vectors == 40
    assert idx.passages.equals(rows)
    queries = _queries(rows, 10)
    for kind in ("bm25", "dense"):
        hits = idx.searcher(kind).search(queries, 1)
        assert (hits["passage_id"] == hits["qid"]).mean() >= 0.9, kind


def test_a_build_with_nothing_to_do_does_not_read_the_corpus(tmp_path, monkeypatch):
    """Cheap re-runs: unchanged size and mtime -> no checksum; `verify` hashes anyway."""
    import os

    from clarify import files

    corpus = write_small_corpus(tmp_path / "c.jsonl", n_core=20, n_random=0)
    out = build_index([corpus], tmp_path / "idx", dense=False)
    hashed = []
    real = files.sha256
    monkeypatch.setattr(files, "sha256", lambda p: hashed.append(p) or real(p))
    build_index([corpus], out, dense=False)
    assert hashed == []  # a stat of each file, nothing read
    build_index([corpus], out, dense=False, verify=True)
    assert hashed == [corpus]
    st = corpus.stat()
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched, same bytes: hashed, still current
    hashed.clear()
    build_index([corpus], out, dense=False)
    assert hashed == [corpus] and open_index(out).manifest.corpus[0].mtime_ns == st.st_mtime_ns
    data = corpus.read_bytes()
    corpus.write_bytes(data.replace(b"a", b"e", 1))  # same size; mtime put back: only `verify` sees it
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns))
    build_index([corpus], out, dense=False)
    with pytest.raises(InputError, match="corpus file 'c.jsonl' changed"):
        build_index([corpus], out, dense=False, verify=True)


def test_the_collection_indexer_gives_the_same_bm25_hits_as_the_in_process_indexer(tmp_path):
    """Anserini's IndexCollection (child JVM, JsonCollection files, several threads) and the former
    in-process SimpleIndexer path index the embedded corpus into indexes with the same BM25 hits, ids and
    scores, and the same stored raw passages."""
    from clarify.asqa_file import load_asqa
    from clarify.eval import datasets
    from clarify.index.bm25 import BM25Searcher, LuceneStore, build_lucene, build_lucene_inprocess
    from clarify.index.default import default_corpus_files

    passages = read_passages(default_corpus_files())
    new = build_lucene(passages, tmp_path / "collection", threads=2, heap="1g")
    old = build_lucene_inprocess(passages, tmp_path / "inprocess")
    assert new["documents"] == old["documents"] == passages.height == 10116
    assert {k: new[k] for k in old} == old  # terms, unique terms, documents
    questions = load_asqa(datasets.get("asqa").default_path())[0]["question"].to_list()[:200]
    queries = pl.DataFrame({"qid": [str(i) for i in range(len(questions))], "query": questions})
    hits = []
    for folder in ("collection", "inprocess"):
        h = BM25Searcher(LuceneStore(tmp_path / folder)).search(queries, 20)
        hits.append(h.with_columns(pl.col("score").round(4)).sort("qid", "score", "passage_id",
                                                                  descending=[False, True, False]))
    assert hits[0].height == hits[1].height >= 20 * 190
    assert hits[0].select("qid", "passage_id", "score").equals(hits[1].select("qid", "passage_id", "score"))
    sample = passages.sample(50, seed=3)["passage_id"].to_list()
    assert LuceneStore(tmp_path / "collection").passages(sample).equals(passages.filter(
        pl.col("passage_id").is_in(sample)).sort(pl.col("passage_id").replace_strict(
            {p: i for i, p in enumerate(sample)}, return_dtype=pl.Int64)))
    assert not (tmp_path / "collection.collection").exists()


def test_the_next_build_rewrites_an_old_layout_manifest_without_rebuilding(tmp_path):
    """An index whose manifest was written before `schema_version` (index/manifest.py layout 1: the same
    keys without it) is up to date for the next build, which writes the manifest in the current layout
    and leaves the index's files alone."""
    corpus = write_small_corpus(tmp_path / "c.jsonl", n_core=30, n_random=0)
    out = build_index([corpus], tmp_path / "idx", dense=False)
    new = json.loads((out / "manifest.json").read_text())
    old = {k: v for k, v in new.items() if k != "schema_version"}
    (out / "manifest.json").write_text(json.dumps(old))
    segments = {p.name: p.stat().st_mtime_ns for p in (out / "lucene").iterdir()}
    assert open_index(out).manifest.schema_version == 1
    build_index([corpus], out, dense=False)
    assert json.loads((out / "manifest.json").read_text()) == new
    assert {p.name: p.stat().st_mtime_ns for p in (out / "lucene").iterdir()} == segments
