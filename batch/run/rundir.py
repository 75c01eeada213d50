"""Run directories: a frozen config, finished trees in parts (written to a temp name and renamed), the
final tables and the completion cache. Resume = keep the finished trees, replay the others against the
completion cache (no engine call up to where the run stopped: batch/run/scheduler.py).

    runs/NAME/.lock                  flock held by the one process working here; holds its pid and host
    runs/NAME/config.json            frozen effective config (a different config for the same name is an error)
    runs/NAME/inputs.json            what the run reads, pinned with the config: the questions file's
                                     sha256, the model's and the index's fingerprints, and the prompts'
                                     (batch/run/records.py RunInputs, batch/toc/fingerprint.py)
    runs/NAME/questions.parquet
    runs/NAME/parts/0001/            finished trees, appended as they finish (a part is renamed into place
        when complete): llm_calls.parquet hits.parquet answers.parquet state.json (those trees, JSON; the
        sha256 of each Parquet file and a checksum of itself, verified on resume; `ran_on`: the worker,
        node and chunk of a cluster run)
    runs/NAME/cache/                 completion cache (clarify.local_llm.cache): completions.sqlite, and
                                     worker-NN.sqlite of a cluster run's workers (batch/run/cluster.py)
    runs/NAME/{nodes,hits,llm_calls,answers,spans,passages,scores}.parquet   final tables
    runs/NAME/summary.json           written last: its presence means the run is finished (RunSummary)
    runs/NAME/logs/                  one log file per session: library logs, warnings, native output (console.py);
                                     progress.jsonl: the ToC loop's samples, every 30 s of every session
                                     (console.py RunProgress `record`: trees, engine calls, tokens, memory)

Every file is written to a temp name, fsynced and renamed (POSIX rename is atomic: files.py); nothing
is ever deleted to make room for its replacement. The config and inputs are binding once a checkpoint
exists: a failed start (nothing computed yet) never blocks its own directory. config.json is written
first, so a directory holding what a run made (inputs, parts, tables) but no config.json has lost it:
refused as damaged (`RunDir.freeze`), never resumed under whatever config comes next; --restart starts it
over.

`RunDir` writes a run directory; `Run.open` reads one — the one reader of the report, `clarify eval`
on a run, `compare`, the demo's answer printout and a finished run's re-run: the frozen config as a
`RunConfig`, `summary.json`, every table checked against `schemas` as it is read, and the parts' states.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import polars as pl

from clarify import console, faults, jsonl, schemas
from clarify.batch.config import from_dict
from clarify.batch.run.records import PartState, Pin, RanOn, RunInputs, RunSummary, read_json
from clarify.batch.toc import fingerprint
from clarify.batch.toc.tree import Tree
from clarify.errors import InputError
from clarify.files import (
    check_own_dir,
    make_dirs,
    open_own,
    read_holder,
    widen_mode,
    write_holder,
    write_json,
    write_parquet,
)
from clarify.files import fsync as _fsync
from clarify.files import sha256 as file_sha256

# The schema (clarify.schemas) each table file of a run directory is checked against when read.
TABLE_SCHEMAS = {"questions": "questions", "nodes": "nodes", "hits": "run_hits", "llm_calls": "llm_calls",
                 "answers": "answers", "spans": "spans", "passages": "passages", "scores": "scores"}
# Written by finalize (questions.parquet comes first, when the run starts)
FINAL_TABLES = tuple(name for name in TABLE_SCHEMAS if name != "questions")
# The tables of a checkpoint part (parts/NNNN/), each the rows of one record of a finished tree (TreeRows'
# attribute of that name), concatenated by finalize
PART_TABLES = {"llm_calls": schemas.LlmCall, "hits": schemas.RunHit, "answers": schemas.TreeAnswer}
WAVES = "waves"  # checkpoints of clarify before continuous scheduling: refused, and removed by --restart


class Checkpoint(NamedTuple):
    """What the parts written so far hold (`RunDir.load_state`)."""

    parts: int
    trees: list[Tree]  # the finished trees, in the order they were written
    run_s: float | None  # the run's seconds up to the last part (None: unknown)
    engine: dict | None  # the engine's facts (device, dtype) when a real engine ran


def _state_checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()


def input_changes(old: dict[str, Pin], new: dict[str, Pin]) -> list[str]:
    """What differs between two inputs.json's pins (RunInputs.pins): by content (sha256, fingerprint), never
    by path alone, so a run directory or model folder that was moved still resumes."""
    old, new = RunInputs(old).pins, RunInputs(new).pins  # a caller's JSON objects read as Pins
    out = []
    for what, before in sorted(old.items()):
        now = new.get(what) or Pin()
        for key, was, became in (("sha256", before.sha256, now.sha256),
                                 ("fingerprint", before.fingerprint, now.fingerprint)):
            if was and became and was != became:
                where = now.path or before.path or ""
                out.append(f"{what} {where} changed ({key} {was[:12]} → {became[:12]})")
    return out


def config_changes(old: dict, new: dict, ignore: tuple[str, ...] = (), source: str = "config.json") -> list[str]:
    """What differs between a run directory's config.json (`old`, as any clarify wrote it) and this run's
    (`new`), setting by setting ("toc.max_depth: 3 → 2"); `ignore`: settings that never change results.
    Both are read as a RunConfig first (batch/config/load.py from_dict), so a setting an older config.json lacks
    reads as its declared default: what clarify did before the setting existed (tests/test_run_records.py
    holds that to a config.json written by an older clarify). A key this clarify does not know (a setting
    since removed) or a value it refuses is an InputError in one line, naming it."""
    try:
        a, b = (_without(json.loads(from_dict(c, source=source).to_json()), ignore) for c in (old, new))
    except InputError as exc:
        raise InputError(f"{exc}; the run directory was made by a clarify with other settings than this one's: "
                         f"finish it with that clarify, or use a new --out, or rerun with --restart") from None
    return _diff(a, b)


def _without(config: dict, ignore: tuple[str, ...]) -> dict:
    """`config` less the settings named in `ignore`: a top-level key, or `table.key` for one field of a table."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    for name in ignore:
        table, _, key = name.rpartition(".")
        target = out.get(table) if table else out
        if isinstance(target, dict):
            target.pop(key, None)
    return out


