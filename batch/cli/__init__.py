"""clarify answers ambiguous questions offline: Tree of Clarifications (Kim et al., EMNLP 2023) on a local
model served by vLLM, over a local Wikipedia index, with answers quoted from their sources and scored by
the ASQA and QuoteSum metrics.

start here:
  clarify doctor                          what is installed and ready on this machine
  clarify demo                            the whole pipeline on the embedded defaults (minutes)

everyday commands:
  clarify run --dataset asqa --limit 50 --out runs/asqa50      ToC into a run directory (resumable)
  clarify run --dataset jsonl --questions my.jsonl --out runs/mine
  clarify eval --dataset asqa --predictions runs/asqa50       score a run or an official predictions file
  clarify report runs/asqa50 --out report.html                one self-contained HTML report
  clarify show runs/asqa50 [QID]                              one question's tree and quoted answer
  clarify generate --prompts prompts.jsonl --out out.parquet  plain batch generation
  clarify index build --corpus passages.jsonl --out DIR       your own passage index

Run `clarify COMMAND --help` for a command's manual: its options, their defaults and where it writes.

Quiet by default: vLLM, torch, Java and library logs and warnings go to a log file (logs/ in the run
directory, else $CLARIFY_HOME/logs); the terminal shows one progress line per stage and, at the end, the
warnings that matter in words and the log's path. -v/--verbose shows everything as it happens.
Generated files live in $CLARIFY_HOME (default ~/.cache/clarify): converted models, the index, logs.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import shutil
import sys
from pathlib import Path

from clarify import console, files, stops
from clarify.errors import WRITE_ERRNOS, EngineBusy, EngineUnavailable, InputError, redacted, write_failure
from clarify.stops import Stopped

# (module, function) pairs; each function takes the subparsers object and adds its commands.
# Heavy imports happen only when a subcommand runs, so `clarify --help` is instant.
REGISTRARS = [
    ("clarify.batch.cli.doctor", "register"),
    ("clarify.batch.cli.offline", "register"),
    ("clarify.local_llm.cli", "register"),
    ("clarify.index.cli", "register"),
    ("clarify.eval.cli", "register"),
    ("clarify.batch.cli.commands", "register"),
    ("clarify.batch.cli.show", "register"),
]


class ManualFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written (examples keep their lines); every option's default shown
    when it has one worth showing (argparse's ArgumentDefaultsHelpFormatter would also print
    'default: None' and 'default: False')."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        default = action.default
        # `is`, not `in`: 0 and 0.0 equal False, and a default of 0 (`generate --temperature`) is worth showing
        if ("default" in help_text or default is None or default is False or default == argparse.SUPPRESS
                or isinstance(action, argparse._HelpAction | argparse._VersionAction)):
            return help_text
        return f"{help_text} (default: %(default)s)" if help_text else "default: %(default)s"


class Subcommands(argparse._SubParsersAction):
    """A command's subcommands: one given only its one-line `help` (what `clarify --help` lists) has it as
    its description too, so its own `--help` and the generated reference (batch/cli/config_doc.py,
    docs/configuration.md) say what it does; argparse itself leaves that description empty."""

    def add_parser(self, name, **kwargs):
        if not kwargs.get("description") and kwargs.get("help"):
            kwargs["description"] = kwargs["help"][:1].upper() + kwargs["help"][1:] + "."
        return super().add_parser(name, **kwargs)


class Parser(argparse.ArgumentParser):
    """Every clarify (sub)command parser: manual formatting, -v/--verbose on each command, and a
    description on each subcommand (Subcommands)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", ManualFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", Subcommands)


