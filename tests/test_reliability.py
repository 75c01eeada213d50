"""Issue 16: a run that cannot be wedged, a run directory that cannot be corrupted, inputs and configs
checked before anything loads. Scripted engine and the small stand-in index (fast); the crash and
resume properties with the real engine are in test_toc_real.py."""

from __future__ import annotations

import pytest

from clarify.batch import config
from clarify.batch.cli import main
from clarify.errors import InputError

# --- one declared config schema -----------------------------------------------------------------------


def test_config_schema_names_every_bad_field_at_once(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('limit = "3"\n[toc]\ntemperature = 5\nverify = "no"\n'
                 '[model]\nmax_model_len = -1\ngpu_memory_utilization = 0\nstop = "###"\n')
    with pytest.raises(InputError) as err:
        config.load(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}: 6 bad config fields")
    for part in ("limit: expected an integer, got str '3'", "toc.temperature: must be in [0, 2], got 5",
                 "toc.verify: expected a boolean (true or false), got str 'no'",
                 "model.max_model_len: must be >= 1, got -1", "model.gpu_memory_utilization: must be in (0, 1], got 0",
                 "model.stop: expected a list of strings, got str '###'"):
        assert part in msg


@pytest.mark.parametrize(("toml", "match"), [
    ("[toc]\nmax_depth = 2.5\n", r"field 'toc.max_depth'\): expected an integer"),
    ("[toc]\nmax_depth = true\n", r"field 'toc.max_depth'\): expected an integer, got bool"),
    ("[toc]\ntemperature = nan\n", r"field 'toc.temperature'\): expected a number"),
    ("[model]\ngpu_memory_utilization = 1.5\n", r"must be in \(0, 1\], got 1.5"),
    ("[model]\nstop = [\"a\", 3]\n", r"field 'model.stop'\): expected a list of strings"),
    ("[model]\ndtype = \"fp8\"\n", r"field 'model.dtype'\): unknown value 'fp8'"),
    ("toc = 3\n", r"field 'toc'\): must be a table"),
    ("[retrieval]\npool = 3\n", r"field 'retrieval.pool'\): must be >= retrieval.top_k \(5\), got 3"),
    ("offset = -1\n", r"field 'offset'\): must be >= 0, got -1"),
])
def test_config_schema_types_ranges_enums(tmp_path, toml, match):
    p = tmp_path / "c.toml"
    p.write_text(toml)
    with pytest.raises(InputError, match=match):
        config.load(p)


def test_config_values_take_their_declared_types(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[toc]\ntemperature = 1\n[model]\nstop = ["###"]\n')
    cfg = config.load(p)
    assert cfg.toc.temperature == 1.0 and isinstance(cfg.toc.temperature, float)
    assert cfg.model.stop == ("###",)
    assert config.load(None).toc.verify is True


def test_config_overrides_are_checked_too():
    with pytest.raises(InputError, match=r"field 'limit'\): must be >= 0, got -2"):
        config.load(None, {"limit": -2})
    # a table given as a scalar in the file and a dotted override under it: named, not a traceback
    with pytest.raises(InputError, match=r"field 'toc'\): must be a table"):
        config.from_dict({"toc": 1})


def test_cli_config_directory_and_bad_values_one_line(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "is a directory; --config takes a TOML file" in err and "Traceback" not in err
    bad = tmp_path / "bad.toml"
    bad.write_text("[toc]\nverify = \"no\"\ntemperature = 9\n")
    assert main(["run", "--config", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "toc.verify" in err and "toc.temperature" in err
    assert not (tmp_path / "r").exists()  # refused before the run directory is touched
