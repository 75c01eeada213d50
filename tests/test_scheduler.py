"""The continuous driver (batch/run/scheduler.py) on a step engine whose requests finish out of order, as
vLLM's do: no barrier between trees, admission bounded by the engine's capacity, identical tables to the
per-question loop, nothing left in the engine when a run stops (docs/engines.md#schedulers-how-requests-reach-the-engine). Scripted engine, stand-in
index (fast); the real step loop: tests/test_toc_real.py."""

from __future__ import annotations

import polars as pl

from clarify.batch.run.pipeline import nodes_table, run
from clarify.batch.run.scheduler import drive
from clarify.local_llm.cache import CachedEngine
from clarify.local_llm.engine import GenParams, Request
from clarify.local_llm.scripted import ScriptedStepEngine
from tests.test_toc import _calls, _cfg, _resources, _run_cfg, _trees, make_responder
from tests.toc_fakes import FakeIndex


def _step(which: str, prompt: str) -> bool:
    return {"verify": "Proposed Answer:" in prompt, "clarify": prompt.rstrip().endswith("Disambiguations:")}[which]


def test_continuous_has_no_barrier_and_equals_the_loop():
    cfg = _cfg()
    engine = ScriptedStepEngine("scripted", make_responder())
    trees = _trees()
    cont = drive("continuous", trees, _resources(engine), cfg)
    seq_trees = _trees()
    seq = drive("sequential", seq_trees, _resources(ScriptedStepEngine("scripted", make_responder())), cfg)
    # out-of-order completions, identical tables
    assert nodes_table(trees).equals(nodes_table(seq_trees))
    assert pl.DataFrame(cont.answers).equals(pl.DataFrame(seq.answers))
    assert _calls(cont.llm_calls).equals(_calls(seq.llm_calls))
    # no barrier: at some step one tree's verification ran while another tree's clarification was running
    mixed = [step for step in engine.in_flight
             if any(_step("verify", p) for _, p in step) and any(_step("clarify", p) for _, p in step)]
    assert mixed
    # and one tree's final answer went in while other trees were still being expanded
    assert any(any("Answer:" in p and not _step("clarify", p) and not _step("verify", p) for _, p in step)
               and any(_step("clarify", p) for _, p in step) for step in engine.in_flight)
    assert cont.stats.step_calls == engine.steps and cont.stats.generate_calls == 0


def test_admission_is_bounded_by_the_engine_capacity():
    from clarify.batch.run.scheduler import ADMIT_FACTOR
    from tests.test_toc import QUESTIONS

    engine = ScriptedStepEngine("scripted", make_responder(), capacity=1)
    trees = _trees()
    drive("continuous", trees, _resources(engine), _cfg(max_expansions=3))

    def tree_of(prompt: str) -> int:  # every prompt's last "Question:" line starts with its tree's question
        last = prompt.split("Question: ")[-1]
        (i,) = [i for i, q in enumerate(QUESTIONS) if last.startswith(q.rstrip("?"))]
        return i

    trees_per_step = [len({tree_of(p) for _, p in step}) for step in engine.in_flight]
    assert max(trees_per_step) == ADMIT_FACTOR * 1  # capacity 1: never more than 2 trees in the engine
    all_at_once = ScriptedStepEngine("scripted", make_responder())  # default capacity: all 4 trees at once
    drive("continuous", _trees(), _resources(all_at_once), _cfg(max_expansions=3))
    assert len({tree_of(p) for _, p in all_at_once.in_flight[0]}) == len(QUESTIONS)


def test_cache_answers_a_request_returned_but_not_yet_committed(tmp_path):
    inner = ScriptedStepEngine("scripted", lambda p, gp: "hello world")
    cache = CachedEngine(inner, tmp_path / "c", group_rows=10_000, group_s=3600)
    req = Request("a", "Say hello.", GenParams(max_tokens=4))
    cache.submit([req])
    while cache.pending():
        cache.step()
    assert cache.stats.commits == 0 and len(cache) == 0  # not committed yet
    cache.submit([Request("b", "Say hello.", GenParams(max_tokens=4))])
    (rid, comp), = cache.step()
    assert rid == "b" and comp.cached and comp.text == "hello world" and inner.calls == 1
    cache.close()
    assert len(CachedEngine(inner, tmp_path / "c")) == 1


def test_step_calls_answered_by_the_cache_are_not_model_steps(tmp_path):
    """In-run repeats of a byte-identical request (every child pruned, so the root is re-expanded with
    the same prompt and seed: run_toc.py's restart, toc.restart_resample off) come back from the
    completion cache. When nothing else is in flight, such a `step()` call steps no model: the driver's
    step calls may exceed the model's steps, by at most the cache hits. The real-engine run on Intel
    AMX-BF16 hit exactly this (tests/test_toc_real.py); here the repeats are certain on every CPU."""
    inner = ScriptedStepEngine("scripted", make_responder(verdict="False"))
    cache = CachedEngine(inner, tmp_path / "c")
    trees = _trees()[:1]
    cont = drive("continuous", trees, _resources(cache), _cfg(max_expansions=3))
    calls = pl.DataFrame(cont.llm_calls)
    repeats = calls.filter(pl.col("cached"))
    assert repeats.height > 0 and (repeats["step"] == "clarify").any()
    assert cache.stats.hits == repeats.height
    # every model step was driven by one step call; the extra calls each returned at least one repeat
    assert 0 < inner.steps < cont.stats.step_calls <= inner.steps + cache.stats.hits
    assert cont.stats.generate_calls == 0
    cache.close()


