"""Model resolution: embedded names, user directories, and the errors for things that are not models."""

from __future__ import annotations

import json
import struct
import time

import pytest

from clarify.errors import InputError
from clarify.local_llm.models import (
    DEFAULT_MODEL,
    MARKER,
    check_model_dir,
    model_info,
    prepare_model,
    resolve_model,
)
from tests.fixtures_llm import write_fake_model


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(InputError, match=r"nope.*does not exist"):
        resolve_model(tmp_path / "nope")


def test_a_file_is_not_a_model_directory(tmp_path):
    f = tmp_path / "weights.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(InputError, match=r"weights.gguf.*it is a file"):
        resolve_model(f)


def test_missing_config_is_named(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(InputError, match="config.json is missing") as err:
        check_model_dir(tmp_path)
    assert err.value.path == str(tmp_path)


def test_missing_weights_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(InputError, match="no weights"):
        check_model_dir(tmp_path)


@pytest.mark.parametrize(("config", "weights", "said"), [
    ([], None, "config.json must be a JSON object, not list"),         # was an AttributeError, after the run dir
    ({}, None, "config.json names no model_type"),                      # was vLLM's pydantic error after ~11 s
    (None, b"", "weights file is empty"),
    (None, b"\xff" * 8 + b"{}", "not a safetensors file .header length"),
    (None, struct.pack("<Q", 2) + b"[]", "not a safetensors file .header is not a JSON object"),
    (None, struct.pack("<Q", 5) + b"{oops", "not a safetensors file"),
])
def test_a_folder_that_is_not_a_model_is_refused_before_anything_loads(tmp_path, config, weights, said):
    """Checked in milliseconds, before a run directory is written or an engine starts."""
    write_fake_model(tmp_path)
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    if weights is not None:
        (tmp_path / "model.safetensors").write_bytes(weights)
    with pytest.raises(InputError, match=said) as err:
        check_model_dir(tmp_path)
    assert err.value.path.startswith(str(tmp_path))
    write_fake_model(tmp_path)
    assert check_model_dir(tmp_path) == tmp_path


def test_broken_config_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(InputError, match="config.json is not valid JSON"):
        check_model_dir(tmp_path)


def test_unknown_name_lists_the_embedded_models():
    with pytest.raises(InputError, match=f"not an embedded model name.*{DEFAULT_MODEL}"):
        resolve_model("llama-70b")


@pytest.mark.integration
def test_prepare_is_idempotent_and_info_reads_the_real_model(llm_model_dir):
    t0 = time.perf_counter()
    again = prepare_model(DEFAULT_MODEL)
    assert time.perf_counter() - t0 < 2.0 and again == llm_model_dir
    assert (llm_model_dir / MARKER).is_file()
    assert resolve_model(DEFAULT_MODEL) == llm_model_dir
    assert resolve_model(str(llm_model_dir)) == llm_model_dir  # the same folder given as a path

    info = model_info(llm_model_dir)
    assert info["architecture"] == "LlamaForCausalLM"
    assert info["embedded_name"] == DEFAULT_MODEL
    assert info["has_chat_template"] is True
    # SmolLM2-135M: 134.5M parameters with tied embeddings (HF model card: "135M")
    assert 130e6 < info["parameters"] < 140e6
    assert info["max_position_embeddings"] == 8192
    assert info["weights_bytes"] > 2 * 130e6  # bf16: 2 bytes per parameter
