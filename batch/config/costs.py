"""What a question costs the engine, in tokens and LLM calls, under a config's decoding: a run's ETA and the
demo's size and time estimate are computed from these measured constants."""

from __future__ import annotations

from clarify.batch.config.schema import RunConfig

# What a ToC question costs the engine (prompt + output tokens actually computed: identical re-expansion
# prompts are answered once under the official default) on the embedded model and defaults: ~4,400
# (the first 50 ASQA dev questions: 4,275; the demo's 11: 4,382; an AVX2 CPU). The previous behaviour
# (batch/config/previous.toml, re-sampling) costs ~17,000. The demo's size and a run's ETA are estimated from it.
TOKENS_PER_QUESTION = 4_400
# Constrained trees exist (11 valid nodes per question instead of ~0.1), so a question costs more: on ASQA dev
# 0-49 with SmolLM2 (bench/results/constrained.json) 18.6 LLM calls per question vs 8.4 free, 1,010 s at 680
# engine tok/s: ~13,700 tokens of engine time per question (AMD EPYC, bfloat16); a fresh-clone `make demo` of
# 20 constrained questions took 400 s of ToC at 715 tok/s: ~14,300 per question.
CONSTRAINED_TOKENS_PER_QUESTION = 15_000
# LLM calls the engine computes per question (cache hits aside), free and constrained: ASQA dev 0-49 with
# SmolLM2 made 8.4 and 18.6 calls per question (bench/results/constrained.json), of which the engine computed
# ~86 % in the demo's runs (16.0 and 16.1 of 18.6 for 3 and 20 questions: bench/results/estimate.json).
CALLS_PER_QUESTION, CONSTRAINED_CALLS_PER_QUESTION = 7, 16


def tokens_per_question(cfg: RunConfig) -> int:
    """The engine tokens one question is expected to cost under this config's decoding (a run's ETA, the
    demo's size and time estimate)."""
    constrained = cfg.toc.constrain_format or cfg.answer.constrain_quotes
    return CONSTRAINED_TOKENS_PER_QUESTION if constrained else TOKENS_PER_QUESTION


def calls_per_question(cfg: RunConfig) -> int:
    """The LLM calls one question is expected to have computed under this config's decoding (a run's ETA,
    the demo's time estimate)."""
    constrained = cfg.toc.constrain_format or cfg.answer.constrain_quotes
    return CONSTRAINED_CALLS_PER_QUESTION if constrained else CALLS_PER_QUESTION
