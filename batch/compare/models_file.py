"""The model matrix of `clarify compare --models FILE`: one TOML table per model, its own `[model]` settings.

    [[model]]
    model = "smollm2-135m-instruct"      # an embedded model's name or a model folder (required)

    [[model]]
    name = "gemma-fp32"                  # the run directory's name (default: the model folder's name)
    model = "gemma3-270m"
    dtype = "float32"                    # any [model] setting: dtype, tensor_parallel_size, max_model_len,
    chat_template = "off"                # quantization, backend/base_url, gpu_memory_utilization, ...

    [[model]]
    name = "served-8b"
    model = "llama-3.1-8b-instruct"      # the served model's id
    backend = "openai"
    base_url = "http://gpu-box:8000/v1"
    params = "8B"                        # its parameter count, for the table and the plot (optional)

Each entry's keys are checked against the one declaration of `[model]` (batch/config/schema.py ModelConfig: each
field's type and declared range or choices) before anything runs, every bad entry named on its own line
(file, entry, field). An entry's settings replace those of the run's `[model]` table (from --config or the
defaults) for that model only, and each model's run freezes its own (`<run>/config.json`).

`name` and `params` are the comparison's, not the model's: `name` must be a folder name that none of the
comparison folder's own files takes (`COMPARE_FILES`, nor another entry's `<name>.log`); `params` (a
positive number, or one with a K/M/B/T suffix: "135M", "1.5B") is the parameter count the comparison
table and plot show for that model, in place of the one its run read from the model's files (a served
model's run has none; docs/scale.md#comparing-models).
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

# What `clarify compare` writes at the top of its --out besides the models' run directories and their
# `<name>.log` (batch/compare/compare.py): a model's run directory must never take one of these names, or the
# comparison would write into that run's folder (or its table onto the run directory) after the runs.
COMPARE_FILES = ("config.json", "logs", "models", "search_cache", "comparison.parquet", "paired.parquet",
                 "comparison.md", "comparison.png")
_SUFFIX = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def slug(model: str) -> str:
    """The run directory's name of a model: its folder's name, normalised first (`/models/x/..` names
    `models`), never `.` or `..` (a run directory outside `<out>`), never hidden."""
    name = Path(os.path.normpath(model)).name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_.") or "model"


def name_clash(name: str, names: list[str], what: str, hint: str = "", **where) -> InputError | None:
    """The error for `name` as a model's run directory among the entries `names` of one comparison, or None:
    it is one of the comparison's own files (`COMPARE_FILES`; compared without case, as a case-insensitive
    file system sees them), or another entry's log (`<other>.log`). `what` names the entry, `hint` how to
    rename it, `where` the file or field."""
    if name.lower() in COMPARE_FILES:
        return InputError(f"{what}: the run directory {name!r} would take the place of the comparison's own "
                          f"{name.lower()} (clarify compare writes {', '.join(COMPARE_FILES)} beside the runs): "
                          f"give the model another name{hint}", **where)
    if name.lower().endswith(".log") and name[:-4] in names:
        return InputError(f"{what}: the run directory {name!r} would take the place of model {name[:-4]!r}'s "
                          f"log: give the model another name{hint}", **where)
    return None


def parse_params(value: object) -> float:
    """A parameter count: a positive number (135000000, 1.35e8) or a string of one with a K/M/B/T suffix
    ("135M", "1.5B", "8b"). ValueError saying what it takes otherwise."""
    number = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][0-9]+)?)\s*([kKmMbBtT]?)\s*", value)
        if m:
            number = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if number is None or not number > 0 or number == float("inf"):
        raise ValueError(f"must be a positive parameter count (a number, or one with K, M, B or T: \"135M\", "
                         f"\"8B\"), got {value!r}")
    return number


@dataclass(frozen=True)
class Entry:
    name: str  # the run directory's name inside the comparison folder
    settings: dict[str, Any]  # [model] keys this entry sets (always "model")
    params: float | None = None  # the parameter count the comparison shows (a models file's `params`)

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
        settings = {k: v for k, v in table.items() if k not in ("name", "params")}
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
        params = None
        if "params" in table:
            try:
                params = parse_params(table["params"])
            except ValueError as exc:
                bad.append((f"{label}.params", str(exc)))
        if len(bad) == 1:
            problems.append(InputError(what + bad[0][1], path=source, field=bad[0][0]))
        elif bad:  # one line per entry, naming each of its bad fields
            problems.append(InputError(what + "; ".join(f"{f.removeprefix(label + '.')}: {msg}" for f, msg in bad),
                                       path=source, field=label))
        if not bad:
            entries.append(Entry(name or slug(settings["model"]), settings, params))
            numbers.append(i)
    seen: dict[str, int] = {}
    for i, e in zip(numbers, entries):
        if e.name in seen:
            problems.append(InputError(f"two entries would share the run directory {e.name!r}: give one a "
                                       f"`name`", path=source, field=f"model[{i}].name"))
        elif clash := name_clash(e.name, [x.name for x in entries], f"entry {e.model!r}", " (`name`)",
                                 path=source, field=f"model[{i}].name"):
            problems.append(clash)
        seen[e.name] = i
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise InputError(f"{len(problems)} bad model entries:\n" + "\n".join(f"  {p}" for p in problems), path=source)
    return entries
