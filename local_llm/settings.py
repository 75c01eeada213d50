"""The one CPU/CUDA settings table: every setting clarify gives vLLM, per device, as code (docs/engines.md#the-cpucuda-settings-table).

`engine_settings(device, ask)` evaluates the table for one device and returns what an engine is started
with: the keywords of `vllm.LLM(...)`, the environment set before vLLM is imported, and notes that say
what was chosen for the user (a dtype fallback). `render(device, ask)` prints the same rows as a
Markdown table (`clarify doctor --settings`, docs/engines.md#the-cpucuda-settings-table). Nothing here imports torch or vLLM: the device
facts are passed in, so faked devices (CUDA capability 7.0, 8.0, 9.0) are tested on a CPU machine
(tests/test_engine_settings.py), and every keyword is checked against the pinned vLLM's own argument
names (tests/test_vllm_api.py).

Sources for the rules (vLLM 0.32.0, the pinned version):
- bfloat16 needs compute capability >= 8.0 (vllm/platforms/cuda.py checks it and refuses otherwise);
  below it clarify chooses float16 and says so. A float32 model is run in half precision on a GPU (the
  weights are cast), never silently float32.
- `VLLM_BATCH_INVARIANT=1` (vllm/envs.py; vllm/model_executor/determinism/batch_invariant.py): on SM80
  (Ampere) Triton matmul overrides, on SM89/90/100/120 (Ada, Hopper, Blackwell) cuBLAS without split-k;
  clarify refuses it below 8.0. On CPU clarify uses float32 instead, whose results do not depend on the
  batch (docs/results.md).
- Batch defaults: vllm/engine/arg_utils.py `get_batch_defaults` (CPU: 256 sequences, 4096 tokens per
  step for the offline `LLM`; GPUs: 256-1024 and 8192-16384 by memory).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clarify.errors import InputError
from clarify.options import setting

DTYPES = ("auto", "bfloat16", "float16", "float32")  # what [model] dtype accepts
# [model] quantization: "" = none asked (vLLM still reads an AWQ/GPTQ folder's `quantization_config`);
# each method's lowest compute capability: vllm/model_executor/layers/quantization/{awq,gptq}.py
# `get_min_capability` (75, 60); fp8 weights quantized on the fly run on sm_89+ (Ada, Hopper) FP8 cores.
QUANTIZATION_MIN_CAPABILITY = {"awq": (7, 5), "gptq": (6, 0), "fp8": (8, 9)}
QUANTIZATIONS = ("", *QUANTIZATION_MIN_CAPABILITY)
_HALF = {"bfloat16", "bf16", "float16", "fp16", "half"}
# The pinned GPU stack (requirements/gpu.txt: torch 2.13.0 on nvidia-cuda-runtime 13.0.96, vLLM 0.32.0) is
# CUDA 13. CUDA 13.0 removed offline compilation and library support for compute capability < 7.5
# (Maxwell 5.x, Pascal 6.x, Volta 7.0/7.2: NVIDIA CUDA 12.9 / 13.0 toolkit release notes, "Deprecated or
# Dropped Features"; NVIDIA technical blog "Navigating GPU Architecture Support"), so no kernel of the
# pinned torch or vLLM runs on a V100: such a GPU is refused, never planned (stay on CUDA 12.9 for it).
CUDA_MAJOR = 13
GPU_MIN_CAPABILITY = (7, 5)  # Turing (T4, RTX 20xx) and newer
# CUDA 13.0 GA's toolkit driver on Linux x86_64 (CUDA toolkit release notes, table 3, ">= 580.65.06");
# CUDA minor-version compatibility lets any R580 driver run the later 13.0 updates the lock pins.
DRIVER_MIN = (580, 65, 6)
BF16_MIN_CAPABILITY = (8, 0)  # Ampere: bfloat16 tensor cores; vLLM refuses bf16 below it
BATCH_INVARIANT_MIN_CAPABILITY = (8, 0)  # vLLM 0.32's batch-invariant kernels: SM80 and newer
GPU_MAX_NUM_SEQS = 512  # sequences a GPU engine runs at once (vLLM's LLM default is 256, or 1024 on >= 70 GB)
GPU_MAX_NUM_BATCHED_TOKENS = 16384  # tokens per engine step on a GPU (vLLM's H100/H200 offline default)
# [model] chat_template -> VLLMEngine's `chat`: the folder decides, always, never
CHAT_TEMPLATES = {"auto": "auto", "on": True, "off": False}


@dataclass(frozen=True)
class EngineOptions:
    """The engine's options, each declared here once with its default: a run's `[model]` table
    (batch/config/schema.py ModelConfig is made of these and the server client's, local_llm/openai_engine.py
    ClientOptions), the settings table's `Ask` and `VLLMEngine`'s keywords take their defaults from them."""

    # the embedded SmolLM2-135M-Instruct (local_llm/models.py EMBEDDED)
    model: str = setting("smollm2-135m-instruct", flag="--model", nonempty=True,
                         help="model directory or embedded model name; with backend \"openai\", the name the server "
                              "serves (empty: its only model)")
    # Below the embedded SmolLM2's own context (max_position_embeddings 8192 in its config.json); a prompt
    # longer than it is recorded and not sent (batch/run/scheduler.py `fits`).
    max_model_len: int = setting(6144, help="the engine's context in tokens (prompt and output)", lo=1, unit="tokens")
    gpu_memory_utilization: float = setting(0.85, help="CUDA: the fraction of each GPU's memory the engine may "
                                                       "use, in (0, 1] (vLLM EngineArgs)", lo=0, hi=1, lo_open=True)
    tensor_parallel_size: int = setting(1, help="GPUs one engine is sharded over", lo=1)
    # "auto" as the settings table's dtype row (`_dtype` below) resolves it; on CUDA it never keeps the
    # model's own dtype: float32 weights run in bfloat16/float16 too (docs/engines.md).
    dtype: str = setting("auto", help="\"auto\": on CUDA, bfloat16 at compute capability >= 8.0, else float16; "
                                      "on CPU, bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX) "
                                      "and the model's weights are half precision, else float32 (always float32 "
                                      "with batch_invariant). The dtype really run is recorded in summary.json and "
                                      "every cache key.", choices=DTYPES)
    batch_invariant: bool = setting(
        False, help="results that do not depend on the batch (docs/engines.md#batch-invariance): vLLM's "
                    "batch-invariant mode on CUDA (compute capability >= 8.0), float32 on CPU. Part of the model "
                    "identity, hence every cache key.", flag="--batch-invariant", switch=True)
    max_num_seqs: int = setting(0, help="sequences the engine runs at once; 0: the settings table's value for the "
                                        "device (local_llm/settings.py: vLLM's 256 on CPU, 512 on a GPU). The "
                                        "scheduler admits as many trees' requests (VLLMEngine.capacity).", lo=0)
    quantization: str = setting("", help="\"\": vLLM reads a quantized folder's own `quantization_config` (AWQ, "
                                         "GPTQ); \"fp8\": weights quantized on the fly (>= sm_89). CUDA only: the "
                                         "settings table's quantization row (local_llm/settings.py).",
                                    choices=QUANTIZATIONS)
    chat_template: str = setting("auto", help="\"auto\": the chat template when the model folder has one; "
                                              "\"off\": raw text prompts even for a chat model; \"on\": required "
                                              "(a folder without one is refused). Part of the model identity "
                                              "(cache keys).", choices=tuple(CHAT_TEMPLATES))


@dataclass(frozen=True)
class Device:
    """What the engine will run on. CPU: whether it computes bfloat16 natively (hardware.cpu_facts).
    CUDA: the first visible GPU's compute capability, name and memory, and how many are visible."""

    kind: str  # "cpu" | "cuda"
    bf16_native: bool = False
    cores: str = ""  # CPU: the cores an engine binds (VLLM_CPU_OMP_THREADS_BIND's format)
    capability: tuple[int, int] | None = None
    name: str = ""
    count: int = 0
    total_bytes: int = 0
    faiss_gpus: int = 0  # GPUs FAISS sees (faiss-gpu); 0 with faiss-cpu

    def label(self) -> str:
        if self.kind == "cpu":
            return f"CPU (bf16 {'native' if self.bf16_native else 'emulated'})"
        cap = ".".join(map(str, self.capability or ()))
        return f"CUDA {self.name or 'GPU'} (compute capability {cap}) x{self.count}"


