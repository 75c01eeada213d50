"""The comparison of runs in `clarify report` (docs/architecture.md#reports-and-comparisons): one row per run, pure functions over loaded runs.

The runs are read by the one run reader (`batch/run/rundir.py` Run.open); the rendering in `batch/report/html.py`
turns the table into HTML and the metric-vs-size plot (`plots.compare_png`).
"""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl

from clarify.batch.run.records import EngineFacts, PeakMemory, RunSummary
from clarify.batch.run.rundir import Run, run_labels
from clarify.errors import InputError


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested dicts as one level, keys joined with dots (`{"toc": {"max_depth": 3}}` → `toc.max_depth`)."""
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def split_summary(summary: RunSummary | None) -> tuple[dict, dict]:
    """summary.json (its record's JSON; none while the run is unfinished) as (its metrics, everything else),
    each flattened with dots (`flatten`)."""
    rest = summary.to_json() if summary is not None else {}
    metrics = rest.pop("metrics", {}) or {}
    rest.pop("metric_notes", None)  # words about the metrics (the run report shows them beside each)
    return flatten(metrics), flatten(rest)


def fmt(value: object) -> str:
    """A table cell's text: 4 significant digits for floats, JSON for lists and dicts, — for null."""
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value).lower()
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def model_params(run: Run) -> float | None:
    """Parameter count of the run's model (summary `params`, read from the model's files by the run)."""
    value = run.summary.params if run.summary else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def summary_row(run: Run) -> dict:
    """One comparison row: run, model, dataset, questions, params, metrics (bare names), the rest of
    summary.json flattened with dots, and the run's cost (`cost_row`: llm_calls_per_question and
    model_calls_per_question from llm_calls, model_calls = calls not answered from the cache, ...)."""
    n_q = run.questions["qid"].n_unique()
    row: dict = {
        "run": run.name,
        "model": run.config.model.model,
        "dataset": run.config.dataset,
        "questions": n_q,
        "params": model_params(run),
    }
    metrics, rest = split_summary(run.summary)
    row.update(metrics)
    row.update({k: v for k, v in rest.items() if k not in row and k != "params"})
    row.update(cost_row(run))
    return row


def comparison_table(runs: list[Run]) -> pl.DataFrame:
    """One row per run (see `summary_row`), its `run` the run's label (rundir.run_labels: two folders of one
    name are two rows); columns are the union over runs (missing → null)."""
    rows = [{**summary_row(r), "run": label} for r, label in zip(runs, run_labels([r.path for r in runs]))]
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    data = {c: [r.get(c) for r in rows] for c in columns}
    series = []
    for c, values in data.items():
        scalars = [v for v in values if v is not None]
        if scalars and all(isinstance(v, int | float) and not isinstance(v, bool) for v in scalars):
            series.append(pl.Series(c, [float(v) if v is not None else None for v in values], pl.Float64))
        else:
            series.append(pl.Series(c, [None if v is None else fmt(v) for v in values], pl.String))
    return pl.DataFrame(series)


def plotted_metrics(runs: list[Run], table: pl.DataFrame) -> list[str]:
    """Columns of `table` worth plotting against model size: the quality metrics plus cost per question
    (raw totals depend on the question count), numeric ones only."""
    names: list[str] = []
    for run in runs:
        names += [m for m in split_summary(run.summary)[0] if m not in names]
    return [
        c
        for c in [*names, "llm_calls_per_question", "wall_s_per_question"]
        if c in table.columns and table.schema[c] == pl.Float64
    ]


# --- cost per run, and runs compared question by question ------------------------------------------

COST_COLUMNS = ("engine_tokens_per_question", "llm_calls_per_question", "model_calls_per_question",
                "wall_s_per_question", "device_s_per_question", "tokens_per_s", "peak_rss_gib", "peak_gpu_gib")


