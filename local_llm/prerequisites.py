"""What a machine needs to run clarify, declared once (docs/getting-started.md#prerequisites is rendered from
this table, tests/test_prerequisites.py keeps the page equal to it), and the check of each against this
machine's facts (`clarify doctor`, section "prerequisites").

`gather()` reads the facts (Python, glibc, free disk under $CLARIFY_HOME, RAM, the NVIDIA driver from
/proc/driver/nvidia/version, the GPUs' compute capabilities from torch where CUDA is up); `checks(facts)` is
pure, so a faked old glibc, driver or V100 is tested on a CPU machine.

Where each number comes from:
- Python 3.11 and glibc >= 2.28: `make lock` resolves every wheel for CPython 3.11 on
  x86_64-manylinux_2_28 (Makefile LOCK_TARGET); a manylinux_2_28 wheel needs glibc >= 2.28 (PEP 600).
- NVIDIA driver and GPU architecture: the pinned GPU stack is CUDA 13 (local_llm/settings.py CUDA_MAJOR,
  DRIVER_MIN, GPU_MIN_CAPABILITY, with their sources).
- Disk and RAM per setup: the sizes of the files each one reads (measured here, or as their publishers
  list them), the GPU memory from the preflight's own estimate (local_llm/preflight.py `need_per_gpu`) for
  Llama 3.1 shapes as their config.json files state them. Each row says which.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from clarify.local_llm.preflight import Check, ModelShape, need_per_gpu
from clarify.local_llm.settings import CUDA_MAJOR, DRIVER_MIN, GPU_MIN_CAPABILITY, Ask

PYTHON = (3, 11)
GLIBC_MIN = (2, 28)
GB = 10**9
# Llama-3.1-8B-Instruct and Llama-3.1-70B-Instruct in bfloat16: safetensors bytes and config.json shapes
# (the same shapes tests/test_gpu_plan.py plans with).
LLAMA_8B = ModelShape(weight_bytes=16_060_522_496, stored_dtype="bfloat16", layers=32, kv_heads=8, head_dim=128)
LLAMA_70B = ModelShape(weight_bytes=141_107_412_992, stored_dtype="bfloat16", layers=80, kv_heads=8, head_dim=128)


def _gpu_need(shape: ModelShape, tp: int) -> str:
    """GiB per GPU at the default [model] (max_model_len 6144, bfloat16) over `tp` GPUs."""
    need = need_per_gpu(shape, Ask(model_dtype="bfloat16"), "bfloat16", tp)
    return f"{need.total / 2**30:.1f} GiB"


@dataclass(frozen=True)
class Setup:
    """What one way of running clarify needs beyond the software: disk (GB, 10^9) and RAM (GB)."""

    name: str
    disk_gb: float
    ram_gb: float
    gpu: str  # "" : none
    source: str  # how the figures were derived


SETUPS: tuple[Setup, ...] = (
    Setup("embedded (CPU demo, tests)", 6, 8, "",
          "measured on this project's machines: the CPU stack's .venv 5.2 GB, $CLARIFY_HOME 0.3 GB (prepared "
          "SmolLM2 260 MB, embedded index 41 MB); RAM: one vLLM CPU engine ~3.4 GB RSS (tests/fixtures_llm.py) "
          "+ its 2 GiB KV cache (VLLM_CPU_KVCACHE_SPACE) + the JVM and encoder"),
    Setup("full DPR Wikipedia (Pyserini Lucene + flat FAISS)", 70, 64, "",
          "Pyserini's tarballs (pyserini/prebuilt_index_info.py): lucene-index.wikipedia-dpr-100w 9.2 GB, "
          "faiss.wikipedia-dpr-100w.dpr_multi flat 60 GB (21,015,324 x 768 float32); twice that while unpacking; RAM: the "
          "memory-mapped flat index in the page cache (less RAM works, each search then reads disk: "
          "docs/retrieval.md)"),
    Setup("one 8B model (Llama-3.1-8B-Instruct, bfloat16)", 17, 32,
          f"1 GPU, {_gpu_need(LLAMA_8B, 1)} free at max_model_len 6144",
          "disk: its safetensors, 16.1 GB; GPU: the preflight's estimate (weights + KV cache at max_model_len "
          "+ ~2 GiB overhead, local_llm/preflight.py); RAM: the weights pass through the page cache once per "
          "engine (16 GB) + the run process (torch, vLLM, JVM, encoder); an estimate, not measured on a GPU"),
    Setup("one 70B model (Llama-3.1-70B-Instruct, bfloat16)", 142, 192,
          f"4 x 80 GB GPUs (tensor_parallel_size 4), {_gpu_need(LLAMA_70B, 4)} each; on 2 GPUs "
          f"{_gpu_need(LLAMA_70B, 2)} each exceeds 0.85 x 80 GB",
          "disk: its safetensors, 141.1 GB; GPU: the preflight's estimate (batch/compare/gpu_plan.py plans the same); "
          "RAM: the weights through the page cache (141 GB) + the run process; an estimate, not measured on a GPU"),
)


@dataclass(frozen=True)
class Prerequisite:
    """One requirement: what is needed, why (its source), and what to do when it is missing."""

    name: str
    need: str
    why: str
    fix: str
    gpu_only: bool = False


DRIVER = ".".join(str(p) if i == 0 else f"{p:02d}" for i, p in enumerate(DRIVER_MIN))
TABLE: tuple[Prerequisite, ...] = (
    Prerequisite("Python", f"CPython {PYTHON[0]}.{PYTHON[1]} (Linux x86_64)",
                 "every wheel in requirements/*.txt is locked for CPython 3.11 (Makefile LOCK_TARGET)",
                 "install python3.11 (and python3.11-venv), then `make setup`"),
    Prerequisite("glibc", f">= {GLIBC_MIN[0]}.{GLIBC_MIN[1]}",
                 "the locks resolve for x86_64-manylinux_2_28; such wheels need glibc >= 2.28 (PEP 600): "
                 "RHEL/Rocky 8, Debian 10, Ubuntu 18.10 or newer",
                 "a newer distribution (or a container with one)"),
    Prerequisite("disk", "per setup (below), free under $CLARIFY_HOME",
                 "the files each setup reads (below)", "free space, or point $CLARIFY_HOME at a larger disk"),
    Prerequisite("RAM", "per setup (below)", "the processes and page cache each setup needs (below)",
                 "a machine with more memory, or a smaller setup"),
    Prerequisite("NVIDIA driver", f">= {DRIVER} (R{DRIVER_MIN[0]})",
                 f"the GPU stack (requirements/gpu.txt) is CUDA {CUDA_MAJOR}: torch 2.13.0 on nvidia-cuda-runtime "
                 f"13.0; CUDA 13.0's Linux driver is >= {DRIVER} (NVIDIA CUDA toolkit release notes, table 3)",
                 f"install NVIDIA driver R{DRIVER_MIN[0]} or newer (nvidia-smi shows the version)", gpu_only=True),
    Prerequisite("GPU architecture", f"compute capability >= {GPU_MIN_CAPABILITY[0]}.{GPU_MIN_CAPABILITY[1]} (Turing or newer: "
                        "T4, A10, A100, L40S, H100, ...)",
                 "CUDA 13 dropped Maxwell, Pascal and Volta (compute capability < 7.5): a V100 (7.0) cannot run "
                 "the pinned stack, and clarify refuses it instead of planning a run on it",
                 "a Turing or newer GPU, or the CPU stack", gpu_only=True),
)


@dataclass(frozen=True)
class HostFacts:
    python: tuple[int, int]
    glibc: tuple[int, ...] | None  # None: not glibc (musl) or unknown
    disk_free_bytes: int | None
    ram_bytes: int | None
    driver: str | None = None  # the NVIDIA kernel module's version; None: no NVIDIA driver loaded
    capabilities: tuple[tuple[int, int], ...] = ()  # one per visible GPU
    gpu_names: tuple[str, ...] = field(default=())


def _version(text: str | None) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text or ""))


def checks(facts: HostFacts) -> list[Check]:
    """Each prerequisite (and each setup's disk and RAM) as ok or missing, with the fix."""
    by = {p.name: p for p in TABLE}
    out = []
    py = by["Python"]
    got = ".".join(map(str, facts.python))
    out.append(Check("Python", tuple(facts.python) == PYTHON, f"{got}, needs {py.need}", "" if
                     tuple(facts.python) == PYTHON else py.fix))
    g = by["glibc"]
    if facts.glibc is None:
        out.append(Check("glibc", False, "not found (a musl or unknown C library)", g.fix))
    else:
        ok = facts.glibc >= GLIBC_MIN
        out.append(Check("glibc", ok, f"{'.'.join(map(str, facts.glibc))}, needs {g.need}", "" if ok else g.fix))
    for s in SETUPS:
        short, fixes = [], []
        if facts.disk_free_bytes is not None and facts.disk_free_bytes < s.disk_gb * GB:
            short.append(f"{s.disk_gb:g} GB disk, {facts.disk_free_bytes / GB:.1f} GB free")
            fixes.append(by["disk"].fix)
        if facts.ram_bytes is not None and facts.ram_bytes < s.ram_gb * GB:
            short.append(f"{s.ram_gb:g} GB RAM, {facts.ram_bytes / GB:.1f} GB here")
            fixes.append(by["RAM"].fix)
        need = f"{s.disk_gb:g} GB disk, {s.ram_gb:g} GB RAM" + (f", {s.gpu}" if s.gpu else "")
        out.append(Check(f"setup: {s.name}", not short,
                         f"needs {need}" + (f"; short of {'; '.join(short)}" if short else ""), "; ".join(fixes)))
    if facts.driver is None and not facts.capabilities:
        out.append(Check("NVIDIA driver", True, "no NVIDIA driver loaded: the CPU stack only"))
        return out
    d = by["NVIDIA driver"]
    ok = facts.driver is not None and _version(facts.driver)[:3] >= DRIVER_MIN
    out.append(Check("NVIDIA driver", ok, f"{facts.driver or 'unknown'}, needs {d.need}", "" if ok else d.fix))
    gpu = by["GPU architecture"]
    names = facts.gpu_names or tuple("GPU" for _ in facts.capabilities)
    old = [f"{i}: {n} ({c[0]}.{c[1]})" for i, (n, c) in enumerate(zip(names, facts.capabilities, strict=False))
           if tuple(c) < GPU_MIN_CAPABILITY]
    seen = ", ".join(f"{n} ({c[0]}.{c[1]})" for n, c in zip(names, facts.capabilities, strict=False)) or "none visible"
    out.append(Check("GPU architecture", not old, (f"below {gpu.need}: " + "; ".join(old)) if old else f"{seen}, needs {gpu.need}",
                     gpu.fix if old else ""))
    return out


def render_markdown() -> str:
    """The prerequisites as docs/getting-started.md#prerequisites shows them."""
    lines = ["| prerequisite | needs | why | when missing |", "| --- | --- | --- | --- |"]
    for p in TABLE:
        lines.append(f"| {p.name}{' (GPU stack)' if p.gpu_only else ''} | {p.need} | {p.why} | {p.fix} |")
    lines += ["", "| setup | disk | RAM | GPU | how the figures were derived |", "| --- | --- | --- | --- | --- |"]
    for s in SETUPS:
        lines.append(f"| {s.name} | {s.disk_gb:g} GB | {s.ram_gb:g} GB | {s.gpu or 'none'} | {s.source} |")
    return "\n".join(lines)


def _glibc() -> tuple[int, ...] | None:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
    except (ValueError, OSError, AttributeError):
        text = " ".join(platform.libc_ver())
    return _version(text) or None if "glibc" in text else None


def _driver(proc: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    """The loaded NVIDIA kernel module's version ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06 ...")."""
    try:
        m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", proc.read_text(encoding="utf-8"))
    except OSError:
        return None
    return m.group(1) if m else None


def gather(home: Path) -> HostFacts:
    """This machine's facts; torch is asked for GPUs only where it is imported already or CUDA is up."""
    disk = None
    probe = home
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        disk = shutil.disk_usage(probe).free
    except OSError:
        pass
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        ram = None
    caps: tuple = ()
    names: tuple = ()
    try:
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            caps = tuple(tuple(torch.cuda.get_device_capability(i)) for i in range(n))
            names = tuple(torch.cuda.get_device_name(i) for i in range(n))
    except Exception:  # no torch, or CUDA not up: the driver line says what is known
        pass
    return HostFacts(sys.version_info[:2], _glibc(), disk, ram, _driver(), caps, names)
