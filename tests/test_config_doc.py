"""docs/configuration.md is generated from the code (batch/config_doc.py): the test regenerates it and
fails when a config default, an allowed value or a flag changed without the page. `clarify run
--print-config` prints TOML that `--config` reads back to the same config. Fast: nothing runs."""

from __future__ import annotations

import dataclasses

from clarify.batch import commands, config, config_doc
from clarify.batch.cli import main

REGENERATE = "python -m clarify.batch.config_doc --write"


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
