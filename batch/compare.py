"""`clarify compare`: the same questions over the same index with several models.

Each model gets its own run directory (resumable like any run) and runs in its own process, so one
model's vLLM engine is gone before the next is built; retrieval for identical queries is computed once
and shared through `<out>/search_cache` (batch/search_cache.py).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl

from clarify.errors import InputError


def _slug(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model).name or model).strip("_") or "model"


def _flags(args: argparse.Namespace) -> list[str]:
    out = []
    for flag in ("config", "dataset", "questions", "limit", "offset", "index", "answer_style", "seed", "scheduler"):
        v = getattr(args, flag, None)
        if v is not None:
            out += [f"--{flag.replace('_', '-')}", str(v)]
    if getattr(args, "no_verify", False):
        out.append("--no-verify")
    return out


def _fd_stream(stream):
    """`stream` when it has a file descriptor (a child process can write to it), else None (inherit)."""
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return stream


def model_params(model: str) -> int | None:
    """Parameter count read from the model's files (local_llm.models.model_info)."""
    try:
        from clarify.local_llm.models import model_info, resolve_model

        return model_info(resolve_model(model)).get("parameters")
    except Exception:  # a model that cannot be inspected still gets compared; size is then unknown
        return None


def compare(models: list[str], args: argparse.Namespace, out: Path) -> pl.DataFrame:
    if len(models) < 2:
        raise InputError("give at least two models to compare", field="--models")
    out.mkdir(parents=True, exist_ok=True)
    rows, metric_names = [], []
    for model in models:
        run_dir = out / _slug(model)
        cmd = [sys.executable, "-m", "clarify.batch.cli", "run", "--model", model, "--out", str(run_dir),
               "--search-cache", str(out / "search_cache"), *_flags(args)]
        if getattr(args, "verbose", False):
            cmd.append("--verbose")
        print(f"== {model}: {' '.join(cmd[3:])}", flush=True)
        # the child's terminal is ours: sys.stdout/sys.stderr, which a quiet session (console.session) keeps
        # on the terminal while descriptors 1 and 2 go to the log
        proc = subprocess.run(cmd, stdout=_fd_stream(sys.stdout), stderr=_fd_stream(sys.stderr))
        if proc.returncode != 0:
            raise InputError(f"the run for model {model!r} failed (exit {proc.returncode}); see its output above",
                             path=str(run_dir))
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        row = {"model": model, "params": model_params(model), "run_dir": str(run_dir),
               "n_questions": summary["n_questions"],
               # all sessions up to their last checkpoint + finalize (older runs: the session that finished)
               "wall_s": summary.get("wall_s_total") or summary["wall_s_last_session"],
               "llm_calls_per_question": summary["llm_calls_per_question"],
               "prompt_tokens": summary["tokens"]["prompt"], "output_tokens": summary["tokens"]["output"],
               "valid_nodes_per_question": summary["valid_nodes_per_question"],
               "parse_errors": summary["parse_errors"], "cached_calls": summary["cached_calls"]}
        for k, v in (summary.get("metrics") or {}).items():
            row[k] = v if isinstance(v, int | float) else None
            if row[k] is not None and k != "missing_predictions" and k not in metric_names:
                metric_names.append(k)
        for k, v in (summary.get("quote_fidelity") or {}).items():
            if isinstance(v, int | float):
                row[f"quote_{k}"] = v
        rows.append(row)
    table = pl.DataFrame(rows, infer_schema_length=None)
    from clarify.batch.rundir import write_parquet

    write_parquet(table, out / "comparison.parquet")
    (out / "comparison.md").write_text(_markdown(table), encoding="utf-8")
    try:
        from clarify.batch.plots import plot_compare

        # the quality metrics and the few run measures worth a panel each (not every counter)
        measures = ["quote_share_verbatim_after_repair", "llm_calls_per_question"]
        if args.dataset != "quotesum":  # QuoteSum mode builds no tree
            measures.insert(1, "valid_nodes_per_question")
        shown = metric_names + [c for c in measures if c in table.columns]
        plot_compare(table, out / "comparison.png", metrics=shown)
    except ImportError:
        pass
    return table


def _markdown(table: pl.DataFrame) -> str:
    """One row per measure, one column per model (readable however many metrics there are)."""
    models = table["model"].to_list()
    lines = ["| measure | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for col in table.columns:
        if col in ("model", "run_dir"):
            continue
        cells = [f"{v:.3f}" if isinstance(v, float) else ("—" if v is None else str(v)) for v in table[col]]
        lines.append(f"| {col} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
