"""CLI commands of `batch/`: run, demo, compare (and report, from batch/report/cli.py); the demo's size and
time estimate from a probe of the engine are batch/cli/demo_sizing.py's."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from clarify.batch import config
from clarify.batch.cli import demo_sizing
from clarify.batch.config import (
    ANSWER_STYLES,
    PART_TREES,
    RunConfig,
)
from clarify.batch.run.records import RunSummary, Tokens
from clarify.options import add_flag, flag_value, toml_value

RUN_EPILOG = f"""\
examples:
  clarify run --dataset asqa --limit 50 --out runs/asqa50
  clarify run --dataset asqa --limit 50 --out runs/asqa50-gemma --model gemma3-270m
  clarify run --dataset asqa --questions ASQA.json --limit 0 --out runs/asqa-dev   all dev, train demos
  clarify run --dataset quotesum --out runs/qs                  answer from QuoteSum's own sources
  clarify run --dataset jsonl --questions my.jsonl --out runs/mine   JSONL lines {{"qid": ..., "question": ...}}
  clarify run --config batch/config/previous.toml --dataset asqa --limit 20 --out runs/prev
  clarify run --dataset asqa --limit 0 --workers 8 --out runs/asqa-all     8 engines on Ray (8 GPUs)
  clarify run --dataset asqa --limit 0 --ray-address auto --out runs/asqa-all   every GPU of a Ray cluster

defaults: the paper's settings (batch/config/schema.py; docs/fidelity.md), the
embedded model {RunConfig().model.model} and the embedded Wikipedia index in $CLARIFY_HOME.

scheduler (default {toml_value(RunConfig().scheduler)}): continuous (vLLM's step loop, every tree advances the moment its
own request returns), waves (all trees in lockstep, one generate per wave) or sequential (one question at a
time, as the official code); all three give identical tables, so a run may be resumed under another. With --workers or
--ray-address, chunks of questions go to Ray workers (one engine each) and come back as parts; the tables
are the same as one process's (docs/scale.md#running-on-a-cluster).

writes into --out: config.json (frozen), questions.parquet, parts/NNNN/ (finished trees), cache/
(completion cache), the final tables nodes, hits, llm_calls, answers, spans, passages, scores (.parquet),
summary.json (written last) and logs/ (library logs of each session). Running the same command again
resumes; on a finished run it makes no model call.
"""

DEMO_EPILOG = """\
The main job on the embedded defaults: builds the embedded index if absent, measures the engine's speed
on work shaped like ToC's (~10-30 s), answers as many ASQA dev questions as fit ~{budget} minutes of ToC
(re-estimated once the first tree is done), scores them, prints the summary and one question as
`clarify show` does (the one with the most valid nodes: its tree of clarifications and its answer with the
quotes resolved), and writes report.html.

examples:
  clarify demo
  clarify demo --limit 20 --out runs/demo20

writes into --out (default runs/demo): a run directory (see `clarify run --help`) and report.html.
"""

COMPARE_EPILOG = """\
examples:
  clarify compare --models smollm2-135m-instruct,gemma3-270m --dataset asqa --limit 20 --out runs/cmp
  clarify compare --models smollm2-135m-instruct,/models/my-hf-model --dataset quotesum --out runs/cmp-qs
  clarify compare --models /models/qwen-7b,/models/qwen-32b --parallel --limit 0 --out runs/cmp-all
                    on CPU both at once, each on half of the cores
  clarify compare --models models.toml --limit 0 --out runs/sizes --plan-only
                    one [[model]] table per model with its own settings; on GPUs each model gets the fewest
                    GPUs that hold it, as many run at once as fit, the rest start as GPUs free up

