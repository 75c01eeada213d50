"""docs/configuration.md is generated from the code (batch/cli/config_doc.py): the test regenerates it and
fails when a config default, an allowed value or a flag changed without the page. `clarify run
--print-config` prints TOML that `--config` reads back to the same config. Fast: nothing runs."""

from __future__ import annotations

import argparse
import dataclasses

from clarify.batch import config
from clarify.batch.cli import Parser, build_parser, commands, config_doc, main

REGENERATE = "python -m clarify.batch.cli.config_doc --write"


def test_the_page_is_what_the_code_generates():
    assert config_doc.PAGE.read_text(encoding="utf-8") == config_doc.render(), (
        f"docs/configuration.md is out of date with the code: run `{REGENERATE}` and commit the page")


def test_the_page_notices_a_changed_default_and_a_changed_flag(monkeypatch):
    page = config_doc.PAGE.read_text(encoding="utf-8")
    field = {f.name: f for f in dataclasses.fields(config.TocConfig)}["max_depth"]
    monkeypatch.setattr(field, "default", 4)
    assert "| toc.max_depth | int | `4` |" in config_doc.render() and config_doc.render() != page
    monkeypatch.undo()
    monkeypatch.setattr(commands, "PART_TREES", 65)  # `clarify run --part-trees`' default
    assert "`--part-trees` | int | `65`" in config_doc.render()


def test_every_key_and_run_flag_is_on_the_page():
    page = config_doc.PAGE.read_text(encoding="utf-8")
    for section, cls in [("", config.RunConfig), *config._SECTIONS.items()]:
        for f in dataclasses.fields(cls):
            if f.name not in config._SECTIONS:
                assert f"| {section + '.' if section else ''}{f.name} |" in page, f.name
    for flag in ("--constrain-format", "--print-config", "--workers", "--faiss-index"):
        assert f"`{flag}`" in page
    # a flag that sets a key says which, and whether it changes results
    assert "| `--seed` | int |  |  | `seed`, yes (frozen) |" in page
    assert "`cluster.workers`, no (recorded)" in page


def undescribed(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("clarify",)) -> list[str]:
    """Every subcommand (nested ones included), positional argument and flag of `parser` without a help
    text, by where it is: `clarify index build --hnsw-m`, `clarify show RUN`, `clarify models (subcommand
    info)`. A subcommand needs both its one-line help (what its parent's --help lists) and a description
    (what its own --help and the reference show)."""
    blank = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                if not (listed.get(name) or "").strip() or not (child.description or "").strip():
                    blank.append(f"{' '.join(path)} (subcommand {name})")
                blank += undescribed(child, (*path, name))
            continue
        name = "/".join(action.option_strings) or (action.metavar if isinstance(action.metavar, str) else action.dest)
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            blank.append(f"{' '.join(path)} {name}")
    return blank


def test_every_command_argument_and_flag_is_described():
    """The reference is complete: the real `clarify` parser has no subcommand, positional or flag without a
    description, so the page has none either (a blank 'what' cell, a section without a sentence)."""
    assert undescribed(build_parser()) == [], "give these a help= text (and regenerate: " + REGENERATE + ")"


def test_a_missing_description_is_named():
    top = Parser(prog="clarify")
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    index = sub.add_parser("index", help="the index")
    build = index.add_subparsers(dest="index_command").add_parser("build", help="build one")
    build.add_argument("--hnsw-m", type=int, default=32)
    show = sub.add_parser("show")  # no help: neither listed nor described
    show.add_argument("run_dir", metavar="RUN", help="a run")
    show.add_argument("qid", metavar="QID", nargs="?")
    assert undescribed(top) == ["clarify index build --hnsw-m", "clarify (subcommand show)", "clarify show QID"]


def test_the_page_shows_positionals_and_subcommand_descriptions():
    page = config_doc.PAGE.read_text(encoding="utf-8")
    section = {path: parser for path, parser in config_doc.leaves(build_parser())}
    for path, parser in section.items():
        heading = f"### clarify {' '.join(path)}\n\n"
        assert heading + config_doc._cell(parser.description) + "\n" in page, path
    show = page[page.index("### clarify show"):]
    assert "| `RUN` | text |  |  | required | a run directory" in show
    assert "| `[QID]` | text |  |  |  | the question's id" in show
    assert "| `RUN_DIR` | list |  |  | required | run directories" in page[page.index("### clarify report"):]
    assert "| `bundle` | text |  |  | required |" in page[page.index("### clarify offline manifest"):]
    # a help's %% is printed as %, as --help prints it; a default of 0 is shown, not taken for "off"
    assert "paired 95% intervals" in page and "%%" not in page
    assert "| `--temperature` | float | `0.0` |" in page


def test_print_config_round_trips_through_config(tmp_path, capsys):
    argv = ["run", "--dataset", "quotesum", "--limit", "7", "--constrain-format", "--seed", "3",
            "--scheduler", "waves", "--workers", "2", "--out", str(tmp_path / "run"), "--print-config"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert not (tmp_path / "run").exists()  # nothing is written, no log folder either
    assert 'dataset = "quotesum"' in printed and "constrain_format = true" in printed
    toml = tmp_path / "run.toml"
    toml.write_text(printed, encoding="utf-8")
    expected = config.load(None, {"dataset": "quotesum", "limit": 7, "toc.constrain_format": True, "seed": 3,
                                  "scheduler": "waves", "cluster.workers": 2})
    assert config.load(toml) == expected and config.load(toml).to_json() == expected.to_json()
    assert main(["run", "--config", str(toml), "--out", str(tmp_path / "run"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed


def test_to_toml_keeps_odd_strings_and_lists(tmp_path):
    cfg = dataclasses.replace(config.RunConfig(), index='C:\\x "q"\ttab\x7f😀',
                              model=config.ModelConfig(stop=("\n\nQ:", "]")))
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml(), encoding="utf-8")
    assert config.load(path) == cfg
