"""The one CPU/CUDA settings table (local_llm/settings.py), rendered for a CPU and for faked CUDA devices of
compute capability 7.5 (T4), 8.0 (A100) and 9.0 (H100), and 7.0 (V100), which the pinned CUDA 13 stack refuses. Pure: no torch, no vLLM, no GPU. The keywords
themselves are checked against the pinned vLLM's argument names in tests/test_vllm_api.py."""

from __future__ import annotations

import pytest

from clarify.errors import InputError
from clarify.local_llm.settings import Ask, Device, engine_settings, render

CPU_BF16 = Device("cpu", bf16_native=True, cores="0-1")
CPU_AVX2 = Device("cpu", bf16_native=False, cores="0-3")
V100 = Device("cuda", capability=(7, 0), name="Tesla V100", count=4, total_bytes=32 << 30)
T4 = Device("cuda", capability=(7, 5), name="Tesla T4", count=4, total_bytes=16 << 30)
A100 = Device("cuda", capability=(8, 0), name="A100", count=8, total_bytes=80 << 30)
H100 = Device("cuda", capability=(9, 0), name="H100", count=8, total_bytes=80 << 30)
BF16_MODEL = Ask(model="/models/m", model_dtype="bfloat16", max_model_len=6144, gpu_memory_utilization=0.9,
                 tensor_parallel_size=1)


@pytest.mark.parametrize(("device", "dtype"), [(T4, "float16"), (A100, "bfloat16"), (H100, "bfloat16")])
def test_cuda_runs_half_precision_by_capability_with_graphs_and_gpu_batches(device, dtype):
    s = engine_settings(device, BF16_MODEL)
    assert s.llm["dtype"] == dtype
    assert s.llm["enforce_eager"] is False  # CUDA graphs
    assert s.llm["gpu_memory_utilization"] == 0.9 and s.llm["max_model_len"] == 6144
    assert s.llm["max_num_seqs"] >= 256 and s.llm["max_num_batched_tokens"] >= 6144
    assert s.llm["enable_prefix_caching"] is True and s.llm["trust_remote_code"] is False
    assert "enable_chunked_prefill" not in s.llm  # vLLM's default (on) on GPUs
    assert not [k for k in s.env if k.startswith("VLLM_CPU_")]  # CPU-only variables never set on CUDA
    assert "VLLM_BATCH_INVARIANT" not in s.env
    # a bf16 model on a GPU without bf16 is run in float16, and the user is told
    assert bool(s.notes) == (device is T4) and (not s.notes or "float16" in s.notes[0])


def test_cpu_keeps_its_own_settings():
    s = engine_settings(CPU_BF16, BF16_MODEL)
    assert s.llm["dtype"] == "bfloat16" and s.llm["enforce_eager"] is True and s.llm["enable_chunked_prefill"] is False
    assert "gpu_memory_utilization" not in s.llm and "max_num_batched_tokens" not in s.llm
    assert s.env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and s.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert engine_settings(CPU_AVX2, BF16_MODEL).llm["dtype"] == "float32"


def test_a_gpu_never_runs_float32_silently():
    fp32 = Ask(model="m", model_dtype="float32")
    s = engine_settings(H100, fp32)
    assert s.llm["dtype"] == "bfloat16" and "float32" in s.notes[0]
    s = engine_settings(H100, Ask(model="m", model_dtype="float32", dtype="float32"))
    assert s.llm["dtype"] == "float32" and "float32 on a GPU" in s.notes[0]  # asked for: kept, and said
    with pytest.raises(InputError, match="bfloat16 needs a GPU of compute capability >= 8.0"):
        engine_settings(T4, Ask(model="m", dtype="bfloat16"))


def test_batch_invariant_by_device():
    ask = Ask(model="m", model_dtype="bfloat16", batch_invariant=True)
    for gpu in (A100, H100):
        s = engine_settings(gpu, ask)
        assert s.env["VLLM_BATCH_INVARIANT"] == "1" and s.llm["dtype"] == "bfloat16"
    with pytest.raises(InputError, match="field 'model.batch_invariant'.*compute capability >= 8.0"):
        engine_settings(T4, ask)
    s = engine_settings(CPU_BF16, ask)  # CPU: float32, whose results do not depend on the batch
    assert s.llm["dtype"] == "float32" and "VLLM_BATCH_INVARIANT" not in s.env
    with pytest.raises(InputError, match="runs float32 on a CPU"):
        engine_settings(CPU_BF16, Ask(model="m", dtype="bfloat16", batch_invariant=True))


