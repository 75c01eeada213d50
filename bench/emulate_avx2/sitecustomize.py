"""Run any clarify command here as if on an AVX2-only x86 CPU (the slowest kind CI draws).

    PYTHONPATH=bench/emulate_avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 make test

Python imports `sitecustomize` from the first sys.path entry that has one, in every process, so the
`clarify` subprocesses and engine workers that tests start are emulated too. Three layers decide
which instructions the engine uses, and each is held to AVX2:
- ATen's kernels: `ATEN_CPU_CAPABILITY=avx2` (torch/csrc docs: "ATEN_CPU_CAPABILITY"), which also makes
  `torch.backends.cpu.get_cpu_capability()` report AVX2;
- oneDNN's matmuls: `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN's "CPU dispatcher control" docs);
- vLLM-CPU's own kernels and every bfloat16/AMX choice ask `torch.cpu._is_avx512_supported()`,
  `_is_avx512_bf16_supported()` and `_is_amx_tile_supported()` (vllm/platforms/cpu.py `import_kernels`
  loads `vllm._C_AVX2` when the first is False; clarify's local_llm/hardware.py `cpu_facts` resolves
  `dtype = "auto"` from the other two). Those read CPUID, not the environment, so this file answers
  False for them as soon as torch is imported.
The result is the instruction set of an AVX2-only CPU, not its clock or caches: use it for ratios in one
run (docs/results.md), and mark a time carried over to a real AVX2 machine as an estimate.
"""

import importlib.abc
import importlib.machinery
import sys

_HIDDEN = ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported",
           "_is_amx_tile_supported", "_is_amx_fp16_supported")


def _hide(torch) -> None:
    for name in _HIDDEN:
        if hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda: False)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds `torch` as usual and patches it right after its module body has run. It stays on
    sys.meta_path: libraries ask `importlib.util.find_spec("torch")` before importing it, and that spec
    is not the one the import then executes."""

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _hide(module)

        spec.loader.exec_module = exec_module
        return spec


if "torch" in sys.modules:
    _hide(sys.modules["torch"])
else:
    sys.meta_path.insert(0, _AfterTorch())
