"""Where clarify's files live, and the one way it writes them.

- `home()`: `$CLARIFY_HOME` (default `~/.cache/clarify`), everything generated — converted models, the
  embedded index, demo vectors, NLTK tables, logs. Never in git.
- `data_dir()`: `$CLARIFY_DATA`, else the `data/` folder shipped inside the package (`clarify/data`,
  package data in pyproject.toml: the same place for an editable and a regular install).
- `write_atomic(path, write)`: every file clarify writes goes through it — into a temp name in the same
  folder, fsync, rename (POSIX rename is atomic), fsync the folder so the rename survives a power cut.
  A reader never sees half a file; nothing is deleted to make room for its replacement.

Private by default (docs/reproducibility.md#files-and-permissions): what clarify creates — run directories, completion
caches, logs, `$CLARIFY_HOME` — is the user's alone, folders 0700 and files 0600, because a cache holds
every prompt and completion. `$CLARIFY_FILE_MODE` relaxes it: `group` (0750/0640) or `umask` (the
process umask decides, as for any program). A file clarify opens by a fixed name (a lock, a log) is
opened without following a symlink (`open_own`); a temp file gets an unpredictable name (mkstemp).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

MODE_ENV = "CLARIFY_FILE_MODE"
# (folder mode, file mode, umask of a clarify command) for each setting; the process umask still applies
MODES = {"private": (0o700, 0o600, 0o077), "group": (0o750, 0o640, 0o027), "umask": (0o777, 0o666, 0)}
HOLDER_BYTES = 512  # a lock file's record: who holds it, padded with spaces (never truncated)


def home() -> Path:
    """`$CLARIFY_HOME`, default `~/.cache/clarify`."""
    return Path(os.environ.get("CLARIFY_HOME") or Path.home() / ".cache" / "clarify").expanduser()


def data_dir() -> Path:
    """`$CLARIFY_DATA`, else the shipped `data/` folder beside this module."""
    return Path(os.environ.get("CLARIFY_DATA") or Path(__file__).resolve().parent / "data").expanduser()


def modes() -> tuple[int, int, int]:
    """(folder mode, file mode, umask bits) of `$CLARIFY_FILE_MODE` (default `private`)."""
    name = os.environ.get(MODE_ENV) or "private"
    if name not in MODES:
        from clarify.errors import InputError

        raise InputError(f"{MODE_ENV} must be one of {', '.join(MODES)}, got {name!r}")
    return MODES[name]


def restrict_umask() -> None:
    """Add the setting's umask bits to the process umask (a clarify command, before it writes anything):
    files that other libraries create (Parquet, Lucene, FAISS, SQLite's journal) are private as well."""
    os.umask(current_umask() | modes()[2])


def make_dirs(path: str | Path) -> Path:
    """`mkdir -p`, every folder it creates with the setting's folder mode (less the umask); existing
    folders are left as they are."""
    path = Path(path)
    missing = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=modes()[0])
        except FileExistsError:  # made meanwhile by another process
            pass
    if not path.is_dir():
        raise NotADirectoryError(f"not a directory: {path}")
    return path


def check_own_dir(path: str | Path, what: str = "folder") -> Path:
    """InputError unless `path` is a folder of this user: clarify writes only into its own folders (one of
    another user could hold planted links, and their owner could read what is written)."""
    from clarify.errors import InputError

    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"cannot use as a {what}: {exc.strerror or exc}", path=str(path)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"cannot use as a {what}: not a directory", path=str(path))
    if st.st_uid != os.geteuid():
        raise InputError(f"this {what} belongs to {_user(st.st_uid)}, not to you; clarify writes only into "
                         f"folders of its own user: use another path", path=str(path))
    return path


def _user(uid: int) -> str:
    try:
        import pwd

        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def open_own(path: str | Path, flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """A descriptor of the regular file `path` of this user, created with the setting's file mode: never
    through a symlink (O_NOFOLLOW: a planted link is ELOOP), never another user's file or a special file
    (PermissionError), never truncated here (O_TRUNC is refused: truncate after this check)."""
    if flags & os.O_TRUNC:
        raise ValueError("open_own never truncates on open: os.ftruncate the descriptor it returns")
    # O_NONBLOCK: a FIFO planted at the name fails or returns at once instead of hanging the open
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, modes()[1])
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symbolic link (never followed)", str(path)) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"it belongs to {_user(st.st_uid)}"
        raise PermissionError(errno.EPERM, f"refusing to use it: {why}", str(path))
    os.set_blocking(fd, True)
    return fd


def write_holder(fd: int) -> None:
    """Record this process in a lock file it holds: pid, host and command line, one fixed-size record
    written in place (the file is never truncated)."""
    me = f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)}".encode("utf-8", "replace")
    me = me[: HOLDER_BYTES - 1].decode("utf-8", "ignore").encode("utf-8")  # whole characters only
    os.pwrite(fd, me.ljust(HOLDER_BYTES), 0)


def read_holder(fd: int) -> str:
    """Who holds a lock file (`write_holder`'s record), safe to print (errors.printable)."""
    from clarify.errors import printable

    try:
        text = os.pread(fd, HOLDER_BYTES, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return printable(text) or "another process"


def fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` into a temp file beside `path`, fsync, rename onto `path`, fsync the folder.

    The temp file is made by mkstemp (an unpredictable name, O_EXCL: never a planted file or link) with
    the setting's file mode; `write` rewrites it in place. The rename replaces a link at `path` itself,
    never what it points to."""
    path = Path(path)
    make_dirs(path.parent)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.tmp", dir=path.parent)
    tmp = Path(name)
    try:
        try:
            widen_mode(fd)
        finally:
            os.close(fd)
        write(tmp)
        fsync(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync(path.parent)
    return path


def widen_mode(target: int | str | Path, *, folder: bool = False) -> None:
    """What mkstemp/mkdtemp made (0600/0700) gets the setting's mode, less the umask, when that is wider.
    `target`: a path or a descriptor."""
    mode = modes()[0 if folder else 1]
    if mode not in (0o600, 0o700):
        os.chmod(target, mode & ~current_umask())


def current_umask() -> int:
    """The process umask, read without changing it (Linux: /proc/self/status), else by setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


def write_text(text: str, path: str | Path) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def page_main(argv: list[str] | None, page: Path, render: Callable[[], str], description: str,
              shown: Callable[[], str] | None = None) -> int:
    """The command line of a generated docs page (batch/cli/config_doc.py, batch/cli/errors_doc.py,
    bench/results_doc.py): `--write` writes `render()` to `page`, else `shown()` (default: the page) is printed."""
    import argparse

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--write", action="store_true", help=f"write {page}")
    if ap.parse_args(argv).write:
        page.parent.mkdir(exist_ok=True)
        page.write_text(render(), encoding="utf-8")
        print(f"wrote {page}")
    else:
        sys.stdout.write((shown or render)())
    return 0


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
