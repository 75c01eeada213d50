"""`clarify demo` sizes itself to the machine: a newcomer on the slowest CPU waits minutes, not hours."""

from __future__ import annotations

from clarify.batch.commands import (
    DEMO_BUDGET_S,
    DEMO_CONSTRAINTS,
    DEMO_MAX_QUESTIONS,
    DEMO_MIN_QUESTIONS,
    DEMO_TOKENS_PER_QUESTION,
    PROBE_BATCH,
    PROBE_OUTPUT_TOKENS,
    PROBE_PROMPT_TOKENS,
    PROBE_TO_TOC,
    PROBE_WARMUP,
    demo_size,
    demo_tokens_per_question,
    estimate_words,
    probe_prompts,
    probe_speed,
    toc_estimate_s,
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
    prompt_tokens = llm_engine.stats.prompt_tokens
    tps = probe_speed(llm_engine, batch=2, warmup=1)  # the demo's shape, fewer prompts (the suite's budget)
    assert tps > 10  # tokens per second, prompt + output
    assert llm_engine.stats.calls == calls + 2  # a warm-up call, then the measured batch
    # Nothing measured came from vLLM's prefix cache (it once inflated the probe ~5x on an AVX2 CPU).
    assert llm_engine.stats.cached_prompt_tokens - cached < 16 * 3  # at most a stray block per prompt
    # ToC's prompt length with the real tokenizer (PROBE_TOKENS_PER_LINE holds)
    per_prompt = (llm_engine.stats.prompt_tokens - prompt_tokens) / 3
    assert 0.8 * PROBE_PROMPT_TOKENS <= per_prompt <= 1.25 * PROBE_PROMPT_TOKENS


class _Timed:
    """An engine whose batches take scripted seconds on a fake clock: the first (a new shape) 10 s of
    set-up, the next 2 s."""

    def __init__(self, clock):
        self.clock, self.batches = clock, []

    def generate(self, prompts, params):
        from clarify.local_llm.engine import Completion

        self.batches.append((len(prompts), [len(p.split()) for p in prompts], [p.max_tokens for p in params]))
        self.clock[0] += 10.0 if len(self.batches) == 1 else 2.0
        return [Completion(texts=("x",), finish_reason="length", prompt_tokens=PROBE_PROMPT_TOKENS,
                           output_tokens=p.max_tokens) for p in params]


def test_probe_times_toc_shaped_work_after_a_warm_up_of_its_shape(monkeypatch):
    import types

    from clarify.batch import commands

    clock = [0.0]
    monkeypatch.setattr(commands, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    engine = _Timed(clock)
    tps = probe_speed(engine)
    (n_w, words_w, out_w), (n_p, words_p, out_p) = engine.batches
    assert (n_w, n_p) == (PROBE_WARMUP, PROBE_BATCH) and PROBE_BATCH >= 4  # a running batch like ToC's
    assert set(out_w) == set(out_p) == {PROBE_OUTPUT_TOKENS}
    assert min(words_w + words_p) > PROBE_PROMPT_TOKENS / 2  # long prompts: ToC is prompt-heavy
    assert tps == PROBE_BATCH * (PROBE_PROMPT_TOKENS + PROBE_OUTPUT_TOKENS) / 2.0  # the set-up is not measured


def test_estimate_and_its_words():
    # 3 questions of 15,000 tokens at a probed 500 tok/s (ToC: PROBE_TO_TOC of it)
    assert toc_estimate_s(3, 15_000, 500.0) == 3 * 15_000 / (PROBE_TO_TOC * 500.0)
    assert toc_estimate_s(6, 15_000, 500.0) == 2 * toc_estimate_s(3, 15_000, 500.0)
    assert estimate_words(240.0, 300.0) == " (ToC took 5.0 min, expected ~4.0 min: -20%)"
    assert estimate_words(None, 300.0) == "" and estimate_words(240.0, None) == ""