def test_a_stopped_run_leaves_nothing_in_the_engine(tmp_path):
    engine = ScriptedStepEngine("scripted", make_responder())
    got = run(_run_cfg(tmp_path), tmp_path / "r", engine_factory=lambda c: engine, index=FakeIndex(),
              progress=False, stop_after_parts=1, part_trees=1)
    assert got is None and engine.pending() == 0
    done = run(_run_cfg(tmp_path), tmp_path / "r", engine_factory=lambda c: ScriptedStepEngine("s2", make_responder()),
               index=FakeIndex(), progress=False)
    assert done.n_questions == 3 and done.parts >= 2


def test_scheduler_is_recorded_but_a_run_resumes_under_another(tmp_path):
    import json

    engine = ScriptedStepEngine("scripted", make_responder())
    out = tmp_path / "r"
    run(_run_cfg(tmp_path), out, engine_factory=lambda c: engine, index=FakeIndex(), progress=False,
        stop_after_parts=1, part_trees=1)
    assert json.loads((out / "config.json").read_text())["scheduler"] == "continuous"
    summary = run(_run_cfg(tmp_path, scheduler="sequential"), out, engine_factory=lambda c: engine,
                  index=FakeIndex(), progress=False)
    assert summary.scheduler == "sequential"
    assert json.loads((out / "config.json").read_text())["scheduler"] == "sequential"
    full = run(_run_cfg(tmp_path, scheduler="waves"), tmp_path / "full",
               engine_factory=lambda c: ScriptedStepEngine("scripted", make_responder()), index=FakeIndex(),
               progress=False)
    for name in ("nodes", "hits", "answers", "scores"):
        assert pl.read_parquet(out / f"{name}.parquet").equals(pl.read_parquet(tmp_path / "full" / f"{name}.parquet"))
    assert summary.metrics == full.metrics


def test_rerank_order_ignores_float_noise_from_the_batch():
    """index/search.py: scores are rounded before sorting, ties keep the fused order, so a cross-encoder's
    last-bit noise (it depends on the batch a query is scored in) never reorders passages."""
    import numpy as np

    from clarify.index.search import RerankSearcher

    class Fused:
        candidates = 3

        def fused(self, queries, depth):
            return pl.DataFrame({"qid": [q for q in queries["qid"] for _ in range(3)],
                                 "passage_id": ["a", "b", "c"] * queries.height})

    class Noisy:
        name = "noisy"

        def __init__(self, noise):
            self.noise = noise

        def score(self, queries, ids):
            return [np.array([0.5, 0.5 + self.noise, 0.25]) for _ in queries]

    q = pl.DataFrame({"qid": ["q"], "query": ["who?"]})
    orders = [RerankSearcher(Fused(), Noisy(n)).search(q, k=3)["passage_id"].to_list() for n in (0.0, 1e-9, -1e-9)]
    assert orders == [["a", "b", "c"]] * 3
    # a real difference still counts
    assert RerankSearcher(Fused(), Noisy(1e-3)).search(q, k=3)["passage_id"].to_list() == ["b", "a", "c"]


def test_trees_fed_while_the_loop_runs_join_the_running_batch():
    """`run_continuous(more=...)` (a Ray worker's chunks, batch/run/cluster.py): trees handed over later are
    admitted while the first ones are still in the engine — no drain between batches — and every tree's
    rows equal those of one run over all trees at once."""
    from clarify.batch.run.scheduler import run_continuous

    cfg = _cfg()
    engine = ScriptedStepEngine("scripted", make_responder())
    first, *later = _trees()
    feeds = [[t] for t in later]
    asked: list[tuple[bool, int]] = []  # (block, engine requests in flight) at each call

    def more(block: bool):
        asked.append((block, engine.pending()))
        return feeds.pop(0) if feeds else None

    rows = {}
    run_continuous([first], _resources(engine), cfg, lambda t, r: rows.__setitem__(t.qid, r), more=more)
    assert not feeds and len(rows) == 1 + len(later)
    # the later trees came in while earlier requests were in the engine (not after it drained)
    assert sum(1 for block, pending in asked[:len(later)] if not block and pending > 0) == len(later)
    all_at_once = drive("continuous", _trees(), _resources(ScriptedStepEngine("scripted", make_responder())), cfg)
    fed = [c for t in _trees() for c in rows[t.qid].llm_calls]
    assert _calls(fed).equals(_calls(all_at_once.llm_calls))
