"""The run configuration read: a TOML file (or a run's frozen config.json), CLI overrides by dotted key, and
the defaults, validated against the schema (batch/config/schema.py) into one RunConfig; every bad key or
value is named in one InputError."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from clarify.batch.config.schema import _SECTIONS, RunConfig, _as_declared, validate
from clarify.errors import InputError
from clarify.jsonl import read_json


def from_dict(data: dict[str, Any], *, source: str = "config") -> RunConfig:
    """Build a RunConfig from nested dicts; every bad key or value is named in one InputError."""
    validate(data, source=source)
    kwargs: dict[str, Any] = {name: cls(**_as_declared(data.get(name) or {}, cls)) for name, cls in _SECTIONS.items()}
    kwargs.update(_as_declared({k: v for k, v in data.items() if k not in _SECTIONS}, RunConfig))
    return RunConfig(**kwargs)


def load(path: str | Path | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Load a TOML config (or the defaults when `path` is None) and apply dotted-key overrides,
    e.g. {"toc.max_depth": 2, "limit": 5}."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        if Path(path).is_dir():
            raise InputError("is a directory; --config takes a TOML file", path=source)
        if not Path(path).exists():
            raise InputError("config file not found", path=source)
        try:
            # a run directory's frozen config.json repeats that run's settings (`clarify compare` passes one),
            # read as every JSON file is (clarify.jsonl read_json: bad JSON named by file and line)
            data = read_json(path) if Path(path).suffix == ".json" else tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise InputError("config file not found", path=source) from exc
        except OSError as exc:
            raise InputError(f"cannot read the config file: {exc.strerror or exc}", path=source) from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise InputError(f"not valid TOML: {exc}", path=source) from exc
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        target = data
        *parents, leaf = key.split(".")
        for p in parents:
            if isinstance(target, dict):
                target = target.setdefault(p, {})
        if isinstance(target, dict):  # else the file's `[p]` is not a table: validate names it
            target[leaf] = value
    return from_dict(data, source=source)
