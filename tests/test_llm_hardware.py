"""dtype = "auto" resolution (local_llm/hardware.py, the settings table's dtype row): both CPU branches, CUDA, explicit dtypes, and the
run config's field. Pure: the CPU facts are passed in, so both branches run on any machine."""

from __future__ import annotations

import pytest

from clarify.batch import config
from clarify.errors import InputError
from clarify.local_llm.hardware import EngineBusy, check_gpu_memory, cpu_facts, resolve_dtype


@pytest.mark.parametrize(("bf16_native", "model_dtype", "expected"), [
    (True, "bfloat16", "bfloat16"),   # AVX512-BF16 / AMX: the model's half precision, natively
    (True, "float16", "bfloat16"),
    (True, "float32", "float32"),     # a float32 model stays float32
    (False, "bfloat16", "float32"),   # AVX2-only: bf16 would be emulated (3.7x slower) -> float32
    (False, None, "float32"),
])
def test_auto_on_cpu_follows_the_capability(bf16_native, model_dtype, expected):
    assert resolve_dtype("auto", "cpu", bf16_native=bf16_native, model_dtype=model_dtype) == expected


def test_auto_on_cuda_follows_the_compute_capability_and_explicit_dtype_wins():
    for capability, expected in (((7, 5), "float16"), ((8, 0), "bfloat16"), ((9, 0), "bfloat16")):
        assert resolve_dtype("auto", "cuda", bf16_native=False, model_dtype="bfloat16",
                             capability=capability) == expected
    # below 7.5 (a V100) the pinned CUDA 13 stack does not run at all (local_llm/settings.py): refused, no dtype
    with pytest.raises(InputError, match="below 7.5"):
        resolve_dtype("auto", "cuda", bf16_native=False, model_dtype="bfloat16", capability=(7, 0))
    for dt in ("bfloat16", "float16", "float32"):
        assert resolve_dtype(dt, "cpu", bf16_native=False, model_dtype="bfloat16") == dt
        assert resolve_dtype(dt, "cpu", bf16_native=True, model_dtype="float32") == dt
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        resolve_dtype("fp8", "cpu", bf16_native=True, model_dtype=None)


def test_cpu_facts_are_consistent_with_torch(monkeypatch):
    import torch

    facts = cpu_facts()
    assert facts["capability"] == torch.backends.cpu.get_cpu_capability()
    assert facts["bf16_native"] == (facts["avx512_bf16"] or facts["amx"])
    # a mocked AVX2-only machine (no native bf16) resolves to float32 through the same call the engine makes
    cpu_facts.cache_clear()
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    try:
        mocked = cpu_facts()
        assert not mocked["bf16_native"]
        assert resolve_dtype("auto", "cpu", bf16_native=mocked["bf16_native"], model_dtype="bfloat16") == "float32"
    finally:
        cpu_facts.cache_clear()


def test_dtype_is_a_config_field_checked_up_front():
    assert config.load(None).model.dtype == "auto"
    assert config.load(None, {"model.dtype": "float32"}).model.dtype == "float32"
    with pytest.raises(InputError, match="model.dtype"):
        config.load(None, {"model.dtype": "int3"})


HOLDER = """
import sys, time
from clarify.local_llm.hardware import CoreLock
cores = {int(c) for c in sys.argv[1].split(",")}
with CoreLock(cores):
    print("holding", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _hold(cores, seconds):
    """Another process working on `cores` (what a second clarify engine does while it generates)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", HOLDER, ",".join(map(str, cores)), str(seconds)],
                            stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": ":".join(sys.path)})
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_core_lock_refuses_or_waits_naming_the_other_process():
    from clarify.local_llm.hardware import CoreLock, EngineBusy, parse_cpu_list

    assert parse_cpu_list("0-2,5") == {0, 1, 2, 5} and parse_cpu_list("auto") == set()
    holder = _hold({900, 901}, 3)  # cores numbered out of the way of real engines' lock files
    try:
        with pytest.raises(EngineBusy, match=rf"core 90[01] is in use by a vLLM engine of pid {holder.pid}"):
            with CoreLock({901}, mode="refuse"):
                pass
        with CoreLock({902}, mode="refuse"):  # disjoint cores: no conflict
            pass
        said: list[str] = []
        with CoreLock({900, 901}, mode="wait", say=said.append) as lock:
            pass
        # we got the cores only once the holder let go of them (it holds them 3 s after "holding")
        assert holder.wait(timeout=10) == 0
        assert lock.waited_s > 1.5 and len(said) == 1 and f"pid {holder.pid}" in said[0]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.integration