def wall_s(summary: RunSummary | None) -> float | None:
    """The run's wall time: every session up to its last checkpoint plus finalize (`wall_s_total`,
    batch/run/pipeline.py finalize), else the last session's when an earlier session's time was lost."""
    for value in (summary.wall_s_total, summary.wall_s_last_session) if summary else ():
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def cost_row(run: Run) -> dict:
    """What the run cost, per question: engine tokens (prompt + output of the calls the engine computed,
    not those answered from the completion cache), LLM calls (all, and those that reached the model), wall
    seconds, device-seconds (wall x the GPUs, or CPU cores, the engine held: summary `engine.device_count`;
    for runs made before it was recorded, tensor_parallel_size on CUDA), engine tokens per second of
    generation (summary `engine_tokens_per_s`) and peak memory (summary `peak_memory_last_session`, where recorded)."""
    summary = run.summary or RunSummary()  # an unfinished run: its tables so far, no summary
    n_q = run.questions["qid"].n_unique() or summary.n_questions or 0
    calls = run.llm_calls
    computed = calls.filter(~pl.col("cached").fill_null(False))
    engine = summary.engine or EngineFacts()
    devices = engine.device_count
    if devices is None and engine.device == "cuda":
        devices = run.config.model.tensor_parallel_size
    wall = wall_s(summary)
    peak = summary.peak_memory_last_session or PeakMemory()

    def per_q(value):
        return value / n_q if value is not None and n_q else None

    def gib(value):
        return value / 2**30 if isinstance(value, int | float) else None

    tokens = int(computed["prompt_tokens"].fill_null(0).sum() + computed["output_tokens"].fill_null(0).sum())
    return {
        "device": engine.device,
        "devices": devices,
        "engine_tokens_per_question": per_q(tokens),
        "llm_calls_per_question": per_q(calls.height),
        "model_calls_per_question": per_q(computed.height),
        "wall_s": wall,
        "wall_s_per_question": per_q(wall),
        "device_s_per_question": per_q(wall * devices) if wall is not None and devices else None,
        "tokens_per_s": summary.engine_tokens_per_s,
        "peak_rss_gib": gib(peak.rss_bytes),
        "peak_gpu_gib": gib(peak.gpu_bytes),
    }


def cost_table(runs: list[Run]) -> pl.DataFrame:
    """One row per run: run (its label, rundir.run_labels), model and `cost_row`."""
    rows = [{"run": label, "model": r.config.model.model, **cost_row(r)}
            for r, label in zip(runs, run_labels([r.path for r in runs]))]
    return pl.DataFrame(rows, schema={"run": pl.String, "model": pl.String, "device": pl.String,
                                      "devices": pl.Float64, "engine_tokens_per_question": pl.Float64,
                                      "llm_calls_per_question": pl.Float64, "model_calls_per_question": pl.Float64,
                                      "wall_s": pl.Float64, "wall_s_per_question": pl.Float64,
                                      "device_s_per_question": pl.Float64, "tokens_per_s": pl.Float64,
                                      "peak_rss_gib": pl.Float64, "peak_gpu_gib": pl.Float64})


def check_same_questions(runs: list[Run]) -> None:
    """InputError, in one line naming the run and the difference, unless every run answered the same
    questions (qid) of the same dataset as the first: paired statistics compare question by question."""
    first = runs[0]
    qids = set(first.questions["qid"].to_list())
    for run in runs[1:]:
        if run.config.dataset != first.config.dataset:
            raise InputError(f"a run over dataset {run.config.dataset!r} cannot be compared question by question "
                             f"with {first.path} (dataset {first.config.dataset!r})", path=str(run.path))
        other = set(run.questions["qid"].to_list())
        if other != qids:
            only_first, only_this = sorted(qids - other), sorted(other - qids)

            def few(ids: list[str]) -> str:
                return ", ".join(ids[:3]) + (", ..." if len(ids) > 3 else "")

            parts = ([f"lacks {len(only_first)} of {first.path}'s questions ({few(only_first)})"] if only_first else []) + \
                    ([f"has {len(only_this)} that {first.path} lacks ({few(only_this)})"] if only_this else [])
            raise InputError("not over the same questions: " + "; ".join(parts) + " (run both with the same "
                             "--dataset, --offset and --limit, or pair them on the questions both answered: "
                             "clarify report --common-questions)", path=str(run.path))


