"""clarify's own work in a ToC run, with no engine at all: a finished run replayed from its completion cache.

    .venv/bin/python bench/bench_host.py --run RUN [--run RUN2 ...] [--profile] [--write host]

Each run directory is copied, its cache left out, and run again (`--restart`) with its own frozen config
through `clarify.batch.run.pipeline.run`, the real scheduler and tree program, with the engine replaced by
local_llm/replay.py ReplayEngine: every request is answered at once with the completion the run stored
for it, and a request the run never made fails the replay (so nothing is computed, and nothing is
guessed). What is left is clarify's own work, split by component with exclusive timers (a component's
time excludes the components it calls): query encoding, BM25 (Lucene, in the JVM), FAISS, fusion,
rerank, demo kNN, prompt building, parsing, grammars, the completion cache (look-ups and writes, the
replay engine's own time excluded), part and table writes, quote check, scoring, the rest of finalize,
and the scheduler and tree program (the ToC loop's remainder). Start-up (imports, index, encoder, demo
pools) is reported apart: it is paid once per run. The replayed tables must equal the original's
(nodes, hits, llm_calls, answers, spans, scores; llm_calls' `cached` column aside): checked, and a
difference fails the bench.

`--profile`: a second replay under cProfile; its top entries by own time go into the results.
Writes bench/results/NAME.json with `--write NAME` (docs/results.md renders `host` and `host_avx2`).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

T_IMPORT = time.perf_counter()
import polars as pl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from provenance import provenance  # noqa: E402

TABLES = ("nodes", "hits", "llm_calls", "answers", "spans", "scores")


class Timers:
    """Exclusive wall time per component: a call's own time, less the wrapped calls it makes."""

    def __init__(self):
        self.own: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list[float]] = []  # per open call: [children's seconds]

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            self._stack.append([0.0])
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                children = self._stack.pop()[0]
                self.own[name] = self.own.get(name, 0.0) + spent - children
                self.calls[name] = self.calls.get(name, 0) + 1
                if self._stack:
                    self._stack[-1][0] += spent

        timed.__wrapped__ = fn
        return timed


@contextlib.contextmanager
def before_host_cuts():
    """The host's work as it was before: every query encoded by each caller, every demo DA scored."""
    from clarify.batch.toc import program
    from clarify.index import dense

    def old_removed_by(pairs, shown, pool, removal, m):
        if removal == program.Removal.OFFICIAL:
            found = [p.da for p in pairs]
            return [d.demo_id for d in pool if any(m.f1(program.shown_da(dp), b) > 0.8 for dp in d.pairs
                                                   for b in found)]
        return saved_removed(pairs, shown, pool, removal, m)

    saved_memo, saved_removed = dense.QueryMemo.encode_queries, program.removed_by
    dense.QueryMemo.encode_queries = lambda self, texts: self.encode(list(texts))
    program.removed_by = old_removed_by
    try:
        yield
    finally:
        dense.QueryMemo.encode_queries, program.removed_by = saved_memo, saved_removed


def _replace_everywhere(original, replacement) -> int:
    """Point every reference to `original` in clarify's loaded modules (module globals, class attributes)
    at `replacement`: functions imported by name (`from x import f`) are rebound where they were imported."""
    n = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("clarify") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)
                n += 1
            elif isinstance(value, type) and value.__module__ == name:
                for cattr, cvalue in list(vars(value).items()):
                    if cvalue is original:
                        setattr(value, cattr, replacement)
                        n += 1
    return n