def test_a_second_engines_work_waits_or_refuses(llm_engine):
    """Two engines' worth of work on the same cores: the real engine's generate refuses clearly, or
    waits for the other process and then runs (one vLLM-CPU engine per core at a time)."""
    from clarify.local_llm.engine import GenParams
    from clarify.local_llm.hardware import EngineBusy

    lock = llm_engine.cores
    holder = _hold(set(lock.cores), 4)
    try:
        lock.mode = "refuse"
        with pytest.raises(EngineBusy, match=f"pid {holder.pid}"):
            llm_engine.generate(["Say hi."], [GenParams(max_tokens=4)])
        lock.mode = "wait"
        out = llm_engine.generate(["Say hi."], [GenParams(max_tokens=4)])
        assert holder.wait(timeout=10) == 0 and out[0].output_tokens > 0
        assert lock.waited_s > 1.5
    finally:
        lock.mode = "wait"
        holder.kill()
        holder.wait()


def test_gpu_memory_taken_by_another_process_is_one_clear_error():
    gib = 2**30
    readings = {0: (70 * gib, 80 * gib), 1: (10 * gib, 80 * gib)}  # GPU 1: another process holds 70 GiB
    check_gpu_memory(0.85, 1, mem_get_info=readings.__getitem__)  # GPU 0 alone: 70 >= 68 GiB, fine
    with pytest.raises(EngineBusy) as err:
        check_gpu_memory(0.85, 2, mem_get_info=readings.__getitem__)  # tensor parallel over both
    msg = str(err.value)
    assert "GPU 1: 10.0 GiB free of 80.0 GiB, needs 68.0 GiB" in msg and "GPU 0" not in msg
    assert "gpu_memory_utilization" in msg
    check_gpu_memory(0.1, 2, mem_get_info=readings.__getitem__)  # a smaller share fits beside it


def test_engine_busy_is_one_line_not_a_traceback(monkeypatch, capsys):
    """CLARIFY_ENGINE_BUSY=refuse (or a full GPU) ends a command with the one line saying by whom."""
    from clarify.batch import cli
    from clarify.errors import EngineBusy

    def busy(args):
        raise EngineBusy("CPU core 0 is in use by a vLLM engine of pid 4242; wait for it")

    monkeypatch.setattr(cli, "_main", busy)
    assert cli.main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert err == "clarify doctor: error: CPU core 0 is in use by a vLLM engine of pid 4242; wait for it\n"


@pytest.mark.skipif(__import__("platform").machine().lower() not in ("x86_64", "amd64"), reason="x86 only")
def test_avx2_emulation_shows_every_process_an_avx2_only_cpu():
    """bench/emulate_avx2 (how the suite is timed as the slowest CPU kind runs it, on any x86 machine): a
    process started with it sees no AVX-512, AVX512-BF16 or AMX, ATen dispatches AVX2, and "auto" resolves
    to float32, also when a library asks `importlib.util.find_spec("torch")` before importing it (vLLM's
    import does; its kernels are chosen by the same torch.cpu checks, vllm/platforms/cpu.py)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root / "bench" / "emulate_avx2"), "ATEN_CPU_CAPABILITY": "avx2",
           "ONEDNN_MAX_CPU_ISA": "AVX2"}
    code = ("import importlib.util, json; importlib.util.find_spec('torch'); import torch\n"
            "from clarify.local_llm.hardware import cpu_facts, resolve_dtype\n"
            "f = cpu_facts(); f['avx512'] = torch.cpu._is_avx512_supported()\n"
            "f['auto'] = resolve_dtype('auto', 'cpu', bf16_native=f['bf16_native'], model_dtype='bfloat16')\n"
            "print(json.dumps(f))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    facts = json.loads(out.stdout.splitlines()[-1])
    assert facts["capability"] == "AVX2" and facts["auto"] == "float32"
    assert not (facts["avx512"] or facts["avx512_bf16"] or facts["amx"] or facts["bf16_native"])