def paired_questions(runs: list[Run], *, common: bool = False) -> list[str]:
    """The questions (qid) the runs are compared on, in the first run's order: every run's, which must be the
    same (`check_same_questions`); with `common`, those every run answered (the same dataset still; none in
    common is an InputError). Pairing on the overlap is how a large model run on a subset meets a small one
    run on everything: each run's own section still covers all its questions."""
    first = runs[0]
    order = first.questions["qid"].unique(maintain_order=True).to_list()
    if not common:
        check_same_questions(runs)
        return order
    for run in runs[1:]:
        if run.config.dataset != first.config.dataset:
            check_same_questions([first, run])  # the dataset's refusal, in its one line
    shared = set(order).intersection(*(set(r.questions["qid"].to_list()) for r in runs[1:]))
    if not shared:
        raise InputError(f"no question in common with {first.path}: nothing to pair", path=str(runs[1].path))
    return [q for q in order if q in shared]


def common_note(runs: list[Run], qids: list[str]) -> str | None:
    """The line said above a comparison paired on fewer questions than some run answered; None otherwise."""
    counts = [r.questions["qid"].n_unique() for r in runs]
    if all(n == len(qids) for n in counts):
        return None
    each = ", ".join(f"{label}: {n}" for label, n in zip(run_labels([r.path for r in runs]), counts))
    return (f"Paired on the {len(qids)} questions every run answered ({each}); each run's own metrics cover all "
            "its questions.")


PAIRED_SCHEMA = {"a": pl.String, "b": pl.String, "metric": pl.String, "questions": pl.Int64, "a_mean": pl.Float64,
                 "b_mean": pl.Float64, "diff": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64,
                 "excludes_zero": pl.Boolean, "p_perm": pl.Float64, "p_holm": pl.Float64, "significant": pl.Boolean,
                 "mde": pl.Float64, "wins": pl.Int64, "ties": pl.Int64, "losses": pl.Int64}


def paired_table(runs: list[Run], *, qids: list[str] | None = None, resamples: int | None = None,
                 seed: int | None = None) -> pl.DataFrame:
    """Every pair of runs (a before b in the given order) on every metric they report and scored per
    question (summary.json `metrics` found in scores.parquet), as `paired_rows` computes them, over `qids`
    (`paired_questions`; None: the runs must share their questions)."""
    qids = paired_questions(runs) if qids is None else qids
    labels = run_labels([r.path for r in runs])  # runs are keyed by folder (Run.key), shown by label, never by name
    # the metrics the runs report (summary.json `metrics`, in its order) that are scored per question; the
    # per-question helper counts of scores.parquet (n_gold, n_pairs, ...) are not compared
    scored: list[str] = []
    for run in runs:
        scored += [m for m in run.scores["metric"].unique(maintain_order=True).to_list() if m not in scored]
    reported = [m for run in runs for m in (run.summary.metrics if run.summary else {}) if m in scored]
    metrics = list(dict.fromkeys(reported)) or scored
    # (question x metric) value matrix per run, NaN where a run has no value
    frame = pl.DataFrame({"qid": qids}, schema={"qid": pl.String})
    values = []
    for run in runs:
        wide = (run.scores.filter(pl.col("value").is_not_nan()).group_by("qid", "metric").agg(pl.col("value").mean())
                .pivot(on="metric", index="qid", values="value"))
        wide = frame.join(wide, on="qid", how="left", maintain_order="left")
        values.append(np.column_stack([wide[m].cast(pl.Float64).fill_null(np.nan).to_numpy() if m in wide.columns
                                       else np.full(len(qids), np.nan) for m in metrics]) if metrics else None)
    return paired_rows(labels, values, metrics, resamples=resamples, seed=seed)


