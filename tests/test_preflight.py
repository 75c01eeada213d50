"""GPU preflight (local_llm/preflight.py) on faked devices: each failure is one line that says what to do.
No GPU is needed: the facts torch and NVML would give are passed in."""

from __future__ import annotations

from clarify.local_llm.preflight import Check, Gpu, GpuFacts, ModelShape, checks
from clarify.local_llm.settings import Ask
from tests.fixtures_llm import write_fake_model

GIB = 1 << 30
H100 = Gpu("NVIDIA H100 80GB HBM3", (9, 0), free_bytes=79 * GIB, total_bytes=80 * GIB)
T4 = Gpu("Tesla T4", (7, 5), free_bytes=15 * GIB, total_bytes=16 * GIB)
# An 8B model stored in bfloat16 (Llama-3-8B's shape: 32 layers, 8 KV heads of 128): 16 GB of weights.
LLAMA8B = ModelShape(weight_bytes=16 * 10**9, stored_dtype="bfloat16", layers=32, kv_heads=8, head_dim=128)
ASK = Ask(model="m", model_dtype="bfloat16", max_model_len=8192, gpu_memory_utilization=0.9)


def _by_name(found: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in found}


def test_a_healthy_h100_passes_every_check():
    facts = GpuFacts("12.8", "12.9", "575.51", (H100,), nccl="2.27.3", faiss_gpus=None)
    found = _by_name(checks(facts, LLAMA8B, ASK))
    assert all(c.ok and not c.warning for c in found.values()), [c.line() for c in found.values()]
    assert "bfloat16 on sm_90" in found["dtype"].detail
    # 80 GB x 0.9 - 16 GB - 2 GiB overhead, at 128 KiB of KV per token: a few hundred ToC requests
    requests = int(found["memory"].detail.split("room for ~")[1].split()[0])
    assert 200 < requests < 300
    assert "faiss-cpu" in found["FAISS on GPU"].detail


def test_an_old_driver_fails_and_a_minor_version_behind_warns():
    found = _by_name(checks(GpuFacts("12.8", "11.8", "520.61", (H100,)), LLAMA8B, ASK))
    assert not found["driver"].ok and "install an NVIDIA driver for CUDA 12.x" in found["driver"].line()
    found = _by_name(checks(GpuFacts("13.0", "12.8", "570.133.20", (H100,)), LLAMA8B, ASK))  # the pinned stack
    assert not found["driver"].ok and "CUDA 13.x (R580 or newer" in found["driver"].fix
    found = _by_name(checks(GpuFacts("12.8", "12.4", "550.54", (H100,)), LLAMA8B, ASK))
    assert found["driver"].ok and found["driver"].warning and "minor-version compatibility" in found["driver"].detail
    found = _by_name(checks(GpuFacts(None, None, None, ()), LLAMA8B, ASK))
    assert not found["CUDA runtime"].ok and "STACK=gpu" in found["CUDA runtime"].fix


def test_a_t4_gets_float16_and_refuses_bfloat16_and_batch_invariance():
    facts = GpuFacts("13.0", "13.0", "580.65.06", (T4,))
    found = _by_name(checks(facts, LLAMA8B, ASK))
    assert found["dtype"].ok and found["dtype"].warning and "float16" in found["dtype"].detail
    for ask in (Ask(model="m", dtype="bfloat16"), Ask(model="m", batch_invariant=True)):
        bad = _by_name(checks(facts, LLAMA8B, ask))["dtype / batch-invariant"]
        assert not bad.ok and "compute capability >= 8.0" in bad.detail


def test_memory_counts_weights_and_the_kv_cache_at_max_model_len():
    busy = Gpu("NVIDIA H100 80GB HBM3", (9, 0), free_bytes=12 * GIB, total_bytes=80 * GIB)  # someone holds 68 GB
    line = _by_name(checks(GpuFacts("12.8", "12.8", "570", (busy,)), LLAMA8B, ASK))["memory"].line()
    assert line.startswith("  [FAIL] memory: GPU 0: needs") and "nvidia-smi" in line
    # 32k context of a 70B-shaped KV cache on one 80 GB GPU: too much; over 4 GPUs it fits
    big = ModelShape(weight_bytes=140 * 10**9, stored_dtype="bfloat16", layers=80, kv_heads=8, head_dim=128)
    long = Ask(model="m", model_dtype="bfloat16", max_model_len=32768, gpu_memory_utilization=0.9, tensor_parallel_size=4)
    assert not _by_name(checks(GpuFacts("12.8", "12.8", "570", (H100,) * 2), big, long))["GPUs"].ok
    ok = _by_name(checks(GpuFacts("12.8", "12.8", "570", (H100,) * 4, nccl="2.27.3"), big, long))
    assert ok["memory"].ok and ok["NCCL"].ok
    no_nccl = _by_name(checks(GpuFacts("12.8", "12.8", "570", (H100,) * 4), big, long))["NCCL"]
    assert not no_nccl.ok and "NCCL" in no_nccl.detail


def test_the_model_shape_is_read_from_the_folder(tmp_path):
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "float32",
           "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    folder = write_fake_model(tmp_path / "m", data_bytes=4000, config=cfg)
    shape = ModelShape.of(folder)
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.stored_dtype) == (30, 3, 64, "float32")
    assert shape.kv_bytes_per_token("bfloat16") == 2 * 30 * 3 * 64 * 2
    size = (folder / "model.safetensors").stat().st_size
    assert shape.loaded_bytes("bfloat16") == size // 2  # float32 weights run in half precision on a GPU
