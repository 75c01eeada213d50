"""`clarify compare`: the same questions over the same index with several models.

Each model gets its own run directory (resumable like any run) and runs in its own process: one after
another (one model's vLLM engine is gone before the next is built), or with `--parallel` all at once,
each pinned to its own GPUs or CPU cores (`device_groups`), or placed by Ray with `--ray-address`.
Retrieval for identical queries is computed once and shared through `<out>/search_cache`
(batch/search_cache.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

from clarify import stops
from clarify.batch.config import RunConfig
from clarify.batch.rundir import Run
from clarify.errors import InputError
from clarify.eval import datasets
from clarify.files import check_own_dir, make_dirs, open_own, write_json, write_parquet, write_text
from clarify.local_llm.hardware import affinity


def _slug(model: str) -> str:
    """The run directory's name of a model: its folder's name, normalised first (`/models/x/..` names
    `models`), never `.` or `..` (a run directory outside `<out>`), never hidden."""
    name = Path(os.path.normpath(model)).name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_.") or "model"


def _fd_stream(stream):
    """`stream` when it has a file descriptor (a child process can write to it), else None (inherit)."""
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return stream


def device_groups(n: int) -> list[dict[str, str]]:
    """Environment pinning each of `n` concurrent runs to its own devices: the GPUs split into n groups
    (CUDA_VISIBLE_DEVICES), else this process's CPU cores (VLLM_CPU_OMP_THREADS_BIND, each engine's own
    cores: local_llm/hardware.py CoreLock). InputError when there are fewer devices than runs."""
    gpus = _gpu_ids()
    kind, ids, var = ("GPUs", gpus, "CUDA_VISIBLE_DEVICES") if gpus else (
        "CPU cores", sorted(affinity()), "VLLM_CPU_OMP_THREADS_BIND")
    if len(ids) < n:
        raise InputError(f"{n} models at once need at least {n} {kind}; this machine has {len(ids)} (run them one "
                         f"after another, or on a Ray cluster with --ray-address)", field="--parallel")
    per = len(ids) // n
    return [{var: ",".join(str(i) for i in ids[k * per:(k + 1) * per])} for k in range(n)]


def _gpu_ids() -> list[str]:
    """The GPUs this process may use, without initialising CUDA here (the runs do)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def _launch(models: list[str], cfg: RunConfig, out: Path, parallel: bool, verbose: bool) -> dict[str, dict]:
    """Run each model's `clarify run` on the one config (`<out>/config.json`, the model set per run): one
    after another on the terminal, or (`parallel`) all at once, each on its own devices (or on a Ray
    cluster, which places them) with its output in `<out>/<model>.log`.
    Returns model -> {started, finished, devices} (unix seconds)."""
    shared = write_json(cfg.to_dict(), out / "config.json")
    cmds = {}
    for model in models:
        cmd = [sys.executable, "-m", "clarify.batch.cli", "run", "--config", str(shared), "--model", model,
               "--out", str(out / _slug(model)), "--search-cache", str(out / "search_cache")]
        if verbose:
            cmd.append("--verbose")
        cmds[model] = cmd
    times: dict[str, dict] = {}
    if not parallel:
        for model, cmd in cmds.items():
            print(f"== {model}: {' '.join(cmd[3:])}", flush=True)
            t0 = time.time()
            # the child's terminal is ours: sys.stdout/sys.stderr, which a quiet session (console.session)
            # keeps on the terminal while descriptors 1 and 2 go to the log
            proc = _start(cmd, stdout=_fd_stream(sys.stdout), stderr=_fd_stream(sys.stderr))
            _wait({model: proc})
            _check(model, proc.returncode, out, "see its output above")
            times[model] = {"started": t0, "finished": time.time(), "devices": None}
        return times
    groups = [{}] * len(models) if cfg.cluster.ray_address else device_groups(len(models))
    procs = {}
    for (model, cmd), env in zip(cmds.items(), groups):
        log = out / f"{_slug(model)}.log"
        where = ", ".join(f"{k}={v}" for k, v in env.items()) or "placed by Ray"
        print(f"== {model} ({where}): {' '.join(cmd[3:])}  [output: {log}]", flush=True)
        try:
            fd = open_own(log, os.O_WRONLY | os.O_CREAT)  # never through a planted link (files.open_own)
        except OSError as exc:
            raise InputError(f"cannot write the run's output here: {exc.strerror or exc}", path=str(log)) from None
        os.ftruncate(fd, 0)
        with open(fd, "w", encoding="utf-8") as fh:  # the child keeps its own descriptor
            procs[model] = (_start([*cmd, "--no-progress"], stdout=fh, stderr=subprocess.STDOUT,
                                   env={**os.environ, **env}), time.time(), where)

    def finished(model: str, proc: subprocess.Popen) -> None:  # each run's finish time as it finishes
        t0, where = procs[model][1:]
        times[model] = {"started": t0, "finished": time.time(), "devices": where}
        print(f"== {model}: finished (exit {proc.returncode}) after {time.time() - t0:.0f} s", flush=True)

    _wait({model: proc for model, (proc, _, _) in procs.items()}, finished)
    for model, (proc, _, _) in procs.items():
        _check(model, proc.returncode, out, f"see {out / (_slug(model) + '.log')}")
    return times


