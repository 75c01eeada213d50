"""Build, open and cache local indexes (docs/architecture.md#the-index).

An index directory built by clarify:
    manifest.json        format, counts, encoder, dimensions, build settings, timings, checksums
                         (an IndexManifest, index/manifest.py: written by the build, read by every open)
    passages.parquet     the corpus as `passages` [passage_id, title, text]
    lucene/              Pyserini/Lucene BM25 index (raw JSON stored)
    dense/index, dense/docid, dense/embeddings.npy   FAISS (Pyserini layout) + float32 memmap
    encoders/NAME/       a copy of the encoder, when the build used one of the user's (`--encoder DIR`)

Every path the manifest names must lie inside the index folder (`_inside`): an index opened from
elsewhere never makes clarify read another folder or load another encoder (docs/reproducibility.md#files-and-permissions).

`open_index` also opens, as they are, a prebuilt Pyserini Lucene index directory (passage text from
its stored documents) optionally paired with a Pyserini-format FAISS directory and a local encoder.

Build is a no-op when the manifest matches the corpus checksums and settings; a changed corpus or
changed settings raise `InputError` unless `force=True` (then the index is rebuilt). Builds go to a
temporary sibling directory under a file lock and are moved into place when complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import shutil
import sys
import time
import weakref
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
import polars as pl

from clarify import console, faults, stops
from clarify.errors import InputError, need_file
from clarify.files import data_dir, home, make_dirs, modes, open_own
from clarify.files import sha256 as sha256_file
from clarify.index.corpus import DEFAULT_CORPUS_FILES, LAYOUT, corpus_entries, read_corpus_into
from clarify.index.encode import encoding_dir
from clarify.index.manifest import MANIFEST, SCHEMA, Bm25Part, DensePart, IndexManifest, Passages
from clarify.index.search import CANDIDATES
from clarify.index.textstore import IDS_FILE, ROWS_FILE, TEXT_FILE, PassageStore
from clarify.options import setting

ENCODERS = "encoders"  # a custom encoder is copied into <index>/encoders/<name> (the default is packaged)


class SearcherKind(StrEnum):
    """The searchers an index gives (`Index.searcher`); a run's `retrieval.searcher`."""

    BM25 = "bm25"
    DENSE = "dense"
    HYBRID = "hybrid"
    RERANK = "rerank"


SEARCHER_KINDS = tuple(k.value for k in SearcherKind)  # `clarify index search --retriever`


