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
from dataclasses import dataclass
from pathlib import Path

from clarify.errors import InputError
from clarify.jsonl import read_json
from clarify.options import JsonObject

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Provenance(JsonObject):
    """A results file's `provenance` (`provenance()` writes it; bench/results_doc.py and bench/reproduce_doc.py
    state it under every number they print)."""

    date: str | None = None  # UTC, ISO
    cpu: str | None = None  # model, cores and the capability the engine sees
    command: str | None = None  # as run: `bench/NAME.py ARGS`
    commit: str | None = None
    superseded_by: str | None = None  # a later results file that replaces this one's numbers

    @property
    def complete(self) -> bool:
        return all((self.date, self.cpu, self.command, self.commit))


@dataclass(frozen=True)
class Results:
    """One bench/results/NAME.json read back: its provenance typed; the body is each bench's own table."""

    name: str
    provenance: Provenance | None
    body: dict


def read_results(name: str, folder: Path = RESULTS) -> Results:
    """bench/results/NAME.json (clarify.jsonl read_json: bad JSON named by file and line)."""
    path = folder / f"{name}.json"
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise InputError(f"expected a JSON object, got {type(doc).__name__}", path=str(path), line=1)
    prov = doc.get("provenance")
    if prov is not None and not isinstance(prov, dict):
        raise InputError("provenance must be a JSON object", path=str(path), field="provenance")
    return Results(name, Provenance.of(prov), {k: v for k, v in doc.items() if k != "provenance"})


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
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
