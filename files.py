"""Where clarify's files live, and the one way it writes them.

- `home()`: `$CLARIFY_HOME` (default `~/.cache/clarify`), everything generated — converted models, the
  embedded index, demo vectors, NLTK tables, logs. Never in git.
- `data_dir()`: `$CLARIFY_DATA`, else the `data/` folder shipped inside the package (`clarify/data`,
  package data in pyproject.toml: the same place for an editable and a regular install).
- `write_atomic(path, write)`: every file clarify writes goes through it — into a temp name in the same
  folder, fsync, rename (POSIX rename is atomic), fsync the folder so the rename survives a power cut.
  A reader never sees half a file; nothing is deleted to make room for its replacement.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path


def home() -> Path:
    """`$CLARIFY_HOME`, default `~/.cache/clarify`."""
    return Path(os.environ.get("CLARIFY_HOME") or Path.home() / ".cache" / "clarify").expanduser()


def data_dir() -> Path:
    """`$CLARIFY_DATA`, else the shipped `data/` folder beside this module."""
    return Path(os.environ.get("CLARIFY_DATA") or Path(__file__).resolve().parent / "data").expanduser()


def fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` into a temp file beside `path`, fsync, rename onto `path`, fsync the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync(path.parent)
    return path


def write_text(text: str, path: str | Path) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(obj: object, path: str | Path, *, sort_keys: bool = True) -> Path:
    return write_text(json.dumps(obj, indent=2, sort_keys=sort_keys, default=str) + "\n", path)


def write_parquet(df, path: str | Path) -> Path:
    return write_atomic(path, df.write_parquet)


def write_npy(array, path: str | Path) -> Path:
    import numpy as np

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as fh:  # a file object: np.save would append ".npy" to a bare name
            np.save(fh, array)

    return write_atomic(path, save)


def sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
