"""`clarify generate` and `clarify models`: bad input errors (fast) and an end-to-end run (real model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from clarify.batch.cli import main
from clarify.errors import InputError
from clarify.local_llm.cli import read_prompts

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples" / "prompts.jsonl"


def _write(tmp_path, lines: list[bytes | str]) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return p


GOOD = json.dumps({"id": "a", "prompt": "Say hi."})


@pytest.mark.parametrize(
    ("lines", "line", "message"),
    [
        ([GOOD, '{"id": "b", "prompt": "unterminated'], 2, "malformed JSON"),
        ([GOOD, "", json.dumps({"id": "c"})], 3, "missing prompt"),
        ([json.dumps({"prompt": "   "})], 1, "empty prompt"),
        ([GOOD, json.dumps({"prompt": 7})], 2, "prompt must be a string"),
        ([GOOD, b'{"prompt": "caf\xe9"}'], 2, "not valid UTF-8"),
        ([GOOD, GOOD], 2, "duplicate id 'a'"),
        (["[1, 2]"], 1, "expected a JSON object"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path, lines, line, message):
    path = _write(tmp_path, lines)
    with pytest.raises(InputError, match=message) as err:
        read_prompts(path)
    assert err.value.line == line and err.value.path == str(path)
    assert f"{path}:{line}" in str(err.value)


def test_ids_default_to_line_numbers_and_examples_parse(tmp_path):
    path = _write(tmp_path, [json.dumps({"prompt": "one"}), "", json.dumps({"prompt": "three", "id": 9})])
    assert read_prompts(path) == [("1", "one"), ("9", "three")]
    rows = read_prompts(EXAMPLES)
    assert len(rows) >= 30 and all(p.strip() for _, p in rows)


def test_cli_bad_jsonl_exits_2_and_writes_nothing(tmp_path, capsys):
    path = _write(tmp_path, [GOOD, "{oops"])
    out = tmp_path / "out.parquet"
    rc = main(["generate", "--prompts", str(path), "--out", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"{path}:2" in err and "malformed JSON" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == [path]


def test_cli_bad_model_path_exits_2(tmp_path, capsys):
    (tmp_path / "fake-model").mkdir()
    out = tmp_path / "out.parquet"
    rc = main(["generate", "--model", str(tmp_path / "fake-model"), "--prompts", str(EXAMPLES), "--out", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "fake-model" in err and "config.json is missing" in err
    assert not out.exists()


def test_cli_error_in_a_real_process(tmp_path):
    """The installed entry point: one line on stderr, exit status 2, no traceback."""
    path = _write(tmp_path, [GOOD, json.dumps({"id": "x", "prompt": ""})])
    code = "import sys; from clarify.batch.cli import main; sys.exit(main(sys.argv[1:]))"
    res = subprocess.run(
        [sys.executable, "-c", code, "generate", "--prompts", str(path), "--out", str(tmp_path / "o.parquet")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and f"{path}:2" in res.stderr and "empty prompt" in res.stderr


@pytest.mark.integration
def test_cli_generate_end_to_end_then_all_cached(tmp_path, llm_engine, capsys):
    rows = read_prompts(EXAMPLES)[:8]
    prompts = _write(tmp_path, [json.dumps({"id": i, "prompt": p}) for i, p in rows])
    out, cache = tmp_path / "gen.parquet", tmp_path / "cache"
    argv = ["generate", "--prompts", str(prompts), "--out", str(out), "--max-tokens", "16", "--batch-size", "5"]
    argv += ["--cache", str(cache), "--temperature", "0.7", "--seed", "3"]
    calls = llm_engine.stats.calls
    assert main(argv) == 0
    assert llm_engine.stats.calls == calls + 2  # two batches (5 + 3), the same shared engine
    printed = capsys.readouterr().out
    assert "tokens/s" in printed and "8 prompts (0 from cache)" in printed

    df = pl.read_parquet(out)
    assert df.columns == ["id", "prompt", "completion", "finish_reason", "prompt_tokens", "output_tokens", "cached"]
    assert df["id"].to_list() == [i for i, _ in rows]
    assert df["prompt"].to_list() == [p for _, p in rows]
    assert any(t.strip() for t in df["completion"].to_list())  # a sampled text may be empty (end of turn)
    assert (df["output_tokens"] > 0).all() and (df["output_tokens"] <= 16).all()
    assert not df["cached"].any()

    out2 = tmp_path / "gen2.parquet"
    assert main([*argv[:4], str(out2), *argv[5:]]) == 0
    assert llm_engine.stats.calls == calls + 2  # zero model calls on the re-run
    df2 = pl.read_parquet(out2)
    assert df2["cached"].all()
    assert df2.drop("cached").equals(df.drop("cached"))


@pytest.mark.integration
def test_cli_models_prepare_and_info(llm_model_dir, capsys):
    assert main(["models", "prepare"]) == 0
    assert str(llm_model_dir) in capsys.readouterr().out
    assert main(["models", "info", "smollm2-135m-instruct"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["architecture"] == "LlamaForCausalLM" and info["has_chat_template"] is True
    assert main(["models", "prepare", "no-such-model"]) == 2
    assert "unknown embedded model" in capsys.readouterr().err
