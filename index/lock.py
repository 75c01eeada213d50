"""The index folder's locks (docs/reproducibility.md#files-and-permissions): one build at a time into a
folder (`build_lock`, a lock file beside it), readers share a lock on the folder itself (`read_lock`, held by
every opened index, index/local.py), and a rebuild replaces a folder only when no process reads it
(`no_readers`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from clarify.errors import InputError
from clarify.files import make_dirs, open_own


@contextlib.contextmanager
def build_lock(out: Path):
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


def read_lock(path: Path) -> int | None:
    """A shared flock on the index folder itself (no file is written: the folder may be another user's,
    read-only), held by every process that reads the index; `build --force` takes it exclusively before
    it replaces the folder (`no_readers`). Not held while a rebuild swaps the folder in (the folder is
    complete either way)."""
    return _flock_folder(path, fcntl.LOCK_SH)[0]


def no_readers(out: Path, *, wait: Callable[[str], None] | None = None) -> int | None:
    """An exclusive flock on an existing index folder, or InputError when a process is reading it (a
    run, a search): a rebuild must not replace an index under a run. `wait`: wait for the readers
    instead, saying so through it (the build's log). The caller closes the descriptor once the new folder
    is in place."""
    fd, held = _flock_folder(out, fcntl.LOCK_EX)
    if fd is None or held:
        return fd
    if wait:
        wait(f"waiting for the processes reading {out} to finish before replacing it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd
    os.close(fd)
    raise InputError("the index is being read by a running clarify process (a run, a search): let it finish "
                     "or stop it, or build into another folder", path=str(out))
