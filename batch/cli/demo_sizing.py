"""`clarify demo` sized to the machine: a probe times ToC-shaped calls on the engine, and the demo answers as
many questions as fit its time budget (docs/getting-started.md#what-make-demo-does); `estimate_words` puts
the estimate beside the time ToC then took."""

from __future__ import annotations

import time
from dataclasses import dataclass

from clarify.batch import config
from clarify.batch.config.costs import (
    CALLS_PER_QUESTION,
    CONSTRAINED_CALLS_PER_QUESTION,
    CONSTRAINED_TOKENS_PER_QUESTION,
    TOKENS_PER_QUESTION,
)

# The demo is sized to the machine (docs/getting-started.md#what-make-demo-does): a newcomer on an AVX2-only CPU
# (~250 tok/s) waits minutes, not hours, at TOKENS_PER_QUESTION (batch/config/costs.py).
DEMO_TOKENS_PER_QUESTION = TOKENS_PER_QUESTION
DEMO_BUDGET_S = 210
DEMO_MIN_QUESTIONS, DEMO_MAX_QUESTIONS = 3, 20
# The demo decodes under both decoding constraints (the DQ/DA format, quotes copied verbatim), which the
# embedded model needs for ToC to have a tree and checkable quotes at all: on ASQA dev 0-49 (bench/
# bench_constrained.py, docs/running-toc.md#constrained-decoding) they took SmolLM2's parse errors from 100 % to 1.5 %,
# valid nodes from 0.1 to 11.3 per question, answers quoting from 28 % to 100 % and verbatim spans from 0 of
# 204 to all, Answer-F1 from 0 to 1.1, while ROUGE-L (21.9 -> 19.6) and STR-EM (16.7 -> 12.7) moved by less
# than the 50 questions can show (paired 95 % bootstrap intervals hold 0). `clarify run` keeps the official
# free decoding. A resumed demo keeps the settings it was started with. Every declared decoding constraint
# (batch/config/schema.py CONSTRAINTS) is on.
DEMO_CONSTRAINTS = dict.fromkeys(config.CONSTRAINTS, True)
DEMO_CONSTRAINED_TOKENS_PER_QUESTION = CONSTRAINED_TOKENS_PER_QUESTION

# The demo's estimate times ToC's own calls on this engine. ToC is prompt-heavy and, with the demo's few
# questions, latency-bound: on the demo's settings a computed LLM call holds ~TOC_PROMPT_TOKENS of prompt and
# ~TOC_OUTPUT_TOKENS of output, a question ~TOC_CALLS_PER_QUESTION of them, and the continuous scheduler has
# only `toc_concurrency(n)` requests in the engine on average (bench/bench_estimate.py; bench/results/
# estimate.json "mix"). A throughput probe (a batch of prompts, tokens/s) cannot see that: on an AMX Xeon it
# measured 2,185 tok/s where 3 questions of ToC then ran at 683 (estimate 0.38 of the ToC time), and the
# one-batch probe before it 5,463 (0.15). So the probe times one ToC-shaped call alone and PROBE_BATCH of them
# at once (decoded under the run's own clarification grammar, after a warm-up of that shape: the first batch
# of a new shape pays one-off set-up), and ToC's time is its calls in waves of its concurrency.
TOC_PROMPT_TOKENS, TOC_OUTPUT_TOKENS = 830, 31
TOC_CALLS_PER_QUESTION = {True: CONSTRAINED_CALLS_PER_QUESTION, False: CALLS_PER_QUESTION}  # by `constrained`
PROBE_BATCH, PROBE_WARMUP = 6, 2
# Each timing is the fastest of PROBE_ROUNDS: on shared cores another process can slow one round down, never
# speed one up (a `make demo` once probed 6 calls at once in 5.7 s where the two benches just before it took
# 2.95 and 3.62 s, bench/results/estimate.json, and estimated 1.7x the ToC time it then took).
PROBE_ROUNDS = 2


def toc_concurrency(questions: int) -> float:
    """Requests the continuous scheduler keeps in the engine on average for `questions` trees (the running
    batch's mean, engine_usage_last_session.running_mean): the trees start together, then finish one by one,
    so a run's tail holds few. Fitted to the demo's runs (bench/results/estimate.json): 2.05 for 3 questions,
    11.25 for 20."""
    return max(1.0, 0.77 * questions ** 0.9)


