"""Named fault points, so crash tests kill a process at an exact state instead of racing a timer.

Code calls `point(name)` at places where a crash matters (after a batch of completions is committed to
the cache, after a part of finished trees is written). A test sets `CLARIFY_KILL_AT` in the environment of
the process it starts; that process SIGKILLs itself when the named point is reached:

    CLARIFY_KILL_AT="cache-commit"                    the first cache commit
    CLARIFY_KILL_AT="cache-commit after part-done:1"  the first cache commit once part 1 is written

Points: `cache-commit` (local_llm/cache.py), `freeze` (inputs.json written, config.json not yet),
`part-tmp:N` (part N complete in its temp folder, not renamed), `part-done:N` (renamed),
`final-tables` (final tables written, summary.json not yet), `restart-cleared` (`--restart` moved the
parts away, the tables not yet removed), `index-built` (a new index complete in its build folder, not
yet in place: index/build.py), `encoded-chunk:N` (the N-th chunk of passage vectors an index build's
process checkpointed: index/encode.py). tests/test_faults.py kills a run at each of them;
tests/test_index_encode.py a build at `encoded-chunk:N`.

`CLARIFY_KILL_SIGNAL` names another signal to send instead (SIGINT, SIGTERM, SIGHUP: a stop at an exact
state, stops.py); it is sent once.

A verdict never depends on machine speed. Unset (always, outside tests), `point` costs one dict lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "CLARIFY_KILL_AT"
SIGNAL_ENV = "CLARIFY_KILL_SIGNAL"
_passed: set[str] = set()


def point(name: str) -> None:
    """Record that `name` was reached; signal this process (SIGKILL unless CLARIFY_KILL_SIGNAL says
    otherwise) if it is the armed point."""
    spec = os.environ.get(ENV)
    if not spec or "fired" in _passed:
        return
    _passed.add(name)
    target, _, after = (s.strip() for s in spec.partition(" after "))
    if name == target and (not after or after in _passed):
        _passed.add("fired")
        os.kill(os.getpid(), signal.Signals[os.environ.get(SIGNAL_ENV, "SIGKILL")])