@dataclass(frozen=True)
class Ask(EngineOptions):
    """What the run's `[model]` table asks for (its engine options) and the model's own dtype, with what the
    engine sets beyond the table: `model` is the folder the engine loads."""

    model_dtype: str | None = None  # torch_dtype / dtype of the model folder's config.json
    kv_cache_gib: int = 2
    seed: int = 0
    enable_prefix_caching: bool = True
    ray_worker: bool = False  # the engine of a Ray worker (batch/run/cluster.py)


def ask_of(options: EngineOptions, **beyond: Any) -> Ask:
    """The `Ask` of an options object (a run's `[model]` table, a backend's Options, an Ask itself): every engine
    option carried whole, then `beyond` (the model folder and its dtype, a planned tensor_parallel_size, a Ray
    worker's placement). The one place the options are taken apart: an option declared in EngineOptions reaches
    the engine, this table, `clarify doctor --settings` and `clarify compare`'s checks with no edit there."""
    names = [f.name for f in dataclasses.fields(Ask if isinstance(options, Ask) else EngineOptions)]
    return Ask(**{**{name: getattr(options, name) for name in names}, **beyond})


@dataclass
class EngineSettings:
    llm: dict[str, Any]  # vllm.LLM(**llm)
    env: dict[str, str]  # set with setdefault before vLLM is imported (a user's own value wins)
    notes: list[str] = field(default_factory=list)
    faiss: dict[str, Any] = field(default_factory=dict)  # how the dense index is searched (rows "faiss ...")
    encode: dict[str, Any] = field(default_factory=dict)  # how an index build encodes passages (rows "encode ...")


