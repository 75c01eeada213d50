"""Declared fields: the one way clarify declares a field of its settings, its records and its table rows.

A field is a dataclass field, declared once, as vLLM's `EngineArgs` declares its own (vllm/engine/arg_utils.py
`add_cli_args`) and PyTerrier its frames' columns: the field holds the default, and `declared(...)` adds, in
its metadata (`Spec`), what the rest of the code derives from it:

    help, doc           what it does, without its default (the flag's help; `doc`: the longer text of the
                        configuration page, docs/configuration.md, when there is more to say)
    flag, metavar,      the `clarify run` flag that sets it ("": none) and, for a flag without an argument,
    switch              the value it sets (False for `--no-verify`)
    choices, lo, hi,    the allowed values (choices: a tuple, or a callable asked at each check; a StrEnum
    lo_open, nonempty   type declares its own), an inclusive range (lo exclusive when lo_open), not empty
    unit                what a number counts ("s", "tokens"), shown on the configuration page
    result_free         whether a run may change it when resumed: it never changes results (the scheduler,
                        a client's timeouts), so the resume comparison leaves it out (batch/run/rundir.py)
    constraint          a decoding constraint the setting switches on (batch/toc/constraints.py)
    dtype               a table row's field: the Polars type of its column (schemas.py `table_schema`)
    want, required,     a JSON record's field: how an error names what it must hold, whether a current
    omit_none           file must hold it, whether it is written only when set (index/manifest.py,
                        batch/run/records.py)

The type is the annotation, checked by `type_problem` / `json_type_ok`; `problem` checks the rest. From
these the code derives the config's validation (batch/config/schema.py), the configuration page
(batch/cli/config_doc.py), the flags and their help (`add_flag`; batch/cli/commands.py, local_llm/cli.py), the
resume comparison (batch/config/schema.py RESULT_FREE), the tables' schemas and the records' readers and writers.

Plain dataclasses, not pydantic: this module is imported by every command, and importing pydantic 2 and
defining one model takes 0.14-0.23 s on a 2-core machine, more than a `--help` should pay; pydantic coerces
by default (a TOML string "3" would pass as the integer 3, where clarify refuses it, as TOML's types are
the user's); and its errors are its own words over several lines ("1 validation error for M / x / Input
should be a valid integer, unable to parse string as an integer [type=int_parsing, ...]"), where clarify
names the file and the field in one line (docs/troubleshooting.md#configuration).

Here, at the top of the package, because `local_llm/` (the engine's and the server client's options),
`index/` (the manifest), `batch/` (the run config, the run's records) and schemas.py declare fields, and
this module imports nothing of clarify.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, dataclass, field
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class Spec:
    """What a field's declaration says beyond its type and default (the module docstring lists each)."""

    help: str = ""
    doc: str = ""
    flag: str = ""
    metavar: str | None = None
    switch: bool | None = None
    choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    nonempty: bool = False
    unit: str = ""
    result_free: bool = False
    constraint: str = ""
    dtype: Any = None
    want: str = ""
    required: bool = False
    omit_none: bool = False

    def allowed(self, hint: Any = None) -> tuple[str, ...] | None:
        """The allowed values: the declared choices (a callable is asked now), else a StrEnum type's values."""
        if self.choices is not None:
            return tuple(self.choices() if callable(self.choices) else self.choices)
        if is_choice(hint):
            return tuple(m.value for m in hint)
        return None

    def problem(self, value: Any, hint: Any = None) -> str | None:
        """Why a value of the right type is not allowed (choices, empty, range), or None."""
        choices = self.allowed(hint)
        if choices is not None and value not in choices:
            return f"unknown value {value!r}; choose one of {choices}"
        if self.nonempty and not value:
            return "must not be empty"
        below = self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)
        if below or (self.hi is not None and value > self.hi):
            return f"must be {self.bounds()}, got {value!r}"
        return None

    def bounds(self) -> str:
        """The range in words: ">= 1", "> 0", "in (0, 1]"; "" when none is declared."""
        if self.lo is None and self.hi is None:
            return ""
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo}"
        return f"in {'(' if self.lo_open else '['}{self.lo}, {self.hi}]"


PLAIN = Spec()  # a field declared without `declared` (a record's own bookkeeping: extra, schema_version)


def declared(default: Any = MISSING, *, default_factory: Any = MISSING, **spec: Any) -> Any:
    """A dataclass field with its default (or `default_factory`) and its Spec (the keywords)."""
    return field(default=default, default_factory=default_factory, metadata={"spec": Spec(**spec)})


def setting(default: Any, *, help: str, **spec: Any) -> Any:
    """A setting: a declared field that must say what it does (`help`, never the default: the generated help
    adds it)."""
    return declared(default, help=help, **spec)


def spec(f: Field) -> Spec:
    """The Spec of field `f` (PLAIN for one declared without `declared`)."""
    return f.metadata.get("spec", PLAIN)


