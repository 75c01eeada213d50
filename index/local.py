"""Open an index folder: `open_index` checks it and gives a `LocalIndex` (docs/architecture.md#the-index).

Every path the manifest names must lie inside the index folder (`_inside`): an index opened from
elsewhere never makes clarify read another folder or load another encoder (docs/reproducibility.md#files-and-permissions).

`open_index` also opens, as they are, a prebuilt Pyserini Lucene index directory (passage text from
its stored documents) optionally paired with a Pyserini-format FAISS directory and a local encoder
(its checks before anything loads: index/faiss_check.py). Building an index: index/build.py.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from clarify import console
from clarify.errors import InputError
from clarify.files import sha256 as sha256_file
from clarify.index.faiss_check import check_dense, check_faiss_dir, docid_sample
from clarify.index.lock import read_lock
from clarify.index.manifest import MANIFEST, IndexManifest, read_manifest
from clarify.index.search import CANDIDATES, SEARCHER_KINDS, SearcherKind
from clarify.index.textstore import PassageStore


@dataclass(frozen=True)
class DenseOptions:
    """How a process opens the FAISS part (never what it finds, except nprobe/efSearch, which a run pins in
    its config): memory-mapped or read whole, search parameters (0: the index file's), OpenMP threads
    (0: this process's CPUs), device (the GPU hook, dense.to_gpu)."""

    mmap: bool = True
    nprobe: int = 0
    ef_search: int = 0
    threads: int = 0
    device: str = "cpu"


class LocalIndex:
    """An opened index: passages, searchers, encoder; `manifest`: its IndexManifest, None for a prebuilt one.

    passages            pl.DataFrame [passage_id, title, text] (a full copy: small indexes and tools)
    passage_lookup(ids) rows for these ids, in the given order (InputError for unknown ids); reads only
                        those passages (memory-mapped text store, or Lucene's stored documents)
    searcher(kind, candidates=CANDIDATES, cross_encoder=None) -> Searcher; kind: bm25 | dense | hybrid | rerank
    encoder             the query encoder (`encode(texts) -> float32 [n, dim]`; dense.load_encoder)
    """

    def __init__(self, path: Path, manifest: IndexManifest | None, *, lucene_dir: Path | None, dense_dir: Path | None,
                 encoder_spec: str | None, passages_file: Path | None, store: dict | None = None,
                 dense_options: DenseOptions | None = None):
        self.path, self.manifest = Path(path), manifest
        self._lucene_dir, self._dense_dir = lucene_dir, dense_dir
        self._encoder_spec, self._passages_file = encoder_spec, passages_file
        self._store_files, self._store = store, None
        self.dense_options = dense_options or DenseOptions()
        self._passages: pl.DataFrame | None = None
        self._row: dict[str, int] | None = None
        self._lucene = self._dense = self._encoder = None
        self._searchers: dict = {}
        reading = read_lock(self.path)  # held while this object lives: no rebuild under a reader
        if reading is not None:
            weakref.finalize(self, os.close, reading)

    def __repr__(self) -> str:
        return f"LocalIndex({self.path}, bm25={self.has_bm25}, dense={self.has_dense})"

    @property
    def has_bm25(self) -> bool:
        return self._lucene_dir is not None

    @property
    def has_dense(self) -> bool:
        return self._dense_dir is not None

    @property
    def dense_dir(self) -> Path | None:
        return self._dense_dir

    @property
    def encoder_spec(self) -> str:
        return self._encoder_spec or "default"

    # passages -----------------------------------------------------------------------------------
    @property
    def store(self) -> PassageStore | None:
        """The memory-mapped text store (index/textstore.py) of an index built with one (arrow-ipc), else None."""
        if self._store is None and self._store_files is not None:
            self._store = PassageStore(self.path, self._store_files)
        return self._store

    @property
    def passages(self) -> pl.DataFrame:
        if self._passages is None:
            if self.store is not None:
                self._passages = self.store.all()
            elif self._passages_file is not None:
                self._passages = pl.read_parquet(self._passages_file)
            else:  # a prebuilt Lucene index: read back every stored document
                self._passages = self.lucene.all_passages()
        return self._passages

    def passage_lookup(self, ids) -> pl.DataFrame:
        """passage ids -> passages [passage_id, title, text], one row per id in the given order."""
        ids = list(ids)
        if self.store is not None:
            return self.store.lookup(ids)
        if self._passages_file is None and self._passages is None:
            return self.lucene.passages(ids)
        if self._row is None:  # an index built before the text store (passages.parquet, read whole)
            self._row = {p: i for i, p in enumerate(self.passages["passage_id"].to_list())}
        missing = [p for p in ids if p not in self._row]
        if missing:
            raise InputError(f"{len(missing)} unknown passage id(s), e.g. {missing[:3]}", path=str(self.path))
        return self.passages[[self._row[p] for p in ids]] if ids else self.passages.clear()

    # components ----------------------------------------------------------------------------------
    @property
    def lucene(self):
        if self._lucene is None:
            if self._lucene_dir is None:
                raise InputError("this index has no BM25 (Lucene) part", path=str(self.path))
            from clarify.index.bm25 import LuceneStore

            self._lucene = LuceneStore(self._lucene_dir)
        return self._lucene

    @property
    def dense_index(self):
        if self._dense is None:
            if self._dense_dir is None:
                raise InputError("this index has no dense (FAISS) part: use the searcher bm25 (or rerank, which "
                                 "then reranks the BM25 candidates), or attach a FAISS index (--faiss-index)",
                                 path=str(self.path))
            from clarify.index.dense import DenseIndex

            o = self.dense_options
            self._dense = DenseIndex(self._dense_dir, mmap=o.mmap, nprobe=o.nprobe or None,
                                     ef_search=o.ef_search or None, threads=o.threads or None, device=o.device)
        return self._dense

    @property
    def encoder(self):
        if self._encoder is None:
            from clarify.index.dense import load_encoder

            self._encoder = load_encoder(self._encoder_spec)
        return self._encoder

    def searcher(self, kind: SearcherKind | str = SearcherKind.HYBRID, candidates: int = CANDIDATES, *,
                 cross_encoder: str | None = None, threads: int | None = None):
        """A Searcher: search(queries [qid, query], k) -> hits [qid, passage_id, score, rank, retriever].

        hybrid: union of BM25 and dense top-`candidates`, RRF (k=60). rerank: that union rescored by a
        cross-encoder (`cross_encoder`: a local directory; a run's `[retrieval] cross_encoder`), else by dense
        cosine. On an index without a dense part, rerank rescores the BM25 top-`candidates` instead.
        """
        if kind not in SEARCHER_KINDS:
            raise InputError(f"unknown searcher '{kind}' (use one of {', '.join(SEARCHER_KINDS)})", field="retriever")
        if candidates < 1:
            raise InputError("candidates must be at least 1", field="candidates")
        key = (kind, candidates, cross_encoder, threads)
        if key in self._searchers:
            return self._searchers[key]
        from clarify.index.search import HybridSearcher, RerankSearcher

        if kind == SearcherKind.BM25:
            from clarify.index.bm25 import BM25Searcher

            s = BM25Searcher(self.lucene, threads=threads)
        elif kind == SearcherKind.DENSE:
            from clarify.index.dense import DenseSearcher

            s = DenseSearcher(self.dense_index, self.encoder)
        elif kind == SearcherKind.HYBRID:
            if not self.has_dense:
                self.dense_index  # noqa: B018  (raises the error that says what to do)
            s = HybridSearcher(self.searcher(SearcherKind.BM25, threads=threads), self.searcher(SearcherKind.DENSE),
                               candidates=candidates)
        elif self.has_dense:
            s = RerankSearcher(self.searcher(SearcherKind.HYBRID, candidates, threads=threads), self.scorer(cross_encoder))
        else:
            s = RerankSearcher(self.searcher(SearcherKind.BM25, threads=threads), self.scorer(cross_encoder),
                               candidates=candidates)
        self._searchers[key] = s
        return s

    def scorer(self, cross_encoder: str | None = None):
        """The second-stage PairScorer: a cross-encoder (`cross_encoder`, a local directory), else the query
        encoder's similarity (cosine for sentence-transformers, inner product for DPR) with each passage's
        stored vector, or, on an index without a dense part, its text encoded by that same encoder. One
        instance per setting (a cross-encoder is loaded once)."""
        key = ("scorer", cross_encoder)
        if key not in self._searchers:
            if cross_encoder:
                from clarify.index.rerank import CrossEncoderScorer

                self._searchers[key] = CrossEncoderScorer(cross_encoder, self.passage_lookup)
            else:
                from clarify.index.rerank import DenseCosineScorer

                dense = self.dense_index if self.has_dense else None
                self._searchers[key] = DenseCosineScorer(self.encoder, dense, self.passage_lookup)
                how = ("which returns the dense ranking" if dense is not None else
                       "computed by encoding each BM25 candidate's text (this index has no dense part)")
                console.note("reranker", f"reranking fell back to the dense encoder's cosine ({how}) "
                                         "(no cross-encoder "
                                         "configured); set "
                                         "[retrieval] cross_encoder (clarify run --cross-encoder DIR) to a local "
                                         "sentence-transformers CrossEncoder directory for a real reranker "
                                         "(docs/retrieval.md#searchers-and-the-reranker).")
        return self._searchers[key]

    def check_attached(self) -> None:
        """A FAISS folder attached from elsewhere (`faiss_dir`) must index these passages: a sample of its
        docid lines (`docid_sample`) is looked up in them; InputError naming the docid file and a line whose
        id is not a passage here (its vectors would come back as passages this index cannot show). Opens
        the passages (for a prebuilt Lucene index, the JVM): a run calls it before its directory is made."""
        own = self.manifest.dense.dir if self.manifest and self.manifest.dense else None
        if self._dense_dir is None or (own and Path(self._dense_dir).resolve() == (self.path / own).resolve()):
            return
        docid = Path(self._dense_dir) / "docid"
        _, sample = docid_sample(docid)
        for line, pid in sample:
            try:
                self.passage_lookup([pid])
            except InputError:
                raise InputError(f"id {pid!r} is not a passage of the index {self.path}: this FAISS index was built "
                                 f"from another corpus (attach the one built from the index's passages)",
                                 path=str(docid), line=line, field="faiss_index") from None

    def verify(self) -> list[str]:
        """Recompute the manifest checksums (the full read of every file, on request); return the list of
        mismatches (empty = intact)."""
        bad: list[str] = []
        if self.manifest is None:  # a prebuilt index records no checksums
            return bad
        p, d = self.manifest.passages, self.manifest.dense
        if p.sha256 and sha256_file(_inside(self.path, p.file, "the passages file")) != p.sha256:
            bad.append(str(p.file))
        for name, digest in ((d.sha256 or {}) if d else {}).items():
            if sha256_file(_inside(self.path, f"{d.dir}/{name}", "a dense file")) != digest:
                bad.append(f"{d.dir}/{name}")
        return bad


ENCODER_FIX = ("rebuild it with `clarify index build ... --force` (an index now holds a copy of its encoder), "
               "or name the encoder yourself (`--encoder DIR`, open_index(encoder=DIR))")


def _inside(index: Path, name: object, what: str, *, fix: str = "rebuild the index") -> Path:
    """`index / name` for a path the manifest names, refused (InputError) unless it stays inside the index
    folder, links resolved: an index reads and loads only its own files, never another
    folder's, and never an encoder someone else's manifest points at."""
    manifest = str(index / MANIFEST)
    if not isinstance(name, str) or not name:
        raise InputError(f"broken index manifest: {what} is not named", path=manifest)
    target = index / name
    if not target.resolve().is_relative_to(index.resolve()):
        raise InputError(f"the manifest names {what} {name!r}, outside the index folder; an index uses only "
                         f"the files inside it: {fix}", path=manifest)
    return target


def _check_search_options(dense_dir: Path | None, options: DenseOptions | None) -> None:
    """nprobe / efSearch asked for: the index must have them (InputError now, not at the first search)."""
    if options is None or not (options.nprobe or options.ef_search):
        return
    if dense_dir is None:
        raise InputError("nprobe / ef_search are set but the index has no dense (FAISS) part", field="nprobe")
    import faiss

    from clarify.index.dense import mmap_flag, set_search_parameters

    set_search_parameters(faiss.read_index(str(dense_dir / "index"), mmap_flag()), nprobe=options.nprobe or None,
                          ef_search=options.ef_search or None)


def open_index(path, *, faiss_dir=None, encoder: str | None = None,
               dense_options: DenseOptions | None = None) -> LocalIndex:
    """Open an index directory: one built by clarify (manifest.json), or a prebuilt Pyserini Lucene index
    (optionally with a Pyserini-format FAISS directory `faiss_dir` and the local `encoder` that made it:
    a sentence-transformers folder or a Hugging Face DPRQuestionEncoder folder). `faiss_dir`/`encoder`
    also replace a clarify index's own dense part/encoder. Everything is checked here, before anything
    heavy loads (the FAISS header is read memory-mapped); InputError names the path that is wrong.
    """
    from clarify.index.bm25 import is_lucene_dir

    path = Path(path).expanduser()
    if not path.is_dir():
        raise InputError("index directory not found", path=str(path))
    faiss_dir = check_faiss_dir(faiss_dir) if faiss_dir else None
    manifest = read_manifest(path)
    if manifest is not None:
        bm25, dense, pinfo = manifest.bm25, manifest.dense, manifest.passages
        passages_file = _inside(path, pinfo.file, "the passages file")
        store = None
        if pinfo.format == "arrow-ipc":  # the memory-mapped text store (older indexes: passages.parquet)
            store = {k: str(_inside(path, getattr(pinfo, k), "a passage store file").relative_to(path))
                     for k in ("file", "ids", "rows")}
        lucene_dir = _inside(path, bm25.dir, "the BM25 folder") if bm25 else None
        dense_dir = _inside(path, dense.dir, "the dense folder") if dense else None
        for part in (passages_file, lucene_dir, dense_dir):
            if part is not None and not part.exists():
                raise InputError(f"index is incomplete: '{part.name}' is missing", path=str(path))
        spec = encoder or (dense.encoder if dense and not faiss_dir else None) or "default"
        if not encoder and spec != "default":  # the manifest's encoder: only one the index holds
            spec = str(_inside(path, spec, "the encoder folder", fix=ENCODER_FIX))
        dense_dir = faiss_dir or dense_dir
        if dense_dir is not None and (faiss_dir or encoder):
            check_dense(dense_dir, spec)
        _check_search_options(dense_dir, dense_options)
        return LocalIndex(path, manifest, lucene_dir=lucene_dir, dense_dir=dense_dir, encoder_spec=spec,
                          passages_file=None if store else passages_file, store=store, dense_options=dense_options)
    if is_lucene_dir(path):
        spec = encoder or "default"
        if faiss_dir is not None:
            check_dense(faiss_dir, spec)
        _check_search_options(faiss_dir, dense_options)
        return LocalIndex(path, None, lucene_dir=path, dense_dir=faiss_dir, encoder_spec=spec,
                          passages_file=None, dense_options=dense_options)
    if (path / "index").is_file() and (path / "docid").is_file():
        raise InputError("a FAISS directory holds no passage text: open the Lucene index of the same corpus and "
                         "pass this directory as faiss_dir (CLI: --faiss-index)", path=str(path))
    raise InputError("not an index directory (no manifest.json, Lucene segments_* or FAISS index/docid)", path=str(path))

