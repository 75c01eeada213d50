"""`clarify compare`: the same questions over the same index with several models.

The models come as a comma list (each with the run's own [model] settings) or as a models file
(batch/compare/models_file.py: one [[model]] table per model with its own settings, checked up front). Each model
gets its own run directory (resumable like any run; its config.json holds that model's settings) and runs
in its own process. On GPUs the models are packed by memory need (batch/compare/gpu_plan.py: each on the fewest
GPUs that hold it, as many at once as fit, a queued one started as GPUs free up); on CPU one after
another, or with `--parallel` all at once, each on its own cores (`device_groups`); with `--ray-address`
Ray places them. The plan is printed before anything starts (`--plan-only` stops there). `--out` is a new
or empty folder, or an earlier compare's (its runs resume): never a run directory nor a folder with other
files (`check_out`), and no model's name takes one of compare's own (models_file.COMPARE_FILES). Retrieval for
identical queries is computed once and shared through `<out>/search_cache` (batch/run/search_cache.py).
The runs are compared question by question afterwards (batch/report/comparison.py: paired table, cost).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

from clarify import stops
from clarify.batch.compare import gpu_plan
from clarify.batch.compare.models_file import COMPARE_FILES, Entry, from_names, name_clash
from clarify.batch.compare.models_file import slug as _slug
from clarify.batch.config import RunConfig
from clarify.batch.report.comparison import cost_row, paired_markdown, paired_table
from clarify.batch.run.rundir import FINAL_TABLES, Run
from clarify.errors import InputError
from clarify.eval import datasets
from clarify.eval.metrics import Metric
from clarify.files import check_own_dir, make_dirs, open_own, write_json, write_parquet, write_text
from clarify.local_llm.hardware import affinity
from clarify.local_llm.preflight import Gpu


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


GPU_QUERY = ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.free,compute_cap",
             "--format=csv,noheader,nounits"]


def gpu_facts() -> list[tuple[str, Gpu]]:
    """The GPUs this process may use, each with its id and memory, from nvidia-smi (`GPU_QUERY`): without
    initialising CUDA here (the runs do, each on its own GPUs)."""
    try:
        out = subprocess.run(GPU_QUERY, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_gpus(out, os.environ.get("CUDA_VISIBLE_DEVICES"))


def parse_gpus(text: str, visible: str | None) -> list[tuple[str, Gpu]]:
    """`GPU_QUERY`'s lines (index, name, MiB total, MiB free, compute capability) as (id, Gpu), those of
    `visible` (CUDA_VISIBLE_DEVICES: nvidia-smi indices, in its order) when it is set."""
    gpus = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            major, minor = (int(x) for x in parts[4].split("."))
            gpus[parts[0]] = Gpu(parts[1], (major, minor), int(float(parts[3])) << 20, int(float(parts[2])) << 20)
        except (IndexError, ValueError):
            continue
    if visible is not None:
        return [(g.strip(), gpus[g.strip()]) for g in visible.split(",") if g.strip() in gpus]
    return list(gpus.items())


def _command(name: str, config_file: Path, out: Path, verbose: bool) -> list[str]:
    cmd = [sys.executable, "-m", "clarify.batch.cli", "run", "--config", str(config_file),
           "--out", str(out / name), "--search-cache", str(out / "search_cache")]
    return [*cmd, "--verbose"] if verbose else cmd


def _log(out: Path, name: str):
    """`<out>/<name>.log`, emptied, opened for a run's output (never through a planted link: files.open_own)."""
    log = out / f"{name}.log"
    try:
        fd = open_own(log, os.O_WRONLY | os.O_CREAT)
    except OSError as exc:
        raise InputError(f"cannot write the run's output here: {exc.strerror or exc}", path=str(log)) from None
    os.ftruncate(fd, 0)
    return open(fd, "w", encoding="utf-8")