def _start(cmd: list[str], **kwargs) -> subprocess.Popen:
    """A model's run in a session of its own: a Ctrl-C on the terminal reaches this process only, which
    passes it on once (_wait); the run would take a second one as "stop at once" (stops.py)."""
    return subprocess.Popen(cmd, start_new_session=True, **kwargs)


def _wait(procs: dict[str, subprocess.Popen], on_finished=None) -> None:
    """Wait for every run, calling `on_finished(model, proc)` as each ends. Stopped by a signal: the
    same signal goes to each run still going, which writes its finished trees and commits its cache
    (stops.py), and the stop is raised once they have all ended, saying how each ended."""
    running = dict(procs)
    try:
        while running:
            for model, proc in list(running.items()):
                if proc.poll() is not None:
                    del running[model]
                    if on_finished:
                        on_finished(model, proc)
            time.sleep(0.2)
    except stops.Stopped as exc:
        for proc in running.values():
            proc.send_signal(exc.signum)
        for proc in running.values():
            proc.wait()
        exc.done = "; ".join(f"{model}: " + (f"stopped (exit {proc.returncode})" if model in running
                                             else f"finished (exit {proc.returncode})")
                             for model, proc in procs.items())
        raise


def _check(model: str, rc: int, out: Path, where: str) -> None:
    if rc != 0:
        raise InputError(f"the run for model {model!r} failed (exit {rc}); {where}", path=str(out / _slug(model)))


def compare(models: list[str], cfg: RunConfig, out: Path, *, parallel: bool = False,
            verbose: bool = False) -> pl.DataFrame:
    """Run every model over the same questions with one config `cfg` (its model replaced by each; one
    after another, or `parallel`: at once, one model per set of devices) and write the comparison
    table, its Markdown and a plot."""
    if len(models) < 2:
        raise InputError("give at least two models to compare", field="--models")
    if len({_slug(m) for m in models}) < len(models):
        raise InputError("two models would share one run directory (same folder name)", field="--models")
    check_own_dir(make_dirs(out), "comparison folder")
    rows, metric_names = [], []
    times = _launch(models, cfg, out, parallel, verbose)
    for model in models:
        run_dir = out / _slug(model)
        run = Run.open(run_dir)
        summary = run.summary
        row = {"model": model, "params": summary["params"], "run_dir": str(run_dir),
               "started": times[model]["started"], "finished": times[model]["finished"],
               "devices": times[model]["devices"],
               "n_questions": summary["n_questions"],
               # decoding constraints (batch/toc/constraints.py): the run's frozen config says, old runs too
               "constrain_format": run.config.toc.constrain_format,
               "constrain_quotes": run.config.answer.constrain_quotes,
               # all sessions up to their last checkpoint + finalize (None when a session's time was lost)
               "wall_s": summary["wall_s_total"],
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
    write_parquet(table, out / "comparison.parquet")
    write_text(_markdown(table), out / "comparison.md")
    try:
        from clarify.batch.report.plots import plot_compare

        # the quality metrics and the few run measures worth a panel each (not every counter)
        measures = ["quote_share_verbatim_after_repair", "llm_calls_per_question"]
        if datasets.get(cfg.dataset).builds_trees:  # QuoteSum mode builds no tree
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
        if col in ("model", "run_dir", "started", "finished"):
            continue
        cells = [f"{v:.3f}" if isinstance(v, float) else ("—" if v is None else str(v)) for v in table[col]]
        lines.append(f"| {col} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