def _add_verbose(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    """-v on the top parser and on every leaf command (so `clarify run ... -v` works too)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _add_verbose(child)
            if not top:
                return
    parser.add_argument("-v", "--verbose", action="store_true",
                        default=False if top else argparse.SUPPRESS,
                        help="show library logs, warnings and native output on the terminal as well "
                             "(they always go to the log file)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="clarify", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for module, func in REGISTRARS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # a subpackage not built yet must not break the others
            if exc.name == module:
                continue
            raise
        getattr(mod, func)(sub)
    _add_verbose(parser, top=True)
    return parser


def _log_dir(args: argparse.Namespace) -> Path | None:
    """Where a noisy command's log goes (None: the command loads no heavy library and logs nothing)."""
    where = getattr(args, "log_dir", None)
    return where(args) if where else None


def _unmake(log_dir: Path) -> None:
    """A run refused before its directory was set up leaves no directory behind (nothing is written
    before every input is checked, docs/reproducibility.md#checked-before-anything-loads): when the only thing in it is the log folder
    this session made, the logs move to $CLARIFY_HOME/logs and the directory goes."""
    from clarify import console

    run_dir = log_dir.parent
    try:
        if [p.name for p in run_dir.iterdir()] != [log_dir.name]:
            return
        home = console.home_logs()
        home.mkdir(parents=True, exist_ok=True)
        for f in log_dir.iterdir():
            shutil.move(str(f), home / f.name)
        log_dir.rmdir()
        run_dir.rmdir()
    except OSError:
        pass  # the logs stay where they are; never mask the command's own outcome


# Commands that a second call with the same arguments resumes (a run directory keeps what was done).
RESUMABLE = {"run", "demo", "compare"}


def _again(argv: list[str] | None) -> str:
    """The command line that resumes this one, as the user typed it but for URL credentials (errors.redacted)."""
    return redacted("clarify " + shlex.join(sys.argv[1:] if argv is None else argv))


def _stopped(args: argparse.Namespace, argv: list[str] | None, exc: Stopped) -> int:
    """One line for a command stopped by a signal: what stopped it, how far it got, how to go on; the
    exit status a shell gives a process killed by that signal (stops.py)."""
    words = " ".join(filter(None, (args.command, getattr(args, "index_command", None))))
    line = f"clarify {words}: stopped by {exc.name}" + (f": {exc.done}" if exc.done else "")
    again = _again(argv)
    line += f"; resume with: {again}" if args.command in RESUMABLE else f"; nothing kept, run again: {again}"
    print(line, file=sys.stderr, flush=True)
    return exc.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with stops.handled():
        try:
            return _main(args)
        except Stopped as exc:
            return _stopped(args, argv, exc)
        except EngineBusy as exc:  # cores or GPU memory taken by another process: nothing started
            print(f"clarify {args.command}: error: {exc}", file=sys.stderr, flush=True)
            return 1
        except EngineUnavailable as exc:  # a server that stopped answering: what finished is kept
            again = _again(argv)
            tail = f"; what finished is kept, resume with: {again}" if args.command in RESUMABLE else ""
            print(f"clarify {args.command}: error: {exc}{tail}", file=sys.stderr, flush=True)
            return 1


def _main(args: argparse.Namespace) -> int:
    log_dir = _log_dir(args)
    try:
        files.restrict_umask()  # what it and its libraries write is private (docs/reproducibility.md#files-and-permissions)
        if log_dir is None:
            return int(args.func(args) or 0)
        name = "-".join(filter(None, (args.command, getattr(args, "index_command", None),
                                      getattr(args, "models_command", None))))
        made = not log_dir.parent.exists()  # a new run directory, made here only to hold the log
        try:
            with console.session(log_dir, name, verbose=args.verbose):
                rc = int(args.func(args) or 0)
                console.print_notes()
        finally:
            if made:
                _unmake(log_dir)
        return rc
    except (InputError, FileNotFoundError) as exc:
        # Bad input: one line naming the file/line/field, never a traceback.
        print(f"clarify {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        # A full disk, a read-only file system: one line with the path and what to do (errors.py).
        print(f"clarify {args.command}: error: {write_failure(exc)}", file=sys.stderr)
        return 1