def _launch(configs: dict[str, RunConfig], out: Path, parallel: bool, verbose: bool,
            plan: gpu_plan.Plan | None = None, gpu_ids: list[str] | None = None) -> dict[str, dict]:
    """Run each model's `clarify run` on its own frozen config (`<out>/models/<name>.json`: the run's
    settings with that model's [model] table): packed on the GPUs by `plan` (each queued model started as
    GPUs free up, `gpu_plan.run_queue`), else one after another on the terminal, or (`parallel`) all at
    once, each on its own CPU cores (or on a Ray cluster, which places them) with its output in
    `<out>/<name>.log`. Returns name -> {started, finished, devices} (unix seconds)."""
    cmds = {}
    for name, cfg in configs.items():
        cmds[name] = _command(name, write_json(cfg.recorded(), out / "models" / f"{name}.json"), out, verbose)
    times: dict[str, dict] = {}
    if plan is not None:
        return _launch_planned(plan, gpu_ids or [], cmds, out)
    if not parallel:
        for name, cmd in cmds.items():
            print(f"== {name}: {' '.join(cmd[3:])}", flush=True)
            t0 = time.time()
            # the child's terminal is ours: sys.stdout/sys.stderr, which a quiet session (console.session)
            # keeps on the terminal while descriptors 1 and 2 go to the log
            proc = _start(cmd, stdout=_fd_stream(sys.stdout), stderr=_fd_stream(sys.stderr))
            _wait({name: proc})
            _check(name, proc.returncode, out, "see its output above")
            times[name] = {"started": t0, "finished": time.time(), "devices": None}
        return times
    ray = any(c.cluster.ray_address for c in configs.values())
    groups = [{}] * len(configs) if ray else device_groups(len(configs))
    procs = {}
    for (name, cmd), env in zip(cmds.items(), groups):
        where = ", ".join(f"{k}={v}" for k, v in env.items()) or "placed by Ray"
        print(f"== {name} ({where}): {' '.join(cmd[3:])}  [output: {out / (name + '.log')}]", flush=True)
        with _log(out, name) as fh:  # the child keeps its own descriptor
            procs[name] = (_start([*cmd, "--no-progress"], stdout=fh, stderr=subprocess.STDOUT,
                                  env={**os.environ, **env}), time.time(), where)

    def finished(name: str, proc: subprocess.Popen) -> None:  # each run's finish time as it finishes
        t0, where = procs[name][1:]
        times[name] = {"started": t0, "finished": time.time(), "devices": where}
        print(f"== {name}: finished (exit {proc.returncode}) after {time.time() - t0:.0f} s", flush=True)

    _wait({name: proc for name, (proc, _, _) in procs.items()}, finished)
    for name, (proc, _, _) in procs.items():
        _check(name, proc.returncode, out, f"see {out / (name + '.log')}")
    return times


def _launch_planned(plan: gpu_plan.Plan, gpu_ids: list[str], cmds: dict[str, list[str]], out: Path) -> dict[str, dict]:
    """The GPU plan run: each model on its planned GPUs (CUDA_VISIBLE_DEVICES), a queued one started the
    moment enough GPUs are free; a stop reaches every run still going (as `_wait`)."""
    procs: dict[str, subprocess.Popen] = {}
    times: dict[str, dict] = {}

    def start(p: gpu_plan.Placement, ids: list[int]) -> subprocess.Popen:
        visible = ",".join(gpu_ids[i] for i in ids)
        where = f"CUDA_VISIBLE_DEVICES={visible}" if ids else "no GPU"
        print(f"== {p.name} ({where}): {' '.join(cmds[p.name][3:])}  [output: {out / (p.name + '.log')}]", flush=True)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible} if ids else dict(os.environ)
        with _log(out, p.name) as fh:
            procs[p.name] = proc = _start([*cmds[p.name], "--no-progress"], stdout=fh, stderr=subprocess.STDOUT, env=env)
        times[p.name] = {"started": time.time(), "finished": None, "devices": where}
        return proc

    def finished(p: gpu_plan.Placement, proc: subprocess.Popen) -> None:
        times[p.name]["finished"] = time.time()
        print(f"== {p.name}: finished (exit {proc.returncode}) after {time.time() - times[p.name]['started']:.0f} s; "
              f"its GPUs are free", flush=True)

    try:
        gpu_plan.run_queue(plan, start, finished)
    except stops.Stopped as exc:
        _pass_on(exc, procs, {n: p for n, p in procs.items() if p.poll() is None})
        raise
    for name, proc in procs.items():
        _check(name, proc.returncode, out, f"see {out / (name + '.log')}")
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
        _pass_on(exc, procs, running)
        raise


