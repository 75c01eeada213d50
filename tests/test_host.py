"""clarify's own work off the engine's path: the replay engine and the GPU-speed simulator
(local_llm/replay.py), the query-vector memo (index/dense.py QueryMemo) and the indexed demo removal
(batch/toc/match.py AnswerIndex). The host cuts must not change a tree: a run made without them (the
loop as it was) is replayed with them, from its own completions, into identical tables."""

from __future__ import annotations

import json
import math
import random
import shutil

import numpy as np
import polars as pl
import pytest

from clarify.batch.toc import program
from clarify.batch.toc.match import MATCHING, AnswerIndex, MatchRule
from clarify.index import dense
from clarify.local_llm.cache import CachedEngine
from clarify.local_llm.engine import Completion, GenParams, Request, request_key
from clarify.local_llm.replay import GpuModel, ReplayEngine, ReplayMiss, read_caches, run_caches
from clarify.local_llm.scripted import ScriptedEngine
from tests.fixtures_report import DATA, scripted_model
from tests.toc_fakes import HashEncoder

TABLES = ("nodes", "hits", "llm_calls", "answers", "spans", "scores")


def _gpu(**kw) -> GpuModel:
    base = dict(name="test", params=1e9, bytes_per_param=2, kv_bytes_per_token=1e5, peak_flops=1e15, mfu=0.5,
                hbm_bytes_per_s=2e12, bandwidth_efficiency=0.5, step_overhead_s=0.001, gpu_bytes=80e9,
                memory_utilization=0.9, max_num_seqs=64, max_num_batched_tokens=1024, sources=("test",))
    return GpuModel(**{**base, **kw})


def _completions(n: int, prompt_tokens: int, output_tokens: int, model_id: str = "m") -> tuple[dict, list[Request]]:
    reqs = [Request(str(i), f"prompt {i}", GenParams(max_tokens=output_tokens)) for i in range(n)]
    comps = {request_key(model_id, r.prompt, r.params): Completion((f"out {r.rid}",), "stop", prompt_tokens,
                                                                   output_tokens) for r in reqs}
    return comps, reqs


def test_replay_answers_what_the_run_stored_and_refuses_a_request_it_never_made(tmp_path):
    engine = ScriptedEngine("scripted", lambda prompt, params: prompt.upper())
    prompts = ["one", "two", "three"]
    with CachedEngine(engine, tmp_path / "cache") as cached:
        made = cached.generate(prompts, [GenParams()] * 3)
    stored = read_caches(run_caches(tmp_path))
    replay = ReplayEngine(stored, "scripted")
    again = replay.generate(prompts, [GenParams()] * 3)
    assert [c.text for c in again] == [c.text for c in made] == ["ONE", "TWO", "THREE"]
    assert not any(c.cached for c in again)  # the run's completions, as if computed
    replay.submit([Request("a", "two", GenParams()), Request("b", "one", GenParams())])
    assert replay.pending() == 2 and [(rid, c.text) for rid, c in replay.step()] == [("a", "TWO"), ("b", "ONE")]
    with pytest.raises(ReplayMiss, match="not in the replayed caches"):
        replay.generate(["four"], [GenParams()])
    with pytest.raises(ReplayMiss):  # other params: another request
        replay.generate(["one"], [GenParams(max_tokens=7)])


def test_one_request_takes_the_steps_and_seconds_of_the_roofline():
    """3,000 prompt tokens in steps of 1,024: three prefill steps (the last samples the first token), then four
    decode steps for the other four output tokens; each step timed by GpuModel.step_s."""
    gpu = _gpu()
    comps, reqs = _completions(1, 3000, 5)
    sim = ReplayEngine(comps, "m", gpu=gpu)
    sim.start_clock()
    sim.submit(reqs)
    got = []
    while sim.pending():
        got += sim.step()
    assert [rid for rid, _ in got] == ["0"] and sim.sim.steps == 7
    want = (gpu.step_s(1024, 0, 0) + gpu.step_s(1024, 0, 0) + gpu.step_s(952, 0, 0)
            + sum(gpu.step_s(0, 1, 3001 + i) for i in range(4)))
    assert sim.sim.busy_s == pytest.approx(want)
    assert sim.sim.prefill_tokens == 3000 and sim.sim.output_tokens == 5
    # in-process: the clock is the engine's steps plus the (tiny, measured) host time between them
    assert sim.sim.busy_s <= sim.sim.wall_s < sim.sim.busy_s + 0.05


def test_batching_and_the_kv_cache_bound_what_runs_at_once():
    gpu = _gpu(max_num_seqs=8, max_num_batched_tokens=100_000)
    comps, reqs = _completions(20, 100, 10)
    sim = ReplayEngine(comps, "m", gpu=gpu)
    sim.submit(reqs)
    while sim.pending():
        sim.step()
    assert max(sim.sim.running) == 8 and sim.sim.output_tokens == 200
    # a KV cache of 330 tokens holds three sequences of 110
    small = _gpu(gpu_bytes=(2e9 + 330 * 1e5) / 0.9, max_num_batched_tokens=100_000)
    assert small.kv_tokens() == 330
    sim = ReplayEngine(comps, "m", gpu=small)
    sim.submit(reqs)
    while sim.pending():
        sim.step()
    assert max(sim.sim.running) == 3


