"""Cheap identities of files and folders a run pins (inputs.json; docs/reproducibility.md): `fingerprint`, and
`index_pins` for the FAISS folder and query encoder attached to an index from elsewhere."""

from __future__ import annotations

from pathlib import Path

from clarify.files import sha256 as sha256_file

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