def _pass_on(exc: stops.Stopped, procs: dict[str, subprocess.Popen], running: dict[str, subprocess.Popen]) -> None:
    """The stop's signal to each run still going; wait for them; say how each run ended (`exc.done`)."""
    for proc in running.values():
        proc.send_signal(exc.signum)
    for proc in running.values():
        proc.wait()
    exc.done = "; ".join(f"{model}: " + (f"stopped (exit {proc.returncode})" if model in running
                                         else f"finished (exit {proc.returncode})")
                         for model, proc in procs.items())


def _check(model: str, rc: int, out: Path, where: str) -> None:
    if rc != 0:
        raise InputError(f"the run for model {model!r} failed (exit {rc}); {where}", path=str(out / _slug(model)))


def compare(models: list[str] | list[Entry], cfg: RunConfig, out: Path, *, parallel: bool = False,
            verbose: bool = False, plan_only: bool = False,
            gpus: list[tuple[str, Gpu]] | None = None, source: str | None = None) -> pl.DataFrame | None:
    """Run every model over the same questions: `cfg` with each model's own [model] settings (an Entry of a
    models file, batch/compare/models_file.py; a plain name keeps cfg's), each model's run freezing its own. On
    GPUs (`gpus`: (id, facts); default this machine's, `gpu_facts`) packed by memory need (batch/compare/gpu_plan.py);
    on CPU one after another, or `parallel`: at once, one model per set of cores. The plan is printed
    first; `plan_only` stops there (returns None). Writes the comparison table (one row per model: quality
    and cost), the paired table (every pair x metric, batch/report/comparison.py `paired_table`), their
    Markdown and a plot; returns the comparison table. `source`: the models file, named by its errors."""
    entries = from_names(list(models)) if models and isinstance(models[0], str) else list(models)
    if len(entries) < 2:
        raise InputError("give at least two models to compare", field="--models")
    if len({e.name for e in entries}) < len(entries):
        raise InputError("two models would share one run directory (same folder name)", field="--models")
    where = {"path": source} if source else {"field": "--models"}
    for e in entries:  # before anything runs: a clash would surface only once every run had finished
        if clash := name_clash(e.name, [x.name for x in entries], f"model {e.model!r}",
                               " (`name`)" if source else " (a models file's `name`)", **where):
            raise clash
    configs = {e.name: e.config(cfg) for e in entries}
    gpus = gpu_facts() if gpus is None else gpus
    _check_on_device(entries, configs, [g for _, g in gpus], source)
    plan = None
    if gpus:  # each model's need gives its tensor_parallel_size: the one its run freezes (on Ray, its request)
        plan = gpu_plan.plan([_planned(e, configs[e.name]) for e in entries], [g for _, g in gpus])
        for p in plan.placements:
            if p.tp:
                c = configs[p.name]
                configs[p.name] = dataclasses.replace(c, model=dataclasses.replace(c.model, tensor_parallel_size=p.tp))
    if plan is not None and not cfg.cluster.ray_address:
        print(plan.text(), flush=True)
    else:
        plan = None  # Ray places and queues the runs itself
        print(_plan_text(configs, parallel), flush=True)
    if plan_only:
        return None
    check_out(out, [e.name for e in entries])
    check_own_dir(make_dirs(out), "comparison folder")
    write_json(cfg.recorded(), out / "config.json")  # the settings shared by every model (before its own)
    times = _launch(configs, out, parallel, verbose, plan, [i for i, _ in gpus])
    rows, metric_names, runs = [], [], []
    for e in entries:
        run_dir = out / e.name
        run = Run.open(run_dir)
        runs.append(run)
        summary, m = run.summary, run.config.model
        # a models file's `params` in place of the count the run read from the model's files (a served
        # model's run reads none: batch/compare/models_file.py)
        row = {"model": e.name if e.name != _slug(e.model) else e.model,
               "params": e.params if e.params is not None else summary.params,
               "run_dir": str(run_dir), "started": times[e.name]["started"], "finished": times[e.name]["finished"],
               "devices": times[e.name]["devices"],
               "n_questions": summary.n_questions,
               # the model's own settings, as its run froze them (a models file sets them per model)
               "dtype": (summary.engine and summary.engine.dtype) or m.dtype,
               "tensor_parallel_size": m.tensor_parallel_size, "max_model_len": m.max_model_len,
               "quantization": m.quantization or None, "chat_template": m.chat_template,
               # decoding constraints (batch/toc/constraints.py): the run's frozen config says, old runs too
               "constrain_format": run.config.toc.constrain_format,
               "constrain_quotes": run.config.answer.constrain_quotes,
               "prompt_tokens": summary.tokens.prompt, "output_tokens": summary.tokens.output,
               "valid_nodes_per_question": summary.valid_nodes_per_question,
               "parse_errors": summary.parse_errors, "cached_calls": summary.cached_calls}
        # cost: wall_s is every session up to its last checkpoint + finalize (None when a session's time was lost)
        row.update({k: v for k, v in cost_row(run).items() if k not in ("device", "devices")})
        for k, v in summary.metrics.items():
            row[k] = v if isinstance(v, int | float) else None
            if row[k] is not None and k != Metric.MISSING_PREDICTIONS and k not in metric_names:
                metric_names.append(k)
        for k, v in (summary.quote_fidelity.to_json() if summary.quote_fidelity else {}).items():
            if isinstance(v, int | float):
                row[f"quote_{k}"] = v
        rows.append(row)
    table = pl.DataFrame(rows, infer_schema_length=None)
    paired = paired_table(runs)
    write_parquet(table, out / "comparison.parquet")
    write_parquet(paired, out / "paired.parquet")
    write_text(_markdown(table) + "\npaired differences\n\n"
               + paired_markdown(paired), out / "comparison.md")
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


