"""`clarify --help` and each command's help read as a manual; `clarify doctor` says what is ready.
Fast: no engine, no JVM."""

from __future__ import annotations

import json

import pytest

from clarify.batch.cli import build_parser, main
from clarify.batch.config_doc import leaves as _leaves


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
    assert "(default 20; 0 = all" in run
    build = leaves[("index", "build")].format_help()
    assert "(default: cpu)" in build  # defaults are printed (--device)
    assert "default: None" not in build and "default: False" not in build


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