# ----------------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class BuildOptions:
    """What to build. `threads` and `batch_size` affect speed only and are not part of the identity."""

    # `clarify index build`'s flags are generated from these (index/cli.py); each default is the build's
    bm25: bool = setting(True, help="the Lucene index; the flag skips it", flag="--no-bm25", switch=False)
    dense: bool = setting(True, help="embeddings and FAISS; the flag skips them", flag="--no-dense", switch=False)
    encoder: str = setting("default", help="a local sentence-transformers dir, or \"default\": the packaged all-MiniLM-L6-v2",
                           flag="--encoder")
    faiss: str = setting("flat", help="FAISS index: flat | ivf | hnsw, or a faiss.index_factory string such as "
                                      "'IVF{nlist},PQ48', 'IVF{nlist},SQ8', 'SQ8', 'HNSW32' ({nlist}: the default "
                                      "list count); compressed types are what fits a full-Wikipedia index in RAM "
                                      "(docs/retrieval.md#full-english-wikipedia-with-pyserinis-prebuilt-indexes)",
                         flag="--faiss", metavar="KIND")
    nlist: int | None = setting(None, help="IVF lists; unset: ≈ 4·sqrt(n)", flag="--nlist")
    nprobe: int | None = setting(None, help="IVF lists searched per query; unset: min(nlist, max(16, 2·sqrt(nlist)))",
                                 flag="--nprobe")
    hnsw_m: int = setting(32, help="HNSW graph links per vector (faiss IndexHNSWFlat's M) of --faiss hnsw; a factory "
                                   "string names its own, e.g. 'HNSW32'", flag="--hnsw-m", metavar="M")
    ef_search: int | None = setting(None, help="HNSW efSearch stored in the index; unset: 128", flag="--ef-search")
    train_size: int | None = setting(None, help="vectors the index is trained on; unset: 256 per IVF list, at least "
                                                "16,384 for PQ/SQ", flag="--train-size")
    skip_bad: bool = setting(False, help="skip bad rows (and count them) instead of failing", flag="--skip-bad",
                             switch=True)
    # batches are cut by token count (bench/results/encode.json); unset: the CPU/CUDA settings table's
    # "encode batch_size" row for `device` (local_llm/settings.py)
    batch_size: int | None = setting(None, help="encoder batch size (batches are cut by token count); unset: CPU 16, "
                                                "CUDA 256, from the CPU/CUDA settings table", flag="--batch-size")
    threads: int | None = setting(None, help="Lucene indexing threads; unset: every CPU", flag="--threads")
    jvm_heap: str | None = setting(None, help="JVM heap (-Xmx) of the Lucene build, e.g. 16g; unset: a quarter of "
                                              "RAM, 1g-16g (index/jvm.py)", flag="--jvm-heap", metavar="SIZE")
    device: str = setting("cpu", help="encode on cpu | cuda (one worker per visible GPU) | cuda:N", flag="--device")
    processes: int = setting(1, help="encoding worker processes on CPU, each with its share of the cores",
                             flag="--processes")

    def __post_init__(self):
        if not (self.bm25 or self.dense):
            raise InputError("nothing to build: both BM25 and dense are switched off")
        if not isinstance(self.faiss, str) or not self.faiss:
            raise InputError("the FAISS index kind must be flat | ivf | hnsw or a faiss.index_factory string",
                             field="faiss")
        if self.dense and self.faiss not in ("flat", "ivf", "hnsw"):
            from clarify.index.dense import check_factory

            check_factory(self.faiss.replace("{nlist}", "64"))
        from clarify.index.encode import check_device

        check_device(self.device)
        if self.hnsw_m < 2 or self.processes < 1 or any(v is not None and v < 1 for v in (
                self.batch_size, self.nlist, self.nprobe, self.ef_search, self.train_size)):
            raise InputError("batch_size, hnsw_m, nlist, nprobe, ef_search and train_size must be positive",
                             field="build options")

    def identity(self) -> dict:
        d = {"layout": LAYOUT, **asdict(self)}
        for key in ("threads", "batch_size", "jvm_heap", "device", "processes"):  # speed only
            d.pop(key)
        for key in ("ef_search", "train_size"):  # added with attached indexes: absent when unset, so indexes built
            if d[key] is None:                    # before it keep their identity (no rebuild)
                d.pop(key)
        if self.encoder not in ("", "default"):
            d["encoder"] = str(Path(self.encoder).expanduser().resolve())
        return d


# --------------------------------------------------------------------------------------------- helpers
def _current_corpus(files: list[Path], manifest: IndexManifest | None, *, verify: bool = False) -> list[dict]:
    """The corpus files' identities for a build (index/corpus.py `corpus_entries`), cheaply: a file whose
    name, size and mtime are those the manifest recorded keeps the manifest's sha256 (a stat, no read:
    seconds for a 21M-passage corpus); any other file, or every file with `verify`, is hashed in full."""
    cheap = corpus_entries(files, checksum=False)
    old = {c.get("name"): c for c in (manifest.corpus if manifest else ())}
    out = []
    for f, entry in zip(files, cheap):
        prev = old.get(entry["name"])
        if (not verify and prev and prev.get("sha256") and prev.get("bytes") == entry["bytes"]
                and prev.get("mtime_ns") == entry["mtime_ns"]):
            out.append({**entry, "sha256": prev["sha256"]})
        else:
            out.append(corpus_entries([f])[0])
    return out


def read_manifest(path: Path) -> IndexManifest | None:
    """The manifest of the index folder `path` (index/manifest.py), or None when it holds none."""
    mf = Path(path) / MANIFEST
    return IndexManifest.read(mf) if mf.is_file() else None