@dataclass(frozen=True)
class JsonObject:
    """A JSON object read into a record: the keys its readers use declared, typed (None where the object lacks
    them), the others kept in `extra`. `to_json` gives the object back as it was read or made, its keys in
    their order (`keys`; a declared key absent from it stays absent), so what is shown, written again or
    hashed (an index's corpus, a run's pins) is what was there. The records of a run (batch/run/records.py)
    and the index manifest's corpus and build settings (index/manifest.py) are made of these."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)
    keys: tuple[str, ...] | None = field(default=None, kw_only=True, repr=False, compare=False)  # None: declared, extra

    @classmethod
    def _names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("extra", "keys")]

    @classmethod
    def of(cls, data: dict | None) -> Any:
        """The record of an object this clarify made or read; None stays None."""
        if data is None:
            return None
        names = cls._names()
        return cls(**{k: v for k, v in data.items() if k in names},
                   extra={k: v for k, v in data.items() if k not in names}, keys=tuple(data))

    def to_json(self) -> dict:
        keys = (*self._names(), *self.extra) if self.keys is None else self.keys
        return {k: self.extra[k] if k in self.extra else getattr(self, k) for k in keys}

    def value(self, name: str) -> Any:
        """The value of key `name` as the object holds it (declared or in `extra`; None when absent)."""
        return self.to_json().get(name)

    def with_(self, **values: Any) -> Any:
        """This object with `values` set; a declared key it lacked joins it last, as `{**obj, key: value}`."""
        keys = None if self.keys is None else (*self.keys, *(k for k in values if k not in self.keys))
        return dataclasses.replace(self, **values, keys=keys)


def default_of(f: Field) -> Any:
    return f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]


def is_choice(hint: Any) -> bool:
    """Whether a field's type is a choice: a StrEnum, whose values are its choices."""
    return isinstance(hint, type) and issubclass(hint, StrEnum)


def base_type(hint: Any) -> Any:
    """The type a value of the field is stored as in JSON or TOML: `int | None` -> int, `dict[str, int]` ->
    dict, `tuple[str, ...]` -> tuple, a StrEnum -> str."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if is_choice(hint):
        return str
    return typing.get_origin(hint) or hint


TYPE_WORDS = {bool: "a boolean (true or false)", int: "an integer", float: "a number", str: "a string",
              tuple: "a list of strings", dict: "an object", list: "a list"}


def json_type_ok(value: Any, hint: Any) -> bool:
    """Whether `value`, as JSON or TOML gives it, is of the declared type: a bool is not a number, an integer
    is a number (not a NaN or an infinity), a string is not a boolean, and a tuple is a list of strings."""
    t = base_type(hint)
    if t is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):  # True is an int to Python, not to a config or a record
        return False
    if t is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    if t is tuple:
        return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
    return isinstance(value, t)


def type_problem(value: Any, hint: Any) -> str | None:
    """Why `value` is not of the declared type, in words ("expected an integer, got str '3'"), or None."""
    if json_type_ok(value, hint):
        return None
    return f"expected {TYPE_WORDS[base_type(hint)]}, got {type(value).__name__} {value!r}"


def problem(value: Any, f: Field, hint: Any) -> str | None:
    """The declaration's verdict on one value: its type, then its allowed values and range."""
    return type_problem(value, hint) or spec(f).problem(value, hint)


def as_declared(value: Any, hint: Any) -> Any:
    """A checked value in its declared Python type: an integer for a float field is a float, a list a tuple,
    a string of a choice its enum member."""
    t = base_type(hint)
    if t is float:
        return float(value)
    if isinstance(value, list):
        return tuple(value)
    return hint(value) if is_choice(hint) else value


def toml_value(value: Any) -> str:
    """One value in TOML: a JSON string is a TOML basic string, and lists hold strings only (the schema)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):  # JSON's escapes are TOML's; DEL is the one character TOML wants escaped too
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    return repr(value)


def flag_help(f: Field, key: str = "") -> str:
    """A flag's help: the field's declared text, then the config key it sets (for a key of a table) and the
    field's default as a TOML value, e.g. `... ([toc] verify; default true)`."""
    section, _, name = key.rpartition(".")
    # an unset default (None) has no TOML value: the declared help says what unset means
    said = "; ".join([*([f"[{section}] {name}"] if section else []),
                      *([] if f.default is None else [f"default {toml_value(f.default)}"])])
    said = f" ({said})" if said else ""
    # argparse %-formats help texts (for %(default)s): a literal % is doubled
    return f"{spec(f).help}{said}".replace("%", "%%")


def value_type(f: Field) -> type | None:
    """The type a flag's value is parsed to: the default's, or for an unset default (None) the declared
    `int | None` / `float | None`; None for a string."""
    if type(f.default) in (int, float):
        return type(f.default)
    declared = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    return {"int | None": int, "float | None": float}.get(declared)


def flag_dest(f: Field) -> str:
    """The argparse attribute of a setting's flag (`--no-verify` -> no_verify)."""
    return spec(f).flag.removeprefix("--").replace("-", "_")


def flag_value(args: argparse.Namespace, f: Field) -> Any:
    """What the flag of setting `f` gave: a value flag's value, a switch's declared value when it is on;
    None when it was not given."""
    value = getattr(args, flag_dest(f), None)
    switch = spec(f).switch
    if switch is not None:
        return switch if value else None
    return value


def add_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, f: Field, key: str = "", *,
             flag: str = "", choices: tuple[str, ...] | None = None, default: Any = None) -> argparse.Action:
    """The flag of setting `f` (`flag`: its declared one unless given). `default`: what the parsed namespace
    holds when the flag is absent; None (the run's flags) leaves the config's value, from the defaults or
    --config, in force."""
    s = spec(f)
    name = flag or s.flag
    if s.switch is not None:
        return parser.add_argument(name, action="store_true", help=flag_help(f, key))
    kwargs: dict[str, Any] = {"help": flag_help(f, key), "default": default}
    if (kind := value_type(f)) is not None:
        kwargs["type"] = kind
    if choices is not None:
        kwargs["choices"] = choices
    if s.metavar:
        kwargs["metavar"] = s.metavar
    return parser.add_argument(name, **kwargs)