@dataclass(frozen=True)
class Probe:
    """What the demo's probe measured: seconds for one ToC-shaped call alone and for `batch` at once, and
    the engine's tokens/s on the batch (prompt + output)."""

    single_s: float
    batch_s: float
    batch: int
    tokens_per_s: float

    def wave_s(self, concurrency: float) -> float:
        """Seconds `concurrency` ToC-shaped calls take at once: linear between one call and the batch."""
        slope = (self.batch_s - self.single_s) / (self.batch - 1) if self.batch > 1 else 0.0
        return self.single_s + max(0.0, slope) * (concurrency - 1)

    def toc_s(self, questions: int, constrained: bool = True) -> float:
        """Seconds of ToC for `questions`: their computed calls in waves of `toc_concurrency`."""
        c = toc_concurrency(questions)
        return questions * TOC_CALLS_PER_QUESTION[constrained] / c * self.wave_s(c)


def demo_tokens_per_question(constraints: dict) -> int:
    """The tokens one demo question costs under these decoding settings (a run's ETA: config.tokens_per_question)."""
    return DEMO_CONSTRAINED_TOKENS_PER_QUESTION if any(constraints.values()) else DEMO_TOKENS_PER_QUESTION


def demo_size(probe: Probe, constrained: bool = True) -> int:
    """The most questions whose ToC fits the demo's time budget on the probed engine (at least the minimum)."""
    fit = [n for n in range(DEMO_MIN_QUESTIONS, DEMO_MAX_QUESTIONS + 1) if probe.toc_s(n, constrained) <= DEMO_BUDGET_S]
    return max(fit, default=DEMO_MIN_QUESTIONS)


# ~28 tokens per line of probe_prompts with the embedded model's chat template (SmolLM2's tokenizer splits
# numbers into digits; test_demo's real-engine test checks the prompts' length)
PROBE_TOKENS_PER_LINE = 28


def probe_prompts(n: int, tag: str, prompt_tokens: int = TOC_PROMPT_TOKENS) -> list[str]:
    """`n` prompts of ~`prompt_tokens` tokens shaped like ToC's work (numbered passages, a question) that
    share no prefix with each other or with another tag's: vLLM's prefix cache would otherwise serve the
    shared context from memory and the probe would report a speed ToC never sees (seen: 1,202 tok/s probed
    vs ~250 tok/s in the run, AVX2 CPU)."""
    lines = max(1, prompt_tokens // PROBE_TOKENS_PER_LINE)
    return [" ".join(f"[{tag}{i}] Passage {k}: the {k}th edition of festival {tag}{i} moved to a new city."
                     for k in range(lines)) + f"\nQuestion: where was festival {tag}{i} held?" for i in range(n)]


def probe_speed(engine, *, grammar: str | None = None, prompt_tokens: int = TOC_PROMPT_TOKENS,
                output_tokens: int = TOC_OUTPUT_TOKENS, batch: int = PROBE_BATCH, warmup: int = PROBE_WARMUP,
                rounds: int = PROBE_ROUNDS) -> Probe:
    """Time ToC-shaped calls on the engine (`prompt_tokens` of prompt, up to `output_tokens` decoded under
    `grammar`, the run's clarification grammar): after a warm-up of the shape, `rounds` times one call alone
    and `batch` at once, each timed by its fastest round; nothing served from the prefix cache. Not cached,
    ~10-60 s on a CPU."""
    from clarify.local_llm.engine import GenParams

    params = [GenParams(temperature=0.7, seed=i, max_tokens=output_tokens, grammar=grammar) for i in range(batch)]
    engine.generate(probe_prompts(warmup, "w", prompt_tokens), params[:warmup])  # one-off set-up of the shape
    single, many, tokens = [], [], 0
    for r in range(rounds):
        t0 = time.perf_counter()
        engine.generate(probe_prompts(1, f"s{r}-", prompt_tokens), params[:1])
        t1 = time.perf_counter()
        out = engine.generate(probe_prompts(batch, f"p{r}-", prompt_tokens), params)
        t2 = time.perf_counter()
        single.append(t1 - t0)
        many.append(t2 - t1)
        tokens = sum(c.prompt_tokens + c.output_tokens for c in out)
    return Probe(single_s=min(single), batch_s=min(many), batch=batch, tokens_per_s=tokens / min(many))


def estimate_words(expected_s: float | None, toc_s: float | None) -> str:
    """' (ToC took 4.5 min, expected ~4.1 min: -9 %)': the demo's estimate against what ToC took."""
    if not expected_s or not toc_s:
        return ""
    return f" (ToC took {toc_s / 60:.1f} min, expected ~{expected_s / 60:.1f} min: {expected_s / toc_s - 1:+.0%})"
