"""Passage encoding that scales and resumes (docs/retrieval.md#building-your-own-index-at-wikipedia-scale): length-sorted chunks, checkpoints, shards, workers.

The plan. Passages are ordered once by their length in characters (title + newline + text, counted from
the Arrow store with pyarrow compute, no Python string per passage), longest first, and cut into chunks
of CHUNK_ROWS passages. A chunk is the unit of work: its texts are read from the memory-mapped passage
store (index/textstore.py), ordered inside the chunk by token count (the encoder's own tokenizer) and cut
into batches, as `dense.encode_to_memmap` does for a whole corpus (bench/results/encode.json: batches of
similar token counts pad almost nothing). Only one chunk's texts are in memory at a time.

Checkpoints. Each finished chunk is written to the encoding folder (`.<index>.encoding/` beside the index)
as `chunk-NNNNNN.npy` (its rows' vectors, float32, in plan order), atomically: written to a temporary
name and renamed, so a process killed at any point (SIGKILL included) leaves only whole chunks. The folder
survives failures and later starts; `job.json` names what its chunks were computed from (corpus
checksums, encoder, layout, chunk size, batch size, device kind) and a build for anything else clears it.
A build resumes by encoding the chunks that are missing; assembling the chunks in plan order gives the
same vectors, and so the same FAISS index, as an uninterrupted build (tests/test_index_encode.py). The
folder is removed once the index is in place.

Shards and workers. `--shard i/n` encodes the chunks k with k % n == i (interleaved, so every shard gets
long and short passages) and stops: several nodes encode disjoint parts, `merge_shards` copies their
chunks into one encoding folder, and a build without --shard then only assembles. On one node the same
split runs as worker processes (`python -m clarify.index.encode worker`): one per GPU for
`--device cuda`, or `--processes N` on CPU (each with its share of the cores), while the parent shows
passages/s and the ETA from the chunks written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from clarify.errors import InputError
from clarify.files import write_atomic, write_json, write_npy
from clarify.jsonl import read_json

CHUNK_ROWS = 8192  # passages a checkpoint holds ($CLARIFY_ENCODE_CHUNK overrides: tests, benches)
JOB = "job.json"


def chunk_rows() -> int:
    return int(os.environ.get("CLARIFY_ENCODE_CHUNK") or CHUNK_ROWS)


def encoding_dir(out: Path) -> Path:
    """The encoding (checkpoint) folder of the index folder `out`: a sibling that survives failures."""
    out = Path(out)
    return out.parent / f".{out.name}.encoding"


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """"i/n" -> (i, n), 0 <= i < n; None for None."""
    if text in (None, ""):
        return None
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise InputError(f"--shard wants i/n, e.g. 0/4; got {text!r}", field="shard") from None
    if not 0 <= i < n:
        raise InputError(f"--shard {text}: need 0 <= i < n", field="shard")
    return i, n


def check_device(device: str) -> str:
    if device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        return device
    raise InputError(f"unknown device {device!r} (cpu, cuda or cuda:N)", field="device")


# -------------------------------------------------------------------------------------------- the plan
def char_lengths(store) -> np.ndarray:
    """Characters of each passage's encoder text (title + newline + text), in store order, vectorised."""
    import pyarrow.compute as pc

    parts = [np.zeros(0, dtype=np.int64)]
    for i in range(store.reader.num_record_batches):
        batch = store.reader.get_batch(i)
        title = pc.utf8_length(batch.column("title")).to_numpy(zero_copy_only=False).astype(np.int64)
        text = pc.utf8_length(batch.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)
        parts.append(text + np.where(title > 0, title + 1, 0))
    return np.concatenate(parts)


