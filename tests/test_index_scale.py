"""Wikipedia-scale retrieval without a JVM: FAISS factory strings built, opened memory-mapped and searched with their
parameters pinned; the numpy docid map; the memory-mapped passage text store; cheap fingerprints;
the in-memory search cache."""

from __future__ import annotations

import json
import os

import numpy as np
import polars as pl
import pytest

from clarify.errors import InputError
from clarify.index.dense import DenseIndex, DocIds, build_faiss
from clarify.index.fingerprint import fingerprint
from clarify.index.textstore import PassageStore, write_store


def _vectors(n: int = 4000, dim: int = 32, seed: int = 0) -> np.ndarray:
    """Clustered unit vectors (as sentence embeddings are), so IVF/PQ have structure to find."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((40, dim))
    x = centres[rng.integers(0, 40, n)] + 0.35 * rng.standard_normal((n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _write(tmp_path, name, index, n):
    import faiss

    d = tmp_path / name
    d.mkdir()
    faiss.write_index(index, str(d / "index"))
    (d / "docid").write_text("".join(f"doc-{i}\n" for i in range(n)))  # Pyserini's docid file: one id a line
    return d


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, truth)]))


@pytest.mark.parametrize("factory, params, recall", [
    ("Flat", {}, 1.0),
    ("SQ8", {}, 0.9),
    ("HNSW16", {"efSearch": 128}, 0.9),
    ("IVF{nlist},Flat", {"nlist": 64, "nprobe": 16}, 0.85),
    ("IVF{nlist},PQ8", {"nlist": 64, "nprobe": 16}, 0.5),
])
def test_factory_strings_build_open_mmapped_and_search_with_their_parameters(tmp_path, factory, params, recall):
    emb = _vectors()
    index, facts = build_faiss(emb, factory, nlist=64, train_size=3000 if "IVF" in factory or "SQ" in factory
                               else None)
    assert facts["params"] == params
    assert facts["train_rows"] == (3000 if ("IVF" in factory or "SQ" in factory) else 0)
    d = _write(tmp_path, "idx", index, len(emb))
    mapped, whole = DenseIndex(d, mmap=True), DenseIndex(d, mmap=False)
    assert mapped.mapped and not whole.mapped and mapped.params == params
    q = emb[::97] + 0.01
    s1, r1 = mapped.index.search(q, 10)
    s2, r2 = whole.index.search(q, 10)
    assert np.array_equal(r1, r2) and np.allclose(s1, s2)  # the mapped index is the same index
    assert _recall(r1, np.argsort(-(q @ emb.T), axis=1)[:, :10]) >= recall
    assert mapped.docids.take(r1[0][:2]) == [f"doc-{r}" for r in r1[0][:2]]


def test_search_parameters_are_set_per_process_and_refused_where_absent(tmp_path):
    emb = _vectors(2000)
    ivf, _ = build_faiss(emb, "IVF32,PQ8", nprobe=4)
    d = _write(tmp_path, "ivf", ivf, len(emb))
    assert DenseIndex(d).params == {"nlist": 32, "nprobe": 4}  # as built
    assert DenseIndex(d, nprobe=32).params == {"nlist": 32, "nprobe": 32}  # the run's setting
    flat, _ = build_faiss(emb, "flat")
    f = _write(tmp_path, "flat", flat, len(emb))
    with pytest.raises(InputError, match="no search parameter nprobe"):
        DenseIndex(f, nprobe=8)
    hnsw, _ = build_faiss(emb, "hnsw", hnsw_m=8, ef_search=40)
    assert DenseIndex(_write(tmp_path, "hnsw", hnsw, len(emb)), ef_search=200).params == {"efSearch": 200}


def test_bad_factory_string_is_one_clear_error():
    from clarify.index.build import BuildOptions

    with pytest.raises(InputError, match="FAISS cannot make index 'IVF,Nonsense'"):
        BuildOptions(faiss="IVF,Nonsense")


def test_openmp_threads_are_set_explicitly(monkeypatch):
    import faiss

    from clarify.index.dense import set_threads

    assert set_threads(1) == 1 and faiss.omp_get_max_threads() == 1
    monkeypatch.setenv("CLARIFY_FAISS_THREADS", "2")
    assert set_threads(None) == 2 and faiss.omp_get_max_threads() == 2


def test_docid_map_is_numpy_and_finds_rows(tmp_path):
    ids = ["b-2", "a-1", "ünï-3", "c", "a-10"]
    (tmp_path / "docid").write_text("\n".join(ids) + "\n", encoding="utf-8")
    d = DocIds.read(tmp_path / "docid")
    assert d.ids.dtype.kind == "S" and len(d) == 5
    assert d.take([2, 0]) == ["ünï-3", "b-2"]
    assert d.rows(["a-10", "c", "ünï-3"]).tolist() == [4, 3, 2]
    with pytest.raises(InputError, match="not in the FAISS docid file, e.g. \\['a-'\\]"):
        d.rows(["a-"])
    (tmp_path / "docid").write_text("x\ny", encoding="utf-8")  # no final newline
    assert DocIds.read(tmp_path / "docid").take([1]) == ["y"]
    (tmp_path / "docid").write_text("", encoding="utf-8")
    assert len(DocIds.read(tmp_path / "docid")) == 0


def test_passage_store_reads_by_id_from_the_memory_map(tmp_path):
    import pyarrow as pa

    rows = pl.DataFrame({"passage_id": [f"p{i}" for i in range(1000)][::-1],
                         "title": [f"T{i}" for i in range(1000)], "text": [f"text {i} " * 20 for i in range(1000)]})
    files = write_store(rows, tmp_path, batch_rows=100)  # 10 record batches
    assert files["format"] == "arrow-ipc"
    before = pa.total_allocated_bytes()
    store = PassageStore(tmp_path)
    assert pa.total_allocated_bytes() == before  # opened zero-copy: the batches point into the map
    got = store.lookup(["p3", "p999", "p3", "p500"])  # rows from different batches, in the order asked
    assert got["passage_id"].to_list() == ["p3", "p999", "p3", "p500"]
    assert pa.total_allocated_bytes() - before < 100_000  # only those rows were copied out of the map
    assert got.row(0) == rows.filter(pl.col("passage_id") == "p3").row(0)
    assert store.lookup([]).height == 0 and len(store) == 1000
    with pytest.raises(InputError, match="2 unknown passage id\\(s\\), e.g. \\['nope', 'p1000000'\\]"):
        store.lookup(["p1", "nope", "p1000000"])


def test_fingerprint_is_cheap_and_sees_changes(tmp_path):
    big = tmp_path / "idx" / "index"
    big.parent.mkdir()
    big.write_bytes(os.urandom(4 << 20))
    first = fingerprint(big.parent)
    assert fingerprint(big.parent) == first and len(first) == 64
    st = os.stat(big)
    with open(big, "r+b") as fh:  # one byte in a sampled block, the mtime put back
        fh.write(b"\0" if fh.read(1) != b"\0" else b"\1")
    os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint(big.parent) != first
    second, full = fingerprint(big.parent), fingerprint(big.parent, full=True)
    with open(big, "r+b") as fh:  # a byte between the samples, the mtime put back: only `full` sees it
        fh.seek(100_000)
        b = fh.read(1)
        fh.seek(100_000)
        fh.write(bytes([(b[0] + 1) % 256]))
    os.utime(big, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint(big.parent) == second
    assert fingerprint(big.parent, full=True) != full
    os.utime(big)  # touched: the sampled fingerprint changes
    assert fingerprint(big.parent) != second


def test_search_cache_answers_from_memory_and_sees_other_processes(tmp_path, monkeypatch):
    from pathlib import Path

    from clarify.batch.run.search_cache import CachingSearcher
    from clarify.index.search import hits_frame

    class Inner:
        name = "fake"
        calls: list = []

        def search(self, queries, k):
            self.calls.append(queries["query"].to_list())
            q = queries["query"].to_list()
            return hits_frame(queries["qid"].to_list(), [[f"{x}-{r}" for r in range(k)] for x in q],
                              [[1.0 / (r + 1) for r in range(k)] for _ in q], "bm25")

    ident = {"searcher": "bm25", "index": "x"}
    a, b = CachingSearcher(Inner(), tmp_path, ident), CachingSearcher(Inner(), tmp_path, ident)
    q = pl.DataFrame({"qid": ["1", "2"], "query": ["alpha", "beta"]})
    first = a.search(q, 3)
    globs = []
    real_glob = Path.glob
    monkeypatch.setattr(Path, "glob", lambda self, pat: globs.append(pat) or real_glob(self, pat))
    again = a.search(q, 3)  # all known: no folder listing, no inner search
    assert again.equals(first) and globs == [] and Inner.calls == [["alpha", "beta"]]
    got = b.search(q.with_columns(qid=pl.Series(["x", "y"])), 3)  # another process' results, read on a miss
    assert got["passage_id"].to_list() == first["passage_id"].to_list() and Inner.calls == [["alpha", "beta"]]
    assert b.reused == 2 and b.searched == 0
    assert json.loads((a.folder / "identity.json").read_text()) == ident
