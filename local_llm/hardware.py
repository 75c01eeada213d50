"""What the machine computes fast, and the engine dtype that follows from it.

Machines of one kind differ (docs/results.md): some x86 CPUs compute
bfloat16 natively (AVX512-BF16 or AMX tiles), others are AVX2-only and emulate it. vLLM-CPU keeps the
model's bfloat16 under `dtype="auto"`, and on an AVX2-only CPU that is ~3.7x slower than float32
(measured: 69 vs 256 tok/s, SmolLM2, 16 prompts x 64 tokens) and not batch-invariant. So clarify
resolves `dtype = "auto"` itself: bfloat16 where the CPU computes it natively and the weights are half
precision, float32 otherwise; on CUDA bfloat16 from compute capability 8.0, float16 below. The rule is a
row of the one CPU/CUDA settings table (local_llm/settings.py); `resolve_dtype` asks it.

A user's explicit `dtype` always wins. The dtype the engine really runs is part of the model identity
(`VLLMEngine.model_id`, hence every completion-cache key), so completions made in different dtypes
never mix. The capability is asked from torch (the same checks vLLM's CPU platform uses), never
parsed from /proc/cpuinfo.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import stat
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path

from clarify.errors import EngineBusy, InputError
from clarify.files import open_own, read_holder, write_holder
from clarify.local_llm.settings import Ask, Device, dtype_for


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


def resolve_dtype(requested: str, device: str, *, bf16_native: bool, model_dtype: str | None,
                  capability: tuple[int, int] | None = None) -> str:
    """The dtype to ask vLLM for: the settings table's dtype row (local_llm/settings.py). Pure: the facts
    are passed in (`capability`: a GPU's compute capability; None on CUDA means an unknown GPU)."""
    return dtype_for(Device(device, bf16_native=bf16_native, capability=capability),
                     Ask(dtype=requested, model_dtype=model_dtype))


def describe() -> str:
    """One line for benchmarks and `clarify models info`: capability and what 'auto' becomes here."""
    f = cpu_facts()
    return (f"CPU {f['arch']} capability={f['capability']} avx512_bf16={f['avx512_bf16']} amx={f['amx']} "
            f"-> bfloat16 {'native' if f['bf16_native'] else 'emulated (auto resolves to float32)'}")


# -- one engine per CPU core at a time ------------------------------------------------------------
# Two vLLM-CPU engines bound to the same cores slow each other down by two orders of magnitude (their
# OpenMP threads spin against each other; seen: a 20-prompt batch at 4 prompt tok/s). So an engine
# holds a lock on each core it is bound to while it works (a generate call, or while its step loop has
# requests in flight) — not while it sits idle, so a test process holding an idle engine never blocks
# the `clarify` subprocesses it starts. The locks are flock()s on files in the machine's temp folder:
# released by the kernel when the holder dies, so there is no stale lock. Engines pinned to disjoint
# cores (VLLM_CPU_OMP_THREADS_BIND=0 and =1) run side by side.
# The folder is the user's own (`clarify-cpu-locks-<uid>`, 0700): a shared fixed folder let
# another local user plant `core-N.lock` -> a file of yours, which the lock's write then overwrote, and
# its first user's 0755 folder refused everyone else. So the lock files are opened without following a
# link and never truncated, and engines of different users do not see each other's locks.

BUSY_ENV = "CLARIFY_ENGINE_BUSY"  # "wait" (default): wait, saying for whom; "refuse": raise EngineBusy


def cpu_list(cores: set[int]) -> str:
    """{0,1,2,5} -> '0-2,5' (the format of VLLM_CPU_OMP_THREADS_BIND)."""
    parts, run = [], []
    for c in sorted(cores):
        if run and c != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def affinity() -> set[int]:
    """The CPU cores this process may run on."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def parse_cpu_list(spec: str) -> set[int]:
    """'0-2,5' -> {0, 1, 2, 5} (VLLM_CPU_OMP_THREADS_BIND's format); anything else -> empty set."""
    cores: set[int] = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            cores.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return set()
    return cores


def lock_dir() -> Path:
    """This user's folder of core locks: `<temp folder>/clarify-cpu-locks-<uid>`, mode 0700. InputError
    when something else has the name (a link, a file, another user's folder, one others may write):
    it is never used, whoever made it."""
    d = Path(tempfile.gettempdir()) / f"clarify-cpu-locks-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        d.mkdir(mode=0o700)
    st = os.lstat(d)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
        return d
    why = ("not a folder" if not stat.S_ISDIR(st.st_mode) else "a folder of another user"
           if st.st_uid != os.geteuid() else "a folder that others may write to")
    raise InputError(f"the CPU core lock folder is {why}; remove it, or set TMPDIR to a folder of yours",
                     path=str(d))


_held: dict[int, list[int]] = {}  # core -> [fd, holders]: this process's locks, shared by its engines
_held_lock = threading.Lock()


class CoreLock:
    """Exclusive use of a set of cores by this process while work runs (`with lock:`, re-entrant; the
    engines of one process share its locks, so they never wait for each other)."""

    def __init__(self, cores: set[int], *, mode: str | None = None, say=print):
        self.cores = sorted(cores)
        self.mode = mode or os.environ.get(BUSY_ENV, "wait")
        if self.mode not in ("wait", "refuse"):
            raise ValueError(f"{BUSY_ENV} must be 'wait' or 'refuse', got {self.mode!r}")
        self.say = say
        self._taken: list[int] = []
        self._depth = 0
        self.waited_s = 0.0

    def __enter__(self) -> CoreLock:
        self._depth += 1
        if self._depth == 1:
            try:
                for core in self.cores:
                    self._take(core)
            except BaseException:
                self._release()
                self._depth = 0
                raise
        return self

    def _take(self, core: int) -> None:
        with _held_lock:
            if core in _held:
                _held[core][1] += 1
                self._taken.append(core)
                return
        fd = _open_lock(core, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(fd)
            if self.mode == "refuse":
                os.close(fd)
                raise EngineBusy(f"CPU core {core} is in use by a vLLM engine of {holder}; wait for it, "
                                 f"or pin this run to other cores (VLLM_CPU_OMP_THREADS_BIND=...)") from None
            if not self.waited_s:  # said once per engine, not at every batch
                self.say(f"waiting for CPU core {core}: a vLLM engine of {holder} is using it "
                         f"({BUSY_ENV}=refuse to fail instead)")
            t0 = time.perf_counter()
            fcntl.flock(fd, fcntl.LOCK_EX)
            self.waited_s += time.perf_counter() - t0 + 1e-9
        write_holder(fd)
        with _held_lock:
            _held[core] = [fd, 1]
        self._taken.append(core)

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._release()

    def _release(self) -> None:
        with _held_lock:
            for core in self._taken:
                entry = _held[core]
                entry[1] -= 1
                if entry[1] == 0:
                    fcntl.flock(entry[0], fcntl.LOCK_UN)
                    os.close(entry[0])
                    del _held[core]
        self._taken = []


def core_holders(cores: set[int]) -> dict[int, str | None]:
    """Who holds each core's engine lock right now (None: free). Looks without waiting: a shared lock
    taken and dropped at once where the core is free (`clarify doctor`)."""
    out: dict[int, str | None] = {}
    for core in sorted(cores):
        try:
            fd = _open_lock(core, os.O_RDONLY)
        except FileNotFoundError:
            out[core] = None
            continue
        except InputError as exc:  # a lock folder or file clarify will not use: said, not a crash
            out[core] = f"unknown ({exc})"
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            out[core] = None
        except BlockingIOError:
            out[core] = read_holder(fd)
        finally:
            os.close(fd)
    return out


def _open_lock(core: int, flags: int) -> int:
    """The lock file of `core` in this user's lock folder, never through a link (files.open_own)."""
    path = lock_dir() / f"core-{core}.lock"
    try:
        return open_own(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a link (not followed), another user's file, not a regular file
        raise InputError(f"cannot use this CPU core lock: {exc.strerror or exc}; remove it", path=str(path)) from None


# --------------------------------------------------------------------------------------------- CUDA
# The GPU counterpart of the core lock: vLLM reserves `gpu_memory_utilization` x the total
# memory of each GPU it uses and, when other processes hold too much, fails only after spawning and
# loading (vllm/v1/worker/utils.py: "Free memory on device ... is less than desired GPU memory
# utilization"). The same rule, checked before anything loads, fails in one line instead.


def check_gpu_memory(utilization: float, devices: int = 1, *, mem_get_info=None) -> None:
    """Raise EngineBusy when a GPU among the first `devices` has less free memory than
    `utilization` x its total. `mem_get_info(d) -> (free, total)` bytes; default torch.cuda's."""
    if mem_get_info is None:
        import torch

        mem_get_info = torch.cuda.mem_get_info
    short = []
    for d in range(devices):
        free, total = mem_get_info(d)
        if free < utilization * total:
            short.append(f"GPU {d}: {free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB, "
                         f"needs {utilization * total / 2**30:.1f} GiB")
    if short:
        raise EngineBusy(f"GPU memory is taken by other processes ({'; '.join(short)}) at "
                         f"gpu_memory_utilization = {utilization}: wait for them (nvidia-smi names them), "
                         f"or lower [model] gpu_memory_utilization")


def peak_memory() -> dict:
    """This process's peak memory so far: resident set (getrusage ru_maxrss, KiB on Linux) and, where torch
    has initialised CUDA here, the most memory torch's allocator reserved on each GPU of this process
    (an in-process vLLM engine's weights and KV cache; the shards of a tensor-parallel engine in other
    processes are not counted). Bytes; None where not known."""
    import resource
    import sys

    out: dict = {"rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "gpu_bytes": None}
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            out["gpu_bytes"] = sum(int(torch.cuda.max_memory_reserved(d)) for d in range(torch.cuda.device_count()))
    except Exception:  # a CUDA error here only loses a measure
        pass
    return out
