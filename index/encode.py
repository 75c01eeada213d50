"""Passage encoding that scales and resumes (issue 28): length-sorted chunks, checkpoints, shards, workers.

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
class Checkpoints:
    """The encoding folder: job.json plus one `chunk-NNNNNN.npy` per finished chunk (module docstring)."""

    def __init__(self, folder: Path, job: dict):
        self.folder, self.job = Path(folder), job
        self.folder.mkdir(parents=True, exist_ok=True)
        meta = self.folder / JOB
        old = None
        if meta.is_file():
            try:
                old = json.loads(meta.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):
                old = None
        if old != job:
            stale = self.done()
            for k in stale:
                self.path(k).unlink(missing_ok=True)
            if stale:
                print(f"[clarify index] {self.folder}: {len(stale)} encoded chunks were for another corpus or "
                      f"settings; removed", file=sys.stderr, flush=True)
            write_json(job, meta)

    def path(self, k: int) -> Path:
        return self.folder / f"chunk-{k:06d}.npy"

    def done(self) -> set[int]:
        return {int(p.stem.split("-")[1]) for p in self.folder.glob("chunk-*.npy")}

    def save(self, k: int, vectors: np.ndarray) -> None:
        write_npy(np.ascontiguousarray(vectors, dtype=np.float32), self.path(k))  # temp file, fsync, rename

    def load(self, k: int) -> np.ndarray:
        return np.load(self.path(k))


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
        vec = ckpt.load(k)
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
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # FACTS.md: encoding on shared cores
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
    must hold the same job.json (same corpus, encoder and settings). Returns the chunks now in `target`."""
    target = Path(target)
    jobs = []
    for src in map(Path, sources):
        meta = src / JOB
        if not meta.is_file():
            raise InputError("not an encoding folder (no job.json)", path=str(src))
        jobs.append(json.loads(meta.read_text(encoding="utf-8")))
    if any(j != jobs[0] for j in jobs):
        raise InputError("the shard folders were encoded from different corpora or settings (job.json differ)",
                         path=str(sources[0]))
    ckpt = Checkpoints(target, jobs[0])
    for src in map(Path, sources):
        if src.resolve() == target.resolve():
            continue
        for f in sorted(src.glob("chunk-*.npy")):
            if not (target / f.name).exists():
                write_atomic(target / f.name, lambda tmp, f=f: shutil.copyfile(f, tmp))
    return len(ckpt.done())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return _worker(argv[1:])
    raise SystemExit("usage: python -m clarify.index.encode worker --shard i/n --job JSON (started by the build)")


if __name__ == "__main__":
    sys.exit(main())