def paired_rows(names: list[str], values: list[np.ndarray | None], metrics: list[str], *,
                resamples: int | None = None, seed: int | None = None) -> pl.DataFrame:
    """The paired table (PAIRED_SCHEMA) of runs `names`, each scored as `values[i]` ((questions x metrics),
    rows aligned across runs, NaN where a run has no value): for every pair (a before b) and metric, the
    mean of b - a and wins/ties/losses; from eval/paired.MIN_N questions on, its 95 % paired-bootstrap
    interval, whether that excludes 0, the permutation p-value, the minimum detectable effect at this n
    (eval/paired.py; one draw of questions for every pair and metric, fixed seed) and the Holm-adjusted
    p-value over every tested row of the table; `significant` = the difference survives Holm at 5 %.
    Below MIN_N the interval, tests and mark are null (eval/paired.py says why)."""
    from clarify.eval import paired

    pairs = [(i, j) for i in range(len(names)) for j in range(i + 1, len(names))]
    if not metrics or not pairs:
        return pl.DataFrame(schema=PAIRED_SCHEMA)
    a_vals = np.concatenate([values[i] for i, _ in pairs], axis=1)
    b_vals = np.concatenate([values[j] for _, j in pairs], axis=1)
    got = paired.paired_tests(b_vals - a_vals, resamples=resamples or paired.RESAMPLES,
                              seed=paired.SEED if seed is None else seed)
    kept = []
    for k, ((i, j), metric) in enumerate((p, m) for p in pairs for m in metrics):
        both = ~np.isnan(a_vals[:, k]) & ~np.isnan(b_vals[:, k])
        if both.any():
            kept.append((k, i, j, metric, both))
    adjusted = paired.holm(np.array([got.p[k] for k, *_ in kept]))  # the family: the rows shown

    def num(x) -> float | None:
        return None if np.isnan(x) else float(x)

    rows = []
    for (k, i, j, metric, both), p_holm in zip(kept, adjusted):
        lo, hi, tested = num(got.paired.lo[k]), num(got.paired.hi[k]), not np.isnan(got.p[k])
        rows.append({"a": names[i], "b": names[j], "metric": metric, "questions": int(got.paired.n[k]),
                     "a_mean": float(a_vals[both, k].mean()), "b_mean": float(b_vals[both, k].mean()),
                     "diff": float(got.paired.mean[k]), "ci_low": lo, "ci_high": hi,
                     "excludes_zero": (lo > 0 or hi < 0) if lo is not None else None,
                     "p_perm": num(got.p[k]), "p_holm": num(p_holm),
                     "significant": bool(p_holm < paired.ALPHA) if tested else None, "mde": num(got.mde[k]),
                     "wins": int(got.paired.wins[k]), "ties": int(got.paired.ties[k]),
                     "losses": int(got.paired.losses[k])})
    return pl.DataFrame(rows, schema=PAIRED_SCHEMA)


def _p(value: float | None) -> str:
    """A p-value as the tables show it: 3 decimals, `< 0.001` below, — when untested."""
    if value is None:
        return "—"
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def paired_notes(table: pl.DataFrame) -> list[str]:
    """The lines under the paired table: what * means, the minimum n, and per metric the smallest difference
    these questions can tell from noise (the largest `mde` over the pairs shown: eval/paired.py `mde`)."""
    from clarify.eval import paired

    lines = [f"* : the difference survives Holm-Bonferroni at {paired.ALPHA:.0%} over the {table['p_holm'].drop_nulls().len()} "
             f"tests shown (metrics x pairs; p_perm: paired permutation test, {paired.RESAMPLES:,} sign assignments "
             "or all of them; p_holm: adjusted)."]
    small = table.filter(pl.col("questions") < paired.MIN_N)
    if small.height:
        lines.append(f"{small.height} row(s) rest on fewer than {paired.MIN_N} questions: shown without an interval or "
                     f"test, since no outcome of the paired permutation test on fewer than {paired.MIN_N} questions "
                     f"reaches p < {paired.ALPHA} (its smallest p-value is 2 / 2^n).")
    for row in (table.filter(pl.col("mde").is_not_null()).group_by("metric", maintain_order=True)
                .agg(pl.col("mde").max(), pl.col("questions").min()).iter_rows(named=True)):
        lines.append(f"with n = {row['questions']} a difference in {row['metric']} below {row['mde']:.2f} points cannot be "
                     f"told from noise (the minimum detectable effect at {paired.POWER:.0%} power, from the paired SD).")
    return lines