def components() -> dict[str, list]:
    """Component name -> the functions and methods whose own time it is."""
    from clarify.batch.run import pipeline, rundir
    from clarify.batch.toc import constraints, demos, format, prompts, quotes
    from clarify.eval import asqa, quotesum
    from clarify.index import bm25, dense, rerank, search
    from clarify.local_llm import cache

    return {
        "query encoding": [dense.Encoder.encode, dense.DprQueryEncoder.encode],
        "BM25 (Lucene, JVM)": [bm25.BM25Searcher.search, bm25.LuceneStore.passages],
        "FAISS search": [dense.DenseSearcher.search],
        "fusion": [search.HybridSearcher.search, search.HybridSearcher.fused, search.rrf_fuse],
        "rerank": [rerank.DenseCosineScorer.score, rerank.CrossEncoderScorer.score, search.RerankSearcher.search],
        "demo kNN": [demos.KnnPool.select],
        "prompt building": [prompts.clarify_prompt, prompts.answer_prompt, prompts.quoted_answer_prompt,
                            prompts.verify_prompt],
        "parsing": [format.parse_disambiguations, format.parse_verdict, format.clean_long_answer],
        "grammars": [constraints.clarify_grammar, constraints.answer_grammar],
        "completion cache": [cache.CachedEngine.submit, cache.CachedEngine.step, cache.CachedEngine.generate,
                             cache.CachedEngine.flush],
        "part and table writes": [rundir.RunDir.write_part, rundir.RunDir.write_table],
        "quote check": [quotes.check_answers],
        "scoring": [asqa.score_asqa, quotesum.score_quotesum],
        "finalize (rest)": [pipeline.finalize],
        "start-up: index, encoder, demo pools, engine": [pipeline.open_resources],
    }


def install(timers: Timers, replay) -> None:
    for name, fns in components().items():
        for fn in fns:
            if _replace_everywhere(fn, timers.wrap(name, fn)) == 0:
                raise SystemExit(f"bench_host: {name}: {fn.__qualname__} is not referenced anywhere (renamed?)")
    # the replay engine's own work is neither host nor engine work: its own bucket, left out of the host sum
    for meth in ("submit", "step", "generate"):
        setattr(replay, meth, timers.wrap("replay engine (not counted)", getattr(replay, meth)))


def replay_engine(run_dir: Path, cfg, **simulate):
    """The ReplayEngine of a finished run: its caches, its engine model id, its context check (`simulate`:
    ReplayEngine's gpu, overlap and prefix_cached_share, for bench/bench_simulate.py)."""
    from clarify.batch.run.records import RunSummary
    from clarify.local_llm.models import resolve_model
    from clarify.local_llm.replay import ReplayEngine, read_caches, run_caches

    summary = RunSummary.read(run_dir / "summary.json", "give a finished run")
    model_id = summary.engine and summary.engine.model_id
    if not model_id:
        raise SystemExit(f"{run_dir}: summary.json records no engine model id (engine.model_id)")
    count = None
    if cfg.model.backend == "vllm":
        from transformers import AutoTokenizer

        from clarify.local_llm.vllm_engine import prompt_token_ids

        tok = AutoTokenizer.from_pretrained(resolve_model(cfg.model.model))
        chat = ":chat:" in model_id
        count = lambda prompt: len(prompt_token_ids(tok, chat, prompt))  # noqa: E731
    return ReplayEngine(read_caches(run_caches(run_dir)), model_id, max_model_len=cfg.model.max_model_len,
                        count_tokens=count, **simulate)


def same_tables(a: Path, b: Path) -> list[str]:
    """Tables that differ between two run directories (llm_calls' `cached` aside)."""
    differ = []
    for t in TABLES:
        fa, fb = a / f"{t}.parquet", b / f"{t}.parquet"
        if not fa.exists() and not fb.exists():
            continue
        x, y = pl.read_parquet(fa), pl.read_parquet(fb)
        if t == "llm_calls":
            x, y = x.drop("cached"), y.drop("cached")
        if not x.equals(y):
            differ.append(t)
    return differ