NOT_SET = None  # a row's value None: clarify passes nothing, vLLM's own default holds


def unsupported(device: Device) -> str | None:
    """Why the pinned CUDA stack cannot run on `device` (a GPU below GPU_MIN_CAPABILITY), or None."""
    if device.kind != "cuda" or device.capability is None or device.capability >= GPU_MIN_CAPABILITY:
        return None
    cap = ".".join(map(str, device.capability))
    return (f"{device.label()}: compute capability {cap} is below {GPU_MIN_CAPABILITY[0]}.{GPU_MIN_CAPABILITY[1]}, "
            f"which the pinned CUDA {CUDA_MAJOR} stack needs (CUDA 13 dropped Maxwell, Pascal and Volta): use a "
            f"Turing or newer GPU (T4, A100, L40S, H100), or the CPU stack")


def _dtype(d: Device, a: Ask, notes: list[str]) -> str:
    if why := unsupported(d):
        raise InputError(why, field="device")
    if a.dtype not in DTYPES:
        raise InputError(f"unknown dtype {a.dtype!r}; choose one of {DTYPES}", field="model.dtype")
    model_half = str(a.model_dtype or "").lower() in _HALF
    if d.kind == "cpu":
        if a.batch_invariant:  # bf16 greedy texts depend on the batch on CPU; float32 ones do not
            if a.dtype not in ("auto", "float32"):
                raise InputError(f"batch_invariant = true runs float32 on a CPU; dtype {a.dtype!r} is not "
                                 f"batch-invariant there (set dtype = \"auto\" or \"float32\")",
                                 field="model.batch_invariant")
            return "float32"
        if a.dtype != "auto":
            return a.dtype
        return "bfloat16" if d.bf16_native and model_half else "float32"
    bf16_ok = (d.capability or (0, 0)) >= BF16_MIN_CAPABILITY
    if a.dtype == "bfloat16" and not bf16_ok:
        raise InputError(f"dtype bfloat16 needs a GPU of compute capability >= 8.0; {d.label()} has not: "
                         f"set dtype = \"float16\" (or \"auto\")", field="model.dtype")
    if a.dtype != "auto":
        if a.dtype == "float32":
            notes.append("dtype float32 on a GPU, as configured: ~2x the memory and far slower than bfloat16")
        return a.dtype
    chosen = "bfloat16" if bf16_ok else "float16"
    if str(a.model_dtype or "").lower() in ("bfloat16", "bf16") and not bf16_ok:
        notes.append(f"the model's weights are bfloat16 but {d.label()} has no bfloat16: running float16 "
                     f"(results differ from a bfloat16 GPU's)")
    elif not model_half:
        notes.append(f"the model's weights are {a.model_dtype or 'of unknown dtype'}: running {chosen} on the GPU "
                     f"(set dtype = \"float32\" to keep them)")
    return chosen


def dtype_for(device: Device, ask: Ask) -> str:
    """The dtype row alone (notes dropped): `clarify doctor`, `clarify models info`."""
    return _dtype(device, ask, [])


def _batch_invariant_env(d: Device, a: Ask) -> str | None:
    if not a.batch_invariant or d.kind != "cuda":
        return NOT_SET
    if (d.capability or (0, 0)) < BATCH_INVARIANT_MIN_CAPABILITY:
        raise InputError(f"batch_invariant = true needs compute capability >= 8.0 with vLLM 0.32 (Ampere, Ada, "
                         f"Hopper, Blackwell); {d.label()} has not", field="model.batch_invariant")
    return "1"


