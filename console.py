"""What the terminal shows, and where everything else goes (issue 17: quiet by default, everything kept).

A command that loads the heavy libraries (vLLM, torch, sentence-transformers, the JVM) runs inside
`session(log_dir, verbose=...)`:

- Python logging goes to `<log_dir>/<command>-<time>-<pid>.log`. vLLM's loggers print to stdout with
  their own handler unless `VLLM_CONFIGURE_LOGGING=0`, which makes them propagate to the root logger
  (https://docs.vllm.ai/en/stable/usage/troubleshooting.html#logging, vllm/logger.py); transformers'
  library handler is switched off and its records propagate too
  (`transformers.utils.logging.disable_default_handler` / `enable_propagation`).
- `warnings` go to the same file (`logging.captureWarnings`, https://docs.python.org/3/library/logging.html).
- What native code writes to file descriptors 1 and 2 (the JVM's log4j, OpenMP, oneDNN) goes there as
  well: the descriptors are pointed at the log (`os.dup2`), while Python's `sys.stdout`/`sys.stderr`
  are swapped for duplicates of the original descriptors, so clarify's own output, its progress bars
  and any traceback still reach the terminal.
- `-v/--verbose` leaves the descriptors alone and copies every log record to stderr as well.

Warnings that matter to the user are recorded with `note()` and printed once at the end, in words, by
`print_notes()`, with the number of library warnings the log holds and its path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from clarify.errors import WRITE_ERRNOS, InputError, redacted
from clarify.files import check_own_dir, home, make_dirs, open_own

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
KEEP_LOGS = 50  # per folder; older logs are deleted when a new one starts

_notes: dict[str, str] = {}  # key -> sentence; a later note of the same key replaces the earlier one
_warned: Counter[str] = Counter()  # WARNING+ records written to the log, by top-level logger name
_log_path: Path | None = None


def note(key: str, sentence: str) -> None:
    """Record a warning that matters to the user; printed once at the end by `print_notes`."""
    _notes[key] = sentence


def notes() -> list[str]:
    return list(_notes.values())


def log_path() -> Path | None:
    """The log file of the running session (None outside one)."""
    return _log_path


def print_notes(out: TextIO | None = None) -> None:
    """The session's notes in words, the library warnings count and where the log is (nothing when
    there is nothing to note)."""
    out = out or sys.stderr
    lines = notes()
    if _warned:
        by = ", ".join(f"{name} {n}" for name, n in _warned.most_common(4))
        lines.append(f"{sum(_warned.values())} library warning(s) are in the log ({by})")
    if not lines:  # nothing to say: the log is where `--help` says, no need for a line
        return
    print("\nnotes:", file=out)
    for line in lines:
        print(f"  - {line}", file=out)
    if _log_path is not None:
        print(f"log: {_log_path}", file=out, flush=True)


class _LogFile(logging.FileHandler):
    """The session's log file. A record it cannot write (a full disk, a read-only file system) is dropped
    with one note for the session, instead of logging's traceback on stderr for every record."""

    def handleError(self, record: logging.LogRecord) -> None:
        note("log-write", f"the log {self.baseFilename} could not be written to (some records are missing)")


class _CountWarnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        name = record.name
        _warned[name if name.startswith("py.") else name.split(".")[0]] += 1  # py.warnings: `warnings`


def home_logs(_args=None) -> Path:
    """$CLARIFY_HOME/logs: the log folder of commands that have no run directory."""
    return home() / "logs"


def log_file_for(log_dir: Path, command: str) -> Path:
    """A new log file in `log_dir` — or, when that folder cannot be made or is not this user's, or the
    file cannot be written there (a read-only file system, a full disk), in $CLARIFY_HOME/logs, then in
    the system's temporary folder — created private and without following a link (files.open_own)."""
    name = f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    folders = [log_dir, home_logs(), Path(tempfile.gettempdir()) / f"clarify-logs-{os.getuid()}"]
    for i, folder in enumerate(folders):
        last = i == len(folders) - 1
        try:
            folder = check_own_dir(make_dirs(folder))
        except (OSError, InputError):
            if last:
                raise
            continue
        _prune(folder)
        path = folder / name
        try:
            os.close(open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))
            return path
        except OSError as exc:
            if exc.errno in WRITE_ERRNOS and not last:  # nothing can be written here: the next folder
                continue
            # a planted link, another user's file
            raise InputError(f"cannot write the log here: {exc.strerror or exc}", path=str(path)) from None
    raise AssertionError("unreachable")


# The names log_file_for gives (`<command>-<date>-<time>-<pid>.log`): the only files pruning deletes
_LOG_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*-\d{8}-\d{6}-\d+\.log")


def _prune(log_dir: Path, keep: int = KEEP_LOGS) -> None:
    """Keep the newest `keep - 1` of clarify's own logs in a folder (a new one is about to be written);
    any other file, a `notes.log` of the user's say, is never touched."""
    logs = []
    for p in log_dir.glob("*.log"):
        with contextlib.suppress(OSError):
            st = p.lstat()
            if _LOG_NAME.fullmatch(p.name) and stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                logs.append((st.st_mtime, p))
    logs.sort()
    for _, old in logs[: max(0, len(logs) - keep + 1)]:
        with contextlib.suppress(OSError):
            old.unlink()


def _quiet_libraries() -> None:
    """Environment and library switches, set before the heavy imports where that matters."""
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"  # vLLM's records propagate to the root logger
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # huggingface_hub's download bars
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # silences the fork warning of `tokenizers`
    with contextlib.suppress(Exception):  # transformers absent or older: its records stay where they were
        from transformers.utils import logging as hf_logging

        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()


