"""The `provenance` object every bench/results/*.json carries (bench/results_doc.py renders it): when, on
which CPU (model, cores and the capability the engine sees), by which command, at which commit."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), as the other benches print the CPU they ran on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _capability() -> str:
    try:
        from clarify.local_llm.hardware import cpu_facts

        f = cpu_facts()
        return f"capability {f['capability']}, avx512_bf16 {f['avx512_bf16']}, amx {f['amx']}"
    except Exception as exc:  # torch missing or a CPU it cannot read: say so, never fail a bench over it
        return f"capability not read ({type(exc).__name__})"


def provenance(argv: list[str] | None = None) -> dict:
    """Date (UTC), CPU, the command as run (`bench/NAME.py ARGS`), and the commit it ran at."""
    script = Path(sys.argv[0]).name
    args = sys.argv[1:] if argv is None else argv
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"date": datetime.datetime.now(datetime.UTC).date().isoformat(),
            "cpu": f"{cpu_model()}, {os.cpu_count()} cores, {_capability()}",
            "command": " ".join(["bench/" + script, *map(shlex.quote, args)]).strip(),
            "commit": commit}


def write_results(name: str, doc: dict) -> Path:
    """bench/results/NAME.json (docs/results.md renders it: bench/results_doc.py)."""
    path = Path(__file__).resolve().parent / "results" / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
