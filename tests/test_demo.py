"""`clarify demo` sizes itself to the machine: a newcomer on the slowest CPU waits minutes, not hours."""

from __future__ import annotations

from clarify.batch.cli.demo_sizing import (
    DEMO_BUDGET_S,
    DEMO_CONSTRAINTS,
    DEMO_MAX_QUESTIONS,
    DEMO_MIN_QUESTIONS,
    DEMO_TOKENS_PER_QUESTION,
    PROBE_BATCH,
    PROBE_WARMUP,
    TOC_CALLS_PER_QUESTION,
    TOC_OUTPUT_TOKENS,
    TOC_PROMPT_TOKENS,
    Probe,
    demo_size,
    demo_tokens_per_question,
    estimate_words,
    probe_prompts,
    probe_speed,
    toc_concurrency,
)


def test_demo_size_follows_engine_speed():
    def probe(single_s: float) -> Probe:  # a batch of PROBE_BATCH calls takes twice one call
        return Probe(single_s=single_s, batch_s=2 * single_s, batch=PROBE_BATCH, tokens_per_s=0.0)

    assert demo_size(probe(60.0)) == DEMO_MIN_QUESTIONS  # too slow for more than the minimum
    assert demo_size(probe(0.1)) == DEMO_MAX_QUESTIONS
    sizes = [demo_size(probe(s)) for s in (12.0, 8.0, 4.0, 2.0, 0.25)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]  # a faster engine gets more questions
    for s in (6.0, 4.0):  # what it chose fits the budget, one more would not
        n = demo_size(probe(s))
        assert DEMO_MIN_QUESTIONS < n < DEMO_MAX_QUESTIONS
        assert probe(s).toc_s(n) <= DEMO_BUDGET_S < probe(s).toc_s(n + 1)
    # free decoding (a demo resumed from before the constraints) makes fewer calls: more questions fit
    assert demo_size(probe(6.0), constrained=False) > demo_size(probe(6.0))
    per_q = demo_tokens_per_question(DEMO_CONSTRAINTS)
    assert per_q > DEMO_TOKENS_PER_QUESTION and demo_tokens_per_question({"toc.constrain_format": False}) == \
        DEMO_TOKENS_PER_QUESTION


def test_toc_time_is_its_calls_in_waves_of_its_concurrency():
    """ToC's time: a question's calls, run toc_concurrency(n) at a time, each wave as long as that many
    calls at once take (between the probe's one call and its batch)."""
    probe = Probe(single_s=1.0, batch_s=3.5, batch=6, tokens_per_s=0.0)
    assert probe.wave_s(1) == 1.0 and probe.wave_s(6) == 3.5 and probe.wave_s(3.5) == 2.25
    c = toc_concurrency(3)
    assert 1.5 < c < 3  # 3 trees: ~2 requests in flight on average
    assert probe.toc_s(3) == 3 * TOC_CALLS_PER_QUESTION[True] / c * probe.wave_s(c)
    assert toc_concurrency(20) > toc_concurrency(3) and toc_concurrency(1) >= 1
    assert probe.toc_s(20) / probe.toc_s(3) < 20 / 3  # more trees share the engine's steps


def test_probe_prompts_share_no_prefix():
    prompts = probe_prompts(4, "p") + probe_prompts(1, "w")
    assert len({p[:4] for p in prompts}) == 5  # they differ in the first vLLM KV block already
    assert all(len(p) > 2000 for p in prompts)  # ToC-sized context


def test_probe_measures_the_real_engine(llm_engine):
    calls, cached = llm_engine.stats.calls, llm_engine.stats.cached_prompt_tokens
    prompt_tokens = llm_engine.stats.prompt_tokens
    probe = probe_speed(llm_engine, batch=2, warmup=1, rounds=1)  # the demo's shape, fewer calls (the budget)
    assert 0 < probe.single_s and 0 < probe.batch_s and probe.tokens_per_s > 10
    assert llm_engine.stats.calls == calls + 3  # a warm-up call, one call alone, then the batch
    # Nothing measured came from vLLM's prefix cache (it once inflated the probe ~5x on an AVX2 CPU).
    assert llm_engine.stats.cached_prompt_tokens - cached < 16 * 4  # at most a stray block per prompt
    # ToC's prompt length with the real tokenizer (PROBE_TOKENS_PER_LINE holds)
    per_prompt = (llm_engine.stats.prompt_tokens - prompt_tokens) / 4
    assert 0.8 * TOC_PROMPT_TOKENS <= per_prompt <= 1.25 * TOC_PROMPT_TOKENS


class _Timed:
    """An engine whose batches take scripted seconds on a fake clock: the first (a new shape) 10 s of
    set-up, one call 1 s, a batch 2.5 s; in the first round another process slows both down."""

    def __init__(self, clock):
        self.clock, self.batches = clock, []

    def generate(self, prompts, params):
        from clarify.local_llm.engine import Completion

        self.batches.append((len(prompts), [len(p.split()) for p in prompts], params))
        slowed = 3.0 if len(self.batches) in (2, 3) else 1.0
        self.clock[0] += 10.0 if len(self.batches) == 1 else slowed * (1.0 if len(prompts) == 1 else 2.5)
        return [Completion(texts=("x",), finish_reason="length", prompt_tokens=TOC_PROMPT_TOKENS,
                           output_tokens=p.max_tokens) for p in params]


def test_probe_times_toc_shaped_calls_after_a_warm_up_of_their_shape(monkeypatch):
    import types

    from clarify.batch.cli import demo_sizing

    clock = [0.0]
    monkeypatch.setattr(demo_sizing, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    engine = _Timed(clock)
    probe = probe_speed(engine, grammar="root ::= \"x\"")
    assert [n for n, _, _ in engine.batches] == [PROBE_WARMUP, 1, PROBE_BATCH, 1, PROBE_BATCH]
    assert PROBE_BATCH >= 4
    params = [p for _, _, ps in engine.batches for p in ps]
    assert {p.max_tokens for p in params} == {TOC_OUTPUT_TOKENS} and {p.grammar for p in params} == {"root ::= \"x\""}
    # prompt-heavy: ~TOC_PROMPT_TOKENS tokens, a line of 14 words being ~28 tokens (the real-engine test counts them)
    assert min(w for _, words, _ in engine.batches for w in words) > TOC_PROMPT_TOKENS / 2.2
    # the set-up is not timed, and a round slowed by another process does not count
    assert (probe.single_s, probe.batch_s, probe.batch) == (1.0, 2.5, PROBE_BATCH)
    assert probe.tokens_per_s == PROBE_BATCH * (TOC_PROMPT_TOKENS + TOC_OUTPUT_TOKENS) / 2.5


def test_estimate_words():
    assert estimate_words(240.0, 300.0) == " (ToC took 5.0 min, expected ~4.0 min: -20%)"
    assert estimate_words(None, 300.0) == "" and estimate_words(240.0, None) == ""