def replay(run_dir: Path, work: Path, *, profile: bool) -> dict:
    from clarify.batch import config
    from clarify.batch.run import pipeline

    copy = work / run_dir.name
    work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("cache", "report.html"))
    cfg = config.load(run_dir / "config.json")
    timers = Timers()
    t0 = time.perf_counter()
    engine = replay_engine(run_dir, cfg)
    t_engine = time.perf_counter() - t0
    install(timers, engine)
    t0 = time.perf_counter()
    summary = pipeline.run(cfg, copy, engine_factory=lambda c: engine, restart=True, progress=False)
    total = time.perf_counter() - t0
    differ = same_tables(run_dir, copy)
    if differ:
        raise SystemExit(f"bench_host: the replay of {run_dir} differs from the run in {', '.join(differ)}")
    n_q = summary.n_questions
    calls = summary.llm_calls
    toc_s = summary.toc_s_last_session or 0.0
    own = dict(timers.own)
    startup = own.pop("start-up: index, encoder, demo pools, engine", 0.0)
    replay_s = own.pop("replay engine (not counted)", 0.0)
    finalize_parts = ("quote check", "scoring", "finalize (rest)")
    in_loop = {k: v for k, v in own.items() if k not in finalize_parts}
    # the ToC loop's time not in any component: the scheduler and the tree program themselves
    in_loop["scheduler and tree program"] = max(0.0, toc_s - replay_s - sum(in_loop.values()))
    host_loop = sum(in_loop.values())
    finalize = sum(own.get(k, 0.0) for k in finalize_parts)
    out = {
        "run": str(run_dir), "questions": n_q, "llm_calls": calls,
        "answer_style": cfg.answer_style, "constrained": bool(cfg.toc.constrain_format or cfg.answer.constrain_quotes),
        "tables_identical": True,
        "host_ms_per_call": round(1000 * host_loop / calls, 2),
        "host_s_per_question": round(host_loop / n_q, 4),
        "finalize_s_per_question": round(finalize / n_q, 4),
        "toc_loop_s": round(host_loop, 3), "finalize_s": round(finalize, 3),
        "replay_engine_s (excluded)": round(replay_s, 3),
        "startup_s": {"imports": round(T_READY - T_IMPORT, 2), "replay engine (tokenizer, caches)": round(t_engine, 2),
                      "index, encoder, demo pools": round(startup, 2)},
        "run_total_s": round(total, 2),
        "components_ms_per_call": {k: round(1000 * v / calls, 3) for k, v in
                                   sorted({**in_loop, **{k: own[k] for k in finalize_parts if k in own}}.items(),
                                          key=lambda kv: -kv[1])},
        "calls_per_component": dict(timers.calls),
    }
    if profile:
        copy2 = work / (run_dir.name + "-profiled")
        shutil.copytree(run_dir, copy2, ignore=shutil.ignore_patterns("cache", "report.html"))
        engine2 = replay_engine(run_dir, cfg)
        prof = cProfile.Profile()
        prof.enable()
        pipeline.run(cfg, copy2, engine_factory=lambda c: engine2, restart=True, progress=False)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        out["profile_top_tottime"] = [line.strip() for line in buf.getvalue().splitlines()
                                      if line.strip() and line.strip()[0].isdigit()][:15]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", required=True, type=Path, help="a finished run directory")
    ap.add_argument("--profile", action="store_true", help="also replay under cProfile (top entries by own time)")
    ap.add_argument("--label", action="append", default=[], help="a name per --run for the results (default: folder)")
    ap.add_argument("--arms", default="after,before",
                    help="after: the host's work as it is; before: without the query memo and the indexed demo removal")
    ap.add_argument("--write", default=None, metavar="NAME", help="write bench/results/NAME.json (host: docs/results.md)")
    args = ap.parse_args(argv)
    results = {"provenance": provenance(argv),
               "note": "host work only: each run replayed with no engine (local_llm/replay.py ReplayEngine); "
                       "per call = ToC loop seconds / LLM calls",
               "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bench-host-") as tmp:
        for i, run_dir in enumerate(args.run):
            for arm in args.arms.split(","):
                label = f"{args.label[i] if i < len(args.label) else run_dir.name} {arm}"
                with before_host_cuts() if arm == "before" else contextlib.nullcontext():
                    got = replay(run_dir.resolve(), Path(tmp) / arm, profile=args.profile and arm == "after")
                results["runs"][label] = got
                print(f"{label}: {got['questions']} questions, {got['llm_calls']} calls: host {got['host_ms_per_call']} "
                      f"ms per call in the ToC loop, finalize {got['finalize_s_per_question']} s per question", flush=True)
    print(json.dumps(results, indent=1))
    if args.write:
        (REPO / "bench" / "results" / f"{args.write}.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


import clarify.batch.run.pipeline  # noqa: E402,F401  (the import cost, reported apart)

T_READY = time.perf_counter()

if __name__ == "__main__":
    sys.exit(main())
