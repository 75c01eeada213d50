"""Model resolution: embedded names, user directories, and the errors for things that are not models."""

from __future__ import annotations

import json
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
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(InputError, match="no weights"):
        check_model_dir(tmp_path)


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
