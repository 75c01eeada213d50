"""`clarify --help` and each command's help read as a manual; `clarify doctor` says what is ready.
Fast: no engine, no JVM."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from clarify.batch import config
from clarify.batch.cli import build_parser, main
from clarify.batch.cli.config_doc import leaves as _leaves
from clarify.options import spec, toml_value


def test_top_help_is_a_manual():
    text = build_parser().format_help()
    for words in ("start here:", "clarify doctor", "clarify demo", "$CLARIFY_HOME", "-v, --verbose", "log file"):
        assert words in text


def test_every_command_has_help_examples_defaults_and_verbose():
    leaves = dict(_leaves(build_parser()))
    assert {("run",), ("demo",), ("doctor",), ("generate",), ("index", "build"), ("eval",)} <= set(leaves)
    for path, parser in leaves.items():
        text = parser.format_help()
        assert "-v, --verbose" in text, path
        assert "example" in text.lower(), path  # every command shows how it is used
    run = leaves[("run",)].format_help()
    assert "writes into --out" in run and "summary.json" in run and "logs/" in run
    assert "0 = all: for asqa every dev question, or with the shipped dev-only file every one outside the demo pool " \
           "dev 500-947 (default 20)" in " ".join(run.split())  # a setting's flag shows the declared default
    build = leaves[("index", "build")].format_help()
    assert '(default "cpu")' in build  # the declared default is printed (--device: index/build.py BuildOptions)
    assert "default: None" not in build and "default: False" not in build


def _printed(parser) -> str:
    """`--help` as printed, its line breaks undone (argparse also breaks after a hyphen)."""
    return " ".join(re.sub(r"-\n\s+", "-", parser.format_help()).split())


def _flag_help(parser, flag: str) -> str:
    action = next(a for a in parser._actions if flag in a.option_strings)
    text = " ".join(parser._get_formatter()._expand_help(action).split())
    assert text in _printed(parser), flag  # what --help prints for the flag
    return text


def test_every_default_in_the_help_is_the_declared_one():
    """Each flag that sets a run setting prints that setting's default, as the config (RunConfig()) and so
    the run has it: parsed from `clarify run --help` and `clarify compare --help`, one "default X" per flag. A
    default hard-coded into a help text, or a field whose default changed without its help, fails here."""
    cfg = config.RunConfig()

    def value(key: str):
        obj = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        return obj

    leaves = dict(_leaves(build_parser()))
    flagged = config.flagged()
    assert len(flagged) >= 20  # every value flag of `clarify run` is generated from its setting
    for path in (("run",), ("compare",)):
        for key, f in flagged:
            if path == ("compare",) and key == "model.model":
                continue  # compare: each model's own, from --models
            text = _flag_help(leaves[path], spec(f).flag)
            assert re.findall(r"default:? (\"[^\"]*\"|[^\s;)]+)", text) == [toml_value(value(key))], (path, key, text)
    run = _printed(leaves[("run",)])
    assert f"embedded model {cfg.model.model} " in run and f"scheduler (default {toml_value(cfg.scheduler)})" in run
    # the engine's flags of `clarify generate` start from the same declarations
    generate = leaves[("generate",)]
    for flag, key in (("--model", "model.model"), ("--base-url", "model.base_url"), ("--api-key-env", "model.api_key_env")):
        action = next(a for a in generate._actions if flag in a.option_strings)
        assert action.default == value(key), flag
        assert re.findall(r"default:? (\"[^\"]*\"|[^\s;)]+)", _flag_help(generate, flag)) == [toml_value(value(key))]
    assert f"default: {cfg.model.model}" in _printed(leaves[("models", "prepare")])


def test_a_changed_default_changes_the_help(monkeypatch):
    field = {f.name: f for f in dataclasses.fields(config.RunConfig)}["limit"]
    monkeypatch.setattr(field, "default", 30)
    assert "(default 30)" in _flag_help(dict(_leaves(build_parser()))[("run",)], "--limit")


def test_verbose_flag_before_or_after_the_command():
    parser = build_parser()
    assert parser.parse_args(["-v", "doctor"]).verbose is True
    assert parser.parse_args(["doctor", "-v"]).verbose is True
    assert parser.parse_args(["doctor"]).verbose is False


def test_doctor_on_an_empty_home_names_what_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLARIFY_HOME", str(tmp_path / "home"))
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "smollm2-135m-instruct (default): not prepared (clarify models prepare smollm2-135m-instruct)" in text
    assert "embedded: not built" in text and "clarify index build --default" in text
    assert "ready for `clarify demo`: not yet, missing the default model, the embedded index" in text
    for section in ("models", "index", "java", "engine", "disk"):
        assert f"\n{section}\n" in f"\n{text}"


def test_doctor_json_facts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLARIFY_HOME", str(tmp_path))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "x.log").write_text("x" * 1000)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert main(["doctor", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["index"]["built"] is False and facts["ready_for_demo"] is False
    assert facts["clarify_home"]["bytes"] == {"logs": 1000}
    eng = facts["engine"]
    assert eng["vllm"] and eng["device"] in ("cpu", "cuda")
    if eng["device"] == "cpu":
        assert eng["cores_bound"] == "0" and eng["cores_bound_from"] == "VLLM_CPU_OMP_THREADS_BIND"
        assert eng["cpu"]["capability"] and "auto resolves" in eng["cpu_line"] or "native" in eng["cpu_line"]
        assert set(eng["core_holders"]) == {"0"}
    assert facts["java"]["ready"] is True


@pytest.mark.parametrize("argv", [["run", "--help"], ["index", "build", "--help"], ["--help"]])
def test_help_exits_cleanly(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("usage: clarify")
