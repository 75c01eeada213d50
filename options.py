"""A setting is declared once, in its dataclass field, as vLLM's `EngineArgs` declares its own
(vllm/engine/arg_utils.py `add_cli_args`): the field holds the default, and `setting(...)` adds what it does
(`help`, never the default) and the command-line flag that sets it. The flags, their help and the
configuration page are generated from the field (`add_flag`; batch/commands.py, local_llm/cli.py,
batch/config_doc.py), so the default printed by `--help` is the default the code runs with.

Here, at the top of the package, because both `local_llm/` (the engine's and the server client's options)
and `batch/` (the run config) declare settings, and `local_llm/` imports nothing of `batch/`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import Field, field
from typing import Any


def setting(default: Any, *, help: str, flag: str = "", metavar: str | None = None,
            switch: bool | None = None) -> Any:
    """A dataclass field whose default is `default`. `help`: what the setting does, without its default (the
    generated help adds it); `flag`: the `clarify run` flag that sets it ("": none); `switch`: the value a
    flag without an argument sets (False for `--no-verify`), None for a flag that takes a value."""
    return field(default=default, metadata={"help": help, "flag": flag, "metavar": metavar, "switch": switch})


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
    return f"{f.metadata['help']}{said}".replace("%", "%%")


def value_type(f: Field) -> type | None:
    """The type a flag's value is parsed to: the default's, or for an unset default (None) the declared
    `int | None` / `float | None`; None for a string."""
    if type(f.default) in (int, float):
        return type(f.default)
    declared = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    return {"int | None": int, "float | None": float}.get(declared)


def flag_dest(f: Field) -> str:
    """The argparse attribute of a setting's flag (`--no-verify` -> no_verify)."""
    return f.metadata["flag"].removeprefix("--").replace("-", "_")


def flag_value(args: argparse.Namespace, f: Field) -> Any:
    """What the flag of setting `f` gave: a value flag's value, a switch's declared value when it is on;
    None when it was not given."""
    value = getattr(args, flag_dest(f), None)
    if f.metadata["switch"] is not None:
        return f.metadata["switch"] if value else None
    return value


def add_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, f: Field, key: str = "", *,
             flag: str = "", choices: tuple[str, ...] | None = None, default: Any = None) -> argparse.Action:
    """The flag of setting `f` (`flag`: its declared one unless given). `default`: what the parsed namespace
    holds when the flag is absent; None (the run's flags) leaves the config's value, from the defaults or
    --config, in force."""
    meta = f.metadata
    name = flag or meta["flag"]
    if meta["switch"] is not None:
        return parser.add_argument(name, action="store_true", help=flag_help(f, key))
    kwargs: dict[str, Any] = {"help": flag_help(f, key), "default": default}
    if (kind := value_type(f)) is not None:
        kwargs["type"] = kind
    if choices is not None:
        kwargs["choices"] = choices
    if meta["metavar"]:
        kwargs["metavar"] = meta["metavar"]
    return parser.add_argument(name, **kwargs)
