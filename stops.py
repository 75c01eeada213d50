"""Stopping on a signal: SIGINT (Ctrl-C), SIGTERM (`kill`, a scheduler's time limit) and SIGHUP (a closed
terminal) end `run`, `demo`, `compare` and `index build` the same way (docs/reproducibility.md#stopping-and-resuming).

The command runs inside `handled()`. The first signal raises `Stopped` in the main thread — where Python
runs signal handlers (https://docs.python.org/3/library/signal.html#signals-and-threads) — unless the
code is inside a `deferred()` block (one vLLM step, one cache commit, one part being written): then it is
raised when the block ends, so a step, a commit or a part is never cut in half. Whatever is on its way
out then cleans up in `except`/`finally`: in-flight requests are cancelled, finished trees are written as
a part, the completion cache is committed (batch/run/pipeline.py). The command line prints one line — what
stopped it, how far it got, the command that resumes — and exits 128 + the signal's number (130, 143,
129), as a shell reports a process killed by it.

A second signal while that clean-up runs is not caught: the process ends at once (every file clarify
writes is written atomically and the cache is a WAL database, so even then nothing is left half-written).

The JVM that Pyserini runs in is started with -Xrs (index/jvm.py): without it HotSpot installs its own
handlers for these signals and exits the process from a Java thread, with no `finally` run.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_state = {"depth": 0, "pending": None, "active": False}


class Stopped(KeyboardInterrupt):
    """A stop signal arrived. `done`: how far the command got, in words (set by whoever knows)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
        self.done = ""

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _release() -> None:
    """After the first signal, the next one ends the process (the default action)."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)


def _handler(signum: int, frame) -> None:
    _release()
    if _state["depth"]:
        _state["pending"] = signum
        return
    raise Stopped(signum)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into `Stopped` while the block runs (main thread only; elsewhere,
    and when already inside one, a no-op). The previous handlers come back on exit."""
    if _state["active"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    _state.update(active=True, pending=None, depth=0)
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        _state.update(active=False, pending=None, depth=0)


def reclaim() -> None:
    """Put this module's handler back where a library replaced it (Ray's `init` sets its own SIGTERM
    handler), while `handled()` is in force and no signal has come yet."""
    if _state["active"] and threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            if signal.getsignal(s) not in (_handler, signal.SIG_DFL):
                signal.signal(s, _handler)


def requested() -> bool:
    """Whether a stop signal is waiting for the end of a `deferred()` block: code that waits inside one
    (an engine step waiting on a server) returns early instead of making the signal wait too."""
    return _state["pending"] is not None


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A block that a stop signal does not cut: `Stopped` is raised when the outermost one ends. Only the
    main thread's blocks count (the only thread that a handler interrupts)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state["depth"] += 1
    try:
        yield
    finally:
        _state["depth"] -= 1
        if not _state["depth"] and _state["pending"] is not None:
            signum, _state["pending"] = _state["pending"], None
            raise Stopped(signum)
