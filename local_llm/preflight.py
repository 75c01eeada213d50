"""GPU preflight (`clarify doctor` on a CUDA machine, docs/engines.md#gpu-preflight): what would stop vLLM on this server, found
in seconds and said in one line each, with what to do, before any engine starts.

`gather()` asks torch (and NVML, and FAISS) for the facts; `checks(facts, model_dir, ask)` is pure, so every
failure is tested with faked devices on a CPU machine (tests/test_preflight.py). Checked:
- the NVIDIA driver's CUDA version against the CUDA runtime the installed torch is built for (a driver
  older than the runtime's major version cannot run it; an older minor version runs through CUDA's
  minor-version compatibility, except kernels compiled at run time: a warning);
- GPUs visible (CUDA_VISIBLE_DEVICES) against `tensor_parallel_size`, and NCCL for more than one;
- each GPU's free memory against the model's weights plus one sequence's KV cache at `max_model_len`
  (vLLM refuses to start when the KV cache cannot hold `max_model_len` tokens: vllm/v1/core/kv_cache_utils.py
  `check_enough_kv_cache_memory`), and how many ToC requests the rest holds;
- the compute capability against the pinned CUDA 13 stack (>= 7.5: a V100 is refused) and the dtype
  (the settings table's dtype row: bfloat16 needs 8.0) and against
  `batch_invariant`;
- FAISS on the GPU (faiss-gpu) present or not: information, never a failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from clarify.errors import InputError
from clarify.local_llm.settings import CUDA_MAJOR, DRIVER_MIN, Ask, Device, engine_settings, unsupported

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
STORED_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2}
OVERHEAD_BYTES = 2 << 30  # CUDA context, activations, CUDA graphs: vLLM's profile run measures it; ~1-3 GiB
TOC_REQUEST_TOKENS = 2048  # KV tokens one ToC request needs (local_llm/vllm_engine.py CAPACITY_TOKENS)


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: tuple[int, int]
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class GpuFacts:
    torch_cuda: str | None  # the CUDA runtime torch is built for (torch.version.cuda), e.g. "12.8"
    driver_cuda: str | None  # the newest CUDA the driver supports (NVML), e.g. "12.4"; None: unknown
    driver: str | None = None  # the driver's own version, e.g. "550.54.15"
    gpus: tuple[Gpu, ...] = ()
    nccl: str | None = None  # NCCL version torch carries; None: none
    faiss_gpus: int | None = None  # GPUs FAISS sees; None: a CPU-only FAISS


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False  # ok, but worth a look

    def line(self) -> str:
        mark = "ok  " if self.ok and not self.warning else "WARN" if self.ok else "FAIL"
        return f"  [{mark}] {self.name}: {self.detail}" + (f" -> {self.fix}" if self.fix else "")


@dataclass
class ModelShape:
    """What the memory check needs from a model folder: weight bytes as stored and the KV cache's shape."""

    weight_bytes: int
    stored_dtype: str | None
    layers: int
    kv_heads: int
    head_dim: int
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, model_dir: Path) -> ModelShape:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        text = cfg.get("text_config", cfg)
        heads = int(text.get("num_attention_heads") or 0)
        hidden = int(text.get("hidden_size") or 0)
        head_dim = int(text.get("head_dim") or (hidden // heads if heads else 0))
        weights = sum(f.stat().st_size for f in model_dir.iterdir()
                      if f.suffix in (".safetensors", ".bin", ".pt") and f.is_file())
        return cls(weight_bytes=weights, stored_dtype=cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype")
                   or text.get("torch_dtype"), layers=int(text.get("num_hidden_layers") or 0),
                   kv_heads=int(text.get("num_key_value_heads") or heads), head_dim=head_dim)

    def kv_bytes_per_token(self, dtype: str) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES.get(dtype, 2)  # K and V

    def loaded_bytes(self, dtype: str, quantization: str = Ask.quantization) -> int:
        """The weights in the engine's dtype (stored float32 weights run in half precision take half); fp8
        quantized on the fly: one byte per 16-bit weight. An AWQ/GPTQ folder's files are already packed:
        their size as stored."""
        stored = STORED_BYTES.get(str(self.stored_dtype or "").lower(), DTYPE_BYTES.get(dtype, 2))
        loaded = self.weight_bytes * DTYPE_BYTES.get(dtype, 2) // stored
        return loaded // 2 if quantization == "fp8" else loaded


@dataclass(frozen=True)
class Need:
    """One engine's memory on each of its `tp` GPUs: its share of the weights and of one sequence's KV cache
    at max_model_len (vLLM refuses to start without room for it: vllm/v1/core/kv_cache_utils.py
    `check_enough_kv_cache_memory`), plus the overhead every GPU of the engine carries."""

    weights: float
    kv: float
    tp: int

    @property
    def total(self) -> float:
        return self.weights + self.kv + OVERHEAD_BYTES

    def why(self, max_model_len: int, dtype: str) -> str:
        return (f"weights {gib(self.weights)} ({dtype}), KV cache for max_model_len {max_model_len} "
                f"{gib(self.kv)}, ~{gib(OVERHEAD_BYTES)} overhead")


def need_per_gpu(model: ModelShape, ask: Ask, dtype: str, tp: int) -> Need:
    """What each of `tp` GPUs must hold for this model and `[model]` table (the preflight's one estimate)."""
    return Need(model.loaded_bytes(dtype, ask.quantization) / tp,
                model.kv_bytes_per_token(dtype) * ask.max_model_len / tp, tp)


def budget_of(gpu: Gpu, gpu_memory_utilization: float) -> float:
    """What an engine may use of `gpu`: its free memory, at most `gpu_memory_utilization` of the total."""
    return min(gpu.free_bytes, gpu_memory_utilization * gpu.total_bytes)


def _version(v: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(v).split(".")[:2])
    except ValueError:
        return ()


def gib(n: float) -> str:
    """Bytes as GiB in words, e.g. "1.5 GiB" (the preflight's and the GPU plan's messages)."""
    return f"{n / 2**30:.1f} GiB"


def checks(facts: GpuFacts, model: ModelShape, ask: Ask) -> list[Check]:
    """Every preflight check for this model and `[model]` table on the GPUs of `facts` (module docstring)."""
    out: list[Check] = []
    rt, drv = _version(facts.torch_cuda), _version(facts.driver_cuda)
    if not rt:
        out.append(Check("CUDA runtime", False, "the installed torch has no CUDA (a CPU build)",
                         "install the GPU stack: make install-offline STACK=gpu WHEELS=DIR"))
    elif not drv:
        out.append(Check("driver", True, f"torch built for CUDA {facts.torch_cuda}; the driver's CUDA version is "
                         "unknown (NVML not readable)", warning=True))
    elif drv[0] < rt[0]:
        out.append(Check("driver", False, f"driver {facts.driver or '?'} supports CUDA {facts.driver_cuda}, torch is "
                         f"built for CUDA {facts.torch_cuda}", f"install an NVIDIA driver for CUDA {rt[0]}.x"
                         + (f" (R{DRIVER_MIN[0]} or newer, docs/getting-started.md#prerequisites)"
                            if rt[0] == CUDA_MAJOR else "")))
    elif drv < rt:
        out.append(Check("driver", True, f"driver {facts.driver or '?'} supports CUDA {facts.driver_cuda}, older than "
                         f"torch's {facts.torch_cuda}: runs through CUDA minor-version compatibility, except kernels "
                         "compiled at run time", "update the driver if vLLM fails with a PTX/JIT error", warning=True))
    else:
        out.append(Check("driver", True, f"driver {facts.driver or '?'} supports CUDA {facts.driver_cuda} >= torch's "
                         f"{facts.torch_cuda}"))
    n, tp = len(facts.gpus), ask.tensor_parallel_size
    if n < tp or n == 0:
        out.append(Check("GPUs", False, f"{n} visible, tensor_parallel_size {tp} needs {tp}",
                         "check CUDA_VISIBLE_DEVICES and nvidia-smi, or lower [model] tensor_parallel_size"))
        return out
    out.append(Check("GPUs", True, "; ".join(f"{i}: {g.name} (sm_{g.capability[0]}{g.capability[1]}), "
                                            f"{gib(g.free_bytes)} free of {gib(g.total_bytes)}"
                                            for i, g in enumerate(facts.gpus))))
    if tp > 1:
        out.append(Check("NCCL", facts.nccl is not None,
                         f"NCCL {facts.nccl}" if facts.nccl else f"torch has no NCCL; tensor_parallel_size {tp} needs it",
                         "" if facts.nccl else "install the GPU stack's torch (it carries NCCL)"))
    first = facts.gpus[0]
    device = Device("cuda", capability=first.capability, name=first.name, count=n, total_bytes=first.total_bytes)
    old = [why for g in facts.gpus[:tp] if (why := unsupported(Device("cuda", capability=g.capability, name=g.name,
                                                                       count=n)))]
    if old:  # no run is planned on a GPU the pinned CUDA 13 stack has no kernels for (a V100)
        out.append(Check("GPU architecture", False, old[0], "run on a Turing or newer GPU, or with the CPU stack"))
        return out
    try:
        settings = engine_settings(device, ask)
        dtype = settings.llm["dtype"]
        out.append(Check("dtype", True, f"{dtype} on sm_{first.capability[0]}{first.capability[1]}"
                         + (f"; {'; '.join(settings.notes)}" if settings.notes else ""), warning=bool(settings.notes)))
    except InputError as exc:
        out.append(Check("dtype / batch-invariant", False, str(exc), "change [model] dtype or batch_invariant"))
        return out
    out.append(_memory(facts.gpus[:tp], model, ask, dtype))
    out.append(Check("FAISS on GPU", True, f"faiss-gpu sees {facts.faiss_gpus} GPUs" if facts.faiss_gpus else
                     "faiss-cpu (dense search runs on the CPU; fine for IVF/HNSW indexes)"))
    return out


def _memory(gpus: tuple[Gpu, ...], model: ModelShape, ask: Ask, dtype: str) -> Check:
    tp = len(gpus)
    need = need_per_gpu(model, ask, dtype, tp)
    weights, per_token = need.weights, model.kv_bytes_per_token(dtype) / tp
    short, spare = [], []
    for i, g in enumerate(gpus):
        budget = budget_of(g, ask.gpu_memory_utilization)
        if need.total > budget:
            short.append(f"GPU {i}: needs {gib(need.total)} ({need.why(ask.max_model_len, dtype)}), has "
                         f"{gib(budget)} (free, at gpu_memory_utilization {ask.gpu_memory_utilization})")
        else:
            spare.append(budget - weights - OVERHEAD_BYTES)
    if short:
        return Check("memory", False, "; ".join(short),
                     "free the GPU (nvidia-smi names the processes), raise gpu_memory_utilization, lower "
                     "max_model_len, or add GPUs (tensor_parallel_size)")
    requests = int(min(spare) // max(per_token * TOC_REQUEST_TOKENS, 1))
    return Check("memory", True, f"weights {gib(weights)} per GPU, KV cache room for ~{requests} ToC requests "
                 f"of {TOC_REQUEST_TOKENS} tokens (max_num_seqs caps it)")


def gather() -> GpuFacts:
    """This machine's facts: torch (runtime, GPUs, free memory, NCCL), NVML (driver), FAISS. CUDA only."""
    import torch

    gpus = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        gpus.append(Gpu(torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i)), int(free), int(total)))
    driver = driver_cuda = None
    try:  # nvidia-ml-py, a dependency of PyPI's vllm
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        v = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040
        driver_cuda = f"{v // 1000}.{v % 1000 // 10}"
    except Exception:  # no NVML: said as unknown, not a failure
        pass
    nccl = None
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        pass
    faiss_gpus = None
    try:
        import faiss

        faiss_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else None
    except ImportError:
        pass
    return GpuFacts(torch.version.cuda, driver_cuda, str(driver) if driver else None, tuple(gpus), nccl, faiss_gpus)