def _tensor_parallel(d: Device, a: Ask) -> int:
    if d.kind == "cpu" and a.tensor_parallel_size > 1:
        raise InputError("tensor_parallel_size > 1 needs GPUs; a CPU engine runs one shard",
                         field="model.tensor_parallel_size")
    if d.kind == "cuda" and d.count and a.tensor_parallel_size > d.count:
        raise InputError(f"tensor_parallel_size {a.tensor_parallel_size} needs that many GPUs; "
                         f"{d.count} visible (CUDA_VISIBLE_DEVICES)", field="model.tensor_parallel_size")
    return a.tensor_parallel_size


def _quantization(d: Device, a: Ask) -> str | None:
    if not a.quantization:
        return NOT_SET
    if a.quantization not in QUANTIZATION_MIN_CAPABILITY:
        raise InputError(f"unknown quantization {a.quantization!r}; choose one of {QUANTIZATIONS}",
                         field="model.quantization")
    if d.kind == "cpu":
        raise InputError(f"quantization {a.quantization!r} needs a CUDA GPU; a CPU engine runs the weights "
                         f"unquantized (leave quantization empty)", field="model.quantization")
    need = QUANTIZATION_MIN_CAPABILITY[a.quantization]
    if (d.capability or (0, 0)) < need:
        raise InputError(f"quantization {a.quantization!r} needs compute capability >= {need[0]}.{need[1]}; "
                         f"{d.label()} has not", field="model.quantization")
    return a.quantization


@dataclass(frozen=True)
class Row:
    """One setting: its value on CPU and on CUDA (None: not passed) and why they differ."""

    name: str  # an LLM keyword, or "env NAME"
    cpu: Callable[[Device, Ask, list[str]], Any]
    cuda: Callable[[Device, Ask, list[str]], Any]
    why: str


def _same(f: Callable[[Ask], Any]) -> Callable[[Device, Ask, list[str]], Any]:
    return lambda d, a, notes: f(a)


def _const(v: Any) -> Callable[[Device, Ask, list[str]], Any]:
    return lambda d, a, notes: v


TABLE: tuple[Row, ...] = (
    Row("dtype", _dtype, _dtype,
        "CPU: bfloat16 only where computed natively (AVX512-BF16/AMX), else float32 (~3.7x faster on AVX2); "
        "CUDA: bfloat16 on >= sm_80, float16 below, never silently float32"),
    Row("quantization", lambda d, a, n: _quantization(d, a), lambda d, a, n: _quantization(d, a),
        "CUDA only: AWQ (>= sm_75) / GPTQ (>= sm_60) folders are read from their config.json; fp8 on the fly "
        "needs >= sm_89; refused on CPU"),
    Row("max_model_len", _same(lambda a: a.max_model_len), _same(lambda a: a.max_model_len), "the run's context"),
    Row("tensor_parallel_size", lambda d, a, n: _tensor_parallel(d, a), lambda d, a, n: _tensor_parallel(d, a),
        "shards of one engine: GPUs only"),
    Row("gpu_memory_utilization", _const(NOT_SET), _same(lambda a: a.gpu_memory_utilization),
        "CPU: the KV cache is VLLM_CPU_KVCACHE_SPACE GiB of RAM instead"),
    Row("max_num_seqs", _same(lambda a: a.max_num_seqs or NOT_SET), _same(lambda a: a.max_num_seqs or GPU_MAX_NUM_SEQS),
        "sequences per step; the scheduler admits min(this, KV cache / 2048 tokens) trees' requests "
        "(VLLMEngine.capacity)"),
    Row("max_num_batched_tokens", _const(NOT_SET), _const(GPU_MAX_NUM_BATCHED_TOKENS),
        "tokens per step: large GPU batches; CPU keeps vLLM's 4096 (>= max_model_len without chunked prefill)"),
    Row("enable_prefix_caching", _same(lambda a: a.enable_prefix_caching), _same(lambda a: a.enable_prefix_caching),
        "few-shot prompts share long prefixes"),
    Row("enforce_eager", _const(True), _const(False),
        "CPU: torch.compile recompiles at every start (50+ s); CUDA: CUDA graphs"),
    Row("enable_chunked_prefill", _const(False), _const(NOT_SET),
        "CPU: a seeded prompt split across steps kills the engine ('CPU Generator does not use offset'); "
        "CUDA: vLLM's default (on)"),
    Row("seed", _same(lambda a: a.seed), _same(lambda a: a.seed), "the engine's global seed (requests carry their own)"),
    Row("scheduling_policy", _const("priority"), _const("priority"),
        "submit(priority=...) orders the step loop's queue; results never depend on it"),
    Row("trust_remote_code", _const(False), _const(False), "a model folder's own Python code never runs"),
    Row("distributed_executor_backend", _const(NOT_SET),
        lambda d, a, n: "ray" if a.ray_worker and a.tensor_parallel_size > 1 else NOT_SET,
        "a Ray worker's tensor-parallel engine: vLLM's Ray executor puts its shards in the worker's placement "
        "group of GPU bundles (vllm/v1/executor/ray_utils.py); a Ray worker on CPU binds its own cores"),
    Row("faiss device", _const("cpu"), lambda d, a, n: faiss_device(d),
        "dense search on the GPU where faiss-gpu is installed and sees one (index/dense.py to_gpu), else the "
        "memory-mapped CPU index every process of a node shares"),
    Row("encode batch_size", _const(16), _const(256),
        "passages per encoder batch in an index build (`clarify index build --device`): CPU 16, batches cut by "
        "token count (bench/results/encode.json); CUDA: large batches keep the GPU busy"),
    Row("env VLLM_CPU_OMP_THREADS_BIND", lambda d, a, n: d.cores or NOT_SET, _const(NOT_SET),
        "every core of this process (vLLM's default leaves one idle); a Ray worker: its own cores"),
    Row("env VLLM_CPU_KVCACHE_SPACE", _same(lambda a: str(a.kv_cache_gib)), _const(NOT_SET),
        "GiB of RAM for the CPU KV cache"),
    Row("env VLLM_BATCH_INVARIANT", _const(NOT_SET), lambda d, a, n: _batch_invariant_env(d, a),
        "[model] batch_invariant on CUDA (>= sm_80); on CPU float32 is batch-invariant instead"),
    Row("env VLLM_ENABLE_V1_MULTIPROCESSING", _const("0"), _const("0"),
        "the engine core runs in this process: scripts need no __main__ guard"),
)


