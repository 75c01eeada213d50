"""The configuration reference, generated from the code: every config key of `batch/config/schema.py` (type,
default, allowed values, whether it changes results and so is compared on resume: each setting's declaration,
options.Spec) and every subcommand,
positional argument and flag of `clarify` with its description (from the argparse parsers of batch/cli/__init__.py),
as one Markdown page.

    python -m clarify.batch.cli.config_doc --write     # writes docs/configuration.md
    python -m clarify.batch.cli.config_doc             # prints it

tests/test_config_doc.py regenerates the page and fails when docs/configuration.md differs, so a default,
a choice or a flag cannot change without the page.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from clarify.batch import config
from clarify.files import page_main
from clarify.options import base_type, default_of, flag_dest, spec, toml_value

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _type_name(hint: Any, unit: str) -> str:
    t = base_type(hint)  # a StrEnum is a string, one of its values (the "allowed" column)
    name = "bool" if t is bool else t.__name__ if t in (int, float, str) else "list of strings"
    return f"{name} ({unit})" if unit else name


def _allowed(f: dataclasses.Field, hint: Any) -> str:
    s = spec(f)
    if (choices := s.allowed(hint)) is not None:
        return ", ".join(f"`{c}`" for c in choices)
    return "not empty" if s.nonempty else s.bounds()


def config_rows() -> list[tuple[str, str, str, str, str, str]]:
    """(key, type, default, allowed, changes results, description) for every config key, from its declaration
    (options.Spec): the description is its `doc`, else its `help`."""
    return [(key, _type_name(hint, spec(f).unit), f"`{toml_value(default_of(f))}`", _allowed(f, hint),
             "no (recorded)" if spec(f).result_free else "yes (frozen)", spec(f).doc or spec(f).help)
            for key, f, hint in config.settings()]


def _flag_keys() -> dict[str, str]:
    """argparse dest -> the config key its flag sets (the declared flags: config.flagged)."""
    return {flag_dest(f): key for key, f in config.flagged()}


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, child in subs[0].choices.items():
        yield from leaves(child, (*path, name))


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _flag_type(action: argparse.Action) -> str:
    if not action.option_strings:  # a positional's metavar names what it is (RUN), not a type
        if action.nargs in ("+", "*"):
            return "list"  # several (report's RUN_DIR..., merge-shards' folders)
        if action.choices is None and action.type not in (int, float):
            return "text"
    if action.nargs == 0:
        return "switch"
    if action.choices is not None:
        return "choice"
    if action.type in (int, float):
        return action.type.__name__
    if action.type is not None:
        return "list" if "," in str(action.default) or isinstance(action.default, list) else "value"
    return action.metavar.lower() if isinstance(action.metavar, str) else "text"


def _positional(action: argparse.Action) -> str:
    """A positional argument as its usage line names it (`RUN`, `QID`, `names`), optional ones in brackets."""
    name = action.metavar if isinstance(action.metavar, str) else action.dest
    return f"`[{name}]`" if action.nargs in ("?", "*") else f"`{name}`"


def flag_rows(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    """One row per argument of the command: its positional arguments first, in the order they are given
    (as its usage line), then its flags."""
    keys = _flag_keys()
    rows = []
    arguments = sorted(parser._actions, key=lambda a: bool(a.option_strings))  # stable: positionals first
    for a in arguments:
        if isinstance(a, argparse._HelpAction) or a.dest == "verbose":
            continue
        if not a.option_strings:
            optional = a.nargs in ("?", "*")
            shown = "" if a.default in (None, [], argparse.SUPPRESS) else f"`{a.default}`"
            choices = ", ".join(f"`{c}`" for c in a.choices) if a.choices else ""
            rows.append((_positional(a), _flag_type(a), shown, choices, "" if optional else "required",
                         _cell(_help(a))))
            continue
        default = a.default
        if isinstance(default, list):
            default = ",".join(map(str, default))
        # `is`, not `in`: 0 and 0.0 equal False, and a default of 0 is one (`generate --temperature`)
        shown = "" if default is None or default is False or default == argparse.SUPPRESS else f"`{default}`"
        key = keys.get(a.dest) if path[0] in ("run", "compare") else None
        if key is not None:
            free = config.result_free(key)
            effect = f"`{key}`, " + ("no (recorded)" if free else "yes (frozen)")
        else:
            effect = "required" if a.required else ""
        choices = ", ".join(f"`{c}`" for c in a.choices) if a.choices else ""
        rows.append((", ".join(f"`{o}`" for o in a.option_strings), _flag_type(a), shown, choices, effect,
                     _cell(_help(a))))
    return rows


def _help(action: argparse.Action) -> str:
    """An argument's help as `--help` prints it, without the default (its own column): argparse %-formats
    help texts, so a literal % is written %% (options.flag_help) and %(choices)s names the choices."""
    return argparse.HelpFormatter("clarify")._expand_help(action) if action.help else ""


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def render() -> str:
    from clarify.batch.cli import build_parser

    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m clarify.batch.cli.config_doc --write` from batch/config/schema.py and the CLI",
        "parsers; tests/test_config_doc.py fails when this page and the code disagree. Do not edit by hand. -->",
        "",
        "A run's settings come from the defaults (the paper's), then a TOML file (`--config run.toml`, or a "
        "run's frozen `config.json`), then the flags. `clarify run ... --print-config` prints the effective "
        "settings as TOML that `--config` reads back, without running anything:",
        "",
        "```sh",
        "clarify run --dataset asqa --limit 50 --out runs/asqa50 --print-config > run.toml",
        "clarify run --config run.toml --out runs/asqa50",
        "```",
        "",
        "Every key is checked against its type and allowed values before anything loads; one error names "
        "every bad field ([troubleshooting](troubleshooting.md#configuration)). **Changes results**: "
        "\"yes (frozen)\" keys are written into the run directory's `config.json` and a resumed run with "
        "another value is refused ([reproducibility](reproducibility.md)); \"no (recorded)\" keys are "
        "recorded but may change between sessions of one run.",
        "",
        "## Config keys",
        "",
        "Top-level keys first, then one TOML table per section (`[retrieval]`, `[toc]`, `[answer]`, "
        "`[model]`, `[cluster]`).",
        "",
    ]
    lines += _table(("key", "type", "default", "allowed", "changes results", "what"), config_rows())
    lines += ["", "## Command-line flags", "",
              "Every command also takes `-v/--verbose` (library logs on the terminal too) and `-h/--help`. "
              "A flag that sets a config key overrides the TOML file; its default is then the key's. A "
              "command's positional arguments come first in its table, in the order they are given; one in "
              "brackets may be left out.", ""]
    for path, parser in leaves(build_parser()):
        lines += [f"### clarify {' '.join(path)}", "", _cell(parser.description or ""), ""]
        rows = flag_rows(path, parser)
        lines += _table(("argument", "type", "default", "choices", "config key / changes results", "what"), rows)
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return page_main(argv, PAGE, render, "print (or --write) docs/configuration.md")

if __name__ == "__main__":
    sys.exit(main())

