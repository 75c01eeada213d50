"""The model matrix of `clarify compare --models FILE`: one TOML table per model, its own `[model]` settings.

    [[model]]
    model = "smollm2-135m-instruct"      # an embedded model's name or a model folder (required)

    [[model]]
    name = "gemma-fp32"                  # the run directory's name (default: the model folder's name)
    model = "gemma3-270m"
    dtype = "float32"                    # any [model] setting: dtype, tensor_parallel_size, max_model_len,
    chat_template = "off"                # quantization, backend/base_url, gpu_memory_utilization, ...

Each entry's keys are checked against the one declaration of `[model]` (batch/config.py ModelConfig and
RULES) before anything runs, every bad entry named on its own line (file, entry, field). An entry's
settings replace those of the run's `[model]` table (from --config or the defaults) for that model only,
and each model's run freezes its own (`<run>/config.json`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clarify.batch import config
from clarify.batch.config import ModelConfig, RunConfig
from clarify.errors import InputError


def slug(model: str) -> str:
    """The run directory's name of a model: its folder's name, normalised first (`/models/x/..` names
    `models`), never `.` or `..` (a run directory outside `<out>`), never hidden."""
    name = Path(os.path.normpath(model)).name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_.") or "model"


@dataclass(frozen=True)
class Entry:
    name: str  # the run directory's name inside the comparison folder
    settings: dict[str, Any]  # [model] keys this entry sets (always "model")

    @property
    def model(self) -> str:
        return self.settings["model"]

    def config(self, base: RunConfig) -> RunConfig:
        """`base` with this entry's [model] settings in place of its own."""
        values = {**dataclasses.asdict(base.model), **config._as_declared(self.settings, ModelConfig)}
        return dataclasses.replace(base, model=ModelConfig(**values))


def from_names(models: list[str]) -> list[Entry]:
    """The comma list of `--models a,b`: each model with the run's own [model] settings."""
    return [Entry(slug(m), {"model": m}) for m in models]


def load(path: str | Path) -> list[Entry]:
    """Entries of a models TOML file; one InputError listing every bad entry, one line each."""
    source = str(path)
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("models file not found", path=source) from None
    except IsADirectoryError:
        raise InputError("is a directory; --models takes a TOML file or a comma list", path=source) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"not valid TOML: {exc}", path=source) from None
    unknown = sorted(set(data) - {"model"})
    if unknown:
        raise InputError(f"unknown top-level key(s) {unknown}; a models file holds [[model]] tables only", path=source)
    tables = data.get("model")
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise InputError("no [[model]] tables (one per model: model = \"NAME or FOLDER\" and its settings)",
                         path=source)
    problems: list[InputError] = []
    entries: list[Entry] = []
    numbers: list[int] = []  # each entry's place in the file
    for i, table in enumerate(tables, 1):
        settings = {k: v for k, v in table.items() if k != "name"}
        label = f"model[{i}]"
        what = f"entry {table.get('model')!r}: " if isinstance(table.get("model"), str) else ""
        name = table.get("name")
        # the section's own problem (unknown keys) is the entry's; a field's is `model[i].field`
        bad = [(label if f == "model" else f"{label}.{f.removeprefix('model.')}", p)
               for f, p in config._check_values(settings, ModelConfig, "model")]
        if "model" not in settings:
            bad.append((f"{label}.model", "missing: the embedded model's name or a model folder"))
        if name is not None and (not isinstance(name, str) or slug(name) != name):
            bad.append((f"{label}.name", f"must be a folder name (letters, digits, . _ -), got {name!r}"))
        if len(bad) == 1:
            problems.append(InputError(what + bad[0][1], path=source, field=bad[0][0]))
        elif bad:  # one line per entry, naming each of its bad fields
            problems.append(InputError(what + "; ".join(f"{f.removeprefix(label + '.')}: {msg}" for f, msg in bad),
                                       path=source, field=label))
        if not bad:
            entries.append(Entry(name or slug(settings["model"]), settings))
            numbers.append(i)
    seen: dict[str, int] = {}
    for i, e in zip(numbers, entries):
        if e.name in seen:
            problems.append(InputError(f"two entries would share the run directory {e.name!r}: give one a "
                                       f"`name`", path=source, field=f"model[{i}].name"))
        seen[e.name] = i
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise InputError(f"{len(problems)} bad model entries:\n" + "\n".join(f"  {p}" for p in problems), path=source)
    return entries