def paired_markdown(table: pl.DataFrame) -> str:
    """The paired table as Markdown (printed by `clarify compare`) with `paired_notes` under it; * marks a
    difference that survives Holm-Bonferroni."""
    lines = ["| b − a | metric | q | a | b | b − a | 95 % CI | p_perm | p_holm | wins/ties/losses |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.iter_rows(named=True):
        mark = " *" if r["significant"] else ""
        ci = f"{r['ci_low']:+.2f} … {r['ci_high']:+.2f}" if r["ci_low"] is not None else "—"
        lines.append(f"| {r['b']} − {r['a']} | {r['metric']} | {r['questions']} | {r['a_mean']:.2f} | {r['b_mean']:.2f} "
                     f"| {r['diff']:+.2f}{mark} | {ci} | {_p(r['p_perm'])} | {_p(r['p_holm'])} | "
                     f"{r['wins']}/{r['ties']}/{r['losses']} |")
    return "\n".join(lines) + "\n\n" + "\n".join(paired_notes(table)) + "\n"


def compare_stats(runs: list[Run], table: pl.DataFrame, metrics: list[str], qids: list[str] | None = None) -> dict:
    """What the report's comparison adds for runs over the same questions, or over `qids` (`paired_questions`
    with common=True): the paired table and its forest plot, the cost table and quality (the first metric)
    against device-seconds per question. Values for the `compare_stats.html.j2` template part (plots as PNG
    bytes)."""
    from clarify.batch.report.compare_plots import forest_png, quality_cost_png

    qids = paired_questions(runs) if qids is None else qids
    paired = paired_table(runs, qids=qids)
    costs = cost_table(runs)
    # the quality axis: the first metric on which the runs differ (else the first)
    varied = [m for m in metrics if table[m].drop_nulls().n_unique() > 1]
    quality = (varied or metrics or [None])[0]
    shown = costs.join(table.select("run", *([quality] if quality else [])), on="run", how="left")
    return {
        "paired_columns": ["b − a", "metric", "questions", "a", "b", "b − a", "95 % CI", "p (permutation)",
                           "p (Holm)", "wins/ties/losses"],
        "paired_rows": [{"pair": f"{r['b']} − {r['a']}", "metric": r["metric"], "questions": r["questions"],
                         "a_mean": r["a_mean"], "b_mean": r["b_mean"], "diff": r["diff"],
                         "ci": f"{r['ci_low']:+.3g} … {r['ci_high']:+.3g}" if r["ci_low"] is not None else "—",
                         "significant": bool(r["significant"]), "tested": r["p_perm"] is not None,
                         "p_perm": _p(r["p_perm"]), "p_holm": _p(r["p_holm"]),
                         "wtl": f"{r['wins']}/{r['ties']}/{r['losses']}"} for r in paired.iter_rows(named=True)],
        "paired_notes": [n for n in (common_note(runs, qids),) if n] + paired_notes(paired),
        "forest": forest_png(paired),  # PNG bytes (html.py embeds them)
        "cost_columns": costs.columns,
        "cost_rows": list(costs.iter_rows()),
        "quality_cost": quality_cost_png(shown, quality) if quality else None,
        "quality_metric": quality,
    }
