"""The shipped 8-GPU examples (data/examples/*-8gpu.toml) are what docs/scale.md says: each run config goes
through `clarify run --config ... --print-config` and the GPU planner on 8 faked H100s, the models file
through `clarify compare --plan-only`. Their model paths are placeholders (/models/...): the test points
them at fake model folders of the real shapes (config.json as Llama 3.x states it, a sparse safetensors
file of the real size), so nothing is downloaded and no GPU is needed."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from clarify.batch import config
from clarify.batch.cli import build_parser
from clarify.batch.compare.gpu_plan import Model, plan
from clarify.local_llm.preflight import Gpu, ModelShape
from clarify.local_llm.settings import Ask
from tests.fixtures_llm import write_fake_model

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "data" / "examples"
H100 = Gpu("NVIDIA H100 80GB HBM3", (9, 0), free_bytes=81559 << 20, total_bytes=81559 << 20)
# name: (layers, KV heads, hidden size, attention heads, safetensors bytes) as Llama 3.x's config.json and files
SHAPES = {"Llama-3.2-1B-Instruct": (16, 8, 2048, 32, 2_471_645_608),
          "Llama-3.1-8B-Instruct": (32, 8, 4096, 32, 16_060_522_496),
          "Llama-3.1-70B-Instruct": (80, 8, 8192, 64, 141_107_412_992)}
ASQA_DEV = 948  # the official dev split; the shipped file's pool is dev 500-947 (data/asqa/SOURCE.md)


def _models(tmp_path: Path) -> Path:
    for name, (layers, kv, hidden, heads, size) in SHAPES.items():
        folder = write_fake_model(tmp_path / "models" / name, config={
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
            "num_hidden_layers": layers, "num_key_value_heads": kv, "hidden_size": hidden,
            "num_attention_heads": heads, "max_position_embeddings": 131072})
        os.truncate(folder / "model.safetensors", size)  # sparse: the size without the bytes
    return tmp_path / "models"


def _local(example: Path, tmp_path: Path) -> Path:
    """The example with its /models/ placeholders pointed at the fake folders."""
    copy = tmp_path / example.name
    copy.write_text(example.read_text(encoding="utf-8").replace('"/models/', f'"{_models(tmp_path)}/'),
                    encoding="utf-8")
    return copy


@pytest.mark.parametrize(("name", "tp", "workers"), [("asqa-8b-8gpu.toml", 1, 3), ("asqa-70b-8gpu.toml", 4, 2)])
def test_a_shipped_run_config_prints_and_plans_on_eight_h100s(tmp_path, capsys, name, tp, workers):
    path = _local(EXAMPLES / name, tmp_path)
    args = build_parser().parse_args(["run", "--config", str(path), "--print-config", "--out", str(tmp_path / "r")])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert 'index = "/data/wiki/lucene"' in printed and "limit = 0" in printed  # the full index, every question
    assert 'questions = "/data/ASQA.json"' in printed  # all 948 dev questions, not the shipped 448
    cfg = config.load(path)
    assert (cfg.model.tensor_parallel_size, cfg.cluster.workers) == (tp, workers)
    assert cfg.cluster.workers * tp <= 8
    # docs/scale.md's rule: ~Q x 0.4 / B engines busy at full batch B = 128, chunks of B / 0.8 questions
    assert cfg.cluster.workers <= math.ceil(ASQA_DEV * 0.4 / 128) and cfg.cluster.chunk_questions == 128 / 0.8
    m = cfg.model
    shape = ModelShape.of(Path(m.model))
    got = plan([Model(name, shape, Ask(model=m.model, model_dtype="bfloat16", max_model_len=m.max_model_len,
                                       gpu_memory_utilization=m.gpu_memory_utilization,
                                       tensor_parallel_size=m.tensor_parallel_size))], [H100] * 8)
    assert got.placements[0].tp == tp and got.placements[0].dtype == "bfloat16"
    if tp > 1:  # the tensor_parallel_size the config sets is the fewest GPUs that hold the model
        fewer = plan([Model(name, shape, Ask(model=m.model, model_dtype="bfloat16", tensor_parallel_size=0))],
                     [H100] * 8)
        assert fewer.placements[0].tp == tp


def test_the_shipped_models_file_plans_on_eight_h100s(tmp_path, capsys, monkeypatch):
    from clarify.batch.compare import compare

    monkeypatch.setattr(compare, "gpu_facts", lambda: [(str(i), H100) for i in range(8)])
    models = _local(EXAMPLES / "models-8gpu.toml", tmp_path)
    run_cfg = _local(EXAMPLES / "asqa-8b-8gpu.toml", tmp_path)
    args = build_parser().parse_args(["compare", "--models", str(models), "--config", str(run_cfg),
                                      "--out", str(tmp_path / "cmp"), "--plan-only"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "llama-3.1-70b  GPUs 0,1,2,3" in text and "llama-3.1-8b   GPU 4" in text
    assert "llama-3.2-1b   GPU 5" in text and "idle at the start: GPUs 6,7" in text
    assert not (tmp_path / "cmp").exists()  # --plan-only writes nothing


def test_the_cpu_example_prints_the_embedded_models_recommended_settings(capsys):
    """data/examples/asqa-cpu.toml (the air-gap walk's config, bench/check_airgap.py): the embedded model with
    both constraints, the bundle's index given on the command line as the walk gives it."""
    import tomllib

    from clarify.batch.cli import main

    assert main(["run", "--config", str(EXAMPLES / "asqa-cpu.toml"), "--index", "bundle/indexes/wiki-default",
                 "--limit", "3", "--out", "runs/x", "--print-config"]) == 0
    got = tomllib.loads(capsys.readouterr().out)
    assert (got["model"]["model"], got["limit"], got["index"]) == ("smollm2-135m-instruct", 3, "bundle/indexes/wiki-default")
    assert got["toc"]["constrain_format"] is True and got["answer"]["constrain_quotes"] is True
    assert got["answer_style"] == "quoted"
