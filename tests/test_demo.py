"""`clarify demo` sizes itself to the machine: a newcomer on the slowest CPU waits minutes, not hours."""

from __future__ import annotations

from clarify.batch.commands import (
    DEMO_BUDGET_S,
    DEMO_CONSTRAINTS,
    DEMO_MAX_QUESTIONS,
    DEMO_MIN_QUESTIONS,
    DEMO_TOKENS_PER_QUESTION,
    demo_size,
    demo_tokens_per_question,
    probe_prompts,
    probe_speed,
)


def test_demo_size_follows_engine_speed():
    assert demo_size(0) == DEMO_MIN_QUESTIONS
    assert demo_size(2400) == DEMO_MAX_QUESTIONS  # native bf16: the full 20 questions
    sizes = [demo_size(tps) for tps in (100, 250, 400, 800)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]  # a faster engine gets more questions
    for tps in (250, 400):  # AVX2-only CPU in float32, and a little faster: what it chose fits
        assert DEMO_MIN_QUESTIONS < demo_size(tps) < DEMO_MAX_QUESTIONS
        assert demo_size(tps) * DEMO_TOKENS_PER_QUESTION / tps <= DEMO_BUDGET_S
    # the demo decodes constrained (DEMO_CONSTRAINTS): its bigger trees make fewer questions fit
    per_q = demo_tokens_per_question(DEMO_CONSTRAINTS)
    assert per_q > DEMO_TOKENS_PER_QUESTION and demo_tokens_per_question({"toc.constrain_format": False}) == \
        DEMO_TOKENS_PER_QUESTION
    for tps in (400, 800):
        assert demo_size(tps, per_q) < demo_size(tps)
        assert demo_size(tps, per_q) == DEMO_MIN_QUESTIONS or demo_size(tps, per_q) * per_q / tps <= DEMO_BUDGET_S


def test_probe_prompts_share_no_prefix():
    prompts = probe_prompts(4, "p") + probe_prompts(1, "w")
    assert len({p[:4] for p in prompts}) == 5  # they differ in the first vLLM KV block already
    assert all(len(p) > 2000 for p in prompts)  # ToC-sized context


def test_probe_measures_the_real_engine(llm_engine):
    calls, cached = llm_engine.stats.calls, llm_engine.stats.cached_prompt_tokens
    tps = probe_speed(llm_engine)
    assert tps > 10  # tokens per second, prompt + output
    assert llm_engine.stats.calls == calls + 2  # a warm-up call, then the measured batch
    # Nothing measured came from vLLM's prefix cache (it once inflated the probe ~5x on an AVX2 CPU).
    assert llm_engine.stats.cached_prompt_tokens - cached < 16 * 4  # at most a stray block per prompt
