"""Run directories: a frozen config, one Parquet file per finished stage or wave (written to a temp
name and renamed), and the completion cache. Resume = skip what exists.

    runs/NAME/config.json            frozen effective config (a different config for the same name is an error)
    runs/NAME/questions.parquet
    runs/NAME/waves/0001/            one folder per finished wave, renamed into place when complete:
        llm_calls.parquet hits.parquet answers.parquet state.json (every tree, JSON)
    runs/NAME/cache/                 completion cache (clarify.local_llm.cache)
    runs/NAME/{nodes,hits,llm_calls,answers,spans,passages,scores}.parquet   final tables
    runs/NAME/summary.json           written last: its presence means the run is finished
    runs/NAME/logs/                  one log file per session: library logs, warnings, native output (console.py)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl

from clarify.batch.tree import Tree
from clarify.errors import InputError


def write_parquet(df: pl.DataFrame, path: Path) -> None:
    """Atomic write: temp file in the same folder, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    df.write_parquet(tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json(obj: object, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, path)


def _diff(a: object, b: object, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} → {b!r}"]


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise InputError("run directory path exists and is not a directory", path=str(self.path))

    @property
    def cache_dir(self) -> Path:
        return self.path / "cache"

    @property
    def finished(self) -> bool:
        return (self.path / "summary.json").exists()

    def freeze_config(self, config: dict) -> None:
        """Write config.json once; a later run with another config for this directory is refused."""
        path = self.path / "config.json"
        if path.exists():
            old = json.loads(path.read_text(encoding="utf-8"))
            diffs = _diff(old, config)
            if diffs:
                raise InputError("this run directory was made with another config; use a new --out or the "
                                 "same settings. Differences: " + "; ".join(diffs), path=str(path))
            return
        write_json(config, path)

    def table(self, name: str) -> pl.DataFrame | None:
        path = self.path / f"{name}.parquet"
        return pl.read_parquet(path) if path.exists() else None

    def write_table(self, name: str, df: pl.DataFrame) -> Path:
        path = self.path / f"{name}.parquet"
        write_parquet(df, path)
        return path

    # -- waves -----------------------------------------------------------------------------------
    def wave_dirs(self) -> list[Path]:
        root = self.path / "waves"
        if not root.exists():
            return []
        return sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())

    def write_wave(self, wave: int, tables: dict[str, pl.DataFrame], trees: list[Tree], answered: bool,
                   run_s: float | None = None) -> None:
        """All of a wave's rows and every tree's state, made visible at once by renaming the folder.

        run_s: the run's wall seconds up to this checkpoint, summed over the sessions that got it here
        (a resumed session starts from the last checkpoint's run_s; time lost to a crash is not counted)."""
        final = self.path / "waves" / f"{wave:04d}"
        tmp = self.path / "waves" / f".{wave:04d}.tmp{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        for name, df in tables.items():
            df.write_parquet(tmp / f"{name}.parquet")
        (tmp / "state.json").write_text(json.dumps({"wave": wave, "answered": answered, "run_s": run_s,
                                                   "trees": [t.to_dict() for t in trees]}), encoding="utf-8")
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():  # a wave redone after a crash between rename and the next wave: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)

    def load_state(self) -> tuple[int, bool, list[Tree], float | None] | None:
        """(last finished wave, answered, trees, run_s) or None for a fresh run; run_s is None for a
        state written without it. Half-written temp folders are ignored (and cleaned)."""
        for p in (self.path / "waves").glob(".*.tmp*") if (self.path / "waves").exists() else []:
            shutil.rmtree(p, ignore_errors=True)
        dirs = self.wave_dirs()
        if not dirs:
            return None
        state = json.loads((dirs[-1] / "state.json").read_text(encoding="utf-8"))
        return state["wave"], state["answered"], [Tree.from_dict(t) for t in state["trees"]], state.get("run_s")

    def wave_table(self, name: str, schema: dict | None = None) -> pl.DataFrame:
        frames = [pl.read_parquet(d / f"{name}.parquet") for d in self.wave_dirs()
                  if (d / f"{name}.parquet").exists()]
        frames = [f for f in frames if f.height]
        if not frames:
            return pl.DataFrame(schema=schema) if schema else pl.DataFrame()
        return pl.concat(frames, how="diagonal_relaxed")
