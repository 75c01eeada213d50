"""Named fault points (clarify/faults.py): a process kills itself at an exact state, so crash tests
never race a timer."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

SCRIPT = """
from clarify import faults
for name in ["cache-commit", "wave-done:1", "cache-commit", "cache-commit"]:
    print(name, flush=True)
    faults.point(name)
print("end", flush=True)
"""


@pytest.mark.parametrize(("spec", "printed", "killed"), [
    (None, 5, False),                                     # unarmed: nothing happens
    ("cache-commit", 1, True),                            # the first commit
    ("cache-commit after wave-done:1", 3, True),          # the first commit once wave 1 is done
    ("cache-commit after wave-done:2", 5, False),         # never reached
])
def test_kill_point_is_exact(spec, printed, killed):
    env = {"PYTHONPATH": ":".join(sys.path)}
    if spec:
        env["CLARIFY_KILL_AT"] = spec
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert len(proc.stdout.split()) == printed
    assert proc.returncode == (-signal.SIGKILL if killed else 0)
