"""Embeddings shipped beside a corpus, so an index build need not encode it (docs/results.md).

Encoding the embedded corpus (10,116 passages, all-MiniLM-L6-v2) takes ~4 minutes on 2 CPU cores: most
of a newcomer's wait before the first answer. `write` encodes a corpus once and stores the vectors beside
its files, with a sidecar that pins what they were computed from:

    data/wiki/all-MiniLM-L6-v2.embeddings.npy    float32 [n, dim], L2-normalised, rows in corpus order
    data/wiki/all-MiniLM-L6-v2.embeddings.json   format, encoder, index LAYOUT, the corpus files (name,
                                                 sha256, in order), count, dim, the .npy's sha256, the CPU

`build_index` (index/build.py) takes them instead of encoding when the sidecar names exactly this
build's corpus files, encoder and layout, the .npy matches its sha256, AND the encoder on this machine
reproduces a sample of the rows (`SAMPLE` passages spread over the corpus, max |Δ| <= `TOLERANCE`);
anything else, and it encodes as before and says why. The index manifest records which it was.

Why a sample within a tolerance and not a checksum of a rebuild: float32 sums depend on the SIMD width
and on the batch a passage is encoded with (AVX2 and AVX-512 machines differ in the 7th digit), so two
honest rebuilds differ bit-wise; a wrong file (another model, another corpus order) differs at 1e-1.
Shipping the vectors makes every machine's index the same bits. `python -m clarify.index.shipped check
--full DIR` re-encodes every row and reports the largest difference and the top-10 agreement of the
ASQA dev questions' dense search (docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from clarify.errors import InputError
from clarify.index.manifest import CorpusEntry
from clarify.jsonl import read_json

FORMAT = "clarify-embeddings"
VERSION = 1
SAMPLE = 64  # rows re-encoded before shipped vectors are used
TOLERANCE = 1e-4  # max |Δ| of a re-encoded row; rebuilds on AVX2 vs AVX-512 differ by ~1e-6


def paths(folder: Path, encoder_name: str) -> tuple[Path, Path]:
    """(vectors .npy, sidecar .json) of `encoder_name`'s shipped embeddings in `folder`."""
    return folder / f"{encoder_name}.embeddings.npy", folder / f"{encoder_name}.embeddings.json"


def _corpus_key(corpus_entries: list[CorpusEntry]) -> list[dict]:
    return [{"name": c.name, "sha256": c.sha256} for c in corpus_entries]


def sample_rows(n: int, k: int = SAMPLE) -> np.ndarray:
    """`k` rows spread evenly over [0, n), first and last included."""
    return np.unique(np.linspace(0, n - 1, num=min(k, n)).round().astype(np.int64))


def find(corpus_entries: list[CorpusEntry], encoder, layout: int, count: int) -> tuple[np.ndarray | None, str]:
    """(vectors, why) for this build: the shipped vectors beside the first corpus file, checked, or
    (None, why not). `encoder`: index.dense.Encoder; `count`: passages read from the corpus."""
    from clarify.files import sha256 as sha256_file

    npy, meta = paths(Path(corpus_entries[0].path).parent, encoder.name)
    if not meta.is_file() or not npy.is_file():
        return None, f"no shipped embeddings ({meta.name} beside the corpus)"
    try:
        side = read_json(meta)
    except InputError as exc:
        return None, f"{meta} is not valid JSON ({exc.reason})"
    wanted = {"format": FORMAT, "version": VERSION, "encoder": encoder.name, "layout": layout,
              "corpus": _corpus_key(corpus_entries), "count": count, "dim": encoder.dim}
    differ = [k for k, v in wanted.items() if side.get(k) != v]
    if differ:
        return None, f"{meta.name} was made for another {', '.join(differ)}"
    if sha256_file(npy) != side.get("sha256"):
        return None, f"{npy.name} does not match its sha256 in {meta.name}"
    vectors = np.load(npy, mmap_mode="r")
    if vectors.shape != (count, encoder.dim) or vectors.dtype != np.float32:
        return None, f"{npy.name} holds {vectors.dtype} {vectors.shape}, expected float32 ({count}, {encoder.dim})"
    return vectors, "shipped"


def check_sample(vectors: np.ndarray, texts: list[str], encoder, rows: np.ndarray | None = None) -> float:
    """Largest |Δ| between shipped rows and this machine's encoding of the same passages."""
    rows = sample_rows(len(texts)) if rows is None else rows
    fresh = encoder.encode([texts[i] for i in rows])
    return float(np.abs(fresh - np.asarray(vectors[rows])).max())


