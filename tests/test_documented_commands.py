"""Every command line of the README's and docs/'s shell code blocks and every example the commands' `--help`
prints goes through argument parsing and, for the commands that run ToC, the config and the dataset's own
checks: a documented command that cannot work fails here, not in a user's hands. Fast: nothing runs."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from clarify.batch.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def _leaves(parser: argparse.ArgumentParser):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser
        return
    for child in dict.fromkeys(subs[0].choices.values()):
        yield from _leaves(child)


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _page_commands(page: Path) -> list[str]:
    """Lines of a page's shell code blocks (```sh) that start with `clarify ` or `.venv/bin/clarify ` (a `\\`
    continues a line); `# ...` comments and shell redirections dropped, `[optional]` parts kept without
    their brackets, `$NAME` replaced by the block's own `NAME=value` line."""
    out, block, pending, names = [], False, "", {}
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            block = not block and line.strip() in ("```sh", "```bash")
            names = {}
            continue
        if not block:
            continue
        # a block that names the user's paths first (`MODEL=/models/...`, docs/getting-started.md's air-gap
        # walk): its commands are checked with those values
        if assigned := re.match(r"([A-Z_]+)=(\S+)", line.strip()):
            names[assigned[1]] = assigned[2]
            continue
        text = re.sub(r"\$([A-Z_]+)", lambda m, v=names: v.get(m[1], m[0]), pending + line.strip())
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        text = text.removeprefix(".venv/bin/")
        if text.startswith("clarify "):
            text = re.split(r"\s(?:>|\||2>|&&)\s", text.split(" #")[0])[0]
            out.append(re.sub(r"\[([^\]]*)\]", r"\1", text).replace(" ...", "").strip())
    return out


def _readme_commands() -> list[str]:
    return [c for page in PAGES for c in _page_commands(page)]


def _help_commands() -> list[str]:
    """The example lines of every command's --help (the text after two spaces describes it)."""
    top = build_parser()
    names = {n for a in top._actions if isinstance(a, argparse._SubParsersAction) for n in a.choices}
    out = []
    for parser in [top, *_leaves(top)]:
        for line in parser.format_help().splitlines():
            text = line.strip()
            if text.startswith("clarify ") and text.split()[1] in names and not text.endswith("directory"):
                out.append(re.split(r"\s{2,}", text)[0])
    return out


README = _readme_commands()
HELP = _help_commands()


def _validate(line: str) -> None:
    from clarify.batch import config
    from clarify.batch.cli import commands
    from clarify.batch.run.resources import load_questions

    argv = shlex.split(line)[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"{line!r}: argparse refused it (exit {exc.code})") from None
    if args.command not in ("run", "compare"):
        return
    toml = Path(args.config) if args.config else None
    if toml is not None and not toml.is_absolute():
        toml = ROOT / toml
    cfg = config.load(toml if toml is None or toml.exists() else None, commands._overrides(args))
    # a user's own file (my.jsonl, ASQA.json) is a placeholder here; the shipped datasets are real (the run
    # over a small official-layout ASQA.json: tests/test_demo_pool.py)
    if not cfg.questions:
        load_questions(cfg)


def test_the_documented_commands_are_found():
    assert len(README) >= 40 and len(HELP) >= 20
    for page in ("README.md", "docs/getting-started.md", "docs/running-toc.md", "docs/retrieval.md", "docs/scale.md",
                 "docs/evaluation.md"):
        assert _page_commands(ROOT / page), f"{page}: no command found"
    for words in ("clarify run --dataset asqa --limit 50", "clarify compare --models", "clarify index build"):
        assert any(c.startswith(words) for c in README), words
        assert any(c.startswith(words) for c in HELP), words


@pytest.mark.parametrize("line", sorted(set(README + HELP)))
def test_a_documented_command_line_passes_its_checks(line):
    _validate(line)
