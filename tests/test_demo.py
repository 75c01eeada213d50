"""`clarify demo` sizes itself to the machine: a newcomer on the slowest CPU waits minutes, not hours."""

from __future__ import annotations

from clarify.batch.commands import (
    DEMO_BUDGET_S,
    DEMO_MAX_QUESTIONS,
    DEMO_MIN_QUESTIONS,
    DEMO_TOKENS_PER_QUESTION,
    demo_size,
    probe_speed,
)


def test_demo_size_follows_engine_speed():
    assert demo_size(250) == DEMO_MIN_QUESTIONS  # AVX2-only CPU, float32: the smallest demo
    assert demo_size(2400) == DEMO_MAX_QUESTIONS  # native bf16: the full 20 questions
    mid = demo_size(800)
    assert DEMO_MIN_QUESTIONS < mid < DEMO_MAX_QUESTIONS
    assert mid * DEMO_TOKENS_PER_QUESTION / 800 <= DEMO_BUDGET_S  # what it chose fits the budget
    assert demo_size(0) == DEMO_MIN_QUESTIONS


def test_probe_measures_the_real_engine(llm_engine):
    calls = llm_engine.stats.calls
    tps = probe_speed(llm_engine)
    assert tps > 10  # tokens per second, prompt + output
    assert llm_engine.stats.calls == calls + 2  # a warm-up call, then the measured batch