# Files a run directory holds as files, never a comparison folder (where a name of these is a model's run
# directory, a folder): batch/run/rundir.py
_RUN_FILES = (".lock", "inputs.json", "summary.json", "questions.parquet", *(f"{t}.parquet" for t in FINAL_TABLES))
# What other commands write into a comparison folder: `clarify report` of its runs, by default beside them
# (batch/report/html.py; docs/scale.md#comparing-models)
_BESIDE = ("report.html",)


def check_out(out: Path, names: list[str]) -> None:
    """`--out` is new, empty, or a comparison folder of these models or of an earlier compare into it (its
    runs resume): it holds only what compare writes there (`COMPARE_FILES`, each model's run directory and
    `<name>.log`, the models of `models/<name>.json`; the report of its runs). Anything else, a run
    directory above all, is refused in one line before anything is written: compare writes its own config.json and tables at the top of
    --out, which would replace a run's frozen config (docs/scale.md#comparing-models)."""
    if not out.is_dir():
        return  # new (make_dirs makes it), or not a folder (make_dirs says so)
    top = sorted(p.name for p in out.iterdir())
    run_files = [n for n in top if n in _RUN_FILES and (out / n).is_file()]
    if run_files:
        raise InputError(f"is a run directory (it holds {', '.join(run_files[:3])}), not a comparison folder: "
                         f"clarify compare writes its own config.json and tables into --out, so give it a new "
                         f"--out", path=str(out))
    models = out / "models"  # the models an earlier compare into this folder ran: their runs are its own
    earlier = [p.stem for p in models.glob("*.json")] if models.is_dir() else []
    own = {*COMPARE_FILES, *_BESIDE, *(f for n in [*names, *earlier] for f in (n, f"{n}.log"))}
    # a temp file of compare's own (files.write_atomic: `.NAME.tmpXXXX`) left by a killed compare
    foreign = [n for n in top if n not in own
               and not (n.startswith(".") and n[1:].split(".tmp", 1)[0] in own and ".tmp" in n)]
    if foreign:
        raise InputError(f"holds files clarify compare did not write ({', '.join(foreign[:3])}"
                         f"{' ...' if len(foreign) > 3 else ''}): give compare a new or empty --out, or the "
                         f"--out of an earlier compare to resume it", path=str(out))