def test_tensor_parallelism_is_for_gpus_and_a_ray_worker_uses_vllms_ray_executor():
    tp2 = Ask(model="m", tensor_parallel_size=2)
    assert "distributed_executor_backend" not in engine_settings(H100, tp2).llm
    assert engine_settings(H100, Ask(model="m", tensor_parallel_size=2, ray_worker=True)).llm[
        "distributed_executor_backend"] == "ray"
    with pytest.raises(InputError, match="tensor_parallel_size > 1 needs GPUs"):
        engine_settings(CPU_BF16, tp2)
    with pytest.raises(InputError, match="tensor_parallel_size 16 needs that many GPUs; 8 visible"):
        engine_settings(H100, Ask(model="m", tensor_parallel_size=16))


def test_the_rendered_table_has_a_column_per_device_and_every_difference():
    text = render([CPU_BF16, T4, A100, H100], Ask(model="m", model_dtype="bfloat16", batch_invariant=True))
    lines = text.splitlines()
    assert lines[0].count("|") == 7 and "compute capability 7.5" in lines[0] and "compute capability 9.0" in lines[0]
    row = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:6]] for line in lines[2:]}
    assert row["dtype"][0] == "`float32`" and row["dtype"][1].startswith("refused") is False
    assert row["dtype"][1] == "`float16`" and row["dtype"][2] == row["dtype"][3] == "`bfloat16`"
    assert row["enforce_eager"] == ["`True`", "`False`", "`False`", "`False`"]
    assert row["env VLLM_BATCH_INVARIANT"][0] == "not set" and row["env VLLM_BATCH_INVARIANT"][1].startswith("refused")
    assert row["env VLLM_BATCH_INVARIANT"][3] == "`1`"
    assert row["env VLLM_CPU_KVCACHE_SPACE"][1:] == ["not set"] * 3


def test_the_docs_show_the_table_the_code_applies():
    """docs/engines.md#the-cpucuda-settings-table carries the table rendered for the default [model] and a
    bfloat16 model: regenerate it with this test's `render(...)` call when a row changes."""
    from pathlib import Path

    from clarify.batch.config import ModelConfig

    m = ModelConfig()
    ask = Ask(model_dtype="bfloat16", max_model_len=m.max_model_len, gpu_memory_utilization=m.gpu_memory_utilization)
    devices = [Device("cpu", bf16_native=True, cores="0-15"), Device("cpu", bf16_native=False, cores="0-15"),
               Device("cuda", capability=(7, 0), name="V100", count=8),
               Device("cuda", capability=(7, 5), name="T4", count=8),
               Device("cuda", capability=(8, 0), name="A100", count=8),
               Device("cuda", capability=(9, 0), name="H100", count=8)]
    table = render(devices, ask)
    page = Path(__file__).resolve().parents[1] / "docs" / "engines.md"
    assert table in page.read_text(encoding="utf-8"), table


def test_a_v100_is_refused_in_one_line_and_its_column_says_so():
    """CUDA 13 (the pinned torch and vLLM) dropped Volta: no setting is planned for a V100."""
    with pytest.raises(InputError) as got:
        engine_settings(V100, BF16_MODEL)
    assert "\n" not in str(got.value) and "compute capability 7.0 is below 7.5" in str(got.value)
    lines = render([V100, H100], BF16_MODEL).splitlines()
    assert lines[2].startswith("| supported | refused: CUDA Tesla V100") and "| yes |" in lines[2]
    assert all(line.split("|")[2].strip() == "-" for line in lines[3:])
    assert "supported" not in render([T4, H100], BF16_MODEL)  # only shown where a device is refused


def test_dense_search_goes_to_the_gpu_only_where_faiss_sees_one():
    from clarify.local_llm.settings import faiss_device

    assert faiss_device(CPU_BF16) == "cpu" and faiss_device(H100) == "cpu"  # faiss-cpu on a GPU server
    gpu_faiss = Device("cuda", capability=(9, 0), name="H100", count=8, faiss_gpus=8)
    assert faiss_device(gpu_faiss) == "cuda"
    assert engine_settings(gpu_faiss, BF16_MODEL).faiss == {"device": "cuda"}
    assert "faiss device" not in engine_settings(gpu_faiss, BF16_MODEL).llm  # never an engine keyword