def faiss_device(device: Device) -> str:
    """Where a run searches its FAISS index: "cuda" on a CUDA machine whose FAISS sees a GPU, else "cpu"."""
    return "cuda" if device.kind == "cuda" and device.faiss_gpus > 0 else "cpu"


def engine_settings(device: Device, ask: Ask) -> EngineSettings:
    """The table evaluated for `device`: LLM keywords and environment (None values left out)."""
    if device.kind not in ("cpu", "cuda"):
        raise ValueError(f"unknown device kind {device.kind!r}")
    notes: list[str] = []
    llm: dict[str, Any] = {"model": ask.model}
    env: dict[str, str] = {}
    settings_faiss: dict[str, Any] = {}
    settings_encode: dict[str, Any] = {}
    for row in TABLE:
        value = (row.cpu if device.kind == "cpu" else row.cuda)(device, ask, notes)
        if value is NOT_SET:
            continue
        if row.name.startswith("env "):
            env[row.name.removeprefix("env ")] = str(value)
        elif row.name.startswith("faiss "):
            settings_faiss[row.name.removeprefix("faiss ")] = value
        elif row.name.startswith("encode "):
            settings_encode[row.name.removeprefix("encode ")] = value
        else:
            llm[row.name] = value
    return EngineSettings(llm, env, notes, settings_faiss, settings_encode)


def encode_setting(name: str, device_kind: str) -> Any:
    """One "encode ..." row of the table for an index build on `device_kind` ("cpu" or "cuda")."""
    row = next(r for r in TABLE if r.name == f"encode {name}")
    return (row.cpu if device_kind == "cpu" else row.cuda)(Device(device_kind), Ask(), [])


def render(devices: list[Device], ask: Ask) -> str:
    """The table as Markdown, one value column per device (a row that raises shows the error's text)."""
    head = "| setting | " + " | ".join(d.label() for d in devices) + " | why |"
    lines = [head, "|" + " --- |" * (len(devices) + 2)]
    refused = {i: unsupported(d) for i, d in enumerate(devices)}
    if any(refused.values()):  # a device the pinned stack cannot run says so once, and gets no plan
        lines.append("| supported | " + " | ".join(f"refused: {why}" if why else "yes" for why in refused.values())
                     + f" | the pinned CUDA {CUDA_MAJOR} stack runs on compute capability >= "
                       f"{GPU_MIN_CAPABILITY[0]}.{GPU_MIN_CAPABILITY[1]} (docs/getting-started.md#prerequisites) |")
    for row in TABLE:
        cells = []
        for i, d in enumerate(devices):
            if refused[i]:
                cells.append("-")
                continue
            try:
                v = (row.cpu if d.kind == "cpu" else row.cuda)(d, ask, [])
                cells.append("not set" if v is NOT_SET else f"`{v}`")
            except InputError as exc:
                cells.append(f"refused: {exc}")
        lines.append(f"| `{row.name}` | " + " | ".join(cells) + f" | {row.why} |")
    return "\n".join(lines)