@contextlib.contextmanager
def _fd_to(fd: int, target_fd: int, stream_name: str) -> Iterator[None]:
    """Point descriptor `fd` at `target_fd`; `sys.<stream_name>` keeps writing where `fd` pointed.

    Only when the Python stream really is that descriptor (not under pytest's capsys, say)."""
    stream = getattr(sys, stream_name)
    try:
        same = stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        same = False
    stream.flush()
    saved = os.dup(fd)
    replacement = None
    if same:
        replacement = open(os.dup(saved), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                           errors="backslashreplace")
        setattr(sys, stream_name, replacement)
    os.dup2(target_fd, fd)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            (replacement or stream).flush()
        os.dup2(saved, fd)
        os.close(saved)
        if replacement is not None:
            setattr(sys, stream_name, stream)
            replacement.close()


@contextlib.contextmanager
def session(log_dir: str | Path, command: str, *, verbose: bool = False) -> Iterator[Path]:
    """Run a command with its logs, warnings and native output in `<log_dir>/<command>-….log`.

    Everything is restored on exit (handlers, warning capture, descriptors), so it nests in tests."""
    global _log_path
    path = log_file_for(Path(log_dir), command)
    _notes.clear()
    _warned.clear()
    root = logging.getLogger()
    old_level = root.level
    fmt = logging.Formatter(LOG_FORMAT)
    handlers: list[logging.Handler] = [_LogFile(path, encoding="utf-8"), _CountWarnings()]
    handlers[0].setFormatter(fmt)
    if verbose:
        handlers.append(logging.StreamHandler(sys.stderr))
        handlers[-1].setFormatter(fmt)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    _quiet_libraries()
    _log_path = path
    # a --base-url with user:password@ is logged without them (errors.redacted)
    logging.getLogger("clarify").info("clarify %s, argv %s", command, [redacted(a) for a in sys.argv])
    with contextlib.ExitStack() as stack:
        if not verbose:
            fd = open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            stack.callback(os.close, fd)
            stack.enter_context(_fd_to(2, fd, "stderr"))
            stack.enter_context(_fd_to(1, fd, "stdout"))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default")  # each distinct warning once, into the log
                yield path
        except BaseException:
            logging.getLogger("clarify").exception("clarify %s failed", command)
            raise
        finally:
            logging.captureWarnings(False)
            for h in handlers:
                root.removeHandler(h)
                with contextlib.suppress(OSError):  # a full disk: never hide the error that stopped the command
                    h.close()
            root.setLevel(old_level)
            _log_path = None


def progress(**kwargs):
    """A tqdm bar on the terminal (stderr), the one display of a stage."""
    from tqdm.auto import tqdm

    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(**kwargs)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


_open_line: str | None = None  # a timed step's 'what…' waiting for its duration on the same line


def say(message: str) -> None:
    """A line for the user on the terminal (stderr), below an open step line rather than inside it."""
    global _open_line
    print(("\n" if _open_line else "") + message, file=sys.stderr, flush=True)
    if _open_line:
        _open_line = ""  # the step's line was broken: its duration gets a line of its own


@contextlib.contextmanager
def step(what: str, *, enabled: bool = True, timed: bool = True) -> Iterator[None]:
    """One line for a step: 'what… 12 s' when it draws nothing itself (`timed`), else 'what…' on a line
    of its own, above the step's own progress bar."""
    global _open_line
    if not enabled:
        yield
        return
    print(f"{what}…", end="" if timed else "\n", file=sys.stderr, flush=True)
    _open_line = what if timed else None
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if timed:
            took = _duration(time.perf_counter() - t0)
            print(f" {took}" if _open_line else f"{what}… {took}", file=sys.stderr, flush=True)
        _open_line = None


class RunProgress:
    """The one display of a ToC run: trees finished of total, requests in flight, LLM calls, tokens/s and
    an ETA.

    The engine reports finished requests and processed tokens (`engine_update`, called by
    VLLMEngine.on_progress while it steps); the scheduler reports each finished tree and the requests
    it has in the engine (`tree_done`). The ETA is from tokens: `expected_tokens` (what the unfinished
    questions are expected to cost) minus the tokens processed so far, at this session's speed — tree
    counts alone give no ETA until the first trees finish."""

    def __init__(self, total: int, *, finished: int = 0, expected_tokens: int | None = None, enabled: bool = True):
        self.bar = progress(total=total, initial=finished, desc="ToC", disable=not enabled,
                            bar_format="{desc} {n_fmt}/{total_fmt} questions |{bar:16}| {elapsed}{postfix}")
        self.calls = self.tokens = self.running = 0
        self.finished, self.expected = finished, expected_tokens
        self.t0 = time.perf_counter()
        self._show()

    def engine_update(self, requests: int, tokens: int, running: int | None = None) -> None:
        """Requests finished and tokens processed since the last update; `running`: requests in flight."""
        self.calls += requests
        self.tokens += tokens
        if running is not None:
            self.running = running
        self._show()

    def tree_done(self, running: int = 0) -> None:
        """One more tree finished; `running`: requests the run has in the engine now."""
        self.running = running
        self.finished += 1
        self.bar.update(1)
        self._show()

    def _show(self) -> None:
        elapsed = time.perf_counter() - self.t0
        tps = self.tokens / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.running} in flight", f"{self.calls} LLM calls", f"{tps:,.0f} tok/s"]
        if self.expected and tps > 0 and self.tokens < self.expected and self.finished < self.bar.total:
            parts.append(f"ETA ~{_duration((self.expected - self.tokens) / tps)}")
        self.bar.set_postfix_str(", ".join(parts))

    def close(self) -> None:
        self.bar.close()