def _diff(a: object, b: object, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: {a!r} → {b!r}"]


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise InputError("run directory path exists and is not a directory", path=str(self.path))

    # Every path of the layout (the module docstring) is named here; the rest of clarify asks for them.
    @property
    def cache_dir(self) -> Path:
        return self.path / "cache"

    @property
    def config_file(self) -> Path:
        return self.path / "config.json"

    @property
    def inputs_file(self) -> Path:
        return self.path / "inputs.json"

    @property
    def summary_file(self) -> Path:
        return self.path / "summary.json"

    @property
    def lock_file(self) -> Path:
        return self.path / ".lock"

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def progress_record(self) -> Path:
        return self.logs_dir / "progress.jsonl"

    @property
    def parts_dir(self) -> Path:
        return self.path / "parts"

    @property
    def report_file(self) -> Path:
        return self.path / "report.html"

    @property
    def is_run(self) -> bool:
        """A folder is a run directory when it holds config.json: what `Run.open` requires, and what
        `enclosing_run` looks for above a file another command would write."""
        return self.config_file.is_file()

    def table_file(self, name: str) -> Path:
        return self.path / f"{name}.parquet"

    @staticmethod
    def worker_name(slot: int) -> str:
        """A cluster worker's name: its log files' prefix and its completion cache's stem (batch/run/cluster.py)."""
        return f"worker-{slot:02d}"

    @classmethod
    def worker_cache(cls, slot: int) -> str:
        """A cluster worker's completion cache file, in `cache_dir` (SQLite is never written from two hosts)."""
        return f"{cls.worker_name(slot)}.sqlite"

    @property
    def finished(self) -> bool:
        """summary.json and every final table are there (a table deleted since is rebuilt from the parts
        and the completion cache by the next run of the command, with no engine: batch/run/pipeline.py)."""
        return self.summary_file.exists() and all(self.table_file(name).exists() for name in FINAL_TABLES)

    @contextlib.contextmanager
    def lock(self):
        """Hold the run directory for this process (fcntl.flock on `.lock`: the kernel frees it when the
        holder dies, so a stale lock never blocks). A second process is refused, naming the holder. A
        directory of another user is refused (clarify writes only into its own); a new one is
        private (files.make_dirs); `.lock` is never opened through a link, nor truncated."""
        try:
            make_dirs(self.path)
        except OSError as exc:  # a file on the way, no permission, read-only file system
            raise InputError(f"cannot use as a run directory: {exc.strerror or exc}", path=str(self.path)) from None
        check_own_dir(self.path, "run directory")
        try:
            fd = open_own(self.lock_file)
        except OSError as exc:  # a planted link, another user's file, a read-only file system
            raise InputError(f"cannot use as a run directory: {exc.strerror or exc}",
                             path=str(self.lock_file)) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise InputError(f"this run directory is in use by {read_holder(fd)}; wait for it to finish, or "
                                 f"use another --out", path=str(self.path)) from None
            write_holder(fd)
            yield self
        finally:
            os.close(fd)  # releases the flock

    def has_checkpoint(self) -> bool:
        return self.finished or bool(self.part_dirs()) or (self.path / WAVES).exists()

    def own_files(self) -> list[str]:
        """The files of this layout that a run writes only once its config is frozen (`freeze` writes
        config.json first) and that hold what that config made, by name: inputs.json, questions.parquet,
        parts/, the final tables, summary.json, the wave folders of an older clarify. Not `.lock` nor logs/,
        made before the freeze, nor cache/: its keys name model, prompt and parameters, so its rows are valid
        under any config (a cache put in a new run directory, or kept by --restart, is simply used)."""
        names = [self.inputs_file, self.table_file("questions"), self.parts_dir, self.path / WAVES,
                 *(self.table_file(n) for n in FINAL_TABLES), self.summary_file]
        return [p.name for p in names if p.exists() or p.is_symlink()]

    def freeze(self, config: dict, inputs: RunInputs | dict, ignore: tuple[str, ...] = ()) -> None:
        """Pin config.json and inputs.json (`RunInputs`, or its pins alone). Once a checkpoint exists they are
        binding: another config, a changed input or, while trees remain to be made, other prompts
        (batch/toc/fingerprint.py) are refused, naming the difference. Before that (a failed start) they are
        simply rewritten. A directory holding what a run made but no config.json is refused as damaged
        (`own_files`). `ignore`: settings that never change results (the scheduler; `model.max_retries`): a
        resumed run may change them, and config.json records the latest."""
        if not isinstance(inputs, RunInputs):
            inputs = RunInputs(dict(inputs))
        cfg_path, in_path = self.config_file, self.inputs_file
        found = [] if cfg_path.exists() else self.own_files()
        if found:
            # config.json is written before anything else of the run (below), so a directory with the run's
            # files but without it lost it since: nothing left says which settings made those trees, and a
            # resume would mix them with the new ones (docs/reproducibility.md#the-run-directory)
            raise InputError(f"damaged run directory: it holds {', '.join(found[:4])}"
                             f"{' ...' if len(found) > 4 else ''} but no config.json (the settings it was started "
                             f"with), so it cannot be resumed; rerun with --restart to start over (the completion "
                             f"cache is kept), or use a new --out", path=str(self.path))
        if cfg_path.exists() and self.has_checkpoint():
            restart = "use a new --out, or rerun with --restart to start over (the completion cache is kept)"
            raw = _json_object(cfg_path, f"restore it, or {restart}")
            diffs = config_changes(raw, config, ignore, source=str(cfg_path))
            if diffs:
                raise InputError("this run directory was made with another config; use the same settings, or "
                                 f"{restart}. Differences: " + "; ".join(diffs), path=str(cfg_path))
            if raw != config:  # only settings in `ignore` (or added since) differ: record the latest
                write_json(config, cfg_path)
            pinned = RunInputs.read(in_path, f"restore it, or {restart}")
            changed = input_changes(pinned.pins, inputs.pins)
            if changed:
                raise InputError("the inputs of this run changed since it started: " + "; ".join(changed)
                                 + f"; restore them, or {restart}", path=str(self.path))
            if not self.finished:  # a finished run makes no tree: it is only read back
                self._check_prompts(pinned, inputs)
            return
        # config.json first: a start stopped between the two leaves a config.json and no checkpoint, which the
        # next start rewrites; never the run's files without the config that made them (see above)
        write_json(config, cfg_path)
        faults.point("freeze")
        inputs.write(in_path)

    def _check_prompts(self, pinned: RunInputs, inputs: RunInputs) -> None:
        """The run's trees so far were made by the prompts, parser, grammars, stop strings and quote checker
        pinned in inputs.json: other ones would finish the rest differently, so the resume is refused. A run
        directory pinned before the fingerprint existed resumes unchecked, said once, and records it now."""
        if inputs.prompts is None:  # a caller that pins no prompts (tests of the layout)
            return
        if pinned.prompts is None:
            console.note("unpinned-prompts", f"{self.path} was started by a clarify that did not record its prompts "
                                             f"in inputs.json: resumed without checking them; they are recorded now")
            if os.access(self.path, os.W_OK):  # a read-only archive is only read
                dataclasses.replace(pinned, prompts=inputs.prompts, schema_version=inputs.schema_version).write(
                    self.inputs_file)
            return
        changed = fingerprint.changed(pinned.prompts, inputs.prompts)
        if changed:
            raise InputError(f"this run was started with other prompts: {', '.join(changed)} changed since; its "
                             f"finished trees would mix with trees made by the new code. Rerun with --restart to "
                             f"start over (the completion cache is kept), or finish it with the clarify that "
                             f"started it", path=str(self.inputs_file))

    def clear(self) -> None:
        """`--restart`: remove everything the run wrote except the completion cache (content-addressed:
        its keys name model, prompt and parameters, so every row stays valid). The finished mark goes
        first and the wave folders are renamed away in one step, so a crash midway leaves a directory
        that resumes or restarts again, never a mix."""
        self.summary_file.unlink(missing_ok=True)
        for name in (self.parts_dir.name, WAVES):
            if (self.path / name).exists():
                trash = self.path / f".{name}.trash{os.getpid()}"
                os.replace(self.path / name, trash)
                faults.point("restart-cleared")
                shutil.rmtree(trash)
        for name in TABLE_SCHEMAS:
            self.table_file(name).unlink(missing_ok=True)
        for path in (self.inputs_file, self.config_file):
            path.unlink(missing_ok=True)

    def write_table(self, name: str, df: pl.DataFrame) -> Path:
        path = self.table_file(name)
        write_parquet(df, path)
        return path

    # -- parts: finished trees -------------------------------------------------------------------
    def part_dirs(self) -> list[Path]:
        root = self.parts_dir
        if not root.exists():
            return []
        return sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())

    def write_part(self, tables: dict[str, pl.DataFrame], trees: list[Tree], run_s: float | None = None,
                   engine: dict | None = None, ran_on: RanOn | None = None) -> int:
        """Finished trees and all their rows, made visible at once by renaming the folder; returns the
        part's number. state.json holds the sha256 of each table and a checksum of itself (verified by
        `load_state`). Nothing already written is rewritten: a run of N trees writes each tree once.

        run_s: the run's wall seconds up to this part, summed over the sessions that got it here (a
        resumed session starts from the last part's run_s; time lost to a crash is not counted).
        engine: the engine's facts (device, dtype), for a session that finalizes without loading it.
        ran_on: where the trees ran (a cluster run's worker, node and chunk: batch/run/cluster.py)."""
        dirs = self.part_dirs()
        n = int(dirs[-1].name) + 1 if dirs else 1
        final = self.parts_dir / f"{n:04d}"
        make_dirs(final.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{n:04d}.tmp", dir=final.parent))  # 0700, a fresh name
        widen_mode(tmp, folder=True)
        files = {}
        for name, df in tables.items():
            df.write_parquet(tmp / f"{name}.parquet")
            _fsync(tmp / f"{name}.parquet")
            files[f"{name}.parquet"] = file_sha256(tmp / f"{name}.parquet")
        body = {"part": n, "run_s": run_s, "trees": [t.to_dict() for t in trees], "files": files, "engine": engine,
                **({"ran_on": ran_on.to_json()} if ran_on else {})}
        (tmp / "state.json").write_text(json.dumps({**body, "checksum": _state_checksum(body)}), encoding="utf-8")
        _fsync(tmp / "state.json")
        _fsync(tmp)
        faults.point(f"part-tmp:{n}")
        os.replace(tmp, final)  # a folder renamed onto a name that does not exist: atomic
        _fsync(final.parent)
        return n

    def load_state(self) -> Checkpoint | None:
        """The finished trees of every part, or None for a fresh run. Every part is verified first
        (`verify_part`): a damaged one raises InputError in one line. Half-written temp folders are removed
        (the caller holds the lock)."""
        if (self.path / WAVES).exists():
            raise InputError("this run directory was written by an older clarify (wave checkpoints); rerun with "
                             "--restart: the completion cache is kept, so the work done replays without model "
                             "calls", path=str(self.path / WAVES))
        for pattern, root in ((".*.tmp*", self.parts_dir), (".*.trash*", self.path)):
            for p in root.glob(pattern) if root.exists() else []:
                shutil.rmtree(p, ignore_errors=True)
        dirs = self.part_dirs()
        if not dirs:
            return None
        trees, state = [], PartState()
        for d in dirs:
            state = PartState.of(verify_part(d))
            trees += [Tree.from_dict(t) for t in state.trees]
        return Checkpoint(len(dirs), trees, state.run_s, state.engine)

    def part_table(self, name: str) -> pl.DataFrame:
        """The parts' table `name` (PART_TABLES), concatenated; empty, with its schema, before any part."""
        frames = [pl.read_parquet(d / f"{name}.parquet") for d in self.part_dirs()
                  if (d / f"{name}.parquet").exists()]
        frames = [f for f in frames if f.height]
        if not frames:
            return pl.DataFrame(schema=schemas.table_schema(PART_TABLES[name]))
        return pl.concat(frames, how="diagonal_relaxed")


def verify_part(d: Path) -> dict:
    """A part's state, after checking state.json against its checksum and each table against its sha256.
    Damage (a truncated file, a hand edit) raises InputError naming the file and what to do."""
    def damaged(what: str, why: str) -> InputError:
        return InputError(f"damaged checkpoint: {why}. Delete the folder {d} to redo its trees from the "
                          f"completion cache, or rerun with --restart", path=str(d / what))

    if not (d / "state.json").is_file():
        raise damaged("state.json", "the file is missing")
    try:
        state = jsonl.read_json(d / "state.json")
    except InputError:  # bad JSON, not UTF-8, empty, over the size cap: all a write cut short
        raise damaged("state.json", "not valid JSON (truncated?)") from None
    if not isinstance(state, dict) or not {"part", "trees", "checksum"} <= set(state):
        raise damaged("state.json", "not a part's state")
    body = {k: v for k, v in state.items() if k != "checksum"}
    if _state_checksum(body) != PartState.of(state).checksum:
        raise damaged("state.json", "its content does not match its checksum (edited or altered)")
    for name, sha in PartState.of(body).files.items():
        if not (d / name).is_file():
            raise damaged(name, "the file is missing")
        if file_sha256(d / name) != sha:
            raise damaged(name, "the file does not match its sha256 in state.json (truncated or altered)")
    return state


class Run:
    """A run directory, read (`Run.open`): what the writer `RunDir` left there, checked on the way in.

    config: the frozen `RunConfig`; settings: config.json as written (for display); summary: summary.json
    as its record `RunSummary` (None while the run is unfinished); tables by name (`run.table("answers")` or `run.answers`), read on
    first use and checked against `TABLE_SCHEMAS` — a file that is there but unreadable or lacks a column
    is an InputError naming the file and the column; a table not written (yet) is an empty frame with
    its schema, and its file is listed in `missing`."""

    def __init__(self, path: Path, config, settings: dict, summary: RunSummary | None):
        self.path, self.config, self.settings, self.summary = path, config, settings, summary
        self.name = str(summary and summary.name or path.name)
        self.layout = RunDir(path)
        self.missing = [f"{n}.parquet" for n in TABLE_SCHEMAS if not self.layout.table_file(n).is_file()]
        self._tables: dict[str, pl.DataFrame] = {}

    @classmethod
    def open(cls, path: str | Path) -> Run:
        path = Path(path)
        if not path.is_dir():
            raise InputError("not a run directory (no such folder)", path=str(path))
        layout = RunDir(path)
        cfg_path = layout.config_file
        if not layout.is_run:
            raise InputError("not a run directory: config.json is missing", path=str(path))
        settings = _json_object(cfg_path, "restore it, or start the run again with --restart")
        config = from_dict(settings, source=str(cfg_path))
        summary = (RunSummary.read(layout.summary_file, "delete it to rewrite the final tables from the parts")
                   if layout.summary_file.is_file() else None)
        return cls(path, config, settings, summary)

    @property
    def key(self) -> Path:
        """What identifies the run: its folder with every symlink resolved (two paths to one folder are one run;
        two folders of the same name are two). Runs are labelled by `run_labels`, never by name alone."""
        return Path(os.path.realpath(self.path))

    @property
    def finished(self) -> bool:
        return self.summary is not None

    def table(self, name: str, *, required: bool = False) -> pl.DataFrame:
        """The table `name` (TABLE_SCHEMAS), checked. `required`: an absent file is an InputError."""
        if name not in TABLE_SCHEMAS:
            raise KeyError(f"no table {name!r} in a run directory (tables: {', '.join(TABLE_SCHEMAS)})")
        if name not in self._tables:
            path = self.layout.table_file(name)
            if not path.is_file():
                if required:
                    raise InputError(f"the run has no {name}.parquet (has it finished?)", path=str(self.path))
                return schemas.empty(TABLE_SCHEMAS[name])
            try:
                df = pl.read_parquet(path)
            except Exception as exc:  # polars raises several error types for a broken file
                raise InputError(f"cannot read Parquet: {exc}", path=str(path)) from None
            try:
                schemas.check(df, TABLE_SCHEMAS[name])
            except schemas.SchemaError as exc:
                raise InputError(str(exc), path=str(path), field=exc.columns[0]) from None
            self._tables[name] = df
        return self._tables[name]

    def __getattr__(self, name: str) -> pl.DataFrame:
        if name in TABLE_SCHEMAS:
            return self.table(name)
        raise AttributeError(name)

    def parts(self) -> list[PartState]:
        """Every part's verified state (`verify_part`): its trees, tables' checksums, and for a cluster
        run `ran_on` (worker, node, question ids)."""
        return [PartState.of(verify_part(d)) for d in RunDir(self.path).part_dirs()]


def enclosing_run(path: str | Path) -> Path | None:
    """The innermost run directory (`RunDir.is_run`) that holds `path` or a folder above it, symlinks resolved;
    None when there is none. A file written there by another command would replace a run's own file."""
    real = Path(os.path.realpath(path))
    return next((d for d in real.parents if RunDir(d).is_run), None)


def check_distinct(paths: list[str | Path]) -> None:
    """InputError, in one line naming both arguments, when two of `paths` are the same folder once symlinks
    are resolved (`Run.key`): the same run would be compared with itself."""
    seen: dict[str, str | Path] = {}
    for p in paths:
        real = os.path.realpath(p)
        if real in seen:
            same = "" if os.path.abspath(seen[real]) == real == os.path.abspath(p) else f" ({real})"
            raise InputError(f"{seen[real]} and {p} are the same run directory{same}: name each run once")
        seen[real] = p


def run_labels(paths: list[str | Path]) -> list[str]:
    """How each run is named in a comparison: its folder's name, or, where runs share it (`cmpA/smollm2` and
    `cmpB/smollm2`), the shortest end of its path (absolute, symlinks as given) that no other run's path
    ends with. The runs must be distinct folders (`check_distinct`), so every label is different."""
    check_distinct(paths)
    parts = [Path(os.path.abspath(p)).parts for p in paths]
    labels = []
    for i, own in enumerate(parts):
        k = next(k for k in range(1, len(own) + 1)
                 if all(own[-k:] != other[-k:] for j, other in enumerate(parts) if j != i))
        labels.append(str(Path(*own[-k:])))
    return labels


def _json_object(path: Path, what_to_do: str) -> dict:
    data = read_json(path, what_to_do)
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, got {type(data).__name__}", path=str(path), line=1)
    return data
