"""Build an index folder from corpus files (docs/architecture.md#the-index).

An index directory built by clarify:
    manifest.json        format, counts, encoder, dimensions, build settings, timings, checksums
                         (an IndexManifest, index/manifest.py: written by the build, read by every open)
    passages.parquet     the corpus as `passages` [passage_id, title, text]
    lucene/              Pyserini/Lucene BM25 index (raw JSON stored)
    dense/index, dense/docid, dense/embeddings.npy   FAISS (Pyserini layout) + float32 memmap
    encoders/NAME/       a copy of the encoder, when the build used one of the user's (`--encoder DIR`)

Build is a no-op when the manifest matches the corpus checksums and settings; a changed corpus or
changed settings raise `InputError` unless `force=True` (then the index is rebuilt). Builds go to a
temporary sibling directory under a file lock (index/lock.py) and are moved into place when complete.
Opening an index: index/local.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from clarify import faults, stops
from clarify.errors import InputError, need_file
from clarify.files import modes
from clarify.files import sha256 as sha256_file
from clarify.index.corpus import LAYOUT, corpus_entries, read_corpus_into
from clarify.index.encode import encoding_dir
from clarify.index.lock import build_lock, no_readers
from clarify.index.manifest import (
    MANIFEST,
    SCHEMA,
    Bm25Part,
    CorpusEntry,
    DensePart,
    IndexManifest,
    Passages,
    read_manifest,
)
from clarify.index.textstore import IDS_FILE, ROWS_FILE, TEXT_FILE, PassageStore
from clarify.options import setting

ENCODERS = "encoders"  # a custom encoder is copied into <index>/encoders/<name> (the default is packaged)


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


# ------------------------------------------------------------------------- the index in place vs this build
def current_corpus(files: list[Path], manifest: IndexManifest | None, *, verify: bool = False) -> list[CorpusEntry]:
    """The corpus files' identities for a build (index/corpus.py `corpus_entries`), cheaply: a file whose
    name, size and mtime are those the manifest recorded keeps the manifest's sha256 (a stat, no read:
    seconds for a 21M-passage corpus); any other file, or every file with `verify`, is hashed in full."""
    cheap = corpus_entries(files, checksum=False)
    old = {c.name: c for c in (manifest.corpus if manifest else ())}
    out = []
    for f, entry in zip(files, cheap):
        prev = old.get(entry.name)
        if (not verify and prev and prev.sha256 and prev.bytes == entry.bytes
                and prev.mtime_ns == entry.mtime_ns):
            out.append(entry.with_(sha256=prev.sha256))
        else:
            out.append(corpus_entries([f])[0])
    return out


def differences(manifest: IndexManifest, corpus: list[CorpusEntry], options: BuildOptions) -> list[str]:
    """What a rebuild of the index `manifest` describes would change, one sentence each (empty: up to date)."""
    diffs = []
    old = {c.name: c for c in manifest.corpus}
    new = {c.name: c for c in corpus}
    for name in sorted(set(old) | set(new)):
        if name not in old:
            diffs.append(f"corpus file '{name}' was added")
        elif name not in new:
            diffs.append(f"corpus file '{name}' was removed")
        elif old[name].sha256 != new[name].sha256:
            diffs.append(f"corpus file '{name}' changed (sha256 {old[name].sha256[:12]} -> {new[name].sha256[:12]})")
    if [c.name for c in manifest.corpus] != [c.name for c in corpus] and not diffs:
        diffs.append("corpus files are given in a different order")
    for key, value in options.identity().items():  # the settings this build records, each as the index has it
        if manifest.build.value(key) != value:
            diffs.append(f"setting '{key}' changed ({manifest.build.value(key)!r} -> {value!r})")
    encoder = manifest.dense.encoder if manifest.dense else None
    if encoder not in (None, "", "default") and not str(encoder).startswith(f"{ENCODERS}/"):
        diffs.append("the index does not hold a copy of its encoder (built by an older clarify)")
    return diffs


def log(msg: str, *, show: bool = True) -> None:
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
    file whose size and mtime are unchanged is not hashed again unless `verify` (`current_corpus`).
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
    with build_lock(out):
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
                current = current_corpus(files, manifest, verify=verify)
                diffs = differences(manifest, current, options)
                if not diffs:
                    log(f"{out} is up to date ({manifest.passages.count} passages); nothing to do",
                         show=False)
                    if manifest.schema_version < SCHEMA:  # the writer upgrades an old layout (index/manifest.py)
                        try:
                            dataclasses.replace(manifest, schema_version=SCHEMA).write(out / MANIFEST)
                            log(f"{out / MANIFEST} rewritten in the current layout (schema_version {SCHEMA})")
                        except OSError as exc:  # a folder this user may read, not write: it stays readable
                            log(f"{out / MANIFEST} kept in its old layout: {exc.strerror or exc}", show=False)
                    return out
                if not force:
                    raise InputError("index was built from a different corpus or with other settings: "
                                     + "; ".join(diffs) + " (rebuild with --force / force=True)", path=str(out))
                if (fd := no_readers(out)) is not None:  # refused now, not hours into the build
                    os.close(fd)
                log(f"rebuilding {out}: " + "; ".join(diffs))
        current = corpus_entries(files)  # a build hashes every file once
        tmp = out.parent / f".{out.name}.building-{os.getpid()}"
        tmp.mkdir(mode=modes()[0])
        log(f"building {out} from {', '.join(f.name for f in files)}")
        try:
            manifest = _build_into(tmp, files, current, options, encoding=encoding_dir(out), shard=shard)
            if manifest is None:  # a shard: its chunks are in the encoding folder
                return encoding_dir(out)
            dataclasses.replace(manifest, path_built=str(out.resolve())).write(tmp / MANIFEST)
            faults.point("index-built")
            old = None
            readers = no_readers(out, wait=log)  # one that started reading since the check above
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


def _build_into(tmp: Path, files: list[Path], entries: list[CorpusEntry], options: BuildOptions, *, encoding: Path,
                shard: tuple[int, int] | None = None) -> IndexManifest | None:
    timings = {}
    t0 = time.perf_counter()
    read = read_corpus_into(files, tmp, skip_bad=options.skip_bad)  # streamed into the store (index/corpus.py)
    if read.n_skipped:
        log(f"skipped {read.n_skipped} bad rows: {dict(read.skipped)}; e.g. " + " | ".join(read.examples[:3]))
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


def _encode(texts: PassageStore, encoder, options: BuildOptions, entries: list[CorpusEntry], devices: list[str],
            encoding: Path, dense_dir: Path, shard: tuple[int, int] | None):
    """Encode the store's passages through checkpointed chunks (index/encode.py): resume from the chunks
    `encoding` holds, encode the missing ones (this shard's only, with `shard`) in this process or in one
    worker per device, then assemble embeddings.npy. Returns (memmap, facts), or (None, facts) for a shard."""
    from clarify.index import encode as enc

    chunk = enc.chunk_rows()
    order, chunks = enc.plan(texts, chunk)
    job = {"corpus": [[e.name, e.sha256] for e in entries], "count": len(texts), "layout": LAYOUT,
           "encoder": encoder.name, "dim": encoder.dim, "chunk": chunk, "batch_size": encoder.batch_size,
           "device": "cpu" if options.device == "cpu" else "cuda"}
    ckpt = enc.Checkpoints(encoding, job)
    mine = [k for k in range(chunks) if shard is None or k % shard[1] == shard[0]]
    done = ckpt.done()
    todo = [k for k in mine if k not in done]
    if done:
        log(f"resuming the encoding: {len(done)} of {chunks} chunks already in {encoding}")
    rows_todo = sum(len(order[k * chunk : (k + 1) * chunk]) for k in todo)
    log(f"encoding {rows_todo} of {len(texts)} passages in {len(todo)} chunks of {chunk} on "
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
        log(f"shard {shard[0]}/{shard[1]}: {len(mine)} chunks in {encoding}; merge every shard's folder into one "
             f"(clarify index merge-shards) and build without --shard")
        return None, facts
    missing = sorted(set(range(chunks)) - ckpt.done())
    if missing:
        raise RuntimeError(f"{len(missing)} encoded chunks are missing from {encoding} (e.g. {missing[:3]})")
    return enc.assemble(ckpt, order, chunk, encoder.dim, dense_dir / "embeddings.npy"), facts


def _shipped_embeddings(entries: list[CorpusEntry], encoder, texts: PassageStore, out: Path):
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
    npy, _ = shipped.paths(Path(entries[0].path).parent, encoder.name)
    if diff > shipped.TOLERANCE:
        log(f"shipped embeddings {npy.name} differ from this machine's encoder by {diff:.2g} "
             f"(> {shipped.TOLERANCE:g}) on a sample: encoding the corpus instead")
        return None, {"source": "encoded", "shipped": f"sample differs by {diff:.3g}"}
    shutil.copyfile(npy, out)
    log(f"dense: shipped embeddings {npy.name} (a sample of {len(rows)} "
         f"re-encoded here agrees to {diff:.1g})", show=False)
    return np.load(out, mmap_mode="r"), {"source": "shipped", "file": str(npy), "sample_max_abs_diff": diff}