def _differences(manifest: IndexManifest, corpus: list[dict], options: BuildOptions) -> list[str]:
    diffs = []
    old = {c["name"]: c for c in manifest.corpus}
    new = {c["name"]: c for c in corpus}
    for name in sorted(set(old) | set(new)):
        if name not in old:
            diffs.append(f"corpus file '{name}' was added")
        elif name not in new:
            diffs.append(f"corpus file '{name}' was removed")
        elif old[name]["sha256"] != new[name]["sha256"]:
            diffs.append(f"corpus file '{name}' changed (sha256 {old[name]['sha256'][:12]} -> {new[name]['sha256'][:12]})")
    if [c["name"] for c in manifest.corpus] != [c["name"] for c in corpus] and not diffs:
        diffs.append("corpus files are given in a different order")
    for key, value in options.identity().items():
        if manifest.build.get(key) != value:
            diffs.append(f"setting '{key}' changed ({manifest.build.get(key)!r} -> {value!r})")
    encoder = manifest.dense.encoder if manifest.dense else None
    if encoder not in (None, "", "default") and not str(encoder).startswith(f"{ENCODERS}/"):
        diffs.append("the index does not hold a copy of its encoder (built by an older clarify)")
    return diffs


@contextlib.contextmanager
def _lock(out: Path):
    """Exclusive build of `out` (flock on `.NAME.lock` beside it), removed when done. The holder unlinks
    the file while it holds the lock; a waiter that then gets the lock on the unlinked file sees that
    the path no longer names its file (another inode, or none) and locks the current one instead."""
    make_dirs(out.parent)
    lock_path = out.parent / f".{out.name}.lock"
    while True:
        try:
            fd = open_own(lock_path)  # never through a planted link (files.open_own)
        except OSError as exc:
            raise InputError(f"cannot lock the index build: {exc.strerror or exc}", path=str(lock_path)) from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        lock_path.unlink(missing_ok=True)
        os.close(fd)  # releases the flock