writes into --out: one run directory per model (resumable; its config.json holds that model's settings),
models/<name>.json (each run's config), search_cache/ (retrieval shared between the models),
comparison.parquet (quality and cost per model), paired.parquet (every pair x metric: mean difference,
95 % paired-bootstrap interval, wins/ties/losses), comparison.md (printed) and comparison.png (each
metric against the parameter count; against cost per question, or the run order, when a model's count is
unknown, as a served model's is: a models file's `params` gives it). --out must be new, empty, or an
earlier compare's (the same command resumes it): a run directory or a folder holding other files is
refused. No model may be named like these files (models, config.json, comparison.parquet, ...).
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run Tree of Clarifications over a question set into a run directory",
                       description="Tree of Clarifications over a question set, resumable, into a run directory.",
                       epilog=RUN_EPILOG)
    _run_args(p)
    p.add_argument("--out", required=True, help="run directory (runs/NAME); re-running resumes")
    p.add_argument("--search-cache", help="folder sharing retrieval results between runs (clarify compare)")
    p.add_argument("--part-trees", type=int, default=PART_TREES, metavar="N",
                   help=f"finished trees per checkpoint part (default {PART_TREES}; a part is also written "
                        f"every minute)")
    p.add_argument("--restart", action="store_true",
                   help="start this run directory over with the given config and inputs (the completion cache is kept)")
    p.add_argument("--print-config", action="store_true",
                   help="print the effective settings (defaults, --config, flags) as TOML that --config reads back, "
                        "and stop: nothing is loaded or written")
    p.set_defaults(func=cmd_run, log_dir=_run_logs)

    p = sub.add_parser("demo", help="the main job on the embedded defaults (index, model, ASQA questions)",
                       description="The whole pipeline on the embedded defaults, sized to this machine.",
                       epilog=DEMO_EPILOG.format(budget=f"{demo_sizing.DEMO_BUDGET_S / 60:.1f}"))
    p.add_argument("--limit", type=int, default=None,
                   help=f"ASQA dev questions to answer (default: as many as this machine's engine answers in "
                        f"~{demo_sizing.DEMO_BUDGET_S / 60:.1f} minutes, {demo_sizing.DEMO_MIN_QUESTIONS}..{demo_sizing.DEMO_MAX_QUESTIONS}; "
                        f"a resumed demo keeps its own)")
    p.add_argument("--out", default="runs/demo", help="run directory")
    # the run's setting, at its declared default (a demo is a run)
    add_flag(p, next(f for key, f in config.flagged() if key == "answer_style"), choices=ANSWER_STYLES,
             default=config.RunConfig.answer_style)
    p.set_defaults(func=cmd_demo, log_dir=_run_logs)

    p = sub.add_parser("compare", help="the same questions and index with several models, side by side",
                       description="The same questions over the same index with several models, one run "
                                   "each (each in its own process), compared in one table.",
                       epilog=COMPARE_EPILOG)
    p.add_argument("--models", required=True,
                   help="a models TOML file ([[model]] tables: model = NAME or FOLDER and any [model] setting of "
                        "that model: dtype, tensor_parallel_size, max_model_len, quantization, chat_template, "
                        "backend, base_url, gpu_memory_utilization, ...; and the comparison's own name and params), or comma-separated model names or "
                        "directories (each with the run's [model] settings)")
    p.add_argument("--plan-only", action="store_true",
                   help="print which GPUs (or cores) each model would run on, and when, then stop")
    _run_args(p, with_model=False)
    p.add_argument("--out", required=True, help="comparison directory, new or empty or an earlier compare's (then "
                                                "resumed); one run directory per model inside")
    p.add_argument("--parallel", action="store_true",
                   help="on CPU: run the models at the same time, each on its own share of the cores (on GPUs "
                        "models are always packed by memory need, as many at once as fit: batch/compare/gpu_plan.py), or "
                        "placed by Ray with --ray-address; each run's output goes to <out>/<model>.log")
    p.set_defaults(func=cmd_compare, log_dir=_run_logs)

    try:
        from clarify.batch.report.cli import register as register_report
    except ModuleNotFoundError:
        return
    register_report(sub)


def _run_logs(args: argparse.Namespace) -> Path | None:
    """A run's library logs go into its own directory (console.session); --print-config logs nothing."""
    from clarify.batch.run.rundir import RunDir

    if getattr(args, "print_config", False):
        return None
    return RunDir(args.out).logs_dir


CLUSTER_GROUP = "cluster (Ray; docs/scale.md#running-on-a-cluster; never changes results)"


def _run_args(p: argparse.ArgumentParser, *, with_model: bool = True) -> None:
    """The flags that set run settings, generated from the settings' declarations (batch/config/schema.py `flagged`:
    name, help, metavar; the default in the help is the field's), and the two that set none."""
    p.add_argument("--config", help="TOML config file, or a run's frozen config.json (flags override it); default: the "
                                    "paper's settings")
    cluster = p.add_argument_group(CLUSTER_GROUP)
    for key, f in config.flagged():
        if key == "model.model" and not with_model:  # compare: each model's own (--models)
            continue
        add_flag(cluster if key.startswith("cluster.") else p, f, key, choices=config.choices_of(key))
    p.add_argument("--no-progress", action="store_true", help="no progress display")


def _overrides(args: argparse.Namespace) -> dict:
    """The settings the flags give (config key -> value; None: the flag was not given): a value flag's value,
    a switch's declared value when it is on."""
    return {key: flag_value(args, f) for key, f in config.flagged()}


def print_summary(summary: RunSummary, out=None) -> None:
    out = out or sys.stdout  # looked up now: a quiet session (console.session) swaps sys.stdout
    print(f"\n== {summary.name}: {summary.n_questions} {summary.dataset} questions, "
          f"model {summary.model}, {summary.answer_style} answers", file=out)
    on = [name for name, flag in (summary.constraints.to_json() if summary.constraints else {}).items() if flag]
    if on:
        print(f"  decoding constrained: {' and '.join(on)} (batch/toc/constraints.py)", file=out)
    for k, v in summary.metrics.items():
        print(f"  {k:<28} {v if isinstance(v, str) else f'{v:.3f}' if v is not None else 'n/a'}", file=out)
    print(f"  {'llm calls / question':<28} {summary.llm_calls_per_question:.1f} "
          f"(max {summary.llm_calls_per_question_max}, cached {summary.cached_calls})", file=out)
    tokens = summary.tokens or Tokens()
    print(f"  {'tokens prompt / output':<28} {tokens.prompt} / {tokens.output}", file=out)
    print(f"  {'valid nodes / question':<28} {summary.valid_nodes_per_question:.2f}", file=out)
    fixed = summary.cache_recomputed
    if fixed and fixed.rows:
        why = ", ".join(f"{k}: {v}" for k, v in fixed.reasons.items())
        print(f"  {'cache rows recomputed':<28} {fixed.rows} ({why}; damaged on disk, recomputed and "
              f"rewritten this session)", file=out)
    if summary.quote_fidelity:
        print(f"  {'quote fidelity':<28} {json.dumps(summary.quote_fidelity.to_json())}", file=out)
    total = summary.wall_s_total
    print(f"  {'wall time (s)':<28} {summary.wall_s_last_session} this session"
          + (f", {total} in all sessions" if total is not None else ""), file=out)
    if summary.engine_tokens_per_s:
        print(f"  {'engine tokens/s':<28} {summary.engine_tokens_per_s} (prompt + output, this session"
              + (", per engine" if summary.cluster else "") + ")", file=out)
    if c := summary.cluster:
        print(f"  {'Ray workers':<28} {c.workers} ({c.chunks} chunks this session, {c.requeued} requeued, "
              f"{c.restarts} restarts; {c.engine_tokens_per_s_all_workers} tok/s all workers)", file=out)
    use = summary.engine_usage_last_session
    if use and use.engine_steps:
        cached = use.prefix_cached_share
        print(f"  {'engine (' + str(summary.scheduler) + ')':<28} {use.engine_steps} steps, running batch "
              f"mean {use.running_mean} (p10/p50/p90 {use.running_p10}/{use.running_p50}/"
              f"{use.running_p90})" + (f", prefix cache {cached:.0%} of prompt tokens" if cached is not None
                                         else ""), file=out)


def cmd_run(args: argparse.Namespace) -> int:
    from clarify.batch.run.pipeline import run

    cfg = config.load(args.config, _overrides(args))
    if args.print_config:
        sys.stdout.write(cfg.to_toml())
        return 0
    summary = run(cfg, args.out, progress=not args.no_progress, restart=args.restart,
                  search_cache=Path(args.search_cache) if args.search_cache else None, part_trees=args.part_trees)
    print_summary(summary)
    print(f"run directory: {args.out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Build the embedded index if absent, run ToC over ASQA dev questions, score, show one answer."""
    from clarify import console
    from clarify.batch.cli.show import show
    from clarify.batch.run.pipeline import run
    from clarify.batch.run.resources import engine_for
    from clarify.batch.run.rundir import RunDir
    from clarify.index import ensure_default_index

    t_start = time.perf_counter()
    index_dir = ensure_default_index()
    limit, expected_s = args.limit, None
    rd = RunDir(args.out)
    frozen = rd.config_file
    constraints = dict(demo_sizing.DEMO_CONSTRAINTS)
    if frozen.exists():  # a resumed (or finished) demo keeps the size and the decoding it was started with
        from clarify.batch.run.rundir import Run

        started = Run.open(args.out).config
        limit = started.limit if limit is None else limit
        constraints = {key: config.value_of(started, key) for key in demo_sizing.DEMO_CONSTRAINTS}
    cfg = config.load(None, {"dataset": "asqa", "limit": limit or demo_sizing.DEMO_MAX_QUESTIONS,
                             "answer_style": args.answer_style, "index": str(index_dir), **constraints})
    if any(constraints.values()):
        on = [w for k, w in (("toc.constrain_format", "the DQ/DA format"), ("answer.constrain_quotes", "verbatim quotes"))
              if constraints[k]]
        print(f"demo: decoding constrained to {' and '.join(on)} (docs/running-toc.md#constrained-decoding); "
              f"`clarify run` keeps the official free decoding unless --constrain-format/--constrain-quotes",
              flush=True)
    if not rd.summary_file.exists():
        from clarify.batch.toc.constraints import clarify_grammar
        from clarify.batch.toc.settings import TreeSettings

        with console.step("starting the engine and timing ToC's calls on it"):
            tree = TreeSettings.of(cfg)
            engine = engine_for(cfg.model, tree)
            probe = demo_sizing.probe_speed(engine, grammar=clarify_grammar(tree))
        constrained = any(constraints.values())
        if limit is None:
            limit = demo_sizing.demo_size(probe, constrained)
            cfg = config.load(None, {"dataset": "asqa", "limit": limit, "answer_style": args.answer_style,
                                     "index": str(index_dir), **constraints})
        expected_s = probe.toc_s(limit, constrained)
        cpu = f"CPU {engine.cpu['capability']}, " if engine.cpu else ""
        print(f"engine: {engine.device}, {cpu}{engine.dtype}, a ToC call {probe.single_s:.1f} s alone, "
              f"{probe.batch} at once {probe.batch_s:.1f} s -> {limit} ASQA questions, expected "
              f"~{expected_s / 60:.1f} min of ToC (re-estimated once the first tree is done; more: clarify demo "
              f"--limit 20 --out runs/demo20)", flush=True)
    summary = run(cfg, args.out, estimate_s=expected_s)
    print_summary(summary)
    show(Path(args.out))
    try:
        from clarify.batch.report.html import write_report
    except ModuleNotFoundError:
        return 0
    path = write_report([rd.path], rd.report_file)
    print(f"\nreport: {path}")
    took = time.perf_counter() - t_start
    print(f"demo took {took / 60:.1f} min" + demo_sizing.estimate_words(expected_s, summary.toc_s_last_session))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from clarify.batch.compare import models_file
    from clarify.batch.compare.compare import compare

    cfg = config.load(args.config, _overrides(args))  # the TOML and the flags, resolved once for every model
    spec = args.models
    source = None
    if spec.endswith(".toml") or Path(spec).is_file():
        models, source = models_file.load(spec), spec  # every entry checked before anything starts
    else:
        models = [m.strip() for m in spec.split(",") if m.strip()]
    out = Path(args.out)
    if compare(models, cfg, out, parallel=args.parallel, verbose=getattr(args, "verbose", False),
               plan_only=args.plan_only, source=source) is None:
        return 0
    print((out / "comparison.md").read_text(encoding="utf-8"))
    print(f"comparison: {out / 'comparison.parquet'} (one row per model), {out / 'paired.parquet'} (paired "
          f"differences), {out / 'comparison.png'} (plot); the HTML report: clarify report "
          + " ".join(str(out / (m.name if hasattr(m, 'name') else models_file.slug(m))) for m in models))
    return 0