def write(files: list[Path], *, encoder_spec: str = "default", device: str = "cpu") -> Path:
    """Encode the corpus `files` (in this order, as `build_index` reads them) on `device` (cpu, cuda:N) and
    write the vectors and their sidecar beside the first; returns the sidecar's path."""
    from clarify.files import sha256 as sha256_file
    from clarify.files import write_atomic, write_json
    from clarify.index.corpus import LAYOUT, corpus_entries, load_corpus
    from clarify.index.dense import Encoder, encode_to_memmap
    from clarify.local_llm.hardware import describe

    folder = files[0].parent
    entries = corpus_entries(files)
    passages = load_corpus(files).passages
    encoder = Encoder(encoder_spec, batch_size=16, device=device)
    npy, meta = paths(folder, encoder.name)
    t0 = time.perf_counter()
    write_atomic(npy, lambda tmp: encode_to_memmap(encoder, passages, tmp))  # flushed when it returns
    side = {"format": FORMAT, "version": VERSION, "encoder": encoder.name, "layout": LAYOUT,
            "corpus": _corpus_key(entries), "count": passages.height, "dim": encoder.dim, "dtype": "float32",
            "sha256": sha256_file(npy), "encode_s": round(time.perf_counter() - t0, 1), "cpu": describe(),
            "device": device,
            "command": "python -m clarify.index.shipped write " + " ".join(str(f) for f in files)}
    write_json(side, meta, sort_keys=False)
    return meta


def _shipped_in(folder: Path):
    """(passages, encoder, vectors) of the default corpus in `folder`; SystemExit when the shipped
    vectors there are not usable, saying why."""
    from clarify.index.corpus import DEFAULT_CORPUS_FILES, LAYOUT, corpus_entries, load_corpus
    from clarify.index.dense import Encoder

    files = [folder / name for name in DEFAULT_CORPUS_FILES]
    passages = load_corpus(files).passages
    encoder = Encoder("default", batch_size=16)
    vectors, why = find(corpus_entries(files), encoder, LAYOUT, passages.height)
    if vectors is None:
        raise SystemExit(f"shipped embeddings not usable: {why}")
    return passages, encoder, vectors


def check_full(folder: Path, *, queries: int = 100) -> dict:
    """Re-encode every shipped row as a build does (`encode_to_memmap`) and compare: largest |Δ|, and
    whether a flat index over the shipped vectors and one over the fresh vectors return the same top-10
    for the first `queries` ASQA dev questions."""
    import tempfile

    import faiss

    from clarify.asqa_file import load_asqa, shipped_path
    from clarify.index.dense import encode_to_memmap
    from clarify.local_llm.hardware import describe

    passages, encoder, shipped = _shipped_in(folder)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = np.array(encode_to_memmap(encoder, passages, Path(tmp) / "fresh.npy"))
    encode_s = time.perf_counter() - t0
    qs = load_asqa(shipped_path())[0]["question"].to_list()[:queries]
    q = encoder.encode(qs)
    tops = []
    for vecs in (np.asarray(shipped), fresh):
        index = faiss.IndexFlatIP(vecs.shape[1])
        index.add(vecs)
        tops.append(index.search(q, 10)[1])
    same = int(sum((a == b).all() for a, b in zip(*tops)))
    return {"rows": passages.height, "max_abs_diff": float(np.abs(fresh - shipped).max()),
            "queries": len(qs), "same_top10": same, "encode_s": round(encode_s, 1), "cpu": describe()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m clarify.index.shipped", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write", help="encode the corpus FILES and write their embeddings and sidecar beside them")
    w.add_argument("files", type=Path, nargs="+")
    w.add_argument("--device", default="cpu", help="cpu or cuda:N (the machine that encodes)")
    c = sub.add_parser("check", help="re-encode a sample (or --full: every row) and compare")
    c.add_argument("dir", type=Path)
    c.add_argument("--full", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "write":
        print(write(args.files, device=args.device))
        return 0
    if args.full:
        print(json.dumps(check_full(args.dir), indent=2))
        return 0
    from clarify.index.dense import passage_texts

    passages, encoder, vectors = _shipped_in(args.dir)
    diff = check_sample(vectors, passage_texts(passages), encoder)
    print(json.dumps({"sample": len(sample_rows(passages.height)), "max_abs_diff": diff, "tolerance": TOLERANCE}))
    return 0 if diff <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