def test_each_engine_and_client_default_is_declared_once():
    """Every engine option and openai client option has one default, its declaration (local_llm/settings.py
    EngineOptions, local_llm/openai_http.py ClientOptions): the run config's [model] table, the settings
    table's Ask, VLLMEngine's, get_engine's and the context check's keywords and OpenAIEngine's keywords all
    agree with it, so a number hard-coded anywhere else fails here."""
    import dataclasses
    import inspect

    from clarify.batch.config import ModelConfig
    from clarify.local_llm.openai_engine import OpenAIEngine
    from clarify.local_llm.openai_http import ClientOptions, resolve_served_model, served_models
    from clarify.local_llm.settings import EngineOptions, ask_of
    from clarify.local_llm.vllm_engine import VLLMEngine, get_engine, prompts_over_context

    def keywords(fn) -> dict:
        return {k: p.default for k, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}

    run, engine, client, ask = ModelConfig(), EngineOptions(), ClientOptions(), Ask()
    served = keywords(OpenAIEngine.__init__)
    # VLLMEngine and get_engine take the options whole: left out, an Ask at the declared defaults
    assert keywords(VLLMEngine.__init__)["options"] is None and keywords(get_engine)["options"] is None
    for f in dataclasses.fields(EngineOptions):
        seen = {"[model]": getattr(run, f.name), "Ask": getattr(ask, f.name),
                "ask_of([model])": getattr(ask_of(run), f.name)} | (
                {"get_engine": keywords(get_engine)["model"]} if f.name == "model" else {})
        assert seen == dict.fromkeys(seen, getattr(engine, f.name)), f.name
    assert keywords(prompts_over_context)["max_model_len"] == engine.max_model_len == 6144
    for f in dataclasses.fields(ClientOptions):
        seen = {"[model]": getattr(run, f.name)} | ({"OpenAIEngine": served[f.name]} if f.name in served else {})
        assert seen == dict.fromkeys(seen, getattr(client, f.name)), f.name
    assert len(served.keys() & {f.name for f in dataclasses.fields(ClientOptions)}) == 7  # all but base_url
    for check in (resolve_served_model, served_models):  # the start-up check's own deadline
        assert keywords(check)["timeout_s"] == client.check_timeout_s, check.__name__
    # every option of a [model] table reaches the table's Ask, a quantization too (`clarify doctor --settings`)
    assert ask_of(ModelConfig(quantization="fp8", max_num_seqs=8)) == Ask(quantization="fp8", max_num_seqs=8)


def test_quantization_by_device():
    """[model] quantization: passed to vLLM on a GPU that has the method's kernels (an AWQ/GPTQ folder
    needs nothing: vLLM reads its config.json); fp8 on the fly needs sm_89; a CPU engine refuses any."""
    L40S = Device("cuda", capability=(8, 9), name="L40S", count=2, total_bytes=48 << 30)
    assert "quantization" not in engine_settings(A100, BF16_MODEL).llm  # none asked: vLLM's reading of the folder
    for gpu in (L40S, H100):
        assert engine_settings(gpu, Ask(model="m", quantization="fp8")).llm["quantization"] == "fp8"
    assert engine_settings(A100, Ask(model="m", quantization="awq")).llm["quantization"] == "awq"
    assert engine_settings(T4, Ask(model="m", quantization="gptq")).llm["quantization"] == "gptq"
    assert engine_settings(T4, Ask(model="m", quantization="awq")).llm["quantization"] == "awq"
    with pytest.raises(InputError, match=r"field 'device'.*V100.*below 7.5"):  # no plan at all on a V100
        engine_settings(V100, Ask(model="m", quantization="gptq"))
    with pytest.raises(InputError, match=r"field 'model.quantization'.*'fp8' needs compute capability >= 8.9"):
        engine_settings(A100, Ask(model="m", quantization="fp8"))
    with pytest.raises(InputError, match="'awq' needs a CUDA GPU"):
        engine_settings(CPU_AVX2, Ask(model="m", quantization="awq"))
