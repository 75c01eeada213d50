"""The prerequisites, declared once (local_llm/prerequisites.py), checked by `clarify doctor` on faked
machines (an old glibc, an old driver, a V100, too little disk or RAM) and shown by
docs/getting-started.md#prerequisites exactly as the code declares them. No GPU is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from clarify.errors import InputError
from clarify.local_llm.prerequisites import GB, HostFacts, _driver, checks, render_markdown

ROOT = Path(__file__).resolve().parents[1]
GOOD = HostFacts((3, 11), (2, 36), 500 * GB, 256 * GB)


def _by(facts: HostFacts) -> dict:
    return {c.name: c for c in checks(facts)}


def test_a_good_cpu_machine_passes_and_says_it_has_no_gpu_stack():
    found = _by(GOOD)
    assert all(c.ok for c in found.values()), [c.line() for c in found.values()]
    assert "CPU stack only" in found["NVIDIA driver"].detail and "GPU architecture" not in found


def test_old_python_glibc_and_a_musl_libc_are_missing_with_the_fix():
    found = _by(HostFacts((3, 12), (2, 17), 500 * GB, 256 * GB))
    assert not found["Python"].ok and "python3.11" in found["Python"].fix
    assert not found["glibc"].ok and "2.17, needs >= 2.28" in found["glibc"].detail
    assert not _by(HostFacts((3, 11), None, 500 * GB, 256 * GB))["glibc"].ok


def test_each_setup_is_checked_against_disk_and_ram():
    found = _by(HostFacts((3, 11), (2, 28), 20 * GB, 16 * GB))
    assert found["setup: embedded (CPU demo, tests)"].ok
    dpr = found["setup: full DPR Wikipedia (Pyserini Lucene + flat FAISS)"]
    assert not dpr.ok and "70 GB disk, 20.0 GB free" in dpr.detail and "64 GB RAM" in dpr.detail
    big = found["setup: one 70B model (Llama-3.1-70B-Instruct, bfloat16)"]
    assert not big.ok and "4 x 80 GB GPUs" in big.detail and "$CLARIFY_HOME" in big.fix


@pytest.mark.parametrize(("driver", "ok"), [("580.65.06", True), ("580.95.05", True), ("590.44.01", True),
                                            ("575.57.08", False), ("550.54.15", False), (None, False)])
def test_the_driver_cuda_13_needs(driver, ok):
    found = _by(HostFacts((3, 11), (2, 36), 500 * GB, 256 * GB, driver, ((9, 0),), ("NVIDIA H100 80GB HBM3",)))
    assert found["NVIDIA driver"].ok is ok, found["NVIDIA driver"].line()
    assert ok or "R580" in found["NVIDIA driver"].fix
    assert found["GPU architecture"].ok


def test_a_v100_is_missing_the_architecture_cuda_13_supports():
    found = _by(HostFacts((3, 11), (2, 36), 500 * GB, 256 * GB, "580.65.06", ((7, 0), (7, 5)),
                          ("Tesla V100-SXM2-32GB", "Tesla T4")))
    gpu = found["GPU architecture"]
    assert not gpu.ok and "Tesla V100-SXM2-32GB (7.0)" in gpu.detail and "Tesla T4" not in gpu.detail
    assert "Turing or newer" in gpu.fix


def test_the_driver_version_is_read_from_the_kernel_module(tmp_path):
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:23 UTC 2025\n"
                    "GCC version:  gcc version 12.2.0\n")
    assert _driver(proc) == "580.65.06"
    proc.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build\n")
    assert _driver(proc) == "570.133.20"
    assert _driver(tmp_path / "absent") is None


def test_the_preflight_and_the_planner_refuse_a_v100():
    from clarify.batch.compare.gpu_plan import Model, plan
    from clarify.local_llm.preflight import Gpu, GpuFacts, ModelShape
    from clarify.local_llm.preflight import checks as preflight
    from clarify.local_llm.settings import Ask

    v100 = Gpu("Tesla V100-SXM2-32GB", (7, 0), free_bytes=31 << 30, total_bytes=32 << 30)
    shape = ModelShape(weight_bytes=2 * 10**9, stored_dtype="bfloat16", layers=16, kv_heads=8, head_dim=64)
    found = {c.name: c for c in preflight(GpuFacts("13.0", "13.0", "580.65.06", (v100,)), shape, Ask(model="m"))}
    assert not found["GPU architecture"].ok and "below 7.5" in found["GPU architecture"].detail
    assert "memory" not in found  # no memory plan for a GPU it cannot run on
    with pytest.raises(InputError) as got:
        plan([Model("m", shape, Ask(model="m", tensor_parallel_size=0))], [v100] * 8)
    assert "\n" not in str(got.value) and "GPU 0" in str(got.value) and "CUDA 13" in str(got.value)


def test_the_docs_list_the_prerequisites_the_code_checks():
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert render_markdown() in page, render_markdown()