def _planned(entry: Entry, cfg: RunConfig) -> gpu_plan.Model:
    """A model as the GPU planner sees it: its folder's shape (None for a server's model) and settings; a
    tensor_parallel_size the entry does not set is the planner's to choose."""
    from clarify.local_llm import backends
    from clarify.local_llm.models import config_dtype, resolve_model
    from clarify.local_llm.preflight import ModelShape
    from clarify.local_llm.settings import Ask, ask_of

    m = cfg.model
    if not backends.get(m.backend).uses_gpus:
        return gpu_plan.Model(entry.name, None, Ask(model=m.model))
    path = resolve_model(m.model)
    return gpu_plan.Model(entry.name, ModelShape.of(path), ask_of(
        m, model=str(path), model_dtype=config_dtype(path),
        tensor_parallel_size=m.tensor_parallel_size if "tensor_parallel_size" in entry.settings else 0))


def _check_on_device(entries: list[Entry], configs: dict[str, RunConfig], gpus: list[Gpu],
                     source: str | None = None) -> None:
    """Every model's [model] settings through the one settings table for this machine (GPUs, else CPU)
    before anything starts: one line per model it refuses (a quantization on CPU, bfloat16 below sm_80)."""
    from clarify.local_llm import backends
    from clarify.local_llm.settings import Device, ask_of, engine_settings

    device = (Device("cuda", capability=gpus[0].capability, name=gpus[0].name, count=len(gpus)) if gpus
              else Device("cpu"))
    bad = []
    for e in entries:
        m = configs[e.name].model
        if not backends.get(m.backend).uses_gpus:
            continue
        try:
            engine_settings(device, ask_of(m))
        except InputError as exc:
            bad.append(f"model {e.name!r}: {exc}")
    where = {"path": source} if source else {"field": "--models"}
    if len(bad) == 1:
        raise InputError(bad[0], **where)
    if bad:
        raise InputError(f"{len(bad)} models cannot run here:\n" + "\n".join(f"  {b}" for b in bad), **where)


def _plan_text(configs: dict[str, RunConfig], parallel: bool) -> str:
    """The plan without a GPU plan of this machine: a Ray cluster's placement, or this machine's CPU cores."""
    names = list(configs)
    if any(c.cluster.ray_address for c in configs.values()):
        lines = ["plan: every model at once on the Ray cluster, which places and queues them; each worker's request:"]
        for n, c in configs.items():
            tp = c.model.tensor_parallel_size
            lines.append(f"  {n}: " + ("num_gpus 1" if tp == 1 else f"a placement group of {tp} x {{GPU: 1, CPU: 1}}")
                         + f" (tensor_parallel_size {tp}; batch/run/cluster.py), or its own cores on a CPU cluster")
        return "\n".join(lines)
    if not parallel:
        return f"plan: no GPU; {len(names)} models one after another: " + ", ".join(names)
    return "plan: no GPU; every model at once, each on its own CPU cores (VLLM_CPU_OMP_THREADS_BIND): " + ", ".join(names)


def _markdown(table: pl.DataFrame) -> str:
    """One row per measure, one column per model (readable however many metrics there are)."""
    models = table["model"].to_list()
    lines = ["| measure | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for col in table.columns:
        if col in ("model", "run_dir", "started", "finished", "devices"):
            continue
        cells = [f"{v:.3f}" if isinstance(v, float) else ("—" if v is None else str(v)) for v in table[col]]
        lines.append(f"| {col} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
