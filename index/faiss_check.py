"""Checks of a Pyserini-layout FAISS folder (`index` + `docid`) before anything loads: its layout, its
dimension against the query encoder's, its docid lines against its vectors, and a sample of its docids
(attached from elsewhere: `[retrieval] faiss_index`, `--faiss-index`; docs/retrieval.md). One InputError
naming the path and what is wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clarify.errors import InputError


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
