"""What the terminal shows, and where everything else goes (quiet by default, everything kept).

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

import collections
import contextlib
import json
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
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from clarify.errors import WRITE_ERRNOS, InputError, redacted
from clarify.files import check_own_dir, home, make_dirs, open_own
from clarify.options import JsonObject

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


def _quiet_libraries() -> dict[str, str | None]:
    """Environment and library switches, set before the heavy imports where that matters; returns the
    value TQDM_DISABLE had (restored when the session ends: whether a bar is drawn depends on where this
    session's stderr goes)."""
    before = {"TQDM_DISABLE": os.environ.get("TQDM_DISABLE")}
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"  # vLLM's records propagate to the root logger
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # huggingface_hub's download bars
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # silences the fork warning of `tokenizers`
    if not live():  # child processes (Ray workers, `clarify compare`'s runs) draw no library bars either
        os.environ.setdefault("TQDM_DISABLE", "1")
    with contextlib.suppress(Exception):  # transformers absent or older: its records stay where they were
        from transformers.utils import logging as hf_logging

        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()
    return before


@contextlib.contextmanager
def _library_bars_off() -> Iterator[None]:
    """In a log every redraw of a library's progress bar is kept (vLLM's, transformers' GGUF conversion in
    `clarify models prepare`): while this holds, a tqdm bar not given `disable` draws nothing. tqdm reads
    its TQDM_<NAME> defaults once, when it is imported (tqdm/utils.py envwrap), and the CLI has imported it
    by then, so the default is set on the class; clarify's own bars pass `disable` (console.progress)."""
    try:
        from tqdm import std
    except ImportError:
        yield
        return
    original = std.tqdm.__dict__["__init__"]

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("disable", True)
        original.__get__(self, type(self))(*args, **kwargs)

    std.tqdm.__init__ = __init__
    try:
        yield
    finally:
        std.tqdm.__init__ = original


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
    env_before = _quiet_libraries()
    _log_path = path
    # a --base-url with user:password@ is logged without them (errors.redacted)
    logging.getLogger("clarify").info("clarify %s, argv %s", command, [redacted(a) for a in sys.argv])
    with contextlib.ExitStack() as stack:
        if not verbose:
            fd = open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            stack.callback(os.close, fd)
            stack.enter_context(_fd_to(2, fd, "stderr"))
            stack.enter_context(_fd_to(1, fd, "stdout"))
        if not live():
            stack.enter_context(_library_bars_off())
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
            for key, value in env_before.items():  # a later session in this process decides anew
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def progress(**kwargs):
    """A tqdm bar on the terminal (stderr), the one display of a stage. clarify's other bars pass
    `disable=<off> or None`: tqdm's None draws only when the stream is a terminal."""
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


def live(stream: TextIO | None = None) -> bool:
    """Whether `stream` (default: stderr, where progress is drawn) is a terminal: a live bar there, plain
    lines in a log (a redirect, CI, `nohup`), where each rewrite of a bar would be kept."""
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


monotonic = time.monotonic  # RunProgress's clock (a test of a whole run replaces it)

# A run's progress in a log (not a terminal): a line every LOG_EVERY_S seconds or each LOG_STEP of the
# questions, never two within LOG_MIN_S seconds (trees of the continuous scheduler often finish in bursts).
LOG_EVERY_S, LOG_STEP, LOG_MIN_S = 30.0, 0.05, 10.0
RATE_WINDOW_S = 30.0  # the recent past an ETA from LLM calls is taken over
# A run's progress as data (`record`): one JSON line per RECORD_EVERY_S seconds and one at the end, so a
# long run's speed, trees and memory over time stay in its run directory (bench/bench_atsize.py reads them:
# does the engine slow down, does the driver grow, over hundreds of questions).
RECORD_EVERY_S = 30.0


@dataclass(frozen=True)
class ProgressSample(JsonObject):
    """One line of a run's progress record (RUN/logs/progress.jsonl: `RunProgress.sample` writes it,
    `read_progress` reads it back). Counts are this session's: each session starts again at elapsed 0."""

    time: float = 0.0  # the wall clock (Unix seconds)
    elapsed_s: float = 0.0  # this session's seconds
    finished: int = 0  # trees finished, of `total`
    total: int = 0
    calls: int = 0  # engine requests finished this session (cache hits excluded)
    tokens: int = 0  # their prompt + output tokens
    running: int = 0  # requests in flight
    rss_mb: float | None = None  # the driver's resident memory (None where there is no /proc)


def read_progress(path: Path) -> list[list[ProgressSample]]:
    """A progress record split into its sessions (each starts again at elapsed 0); a line that is not a JSON
    object (a write cut short by a kill) is an InputError naming the file and line."""
    sessions: list[list[ProgressSample]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON ({exc.msg})", path=str(path), line=n) from None
        if not isinstance(data, dict):
            raise InputError(f"expected a JSON object, got {type(data).__name__}", path=str(path), line=n)
        s = ProgressSample.of(data)
        if not sessions or s.elapsed_s < sessions[-1][-1].elapsed_s:
            sessions.append([])
        sessions[-1].append(s)
    return sessions


def rss_mb() -> float | None:
    """This process's resident memory now (VmRSS in /proc/self/status), MiB; None where there is no /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


class RunProgress:
    """The one display of a ToC run: trees finished of total, requests in flight, LLM calls, tokens/s and
    an ETA.

    The engine reports finished requests and processed tokens (`engine_update`, called by
    VLLMEngine.on_progress while it steps); the scheduler reports each finished tree and the requests
    it has in the engine (`tree_done`). The ETA is from LLM calls: `expected_calls` (what the unfinished
    questions are expected to make) minus the calls made, at the recent call rate (`call_rate`); without
    it, from tokens: `expected_tokens` minus the tokens processed, at this session's speed — tree counts
    alone give no ETA until the first trees finish.

    On a terminal (`live`) it is a tqdm bar redrawn in place; in a log, one plain line per LOG_EVERY_S
    seconds or LOG_STEP of the questions (at most one per LOG_MIN_S) and one at the end. `estimate_s`: the
    ToC time the caller expected (the demo's probe): once the first tree of this session finishes, one line
    re-estimates it from the speed this run really has. `record`: a JSON-lines file that gets one sample per
    RECORD_EVERY_S seconds and one at the end (`sample`), whether or not anything is shown. `clock` and
    `stream`: tests."""

    def __init__(self, total: int, *, finished: int = 0, expected_tokens: int | None = None, enabled: bool = True,
                 expected_calls: int | None = None, estimate_s: float | None = None, stream: TextIO | None = None,
                 clock=None, is_live: bool | None = None, record: Path | None = None):
        self.stream = stream
        self.record, self.last_record_t = record, None
        self.enabled = enabled
        self.live = enabled and (live(stream) if is_live is None else is_live)
        self.bar = progress(total=total, initial=finished, desc="ToC", disable=not self.live, file=stream or sys.stderr,
                            bar_format="{desc} {n_fmt}/{total_fmt} questions |{bar:16}| {elapsed}{postfix}")
        self.total = total
        self.calls = self.tokens = self.running = 0
        self.finished, self.expected, self.expected_calls = finished, expected_tokens, expected_calls
        self.started_with = finished
        self.estimate_s, self.reestimate_s, self.first_tree_s = estimate_s, None, None
        self.clock = clock or monotonic
        self.t0 = self.clock()
        self.samples: collections.deque[tuple[float, int]] = collections.deque([(self.t0, 0)])  # (time, calls)
        self.last_line_t: float | None = None
        self.last_line_step = -1
        self.lines = 0  # plain lines written (log mode)
        self.last_said = (finished, 0)  # (trees finished, calls) of the last line
        self._show()

    def engine_update(self, requests: int, tokens: int, running: int | None = None) -> None:
        """Requests finished and tokens processed since the last update; `running`: requests in flight."""
        self.calls += requests
        self.tokens += tokens
        if running is not None:
            self.running = running
        if requests:
            now = self.clock()
            self.samples.append((now, self.calls))
            while len(self.samples) > 2 and self.samples[0][0] < now - RATE_WINDOW_S:
                self.samples.popleft()
        self._show()

    def tree_done(self, running: int = 0) -> None:
        """One more tree finished; `running`: requests the run has in the engine now."""
        self.running = running
        self.finished += 1
        self.bar.update(1)
        if self.finished == self.started_with + 1:
            self.first_tree_s = self.elapsed()
            self._reestimate()
        self._show()

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def speed(self) -> float:
        """Tokens per second processed this session."""
        elapsed = self.elapsed()
        return self.tokens / elapsed if elapsed > 0 else 0.0

    def call_rate(self) -> float:
        """LLM calls finished per second over the last RATE_WINDOW_S: the run's start, when the engine
        takes every tree's first prompt at once (and compiles their grammars) and no call finishes for a
        while, does not hold the rate down for the rest of the run."""
        (t_first, calls_first), (t_last, calls_last) = self.samples[0], self.samples[-1]
        return (calls_last - calls_first) / (t_last - t_first) if t_last > t_first else 0.0

    def eta_s(self) -> float | None:
        """Seconds left: the expected LLM calls not made yet at the recent call rate (`call_rate`), or
        without a call count the expected tokens not processed yet at this session's speed."""
        if self.finished >= self.total:
            return None
        rate = self.call_rate()
        if self.expected_calls and rate > 0 and self.calls < self.expected_calls:
            return (self.expected_calls - self.calls) / rate
        tps = self.speed()
        if self.expected and tps > 0 and self.tokens < self.expected:
            return (self.expected - self.tokens) / tps
        return None

    def status(self) -> str:
        parts = [f"{self.running} in flight", f"{self.calls} LLM calls", f"{self.speed():,.0f} tok/s"]
        eta = self.eta_s()
        if eta is not None:
            parts.append(f"ETA ~{_duration(eta)}")
        return ", ".join(parts)

    def _write(self, line: str) -> None:
        if self.live:
            self.bar.write(line, file=self.stream or sys.stderr)
        else:
            print(line, file=self.stream or sys.stderr, flush=True)

    def _reestimate(self) -> None:
        """One line once the first tree finishes: the ToC time from this run's own speed, beside the
        caller's estimate."""
        if not self.enabled or self.estimate_s is None:
            return
        eta = self.eta_s()
        if eta is None:
            return
        self.reestimate_s = self.elapsed() + eta
        self._write(f"ToC re-estimated after the first tree ({_duration(self.elapsed())}, {self.speed():,.0f} "
                    f"tok/s): ~{_duration(self.reestimate_s)} in all (the probe's estimate: "
                    f"~{_duration(self.estimate_s)})")

    def sample(self) -> ProgressSample:
        """What `record` gets: the wall clock, this session's seconds, trees finished of total, engine
        requests and tokens (prompt + output) this session, requests in flight, the driver's memory."""
        return ProgressSample(time=round(time.time(), 3), elapsed_s=round(self.elapsed(), 3), finished=self.finished,
                              total=self.total, calls=self.calls, tokens=self.tokens, running=self.running,
                              rss_mb=rss_mb())

    def _record(self, now: float, force: bool = False) -> None:
        if self.record is None or not (force or self.last_record_t is None or now - self.last_record_t >= RECORD_EVERY_S):
            return
        self.last_record_t = now
        try:
            make_dirs(self.record.parent)  # the run's own file mode, never through a planted link (files.py)
            fd = open_own(self.record, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(json.dumps(self.sample().to_json()) + "\n")
        except OSError as exc:  # a full disk or a removed folder loses the samples, never the run
            logging.getLogger(__name__).warning("progress record %s not written: %s", self.record, exc)
            self.record = None

    def _show(self) -> None:
        self.bar.set_postfix_str(self.status(), refresh=self.live)
        self._record(self.clock())
        if self.live or not self.enabled:
            return
        now = self.clock()
        step = int(self.finished / self.total / LOG_STEP) if self.total else 0
        since = None if self.last_line_t is None else now - self.last_line_t
        if since is not None and (since < LOG_MIN_S or (since < LOG_EVERY_S and step <= self.last_line_step)):
            return
        if since is None and self.finished == self.started_with and self.calls == 0:
            self.last_line_t, self.last_line_step = now, step  # the clock starts; nothing to say yet
            return
        self._line(now, step)

    def _line(self, now: float, step: int) -> None:
        share = f" ({self.finished / self.total:.0%})" if self.total else ""
        self._write(f"ToC {self.finished}/{self.total} questions{share}, {self.status()}, "
                    f"{_duration(now - self.t0)} elapsed")
        self.last_line_t, self.last_line_step = now, step
        self.last_said = (self.finished, self.calls)
        self.lines += 1

    def close(self) -> None:
        if self.enabled and not self.live and self.last_said != (self.finished, self.calls):
            self._line(self.clock(), self.last_line_step)  # where it ended, unless the last line said so
        self._record(self.clock(), force=True)
        self.bar.close()