@pytest.mark.parametrize("host_s", [0.0, 0.004])
def test_in_process_waits_for_the_host_and_overlap_does_not(host_s):
    """The same requests and the same host work between engine calls: in-process the clock is the engine's
    steps plus the host's time; overlapped the engine steps on while the host works: no slower (up to a step
    or two, where the host's submissions land in another step) and, when the host works, faster."""
    import time

    gpu = _gpu()
    walls = {}
    for overlap in (False, True):
        comps, reqs = _completions(16, 400, 30)
        sim = ReplayEngine(comps, "m", gpu=gpu, overlap=overlap)
        sim.start_clock()
        sim.submit(reqs[:8])
        late = reqs[8:]
        while sim.pending() or late:
            if host_s:
                time.sleep(host_s)  # the host's work between engine calls
            if late and sim.sim.steps >= 5:
                sim.submit(late)
                late = []
            sim.step()
        assert sim.sim.output_tokens == 16 * 30
        walls[overlap] = (sim.sim.wall_s, sim.sim.busy_s, sim.sim.host_s)
    wall, busy, host = walls[False]
    assert wall == pytest.approx(busy + host, abs=1e-6) and host >= (host_s * 30 if host_s else 0)
    assert walls[True][0] <= wall * 1.05
    if host_s:  # the host's sleeps hide behind the engine's steps
        assert walls[True][0] < wall - 0.5 * host


def _asqa_answers() -> list[str]:
    items = json.loads((DATA / "asqa" / "dev.json").read_text(encoding="utf-8"))["dev"].values()
    return ["; ".join(p["short_answers"]) for i in items for p in i["qa_pairs"]]


@pytest.mark.parametrize("rule", list(MatchRule))
def test_answer_index_finds_exactly_the_pairs_scoring_every_pair_finds(rule):
    match = MATCHING[rule]
    pool = _asqa_answers()[:1500] + ["", "The", "a", "—", "1"]
    rnd = random.Random(3)
    found_sets = [rnd.sample(pool, 4) for _ in range(25)] + [["", "the"], ["1", "—"], ["Alan Turing"]]
    index = AnswerIndex(pool, match)
    for threshold in (0.0, 0.5, 0.8):
        for found in found_sets:
            want = {i for i, a in enumerate(pool) if any(match.f1(a, b) > threshold for b in found)}
            assert index.above(found, threshold) == want, (rule, threshold, found)
    with pytest.raises(ValueError):
        index.above(["x"], -0.1)


def test_query_memo_encodes_each_text_once_and_gives_the_vectors_encode_gives(monkeypatch):
    enc = HashEncoder()
    seen: list[str] = []
    plain = enc.encode

    def counting(texts):
        seen.extend(texts)
        return plain(texts)

    monkeypatch.setattr(enc, "encode", counting)
    texts = ["who wrote it", "when was it", "who wrote it", "where"]
    got = enc.encode_queries(texts)
    assert np.array_equal(got, plain(texts)) and seen == ["who wrote it", "when was it", "where"]
    again = enc.encode_queries(["where", "who wrote it"])
    assert np.array_equal(again, plain(["where", "who wrote it"])) and len(seen) == 3  # nothing re-encoded
    assert enc.encode_queries([]).shape == (0, 256)
    monkeypatch.setattr(dense, "MEMO_QUERIES", 2)
    enc.encode_queries(["a", "b", "c"])  # the least recently used go first
    assert list(enc.__dict__["_query_memo"]) == ["b", "c"]


def _old_removed_by(pairs, shown, pool, removal, match):
    """program.removed_by before AnswerIndex: every demo DA of the pool scored against every DA found."""
    if removal == program.Removal.OFFICIAL:
        found = [p.da for p in pairs]
        return [d.demo_id for d in pool if any(match.f1(program.shown_da(dp), b) > 0.8 for dp in d.pairs for b in found)]
    return _NEW_REMOVED_BY(pairs, shown, pool, removal, match)


_NEW_REMOVED_BY = program.removed_by


@pytest.mark.integration
def test_a_run_made_before_the_host_cuts_replays_into_identical_tables(tmp_path, default_local_index, monkeypatch):
    """The differential of the host cuts: a run made with the loop as it was (each caller encodes its own
    queries, every demo DA scored), on the real index and encoder with a scripted model; then the same run
    with the memo and the indexed removal, every request answered by a ReplayEngine from the first run's
    cache (a request it never made fails): the same tables, and every call answered by the replay."""
    from clarify.batch import config
    from clarify.batch.run.pipeline import run

    cfg = config.load(None, {"dataset": "asqa", "limit": 3, "answer_style": "quoted", "toc.max_expansions": 4})
    engine = ScriptedEngine("scripted-before", scripted_model(prunes=True))
    with monkeypatch.context() as before:
        before.setattr(dense.QueryMemo, "encode_queries", lambda self, texts: self.encode(list(texts)))
        before.setattr(program, "removed_by", _old_removed_by)
        run(cfg, tmp_path / "before", engine_factory=lambda c: engine, index=default_local_index, progress=False)
    shutil.copytree(tmp_path / "before", tmp_path / "after", ignore=shutil.ignore_patterns("cache"))
    replay = ReplayEngine(read_caches(run_caches(tmp_path / "before")), "scripted-before")
    answered = []
    plain_submit = replay.submit
    replay.submit = lambda reqs: (answered.extend(reqs), plain_submit(reqs))[-1]
    run(cfg, tmp_path / "after", engine_factory=lambda c: replay, index=default_local_index, progress=False,
        restart=True)
    calls = pl.read_parquet(tmp_path / "after" / "llm_calls.parquet")
    # every call the cache could not answer reached the replay (identical ones in flight together share one)
    assert calls.height > 20 and 0 < len(answered) <= calls.filter(~pl.col("cached")).height
    assert len({(r.prompt, r.params) for r in answered}) == len(answered)
    for t in TABLES:
        a, b = (pl.read_parquet(tmp_path / d / f"{t}.parquet") for d in ("before", "after"))
        if t == "llm_calls":
            a, b = a.drop("cached"), b.drop("cached")
        assert a.equals(b), t
    assert math.isfinite(json.loads((tmp_path / "after" / "summary.json").read_text())["wall_s_total"])
