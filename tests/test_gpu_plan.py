"""`clarify compare` on GPUs: models packed by memory need (batch/compare/gpu_plan.py), with faked devices and
model shapes as their config.json files state them (Llama 3.x: layers, KV heads, head size; weights as
the safetensors files weigh)."""

from __future__ import annotations

import pytest

from clarify.batch.compare.gpu_plan import Model, group_sizes, plan, run_queue
from clarify.errors import InputError
from clarify.local_llm.preflight import Gpu, ModelShape
from clarify.local_llm.settings import Ask

H100 = Gpu("NVIDIA H100 80GB HBM3", (9, 0), free_bytes=81559 << 20, total_bytes=81559 << 20)
RTX4090 = Gpu("NVIDIA GeForce RTX 4090", (8, 9), free_bytes=24564 << 20, total_bytes=24564 << 20)
# Llama-3.2-1B, Llama-3.1-8B, Llama-3.1-70B (bf16) and hugging-quants' 70B AWQ-INT4 folder (float16 config)
L1B = ModelShape(weight_bytes=2_471_645_608, stored_dtype="bfloat16", layers=16, kv_heads=8, head_dim=64)
L8B = ModelShape(weight_bytes=16_060_522_496, stored_dtype="bfloat16", layers=32, kv_heads=8, head_dim=128)
L70B = ModelShape(weight_bytes=141_107_412_992, stored_dtype="bfloat16", layers=80, kv_heads=8, head_dim=128)
L70B_AWQ = ModelShape(weight_bytes=39_772_315_648, stored_dtype="float16", layers=80, kv_heads=8, head_dim=128)


def model(name: str, shape: ModelShape, **ask) -> Model:
    return Model(name, shape, Ask(model=name, model_dtype=shape.stored_dtype, max_model_len=6144,
                                  **{"tensor_parallel_size": 0, **ask}))


def test_eight_h100s_hold_1b_8b_70b_at_once_each_on_the_fewest_gpus():
    got = plan([model("llama-1b", L1B), model("llama-8b", L8B), model("llama-70b", L70B)], [H100] * 8)
    by = {p.name: p for p in got.placements}
    assert [p.name for p in got.placements] == ["llama-70b", "llama-8b", "llama-1b"]  # largest first
    assert (by["llama-70b"].tp, by["llama-70b"].gpus) == (4, [0, 1, 2, 3])  # 2 GPUs would need 68.6 GiB each
    assert (by["llama-8b"].gpus, by["llama-1b"].gpus) == ([4], [5])
    assert not got.queued() and all(p.dtype == "bfloat16" for p in got.placements)
    text = got.text()
    print(text)  # the plan `clarify compare --plan-only` prints
    assert "llama-70b  GPUs 0,1,2,3" in text and "on 2 GPUs 68.6 GiB > 67.7 GiB" in text
    assert "idle at the start: GPUs 6,7" in text


def test_two_24gb_gpus_run_the_70b_awq_on_both_and_queue_the_8b():
    """The AWQ folder's packed weights (37 GiB) need both GPUs, at its own gpu_memory_utilization 0.95
    (at 0.85 it would not fit); the 8B fits one GPU but waits until the 70B's GPUs free up."""
    awq = model("llama-70b-awq", L70B_AWQ, gpu_memory_utilization=0.95)
    got = plan([model("llama-8b", L8B), awq], [RTX4090] * 2)
    assert [(p.name, p.tp, p.gpus) for p in got.placements] == [("llama-70b-awq", 2, [0, 1]), ("llama-8b", 1, [])]
    assert "queued: the first 1 GPU that free up" in got.text()
    with pytest.raises(InputError, match="'llama-70b-awq' fits on no GPU group here: on 2 GPUs it needs 21.5 GiB"):
        plan([model("llama-70b-awq", L70B_AWQ)], [RTX4090] * 2)


def test_a_model_that_fits_nowhere_is_refused_in_one_line_before_anything_starts():
    with pytest.raises(InputError) as got:
        plan([model("llama-8b", L8B), model("llama-70b", L70B)], [RTX4090] * 2)
    line = str(got.value)
    assert "\n" not in line and "'llama-70b' fits on no GPU group" in line and "on 2 GPUs it needs" in line
    # a tensor_parallel_size the entry sets is kept, and checked
    fixed = plan([model("llama-8b", L8B, tensor_parallel_size=2)], [H100] * 8)
    assert fixed.placements[0].gpus == [0, 1]
    with pytest.raises(InputError, match="tensor_parallel_size 16 needs 16 GPUs"):
        plan([model("llama-8b", L8B, tensor_parallel_size=16)], [H100] * 8)
    assert group_sizes(8) == [1, 2, 4, 8] and group_sizes(6) == [1, 2] and group_sizes(1) == [1]


class FakeRun:
    """A run that ends after `polls` polls (subprocess.Popen's poll: None while running)."""

    def __init__(self, log: list, name: str, polls: int):
        self.log, self.name, self.left = log, name, polls

    def poll(self):
        if self.left == 0:
            return 0
        self.left -= 1
        if self.left == 0:
            self.log.append(("finished", self.name))
            return 0
        return None


def test_a_freed_gpu_starts_the_next_queued_model():
    """Two GPUs, three one-GPU models and a two-GPU one: the first two start, the others wait; when the
    short run on GPU 1 ends, the next queued one-GPU model starts on GPU 1 while the first still runs;
    the two-GPU model starts only once both are free."""
    models = [model("a", L8B), model("b", L8B), model("c", L8B), model("big", L70B_AWQ, gpu_memory_utilization=0.95)]
    the_plan = plan(models, [RTX4090] * 2)
    assert [(p.name, p.gpus) for p in the_plan.placements] == [("big", [0, 1]), ("a", []), ("b", []), ("c", [])]
    the_plan = plan(models[:3] + [model("d", L8B)], [RTX4090] * 2)
    log: list = []
    lengths = {"a": 5, "b": 2, "c": 3, "d": 1}

    def start(p, ids):
        log.append(("started", p.name, ids))
        return FakeRun(log, p.name, lengths[p.name])

    starts = run_queue(the_plan, start, sleep=lambda s: None)
    assert starts == [("a", [0]), ("b", [1]), ("c", [1]), ("d", [0])]
    assert log.index(("finished", "b")) < log.index(("started", "c", [1])) < log.index(("finished", "a"))
    # mixed sizes: the two-GPU model waits for both; a one-GPU model queued behind it does not
    mixed = plan([model("big", L70B_AWQ, gpu_memory_utilization=0.95), model("a", L8B), model("b", L8B)],
                 [RTX4090] * 2)
    log.clear()
    lengths.update(big=2, a=1, b=1)
    assert run_queue(mixed, start, sleep=lambda s: None) == [("big", [0, 1]), ("a", [0]), ("b", [1])]


def test_a_gpu_another_process_fills_is_left_out():
    """Free memory differs by GPU: a model goes to the GPUs with room for its share, not the lowest ids."""
    busy = Gpu("NVIDIA H100 80GB HBM3", (9, 0), free_bytes=10 << 30, total_bytes=81559 << 20)
    got = plan([model("llama-8b", L8B), model("llama-1b", L1B)], [busy, H100, H100])
    assert [(p.name, p.gpus) for p in got.placements] == [("llama-8b", [1]), ("llama-1b", [0])]
