"""`clarify run`: questions → trees (a scheduler: batch/run/scheduler.py) → answers → quote check → scores,
in a run directory.

Heavy resources (index, encoder, vLLM) are opened only when there is work left, so a finished run
re-run makes zero model calls, opens no model and rewrites nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import polars as pl

from clarify import console, faults, schemas, stops
from clarify.batch.config import (
    CONSTRAINTS,
    PART_TREES,
    RESULT_FREE,
    AnswerStyle,
    ModelConfig,
    RunConfig,
    calls_per_question,
    tokens_per_question,
    value_of,
)
from clarify.batch.run import cluster
from clarify.batch.run.records import (
    CacheRecomputed,
    ClusterWork,
    Constraints,
    EngineFacts,
    EngineUsage,
    PeakMemory,
    QuoteFidelity,
    RunInputs,
    RunSummary,
    Tokens,
)
from clarify.batch.run.resources import PreparedRun, open_resources, passages_only, prepare, tables
from clarify.batch.run.rundir import FINAL_TABLES, PART_TABLES, Run, RunDir
from clarify.batch.run.scheduler import DRIVERS, SchedStats
from clarify.batch.toc.fingerprint import prompts_fingerprint
from clarify.batch.toc.program import Resources, Step, TreeRows
from clarify.batch.toc.tree import Tree
from clarify.errors import InputError
from clarify.eval.datasets import Dataset
from clarify.local_llm.hardware import peak_memory
from clarify.local_llm.models import parameter_count


def nodes_table(trees: list[Tree]) -> pl.DataFrame:
    return schemas.frame((row for t in trees for row in t.node_rows()), schemas.NodeRow)


PART_S = 60.0  # seconds between parts while trees finish


def run(cfg: RunConfig, out: str | Path, *, engine_factory=None, index=None, progress: bool = True,
        stop_after_parts: int | None = None, part_trees: int = PART_TREES, search_cache: Path | None = None,
        restart: bool = False, on_part=None, estimate_s: float | None = None) -> RunSummary | None:
    """Run (or resume, or just report) the configured job in run directory `out`; returns its summary.json as
    its record (None when `stop_after_parts` stopped it).

    Every input is checked before the run directory is touched, the directory is locked for this
    process, and checkpoints are verified before the model loads. restart: start over (the completion
    cache is kept). part_trees: finished trees per part; stop_after_parts: stop once that many parts
    exist (tests of resume). With `[cluster]` workers the trees run on Ray (batch/run/cluster.py; `on_part`:
    called with its worker pool after each part, for tests of faults). estimate_s: the ToC time the caller
    expected (the demo's probe), re-estimated on the progress display once the first tree finishes."""
    from clarify.local_llm.cache import check_caches

    rd = RunDir(out)
    prep = prepare(cfg, index=index, engine_factory=engine_factory)  # every input resolved once (resources.py)
    # the pool used, not `auto`, is what config.json records and a resumed run compares
    cfg, inputs = dataclasses.replace(cfg, demo_pool=prep.pool.spec), prep.inputs
    check_caches(rd.cache_dir)
    if progress:  # with the stage lines; --no-progress keeps the terminal to errors (inputs.json has it)
        console.say(prep.pool.line(inputs["demo_pool"].demos)
                    + _limit_words(cfg.limit, prep.pool, prep.questions.height))
    # what pins the run: its inputs, and the code that makes its requests and reads its completions
    pinned = RunInputs(inputs, prompts=prompts_fingerprint())
    if rd.finished and not restart and not os.access(rd.path, os.W_OK):
        # a finished run on a read-only file system (an archive): nothing to write, nothing to lock
        rd.freeze(json.loads(cfg.to_json()), pinned, ignore=RESULT_FREE)  # compares only: it is finished
        return Run.open(rd.path).summary
    with rd.lock():
        if restart:
            rd.clear()
        # the scheduler is recorded but never changes results: a run may resume under another one
        rd.freeze(json.loads(cfg.to_json()), pinned, ignore=RESULT_FREE)
        if rd.finished:
            return Run.open(rd.path).summary
        return _run_locked(rd, prep, cfg, progress, stop_after_parts, part_trees, search_cache, on_part, estimate_s)


def _limit_words(limit: int, pool, n: int) -> str:
    """`--limit 0` said with its count (ASQA with a dev pool: the questions outside it)."""
    if limit:
        return ""
    outside = " outside the pool" if pool.from_questions else ""
    return f"; limit 0: {n:,} question{'' if n == 1 else 's'}{outside}"


class _Parts:
    """Finished trees waiting to be written, flushed as a part every `every` trees or PART_S seconds."""

    def __init__(self, rd: RunDir, every: int, run_s, engine, commit):
        self.rd, self.every, self.run_s, self.engine, self.commit = rd, every, run_s, engine, commit
        self.trees: list[Tree] = []
        self.rows: list[TreeRows] = []
        self.last = time.monotonic()
        self.written = len(rd.part_dirs())
        self.trees_written = 0  # this session's

    def salvage(self) -> None:
        """Write the finished trees whatever stopped the run (a signal, an error); a failure to write them is
        logged, never raised over the error that stopped the run."""
        try:
            self.flush()
        except Exception:
            logging.getLogger("clarify").exception("could not write the finished trees as a part")

    def add(self, tree: Tree, rows: TreeRows) -> bool:
        """Keep a finished tree; True when a part was written."""
        self.trees.append(tree)
        self.rows.append(rows)
        if len(self.trees) >= self.every or time.monotonic() - self.last >= PART_S:
            return self.flush()
        return False

    def flush(self) -> bool:
        if not self.trees:
            return False
        # the completion cache first: a part never holds a completion the cache could lose, so a run killed
        # after any part redoes no call made before it
        with stops.deferred():  # a stop signal waits for the part
            self.commit()
            n = self.rd.write_part(tables(self.rows), self.trees, run_s=self.run_s(), engine=self.engine())
        self.trees_written += len(self.trees)
        self.trees, self.rows, self.last, self.written = [], [], time.monotonic(), n
        faults.point(f"part-done:{n}")
        return True


def _run_locked(rd: RunDir, prep: PreparedRun, cfg: RunConfig, progress: bool, stop_after_parts: int | None,
                part_trees: int, search_cache: Path | None, on_part, estimate_s: float | None = None) -> RunSummary | None:
    """The run in its locked directory: `prep`'s parts for the trees, the whole `cfg` (as frozen) for what
    the run as a whole records and decides (scheduler, cluster, summary)."""
    questions = prep.questions
    t_start = time.perf_counter()
    state = rd.load_state()  # verified: a damaged checkpoint is reported before any model loads
    if state is None:
        rd.write_table("questions", questions.select(list(schemas.QUESTIONS)))
    finished = {t.qid: t for t in state.trees} if state else {}
    prior_s = state.run_s if state else 0.0  # earlier sessions' seconds up to their last part

    def run_s() -> float | None:
        return None if prior_s is None else round(prior_s + time.perf_counter() - t_start, 3)

    stats, cluster_done, engine = SchedStats(), None, state.engine if state else None
    if len(finished) < questions.height and cluster.wanted(cfg.cluster):  # the trees on Ray workers, as parts
        display = console.RunProgress(questions.height, finished=len(finished),
                                      expected_tokens=(questions.height - len(finished)) * tokens_per_question(cfg),
                                      expected_calls=(questions.height - len(finished)) * calls_per_question(cfg),
                                      enabled=progress, estimate_s=estimate_s, record=rd.progress_record)
        try:
            outcome = cluster.run_chunks(rd, prep, cfg, set(finished), search_cache=search_cache, display=display,
                                         run_s=run_s, stop_after_parts=stop_after_parts, on_part=on_part)
        except stops.Stopped as exc:
            exc.done = _how_far(rd, questions.height)
            raise
        finally:
            display.close()
        if outcome.stopped:
            return None
        state = rd.load_state()
        finished = {t.qid: t for t in state.trees}
        stats = outcome.stats
        cluster_done = outcome.summary(time.perf_counter() - t_start)
        engine = outcome.engine or state.engine
    if len(finished) == questions.height:  # every tree written (by workers, or before a crash): no model here
        res = passages_only(prep)
        trees = [finished[q] for q in questions["qid"]]
        with console.step("checking quotes and scoring", enabled=progress, timed=False):
            summary = finalize(rd, prep, cfg, trees, res, session_start=t_start, stats=stats,
                               prior_s=prior_s, engine=engine, cluster=cluster_done)
        note_run(summary, cfg.model)
        return summary
    with console.step("opening the index, the encoder and the engine", enabled=progress):
        res = open_resources(prep, rd.cache_dir, search_cache=search_cache)
    try:  # the completion cache is closed (its WAL folded into the file) when the run stops, not at GC
        # unfinished trees start over: replayed against the completion cache, they cost no model call up
        # to where the run stopped (seeds and keys depend only on the tree's own requests)
        trees = [finished.get(q) or Tree.new(q, text, verify=prep.tree.toc.verify)
                 for q, text in zip(questions["qid"], questions["question"])]
        todo = [t for t in trees if t.qid not in finished]
        display = console.RunProgress(len(trees), finished=len(finished),
                                      expected_tokens=len(todo) * tokens_per_question(cfg),
                                      expected_calls=len(todo) * calls_per_question(cfg), enabled=progress,
                                      estimate_s=estimate_s, record=rd.progress_record)
        res.engine.on_progress = lambda requests, tokens: display.engine_update(requests, tokens,
                                                                                res.engine.pending())
        before = engine_usage_start(res.engine)
        parts = _Parts(rd, part_trees, run_s, res.engine.facts, res.engine.flush)

        def on_tree(tree: Tree, rows: TreeRows) -> None:
            display.tree_done(running=res.engine.pending())
            if parts.add(tree, rows) and stop_after_parts is not None and parts.written >= stop_after_parts:
                raise _Stop

        t_toc = time.perf_counter()
        try:
            stats = DRIVERS[cfg.scheduler](todo, res, prep.tree, on_tree)
            parts.flush()
        except _Stop:
            return None
        except BaseException as exc:  # the driver cancelled what was in flight; the finished trees stay
            parts.salvage()
            if isinstance(exc, stops.Stopped):
                exc.done = _written(len(finished) + parts.trees_written, len(trees), parts.written)
            raise
        finally:
            display.close()
            res.engine.on_progress = None
        toc_s = time.perf_counter() - t_toc
        with console.step("checking quotes and scoring", enabled=progress, timed=False):
            summary = finalize(rd, prep, cfg, trees, res, session_start=t_start, stats=stats,
                               prior_s=prior_s, usage=engine_usage(res.engine, before, stats),
                               # the ToC part of the session (what the demo's estimate is of)
                               toc_s=round(toc_s, 2))
        note_run(summary, cfg.model)
        return summary
    finally:
        res.engine.close()


def _how_far(rd: RunDir, total: int) -> str:
    """How many trees a stopped run has written, in words."""
    try:
        state = rd.load_state()
    except (InputError, OSError):
        return "its parts could not be read"
    return _written(len(state.trees) if state else 0, total, len(rd.part_dirs()))


def _written(trees: int, total: int, parts: int) -> str:
    return f"{trees} of {total} trees written ({parts} part{'' if parts == 1 else 's'})"


def engine_usage_start(engine) -> dict:
    """The real engine's counters now (EngineInfo.engine_stats), to take this session's share at the end."""
    st = engine.engine_stats
    if st is None:
        return {}
    return {"steps": st.steps, "running": len(st.running), "prompt_tokens": st.prompt_tokens,
            "cached_prompt_tokens": st.cached_prompt_tokens}


def engine_usage(engine, before: dict, stats: SchedStats) -> dict:
    """This session's engine work: engine steps, the running batch at each step (mean,
    p10/p50/p90), the share of prompt tokens served from vLLM's prefix cache, tokens per second of
    generation, and what the scheduler did."""
    out: dict = {"generate_calls": stats.generate_calls, "scheduler_step_calls": stats.step_calls}
    st = engine.engine_stats
    if before and st is not None:
        running = st.running[before["running"]:]
        prompt = st.prompt_tokens - before["prompt_tokens"]
        out.update({
            "engine_steps": st.steps - before["steps"],
            "running_mean": round(float(sum(running) / len(running)), 2) if running else None,
            **{f"running_p{q}": (float(_percentile(running, q)) if running else None) for q in (10, 50, 90)},
            "prefix_cached_share": round((st.cached_prompt_tokens - before["cached_prompt_tokens"]) / prompt, 4)
            if prompt else None,
        })
    return out


def _percentile(values: list[int], q: int) -> float:
    import numpy as np

    return round(float(np.percentile(np.asarray(values, dtype=np.float64), q)), 1)


PARSE_ERROR_NOTE = 0.2  # share of calls whose completion did not parse cleanly worth telling the user


def note_run(summary: RunSummary, model: ModelConfig) -> None:
    """The run's warnings that matter to the user, in words (printed once at the end by the CLI); `model`: the
    run's `[model]` table."""
    too_long = summary.prompts_too_long or 0
    if too_long:
        console.note("too-long", f"{too_long} prompt(s) were longer than the model's context "
                                 f"(max_model_len {model.max_model_len}) and were not sent; those nodes got no "
                                 f"clarification. Raise [model] max_model_len or lower retrieval.top_k.")
    calls = summary.llm_calls or 0
    bad = (summary.parse_errors or 0) - too_long
    if calls and bad / calls > PARSE_ERROR_NOTE:
        console.note("parse-errors", f"{bad / calls:.0%} of the model's completions ({bad} of {calls}) did not "
                                     f"parse cleanly (llm_calls.parse_error in the run directory); a larger "
                                     f"model follows the format better.")


class _Stop(Exception):
    """Raised by the checkpoint hook to stop after a given part (tests of resume)."""


def finalize(rd: RunDir, prep: PreparedRun, cfg: RunConfig, trees: list[Tree], res: Resources, *, session_start: float, stats: SchedStats, prior_s: float | None, engine: dict | None = None,
             usage: dict | None = None, cluster: dict | None = None, toc_s: float | None = None) -> RunSummary:
    """Final tables, quote check, scores and summary.json (written last); `cfg`: the frozen config, of which
    the summary records the dataset, model, answer style, constraints and scheduler.

    session_start: perf_counter at this session's start. prior_s: the run's seconds before this session
    (the `run_s` of the checkpoint it resumed from; 0 for a fresh run, None when unknown). engine: the
    engine facts of the checkpoint, when this session loaded no engine. usage: this session's engine work
    (`engine_usage`). cluster: what a cluster run's workers did (batch/run/cluster.py Outcome.summary). toc_s:
    this session's seconds of ToC (its trees), when it made trees in this process."""
    from clarify.batch.toc.quotes import check_answers, quote_fidelity

    questions = prep.questions

    # rows in question order, each tree's in the order its program made them: the same tables whichever
    # scheduler ran and however the trees were split into parts
    order = pl.DataFrame({"qid": questions["qid"]}).with_row_index("_q")
    parts = {name: rd.part_table(name).join(order, on="qid", how="left", maintain_order="left")
             .sort("_q", maintain_order=True).drop("_q") for name in PART_TABLES}
    calls, hits, answers = parts["llm_calls"], parts["hits"], parts["answers"]
    nodes = nodes_table(trees)
    passage_ids = list(dict.fromkeys(hits["passage_id"].to_list() if hits.height else [])
                       | dict.fromkeys(p for ps in answers["passage_ids"].to_list() for p in ps))
    store = res.passages(passage_ids)
    passages = pl.DataFrame([{"passage_id": p.passage_id, "title": p.title, "text": p.text} for p in store.values()],
                            schema=schemas.PASSAGES)
    spans = schemas.empty("spans")
    fidelity = None
    answers = answers.with_columns(answer_raw=pl.col("answer"))
    if cfg.answer_style == AnswerStyle.QUOTED:
        answers, spans = check_answers(answers, passages, progress=False)
        calls = _add_quote_notes(calls, answers)
        answers = answers.drop("quote_note")
        fidelity = quote_fidelity(spans, answers)
        answers = answers.with_columns(answer=pl.col("repaired_answer")).drop("repaired_answer")
    else:
        answers = answers.with_columns(answer_plain=pl.col("answer"))
    answers = schemas.conform(answers, "answers")

    scores, metrics, notes = score(prep.dataset, answers, nodes, prep.gold)
    final = {"nodes": nodes, "hits": hits, "llm_calls": calls, "answers": answers, "spans": spans,
             "passages": passages, "scores": scores}
    for name in FINAL_TABLES:
        rd.write_table(name, final[name])
    faults.point("final-tables")

    n_q = questions.height
    session_s = time.perf_counter() - session_start
    per_q = calls.group_by("qid").len()
    valid = nodes.filter(pl.col("status").is_in(schemas.KEPT_STATUSES))
    summary = RunSummary(
        name=rd.path.name, dataset=cfg.dataset, model=cfg.model.model,
        engine_model_id=calls["model"][0] if calls.height else None,
        engine=EngineFacts.of(res.engine.facts() if res.engine is not None else engine),
        answer_style=cfg.answer_style, n_questions=n_q, metrics=metrics, metric_notes=notes,
        # the decoding constraints (batch/toc/constraints.py), by their declared names ("format", "quotes"),
        # shown by the report and `clarify compare`
        constraints=Constraints(**{name: value_of(cfg, key) for key, name in CONSTRAINTS.items()}),
        llm_calls=calls.height, llm_calls_per_question=calls.height / n_q,
        llm_calls_per_question_max=int(per_q["len"].max()) if per_q.height else 0,
        llm_calls_by_step=dict(calls.group_by("step").len().iter_rows()),
        cached_calls=int(calls["cached"].sum()) if calls.height else 0,
        tokens=Tokens(prompt=int(calls["prompt_tokens"].sum()), output=int(calls["output_tokens"].sum())),
        parse_errors=int(calls["parse_error"].is_not_null().sum()),
        prompts_too_long=int((calls["finish_reason"] == "prompt_too_long").sum()) if calls.height else 0,
        scheduler=cfg.scheduler,
        parts=len(rd.part_dirs()),
        engine_usage_last_session=EngineUsage.of(usage),
        valid_nodes_per_question=valid.height / n_q,
        max_depth=int(nodes["depth"].max()) if nodes.height else 0,
        node_status=dict(nodes.group_by("status").len().iter_rows()),
        wall_s_last_session=round(session_s, 2),
        # earlier sessions up to their last checkpoint + this one; work lost to a crash is not counted
        wall_s_total=None if prior_s is None else round(prior_s + session_s, 2),
        seconds_last_session={k: round(v, 2) for k, v in stats.seconds.items()},
        # tokens the engine processed (prompt + output) per second of generate time, this session only
        engine_tokens_per_s=round(stats.tokens / stats.seconds["generate"], 1) if stats.seconds["generate"] else None,
        # this session's process: peak memory (RSS; GPU where torch reserved it here), the cost table's
        peak_memory_last_session=PeakMemory.of(peak_memory()),
        # completion-cache rows found damaged (checksum mismatch, unreadable) and recomputed, this session
        cache_recomputed=CacheRecomputed.of(res.engine.stats.recomputed()) if res.engine is not None else CacheRecomputed(),
        quote_fidelity=QuoteFidelity.of(fidelity),
        params=parameter_count(prep.model_path or cfg.model.model),
        cluster=ClusterWork.of(cluster),
        toc_s_last_session=toc_s,
    )
    summary.write(rd.summary_file)
    return summary


def _add_quote_notes(calls: pl.DataFrame, answers: pl.DataFrame) -> pl.DataFrame:
    """The quote check's notes (a repair that ran out of its work budget, batch/toc/quotes.py REPAIR_BUDGET)
    join the parse notes of the answer's llm_calls row: the run's one record of model output that was
    not read in full."""
    notes = answers.filter(pl.col("quote_note").is_not_null()).select("qid", "quote_note")
    if not notes.height:
        return calls
    return (calls.join(notes.with_columns(step=pl.lit(Step.ANSWER.value)), on=["qid", "step"], how="left",
                       maintain_order="left")
            .with_columns(parse_error=pl.when(pl.col("quote_note").is_null()).then("parse_error")
                          .otherwise(pl.concat_str(["parse_error", "quote_note"], separator="; ", ignore_nulls=True)))
            .drop("quote_note"))


def score(ds: Dataset, answers: pl.DataFrame, nodes: pl.DataFrame, gold) -> tuple[pl.DataFrame, dict, dict]:
    """The long scores table, the summary metrics and each metric's note (how it was aggregated, or why it is
    missing: eval/summary.py), by the scorer `clarify eval` uses on the run (eval/summary.py
    score_predictions): a run's answers in question order, one per question."""
    from clarify.eval.summary import score_predictions

    if gold is None:
        return schemas.empty("scores"), {}, {}
    scored = score_predictions(ds, ds.predictions(answers), gold, nodes=nodes)
    return scored.scores, scored.metrics, scored.notes