def _flock_folder(path: Path, op: int) -> tuple[int | None, bool]:
    """Open the folder `path` and try the flock `op` on it without waiting: (its descriptor, or None when
    it cannot be opened; whether the lock is held — also where the file system has no flock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None, False
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
    except BlockingIOError:
        return fd, False
    except OSError:
        pass
    return fd, True


def _read_lock(path: Path) -> int | None:
    """A shared flock on the index folder itself (no file is written: the folder may be another user's,
    read-only), held by every process that reads the index; `build --force` takes it exclusively before
    it replaces the folder (`_no_readers`). Not held while a rebuild swaps the folder in (the folder is
    complete either way)."""
    return _flock_folder(path, fcntl.LOCK_SH)[0]


def _no_readers(out: Path, *, wait: bool = False) -> int | None:
    """An exclusive flock on an existing index folder, or InputError when a process is reading it (a
    run, a search): a rebuild must not replace an index under a run. `wait`: wait for the readers
    instead, saying so. The caller closes the descriptor once the new folder is in place."""
    fd, held = _flock_folder(out, fcntl.LOCK_EX)
    if fd is None or held:
        return fd
    if wait:
        _log(f"waiting for the processes reading {out} to finish before replacing it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd
    os.close(fd)
    raise InputError("the index is being read by a running clarify process (a run, a search): let it finish "
                     "or stop it, or build into another folder", path=str(out))


def _log(msg: str, *, show: bool = True) -> None:
    """An index build message: on the terminal (stderr) when `show`, else only in the log."""
    if show:
        print(f"[clarify index] {msg}", file=sys.stderr, flush=True)
    else:
        logging.getLogger("clarify.index").info(msg)


# ----------------------------------------------------------------------------------------------- build
def build_index(corpus, out, *, options: BuildOptions | None = None, force: bool = False, verify: bool = False,
                shard: tuple[int, int] | None = None, **option_kw) -> Path:
    """Build an index from corpus files (JSONL / Parquet / TSV) into directory `out`; return `out`.

    No-op when `out` already holds an index built from the same files (sha256) with the same settings; a
    file whose size and mtime are unchanged is not hashed again unless `verify` (`_current_corpus`).
    A changed corpus or changed settings -> InputError listing the differences, unless `force=True`.
    `option_kw` are BuildOptions fields (bm25=, dense=, encoder=, faiss=, nlist=, hnsw_m=, skip_bad=, ...).
    Encoding resumes from the chunks a killed build left in the encoding folder (index/encode.py).
    `shard=(i, n)`: only encode the chunks of shard i of n into the encoding folder and return that folder
    (no index: merge the shards' folders, `encode.merge_shards`, and build without a shard).
    """
    options = options or BuildOptions(**option_kw)
    files = [Path(corpus)] if isinstance(corpus, str | Path) else [Path(c) for c in corpus]
    if not files:
        raise InputError("no corpus files given")
    out = Path(out).expanduser()
    if shard is not None and not options.dense:
        raise InputError("--shard splits the encoding: it needs the dense part (drop --no-dense)", field="shard")
    for f in files:
        need_file(f, "corpus file")
    with _lock(out):
        for stale in out.parent.glob(f".{out.name}.building-*"):  # we hold the lock: leftovers of killed builds
            shutil.rmtree(stale, ignore_errors=True)
        if out.exists():
            if not out.is_dir():
                raise InputError("index output path exists and is not a directory", path=str(out))
            manifest = read_manifest(out)
            if manifest is None and any(out.iterdir()):
                raise InputError("directory exists, is not empty and is not a clarify index; refusing to overwrite it",
                                 path=str(out))
            if manifest is not None:
                current = _current_corpus(files, manifest, verify=verify)
                diffs = _differences(manifest, current, options)
                if not diffs:
                    _log(f"{out} is up to date ({manifest.passages.count} passages); nothing to do",
                         show=False)
                    if manifest.schema_version < SCHEMA:  # the writer upgrades an old layout (index/manifest.py)
                        try:
                            dataclasses.replace(manifest, schema_version=SCHEMA).write(out / MANIFEST)
                            _log(f"{out / MANIFEST} rewritten in the current layout (schema_version {SCHEMA})")
                        except OSError as exc:  # a folder this user may read, not write: it stays readable
                            _log(f"{out / MANIFEST} kept in its old layout: {exc.strerror or exc}", show=False)
                    return out
                if not force:
                    raise InputError("index was built from a different corpus or with other settings: "
                                     + "; ".join(diffs) + " (rebuild with --force / force=True)", path=str(out))
                if (fd := _no_readers(out)) is not None:  # refused now, not hours into the build
                    os.close(fd)
                _log(f"rebuilding {out}: " + "; ".join(diffs))
        current = corpus_entries(files)  # a build hashes every file once
        tmp = out.parent / f".{out.name}.building-{os.getpid()}"
        tmp.mkdir(mode=modes()[0])
        _log(f"building {out} from {', '.join(f.name for f in files)}")
        try:
            manifest = _build_into(tmp, files, current, options, encoding=encoding_dir(out), shard=shard)
            if manifest is None:  # a shard: its chunks are in the encoding folder
                return encoding_dir(out)
            dataclasses.replace(manifest, path_built=str(out.resolve())).write(tmp / MANIFEST)
            faults.point("index-built")
            old = None
            readers = _no_readers(out, wait=True)  # one that started reading since the check above
            with stops.deferred():  # a stop signal never falls between the two renames (no index at all)
                if out.exists():
                    old = out.parent / f".{out.name}.old-{os.getpid()}"
                    os.replace(out, old)
                os.replace(tmp, out)
            if readers is not None:
                os.close(readers)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
            shutil.rmtree(encoding_dir(out), ignore_errors=True)  # the index is in place: checkpoints done
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build_into(tmp: Path, files: list[Path], entries: list[dict], options: BuildOptions, *, encoding: Path,
                shard: tuple[int, int] | None = None) -> IndexManifest | None:
    timings = {}
    t0 = time.perf_counter()
    read = read_corpus_into(files, tmp, skip_bad=options.skip_bad)  # streamed into the store (index/corpus.py)
    if read.n_skipped:
        _log(f"skipped {read.n_skipped} bad rows: {dict(read.skipped)}; e.g. " + " | ".join(read.examples[:3]))
    store = read.store
    texts = PassageStore(tmp, store)  # memory-mapped: the phases below stream from it
    timings["read_s"] = round(time.perf_counter() - t0, 3)
    created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    passages = Passages(read.count, store["file"], store["ids"], store["rows"], store["format"],
                        sha256=sha256_file(tmp / store["file"]), skipped=dict(read.skipped))
    bm25 = dense = None
    if options.bm25 and shard is None:
        from clarify.index.bm25 import build_lucene

        t0 = time.perf_counter()
        stats = build_lucene(texts, tmp / "lucene", threads=options.threads, heap=options.jvm_heap)
        timings["lucene_s"] = round(time.perf_counter() - t0, 3)
        bm25 = Bm25Part(
            "lucene", stats["documents"],
            stats={k: stats[k] for k in ("total_terms", "documents", "non_empty_documents", "unique_terms")
                   if k in stats},
            indexer=f"Anserini IndexCollection (JsonCollection, -storeRaw), {stats['threads']} threads, "
                    f"heap {stats['heap']}",
            contents="'\"' + title + '\"\\n' + text (DPR convention)", analyzer="Anserini DefaultEnglishAnalyzer (porter)",
            files={p.name: p.stat().st_size for p in sorted((tmp / "lucene").iterdir()) if p.is_file()},
        )
    if options.dense:
        import faiss

        from clarify.index.dense import DEFAULT_ENCODER, Encoder, build_faiss
        from clarify.index.encode import worker_devices
        from clarify.local_llm.settings import encode_setting

        dense_dir = tmp / "dense"
        dense_dir.mkdir()
        t0 = time.perf_counter()
        devices = worker_devices(options.device, options.processes)
        batch = options.batch_size or encode_setting("batch_size", "cpu" if options.device == "cpu" else "cuda")
        encoder = Encoder(options.encoder, batch_size=batch, device=devices[0] if len(devices) == 1 else "cpu")
        encoder_spec = DEFAULT_ENCODER
        if options.encoder not in ("", DEFAULT_ENCODER):  # the index holds its own encoder (`_inside`)
            encoder_spec = f"{ENCODERS}/{encoder.name}"
            shutil.copytree(encoder.path, tmp / encoder_spec)
        emb, source = (None, {"source": "encoded", "shipped": "a shard build"}) if shard else _shipped_embeddings(
            entries, encoder, texts, dense_dir / "embeddings.npy")
        if emb is None:
            emb, facts = _encode(texts, encoder, options, entries, devices, encoding, dense_dir, shard)
            if emb is None:
                return None
            source |= facts
        timings["encode_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        index, facts = build_faiss(emb, options.faiss, nlist=options.nlist, nprobe=options.nprobe,
                                   hnsw_m=options.hnsw_m, ef_search=options.ef_search, train_size=options.train_size)
        faiss.write_index(index, str(dense_dir / "index"))
        _write_docids(dense_dir, texts)
        timings["faiss_s"] = round(time.perf_counter() - t0, 3)
        del emb
        dense = DensePart(
            "dense", encoder_spec, encoder_name=encoder.name, encoder_path=str(encoder.path), dim=encoder.dim,
            normalized=True, metric="inner_product", faiss=options.faiss, factory=facts["factory"],
            faiss_class=type(index).__name__, vectors=int(index.ntotal), train_rows=facts["train_rows"],
            # search parameters stored in the index file; a run may set others ([retrieval] nprobe, ef_search)
            faiss_params=facts["params"] | ({"M": options.hnsw_m} if options.faiss == "hnsw" else {}),
            passage_text="title + '\\n' + text",
            embeddings=source,
            sha256={name: sha256_file(dense_dir / name) for name in ("index", "docid", "embeddings.npy")},
        )
    return IndexManifest(tuple(entries), passages, options.identity(), bm25, dense, timings, created)


def _write_docids(dense_dir: Path, texts: PassageStore) -> None:
    """Pyserini's `docid` file (one passage id a line, row order), streamed from the store's id column
    (ids hold no newline: index/corpus.py refuses them)."""
    with open(dense_dir / "docid", "w", encoding="utf-8") as fh:
        for i in range(texts.reader.num_record_batches):
            ids = texts.reader.get_batch(i).column("passage_id").to_pylist()
            if ids:
                fh.write("\n".join(ids) + "\n")


def _encode(texts: PassageStore, encoder, options: BuildOptions, entries: list[dict], devices: list[str],
            encoding: Path, dense_dir: Path, shard: tuple[int, int] | None):
    """Encode the store's passages through checkpointed chunks (index/encode.py): resume from the chunks
    `encoding` holds, encode the missing ones (this shard's only, with `shard`) in this process or in one
    worker per device, then assemble embeddings.npy. Returns (memmap, facts), or (None, facts) for a shard."""
    from clarify.index import encode as enc

    chunk = enc.chunk_rows()
    order, chunks = enc.plan(texts, chunk)
    job = {"corpus": [[e["name"], e["sha256"]] for e in entries], "count": len(texts), "layout": LAYOUT,
           "encoder": encoder.name, "dim": encoder.dim, "chunk": chunk, "batch_size": encoder.batch_size,
           "device": "cpu" if options.device == "cpu" else "cuda"}
    ckpt = enc.Checkpoints(encoding, job)
    mine = [k for k in range(chunks) if shard is None or k % shard[1] == shard[0]]
    done = ckpt.done()
    todo = [k for k in mine if k not in done]
    if done:
        _log(f"resuming the encoding: {len(done)} of {chunks} chunks already in {encoding}")
    rows_todo = sum(len(order[k * chunk : (k + 1) * chunk]) for k in todo)
    _log(f"encoding {rows_todo} of {len(texts)} passages in {len(todo)} chunks of {chunk} on "
         f"{', '.join(sorted(set(devices)))} x{len(devices) if shard is None else 1}, batch {encoder.batch_size}; "
         f"checkpoints in {encoding}")
    t0 = time.perf_counter()
    if todo and (len(devices) == 1 or shard is not None):
        enc.encode_missing(encoder, texts, ckpt, order, chunk, todo)
    elif todo:
        spec = {"store": str(texts.folder), "files": {"file": TEXT_FILE, "ids": IDS_FILE, "rows": ROWS_FILE},
                "ckpt": str(encoding), "job": job, "encoder": options.encoder, "batch_size": encoder.batch_size,
                "chunk": chunk}
        enc.run_workers(spec, devices, ckpt, len(texts), chunk, rows_todo)
    facts = {"chunks": chunks, "chunks_resumed": len(done), "chunks_encoded": len(todo),
             "workers": 1 if shard is not None else len(devices), "device": options.device,
             "encode_only_s": round(time.perf_counter() - t0, 3)}
    if shard is not None:
        _log(f"shard {shard[0]}/{shard[1]}: {len(mine)} chunks in {encoding}; merge every shard's folder into one "
             f"(clarify index merge-shards) and build without --shard")
        return None, facts
    missing = sorted(set(range(chunks)) - ckpt.done())
    if missing:
        raise RuntimeError(f"{len(missing)} encoded chunks are missing from {encoding} (e.g. {missing[:3]})")
    return enc.assemble(ckpt, order, chunk, encoder.dim, dense_dir / "embeddings.npy"), facts


def _shipped_embeddings(entries: list[dict], encoder, texts: PassageStore, out: Path):
    """(memmap, source) with the corpus' shipped vectors copied to `out` when they are usable here
    (index/shipped.py), else (None, source) saying why they were not; `source` goes in the manifest."""
    from clarify.index import shipped
    from clarify.index.dense import passage_texts

    n = len(texts)
    vectors, why = shipped.find(entries, encoder, LAYOUT, n)
    if vectors is None:
        return None, {"source": "encoded", "shipped": why}
    rows = shipped.sample_rows(n)
    diff = shipped.check_sample(vectors, dict(zip(rows.tolist(), passage_texts(texts.take(rows)))), encoder, rows)
    npy, _ = shipped.paths(Path(entries[0]["path"]).parent, encoder.name)
    if diff > shipped.TOLERANCE:
        _log(f"shipped embeddings {npy.name} differ from this machine's encoder by {diff:.2g} "
             f"(> {shipped.TOLERANCE:g}) on a sample: encoding the corpus instead")
        return None, {"source": "encoded", "shipped": f"sample differs by {diff:.3g}"}
    shutil.copyfile(npy, out)
    _log(f"dense: shipped embeddings {npy.name} (a sample of {len(rows)} "
         f"re-encoded here agrees to {diff:.1g})", show=False)
    return np.load(out, mmap_mode="r"), {"source": "shipped", "file": str(npy), "sample_max_abs_diff": diff}


# ------------------------------------------------------------------------------------------------ open
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
        reading = _read_lock(self.path)  # held while this object lives: no rebuild under a reader
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


def check_faiss_dir(faiss_dir) -> Path:
    """A Pyserini FAISS directory (`index` + `docid`), or InputError naming the path and what is wrong."""
    d = Path(faiss_dir).expanduser()
    if not d.exists():
        raise InputError("FAISS index directory not found", path=str(d), field="faiss_index")
    if not d.is_dir():
        raise InputError("the FAISS index must be a directory holding 'index' and 'docid' (Pyserini's layout)",
                         path=str(d), field="faiss_index")
    missing = [n for n in ("index", "docid") if not (d / n).is_file()]
    if missing:
        raise InputError(f"not a Pyserini FAISS index directory: {' and '.join(repr(m) for m in missing)} missing",
                         path=str(d), field="faiss_index")
    return d


def check_dense(dense_dir: Path, encoder_spec: str | None) -> tuple[int, int]:
    """Before anything loads: the encoder folder's kind and dimension (its config files) against the
    FAISS index's (its header, memory-mapped). One InputError on a mismatch. Returns (dim, vectors)."""
    from clarify.index.dense import encoder_dim, encoder_kind, read_header, resolve_encoder_path

    dim, count = read_header(dense_dir / "index")
    _, enc_path = resolve_encoder_path(encoder_spec)
    if encoder_spec not in (None, "", "default"):
        encoder_kind(enc_path)
    enc_dim = encoder_dim(enc_path)
    if enc_dim != dim:
        raise InputError(f"the query encoder gives {enc_dim}-d vectors but the FAISS index holds {dim}-d vectors: "
                         f"name the encoder the index was built with (--encoder DIR, [retrieval] encoder)",
                         path=str(dense_dir / "index"), field="encoder")
    lines, _ = docid_sample(dense_dir / "docid", 0)
    if lines != count:
        raise InputError(f"'docid' has {lines} lines but the index holds {count} vectors: row i of the index is "
                         f"line i of docid, so both must come from one FAISS build", path=str(dense_dir / "docid"),
                         field="faiss_index")
    return dim, count


DOCID_SAMPLES = 16  # docid lines looked up in the passages when a FAISS folder is attached (first, last, between)


def docid_sample(docid: Path, n: int = DOCID_SAMPLES) -> tuple[int, list[tuple[int, str]]]:
    """(lines of a Pyserini `docid` file, up to `n` of its (line number, id) spread over it: first, last and
    evenly between), from a memory map (a 21M-line file: a fraction of a second)."""
    size = docid.stat().st_size
    if size == 0:
        return 0, []
    data = np.memmap(docid, dtype=np.uint8, mode="r")
    ends = np.flatnonzero(data == 10)
    if data[-1] != 10:
        ends = np.append(ends, size)
    count = len(ends)
    picks = sorted({int((count - 1) * i / max(1, n - 1)) for i in range(n)}) if n else []
    out = []
    for i in picks:
        start = int(ends[i - 1]) + 1 if i else 0
        out.append((i + 1, bytes(data[start:int(ends[i])]).decode("utf-8", "replace")))
    return count, out


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


# ------------------------------------------------------------------------------------------- identities
SAMPLE_BLOCK = 1 << 16  # bytes read at each sampled offset
SAMPLES = 8  # sampled blocks per file (first, last and evenly between)


def fingerprint(path, *, full: bool = False) -> str:
    """A cheap identity of a file or folder: each file's relative name, size and mtime, plus a hash of
    SAMPLES blocks of SAMPLE_BLOCK bytes spread over it (first, last, between) — ~0.5 MB read per
    file, so a 60 GB index costs milliseconds to seconds, and a changed or replaced file (new mtime,
    size, or content at the sampled places) changes it. `full`: hash every byte instead (sha256 of
    each file; minutes at 60 GB), for `clarify index verify`-style checks on request."""
    import hashlib

    root = Path(path)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    h = hashlib.sha256(b"full" if full else b"sampled")
    for f in files:
        st = f.stat()
        name = f.name if f == root else str(f.relative_to(root))
        h.update(f"{name}\0{st.st_size}\0".encode())
        if full:
            h.update(sha256_file(f).encode())
            continue
        h.update(str(st.st_mtime_ns).encode())
        with open(f, "rb") as fh:
            last = max(0, st.st_size - SAMPLE_BLOCK)
            for off in sorted({int(last * i / (SAMPLES - 1)) for i in range(SAMPLES)}):
                fh.seek(off)
                h.update(fh.read(SAMPLE_BLOCK))
    return h.hexdigest()


def index_pins(index) -> dict:
    """What a run pins of its retrieval inputs (inputs.json) beyond the index itself: the FAISS folder and
    the query encoder attached to it from elsewhere (`[retrieval] faiss_index`, `encoder`), by path and
    cheap fingerprint. {} for an index opened with its own parts."""
    out = {}
    manifest = getattr(index, "manifest", None)
    own_dense = manifest.dense.dir if manifest is not None and manifest.dense else None
    dense_dir = getattr(index, "dense_dir", None)
    if dense_dir is not None and (own_dense is None
                                  or Path(dense_dir).resolve() != (Path(index.path) / own_dense).resolve()):
        out["faiss_index"] = {"path": str(dense_dir), "fingerprint": fingerprint(dense_dir)}
    spec = getattr(index, "encoder_spec", "default")
    if spec not in ("", "default") and not Path(spec).resolve().is_relative_to(Path(index.path).resolve()):
        from clarify.index.dense import encoder_kind

        out["encoder"] = {"path": str(spec), "kind": encoder_kind(Path(spec)), "fingerprint": fingerprint(spec)}
    return out


# -------------------------------------------------------------------------------------- default index
def default_index_dir() -> Path:
    return home() / "index" / "wiki-default"


def default_corpus_files() -> list[Path]:
    """The shipped Wikipedia passages (data/wiki, ≈10k): core, DPR extra, DPR random distractors."""
    data = data_dir()
    files = [data / "wiki" / name for name in DEFAULT_CORPUS_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise InputError(f"shipped corpus files are missing: {missing} (set CLARIFY_DATA to the data/ folder)")
    return files


def ensure_default_index() -> Path:
    """Build the embedded default index once into $CLARIFY_HOME/index/wiki-default (progress bars);
    a no-op when built and unchanged, rebuilt when the shipped corpus changed. Returns its path."""
    return build_index(default_corpus_files(), default_index_dir(), options=BuildOptions(), force=True)




def default_index_status() -> dict:
    """The embedded index without opening it (for `clarify doctor`): path, whether built, whether it
    matches the shipped corpus and settings (the differences a rebuild would fix), and its manifest."""
    path = default_index_dir()
    manifest = read_manifest(path) if path.is_dir() else None
    status = {"path": str(path), "built": manifest is not None, "manifest": manifest, "differences": []}
    if manifest is not None:
        status["differences"] = _differences(manifest, _current_corpus(default_corpus_files(), manifest),
                                             BuildOptions())
    return status
