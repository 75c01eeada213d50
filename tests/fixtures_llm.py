"""Fixtures for local_llm tests (and for any test that needs a real engine).

`llm_engine` is SESSION-scoped: one vLLM `LLM` per test process (~3.4 GB RSS, ~5-40 s to start),
shared through `get_engine`, so `clarify generate` run in-process by a test reuses the same instance
(the CLI asks for `get_engine(model_dir, progress=False)`, the same arguments as here).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from clarify.local_llm.engine import GenParams
from clarify.local_llm.scripted import ScriptedEngine


def write_fake_model(folder: Path, data_bytes: int = 0, config: dict | None = None, parameters: int = 0) -> Path:
    """A folder that passes the model-folder check (local_llm/models.py check_model_dir) but holds no
    real model: a config.json with a model_type and a safetensors file with a valid, empty header and
    `data_bytes` more bytes (a way to change the weights' fingerprint). `parameters` > 0: the header
    declares one tensor of that many parameters instead (the size local_llm/models.py parameter_count
    reads from the header; the tensor's data is left out)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "llama",
                                                              "architectures": ["LlamaForCausalLM"]}))
    header = b"{}"
    if parameters:
        header = json.dumps({"weight": {"dtype": "BF16", "shape": [parameters], "data_offsets": [0, 0]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * data_bytes)
    return folder


@pytest.fixture(scope="session")
def llm_model_dir():
    """The embedded default model as a prepared safetensors folder (converted on first use)."""
    from clarify.local_llm.models import DEFAULT_MODEL, prepare_model

    return prepare_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def llm_engine(llm_model_dir):
    """The real VLLMEngine (vLLM on CPU in CI) on the embedded SmolLM2-135M-Instruct."""
    from clarify.local_llm.vllm_engine import get_engine

    return get_engine(llm_model_dir, progress=False)


@pytest.fixture
def echo_engine():
    """ScriptedEngine that answers 'echo:<prompt>' (or the first choice when constrained)."""

    def respond(prompt: str, params: GenParams) -> str:
        return params.choices[0] if params.choices else f"echo:{prompt}"

    return ScriptedEngine("scripted-echo", respond)
