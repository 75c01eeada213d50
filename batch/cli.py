"""`clarify` command line. Each subpackage registers its own subcommands; heavy imports happen
only when a subcommand runs, so `clarify --help` is instant."""

from __future__ import annotations

import argparse
import importlib
import sys

from clarify.errors import InputError

# (module, function) pairs; each function takes the subparsers object and adds its commands.
REGISTRARS = [
    ("clarify.local_llm.cli", "register"),
    ("clarify.index.cli", "register"),
    ("clarify.eval.cli", "register"),
    ("clarify.batch.commands", "register"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clarify", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module, func in REGISTRARS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # a subpackage not built yet must not break the others
            if exc.name == module:
                continue
            raise
        getattr(mod, func)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (InputError, FileNotFoundError) as exc:
        # Bad input: one line naming the file/line/field, never a traceback.
        print(f"clarify {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