def plan(store, chunk: int) -> tuple[np.ndarray, int]:
    """(store rows in encoding order: longest first, stable; number of chunks)."""
    order = np.argsort(-char_lengths(store), kind="stable").astype(np.int64)
    return order, -(-len(order) // chunk)


def texts_of(store, rows: np.ndarray) -> list[str]:
    from clarify.index.dense import passage_texts

    return passage_texts(store.take(rows))


# --------------------------------------------------------------------------------------- checkpoints
def read_job(meta: Path) -> dict | None:
    """An encoding folder's job.json, or None when it is missing; a file that is not a JSON object is an
    InputError naming it (it is only ever written whole: something else wrote or damaged it)."""
    if not meta.is_file():
        return None
    try:
        job = read_json(meta)
    except InputError as exc:
        raise InputError(f"not a JSON job record ({exc.reason[:120]}): remove the encoding folder and encode "
                         f"again", path=str(meta), line=exc.line) from None
    if not isinstance(job, dict):
        raise InputError(f"not a job record (a JSON {type(job).__name__}, not an object): remove the encoding "
                         f"folder and encode again", path=str(meta))
    return job


class Checkpoints:
    """The encoding folder: job.json plus one `chunk-NNNNNN.npy` per finished chunk (module docstring), each
    with its record `chunk-NNNNNN.json` (shape, dtype and sha256 of the .npy, written after it), which a
    merge and the assembly check every chunk against (`check`)."""

    def __init__(self, folder: Path, job: dict):
        self.folder, self.job = Path(folder), job
        self.folder.mkdir(parents=True, exist_ok=True)
        meta = self.folder / JOB
        try:
            old = read_job(meta)
        except InputError:  # a damaged record of this folder: its chunks cannot be trusted, encode again
            old = None
        if old != job:
            stale = self.done()
            for k in stale:
                self.path(k).unlink(missing_ok=True)
                self.record(k).unlink(missing_ok=True)
            if stale:
                print(f"[clarify index] {self.folder}: {len(stale)} encoded chunks were for another corpus or "
                      f"settings; removed", file=sys.stderr, flush=True)
            write_json(job, meta)

    def path(self, k: int) -> Path:
        return self.folder / f"chunk-{k:06d}.npy"

    def record(self, k: int) -> Path:
        return self.folder / f"chunk-{k:06d}.json"

    def done(self) -> set[int]:
        return {int(p.stem.split("-")[1]) for p in self.folder.glob("chunk-*.npy")}

    def rows(self, k: int) -> int:
        return chunk_rows_of(self.job, k)

    def save(self, k: int, vectors: np.ndarray) -> None:
        write_npy(np.ascontiguousarray(vectors, dtype=np.float32), self.path(k))  # temp file, fsync, rename
        self._write_record(k, self.path(k))

    def _write_record(self, k: int, npy: Path) -> None:
        from clarify.files import sha256

        shape, dtype = _npy_header(npy)
        write_json({"shape": list(shape), "dtype": dtype, "sha256": sha256(npy)}, self.record(k))

    def check(self, k: int, npy: Path | None = None) -> None:
        check_chunk(self.job, k, npy or self.path(k))

    def load(self, k: int) -> np.ndarray:
        self.check(k)
        return np.load(self.path(k))


def chunk_rows_of(job: dict, k: int) -> int:
    """Rows of chunk k of `job`: its chunk size, the last chunk the rest."""
    return max(0, min(int(job["chunk"]), int(job["count"]) - k * int(job["chunk"])))


def check_chunk(job: dict, k: int, npy: Path) -> None:
    """InputError naming the file unless chunk k of `job` (its file `npy`) is a float32 array of
    (rows of chunk k, the job's dim) whose bytes are those its record holds (a chunk written before
    records existed is checked by its header and size alone)."""
    fix = "remove it and encode again (a build, or the shard that made it, resumes from the others)"
    if not 0 <= k < -(-int(job["count"]) // int(job["chunk"])):
        raise InputError(f"chunk number {k} is past the job's last chunk: {fix}", path=str(npy))
    try:
        shape, dtype = _npy_header(npy)
    except (OSError, ValueError) as exc:
        raise InputError(f"not a chunk of vectors ({str(exc)[:120]}): {fix}", path=str(npy)) from None
    want = (chunk_rows_of(job, k), int(job["dim"]))
    if dtype != "<f4" or tuple(shape) != want:
        raise InputError(f"holds {dtype} {tuple(shape)}, expected float32 {want}: {fix}", path=str(npy))
    record = npy.with_suffix(".json")
    if record.is_file():
        from clarify.files import sha256

        try:
            digest = read_json(record).get("sha256")
        except (InputError, AttributeError):
            digest = None
        if digest != sha256(npy):
            raise InputError(f"its bytes differ from those recorded when it was written ({record.name}): {fix}",
                             path=str(npy))


def _npy_header(npy: Path) -> tuple[tuple[int, ...], str]:
    """(shape, dtype string) of an .npy file from its header, ValueError when the file's size is not the
    one the header implies (cut short, or bytes added)."""
    with open(npy, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(fh)
        start = fh.tell()
    if fortran:
        raise ValueError("Fortran order")
    size = start + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if npy.stat().st_size != size:
        raise ValueError(f"{npy.stat().st_size} bytes, the header says {size}")
    return tuple(int(x) for x in shape), dtype.str


def encode_chunk(encoder, texts: list[str]) -> np.ndarray:
    """One chunk's vectors in the chunk's row order: batches cut by token count inside the chunk."""
    order = np.argsort(-encoder.token_lengths(texts), kind="stable")
    out = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    size = encoder.batch_size
    for start in range(0, len(texts), size):
        rows = order[start : start + size]
        out[rows] = encoder.encode([texts[i] for i in rows], batch_size=size)
    return out


def encode_missing(encoder, store, ckpt: Checkpoints, order: np.ndarray, chunk: int, todo: list[int], *,
                   progress: bool = True, desc: str = "encode passages") -> int:
    """Encode the chunks `todo` (skipping those already done), checkpointing each; returns chunks encoded."""
    from tqdm.auto import tqdm

    from clarify import faults

    done = ckpt.done()
    todo = [k for k in todo if k not in done]
    rows_todo = sum(len(order[k * chunk : (k + 1) * chunk]) for k in todo)
    with tqdm(total=rows_todo, desc=desc, unit="psg", disable=not progress or None) as bar:  # rate and ETA
        for i, k in enumerate(todo, start=1):
            rows = order[k * chunk : (k + 1) * chunk]
            ckpt.save(k, encode_chunk(encoder, texts_of(store, rows)))
            faults.point(f"encoded-chunk:{i}")  # the i-th chunk this process wrote (tests kill here)
            bar.update(len(rows))
    return len(todo)


def assemble(ckpt: Checkpoints, order: np.ndarray, chunk: int, dim: int, path: Path) -> np.memmap:
    """The chunks' vectors written into a float32 .npy memmap in store (corpus) order."""
    n = len(order)
    emb = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    for k in range(-(-n // chunk)):
        vec = ckpt.load(k)  # checked: shape, dtype, the checksum recorded when it was written
        rows = order[k * chunk : (k + 1) * chunk]
        if vec.shape != (len(rows), dim):
            raise InputError(f"encoded chunk {k} holds {vec.shape}, expected ({len(rows)}, {dim}): remove it and "
                             f"build again", path=str(ckpt.path(k)))
        emb[rows] = vec
    emb.flush()
    return emb


# -------------------------------------------------------------------------------------------- workers
def worker_devices(device: str, processes: int) -> list[str]:
    """One entry per worker: every visible GPU for "cuda", the one GPU for "cuda:N", `processes` CPUs."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        if count == 0:
            raise InputError("--device cuda: torch sees no GPU (CUDA_VISIBLE_DEVICES, the driver, a CUDA torch)",
                             field="device")
        return [f"cuda:{i}" for i in range(count)]
    if device.startswith("cuda:"):
        return [device]
    return ["cpu"] * max(1, processes)


def run_workers(args: dict, devices: list[str], ckpt: Checkpoints, n_rows: int, chunk: int, todo_rows: int, *,
                progress: bool = True) -> None:
    """Start one worker process per entry of `devices` (each takes the chunks k % len == its index) and wait,
    showing passages/s and the ETA from the chunks written. RuntimeError when a worker fails (the chunks
    written so far stay: the next build resumes)."""
    from tqdm.auto import tqdm

    cpus = max(1, len(os.sched_getaffinity(0)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = []
    for i, dev in enumerate(devices):
        threads = max(1, cpus // len(devices)) if dev == "cpu" else 0
        cmd = [sys.executable, "-m", "clarify.index.encode", "worker", "--shard", f"{i}/{len(devices)}",
               "--device", dev, "--threads", str(threads), "--job", json.dumps(args)]
        procs.append(subprocess.Popen(cmd, env=env))
    start_done = len(ckpt.done())
    try:
        with tqdm(total=todo_rows, desc=f"encode passages ({len(devices)} workers)", unit="psg",
                  disable=not progress or None) as bar:
            while any(p.poll() is None for p in procs):
                time.sleep(1.0)
                rows = min(todo_rows, (len(ckpt.done()) - start_done) * chunk)
                bar.update(rows - bar.n)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait()
    bad = [(d, p.returncode) for d, p in zip(devices, procs) if p.returncode != 0]
    if bad:
        raise RuntimeError(f"encoding workers failed: {bad}; the chunks encoded so far are kept in {ckpt.folder} "
                           f"and the next build resumes from them")


def _worker(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m clarify.index.encode worker")
    ap.add_argument("--shard", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--job", required=True, help="JSON: store, files, ckpt, job, encoder, batch_size, chunk")
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # docs/architecture.md#omp_wait_policypassive-outside-vllm
    spec = json.loads(a.job)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    from clarify.index.dense import Encoder
    from clarify.index.textstore import PassageStore

    i, n = parse_shard(a.shard)
    store = PassageStore(Path(spec["store"]), spec["files"])
    ckpt = Checkpoints(Path(spec["ckpt"]), spec["job"])
    encoder = Encoder(spec["encoder"], batch_size=spec["batch_size"], device=a.device)
    order, chunks = plan(store, spec["chunk"])
    encode_missing(encoder, store, ckpt, order, spec["chunk"], [k for k in range(chunks) if k % n == i],
                   progress=False)
    return 0


def merge_shards(target: Path, sources: list[Path]) -> int:
    """Copy the chunks of shard encoding folders `sources` into `target` (an index's encoding folder); all
    must hold the same job.json (same corpus, encoder and settings), and every chunk is checked (shape,
    dtype, the checksum recorded when it was written: `Checkpoints.check`) before anything is copied.
    Returns the chunks now in `target`."""
    target = Path(target)
    jobs = []
    for src in map(Path, sources):
        job = read_job(src / JOB)
        if job is None:
            raise InputError("not an encoding folder (no job.json)", path=str(src))
        jobs.append(job)
    if any(j != jobs[0] for j in jobs):
        raise InputError("the shard folders were encoded from different corpora or settings (job.json differ)",
                         path=str(sources[0]))
    if not all(isinstance(jobs[0].get(key), int) and jobs[0][key] > 0 for key in ("count", "chunk", "dim")):
        raise InputError("not a job record of clarify (count, chunk and dim must be positive integers)",
                         path=str(Path(sources[0]) / JOB))
    copies = []
    for src in map(Path, sources):
        if src.resolve() == target.resolve():
            continue
        for f in sorted(src.glob("chunk-*.npy")):
            try:
                k = int(f.stem.split("-")[1])
            except (IndexError, ValueError):
                raise InputError("not a chunk name (chunk-NNNNNN.npy)", path=str(f)) from None
            check_chunk(jobs[0], k, f)
            copies.append((k, f))
    ckpt = Checkpoints(target, jobs[0])  # every chunk is good: now the target is made
    for k, f in copies:
        if ckpt.path(k).exists():
            continue
        write_atomic(ckpt.path(k), lambda tmp, f=f: shutil.copyfile(f, tmp))
        ckpt._write_record(k, ckpt.path(k))
    return len(ckpt.done())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return _worker(argv[1:])
    raise SystemExit("usage: python -m clarify.index.encode worker --shard i/n --job JSON (started by the build)")


if __name__ == "__main__":
    sys.exit(main())
