"""`CachedEngine`: a content-addressed, durable completion cache in front of any Engine
(docs/architecture.md#engines-and-the-completion-cache).

Key: `request_key(model_id, prompt, params)` (sha256). Only misses reach the inner engine, all of
them in ONE `generate` call; a second identical run makes zero engine calls.

Storage: one SQLite file in WAL mode. Why not one file per key: a benchmark run writes hundreds of
thousands of small entries, and SQLite gives atomic multi-row commits (a whole batch of misses is
committed at once or not at all), crash safety by its journal (a process killed mid-write leaves the
last committed state; the half-written transaction is rolled back on the next open), concurrent
readers beside a writer (WAL), and one file to copy. `synchronous=NORMAL` in WAL mode loses at most
the last transactions on a power cut, never consistency.

Corruption that SQLite cannot see (a row altered on disk, a bad copy) is caught by a checksum:
each row stores sha256(key + payload); a row whose checksum does not match is counted in
`corrupt` (and by reason in `corrupt_reasons`), treated as a miss, recomputed and overwritten; a run
reports the count in summary.json (`cache_recomputed`) and its terminal summary. A file that is not a SQLite database at all
raises an error naming the path (never silently deleted: it may be someone else's file).

Rows: key, model_id, prompt, params (JSON), payload (JSON: texts, finish_reason, prompt_tokens,
output_tokens), checksum, created (unix time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clarify import faults, stops
from clarify.errors import EngineUnavailable, InputError
from clarify.files import make_dirs, open_own
from clarify.local_llm.engine import Completion, Engine, GenParams, Request, as_step_engine, request_key

_SCHEMA = """
CREATE TABLE IF NOT EXISTS completions (
    key TEXT PRIMARY KEY,
    model_id TEXT NOT NULL,
    prompt TEXT NOT NULL,
    params TEXT NOT NULL,
    payload TEXT NOT NULL,
    checksum TEXT NOT NULL,
    created REAL NOT NULL
)
"""
_CHUNK = 500  # keys per SELECT (SQLite's variable limit is 32766; smaller keeps statements short)


def _checksum(key: str, payload: str) -> str:
    return hashlib.sha256((key + "\n" + payload).encode("utf-8")).hexdigest()


def _payload(c: Completion) -> str:
    return json.dumps(
        {
            "texts": list(c.texts),
            "finish_reason": c.finish_reason,
            "prompt_tokens": c.prompt_tokens,
            "output_tokens": c.output_tokens,
        },
        ensure_ascii=False,
        sort_keys=True,
    )


def _completion(payload: str) -> Completion:
    d = json.loads(payload)
    return Completion(
        texts=tuple(d["texts"]),
        finish_reason=d["finish_reason"],
        prompt_tokens=int(d["prompt_tokens"]),
        output_tokens=int(d["output_tokens"]),
        cached=True,
    )


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    engine_calls: int = 0  # calls of the inner engine's generate
    corrupt: int = 0  # entries whose checksum failed or payload was unreadable (recomputed)
    commits: int = 0  # grouped commits of the step loop
    corrupt_reasons: dict[str, int] = field(default_factory=dict)  # why, for each corrupt entry

    def note_corrupt(self, reason: str) -> None:
        self.corrupt += 1
        self.corrupt_reasons[reason] = self.corrupt_reasons.get(reason, 0) + 1

    def as_dict(self) -> dict:
        return asdict(self)

    def recomputed(self) -> dict:
        """{"rows": n, "reasons": {reason: n}}: rows found corrupt and recomputed (summary.json)."""
        return {"rows": self.corrupt, "reasons": dict(self.corrupt_reasons)}


def union_of(folder: Path, own: Path) -> list[Path]:
    """The other completion caches of a run directory's cache folder (`own` excluded): the workers of a
    Ray run each write their own file (SQLite is never written from two hosts: batch/run/cluster.py), and a
    later run reads all of them."""
    return sorted(p for p in Path(folder).glob("*.sqlite") if p.resolve() != Path(own).resolve())


def read_only_uri(path: str | os.PathLike) -> str:
    """The SQLite URI that opens `path` read-only. The path is percent-encoded (pathlib's `as_uri`): a
    `#` or `?` in a file name would otherwise end the path, and `w#x.sqlite` would open `w` read-write
    (https://www.sqlite.org/uri.html)."""
    return Path(path).resolve().as_uri() + "?mode=ro"


def unusable(path: str | os.PathLike, exc: Exception) -> InputError:
    """The one-line error for a completion cache that SQLite cannot read, with what to do about it."""
    return InputError(f"not a usable completion cache ({exc}); move it aside (mv '{path}' '{path}.bad') and run "
                      f"again: the completions it held are computed anew", path=str(path))


# SQLite's result codes for a failed write (https://www.sqlite.org/rescode.html), as the OSError a
# failed file write gives, so the command line says both the same way (errors.write_failure).
_SQLITE_ERRNO = {"SQLITE_FULL": errno.ENOSPC, "SQLITE_READONLY": errno.EROFS, "SQLITE_CANTOPEN": errno.EACCES}


def _write_error(exc: sqlite3.OperationalError, path: Path) -> Exception:
    code = getattr(exc, "sqlite_errorname", "") or ""
    for name, number in _SQLITE_ERRNO.items():
        if code.startswith(name):
            return OSError(number, f"{os.strerror(number)} ({exc})", str(path))
    return exc


def check_caches(folder: str | os.PathLike) -> None:
    """Every completion cache in a run's cache folder opens and has the completions table: checked
    before the run directory is written and before the engine loads (a damaged cache was found only
    after the model had loaded). Reads one row of each, never the whole file."""
    for p in sorted(Path(folder).glob("*.sqlite")):
        if p.stat().st_size == 0:  # made, then stopped before SQLite wrote to it: it starts empty
            continue
        # With no -wal file beside it (closed cleanly) the file is the whole database: read it as immutable,
        # which makes no -shm or -wal file (a finished run's folder is left as it was). A -wal file (a
        # crash) holds committed rows: read through it, unless the file system is read-only, where SQLite
        # cannot open it that way (no writer can be there: immutable then).
        uri, whole = read_only_uri(p), not os.path.exists(f"{p}-wal")
        try:
            try:
                _read_one(uri + "&immutable=1" if whole else uri)
            except sqlite3.OperationalError as exc:
                if whole or not (getattr(exc, "sqlite_errorname", "") or "").startswith("SQLITE_CANTOPEN"):
                    raise
                _read_one(uri + "&immutable=1")
        except sqlite3.DatabaseError as exc:
            raise unusable(p, exc) from None


def _read_one(uri: str) -> None:
    con = sqlite3.connect(uri, uri=True, timeout=60)
    try:
        con.execute("SELECT key, payload, checksum FROM completions LIMIT 1").fetchone()
    finally:
        con.close()


def _create_private(p: Path) -> None:
    """The cache's folders and, when new, its file, with the private modes of files.py (every prompt and
    completion is in it; SQLite gives its -wal and -shm files the database file's mode).

    A new file appears under its name with its table already in it: it is made under a hidden temporary
    name, given the schema and WAL mode, then linked into place. The workers of a cluster run start side
    by side in one cache folder and each reads the others' `*.sqlite` (`union_of`); a file created empty
    and given its table a moment later was seen in between by a starting worker as "no such table:
    completions", which stopped the run."""
    try:
        make_dirs(p.parent)
        if os.path.lexists(p):
            return
        tmp = p.with_name(f".{p.name}.{os.getpid()}-{threading.get_ident()}.new")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # left by a process of this pid that died mid-creation
        os.close(open_own(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL))
        try:
            con = sqlite3.connect(tmp, isolation_level=None)
            try:
                con.execute("PRAGMA journal_mode=WAL")  # kept in the file's header (sqlite.org/wal.html)
                con.execute(_SCHEMA)
            finally:
                con.close()
            try:
                os.link(tmp, p)  # never replaces a file another process linked first
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links: rename, unless the name was taken meanwhile
                if not os.path.lexists(p):
                    os.rename(tmp, p)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except sqlite3.DatabaseError as exc:
        raise unusable(p, exc) from exc
    except OSError as exc:
        raise InputError(f"cannot make a completion cache here: {exc.strerror or exc}", path=str(p)) from None


DEFAULT_FILE = "completions.sqlite"  # a run's own cache in its cache/ folder (batch/run/rundir.py)


class CachedEngine:
    """Engine wrapper: `CachedEngine(engine, path)`; `path` is the SQLite file (a directory is
    accepted too and gets `completions.sqlite` inside). `also`: other cache files, read (never
    written) when a key is not in this one: the union of a cluster run's per-worker caches."""

    def __init__(self, engine: Engine, path: str | os.PathLike, *, group_rows: int = 256, group_s: float = 1.0,
                 also: Sequence[str | os.PathLike] = ()):
        self.engine = engine
        p = Path(path)
        if p.is_dir() or (not p.suffix and not p.exists()):
            p = p / DEFAULT_FILE
        _create_private(p)
        self.path = p
        self.stats = CacheStats()
        self._lock = threading.Lock()
        # step-loop state: hits ready for the next step, misses in flight (key -> caller ids), returned
        # completions not yet committed (grouped commits: a SIGKILL loses at most the last group)
        self._ready: list[tuple[str, Completion]] = []
        self._waiting: dict[str, list[str]] = {}
        self._asked: dict[str, tuple[str, GenParams]] = {}
        self._unsaved: list[tuple[str, str, GenParams, Completion]] = []
        self._last_commit = time.monotonic()
        self.group_rows, self.group_s = group_rows, group_s
        self._stepper = as_step_engine(engine)
        try:
            self._db = sqlite3.connect(p, timeout=60, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise unusable(p, exc) from exc
        self._also = []
        for other in also:
            if os.path.getsize(other) == 0:
                continue  # an empty file holds no completions (left by a creation that stopped midway)
            try:
                con = sqlite3.connect(read_only_uri(other), uri=True, timeout=60, check_same_thread=False)
                con.execute("SELECT 1 FROM completions LIMIT 1").fetchone()  # a cache, not a table scan
            except sqlite3.DatabaseError as exc:
                raise unusable(other, exc) from exc
            self._also.append(con)

    @property
    def model_id(self) -> str:
        return self.engine.model_id

    # -- EngineInfo (local_llm/engine.py), forwarded: None where the wrapped engine cannot tell ------
    @property
    def max_model_len(self) -> int | None:
        return getattr(self.engine, "max_model_len", None)

    def count_tokens(self, prompt: str) -> int | None:
        count = getattr(self.engine, "count_tokens", None)
        return count(prompt) if count is not None else None

    def capacity(self) -> int | None:
        cap = getattr(self.engine, "capacity", None)
        return cap() if cap is not None else None

    def facts(self) -> dict | None:
        facts = getattr(self.engine, "facts", None)
        return facts() if facts is not None else None

    @property
    def engine_stats(self):
        return getattr(self.engine, "engine_stats", None)

    @property
    def on_progress(self):
        return getattr(self.engine, "on_progress", None)

    @on_progress.setter
    def on_progress(self, callback) -> None:
        if hasattr(self.engine, "on_progress"):
            self.engine.on_progress = callback

    # -----------------------------------------------------------------------------------------
    def _lookup(self, keys: Sequence[str]) -> dict[str, Completion]:
        found: dict[str, Completion] = {}
        for db in (self._db, *self._also):
            uniq = [k for k in dict.fromkeys(keys) if k not in found]
            if not uniq:
                break
            self._lookup_in(db, uniq, found)
        return found

    def _lookup_in(self, db: sqlite3.Connection, uniq: list[str], found: dict[str, Completion]) -> None:
        for i in range(0, len(uniq), _CHUNK):
            chunk = uniq[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            rows = db.execute(
                f"SELECT key, payload, checksum FROM completions WHERE key IN ({marks})", chunk
            ).fetchall()
            for key, payload, checksum in rows:
                if checksum != _checksum(key, payload):
                    self.stats.note_corrupt("checksum mismatch")
                    continue
                try:
                    found[key] = _completion(payload)
                except (ValueError, KeyError, TypeError):  # JSONDecodeError is a ValueError
                    self.stats.note_corrupt("unreadable payload")

    def _store(self, rows: list[tuple[str, str, GenParams, Completion]]) -> None:
        now = time.time()
        values = []
        for key, prompt, params, comp in rows:
            payload = _payload(comp)
            values.append(
                (key, self.model_id, prompt, json.dumps(params.as_dict(), sort_keys=True), payload, _checksum(key, payload), now)
            )
        # One transaction per batch: all the misses of a generate call land together or not at all.
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("INSERT OR REPLACE INTO completions VALUES (?,?,?,?,?,?,?)", values)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # SQLite may have rolled back itself (a full disk): no second error
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            raise _write_error(exc, self.path) from exc

    def generate(self, prompts: Sequence[str], params: Sequence[GenParams]) -> list[Completion]:
        """Hits come from disk (`cached=True`); the misses go to the inner engine in one call.

        Identical requests inside one batch share one computation: the cache is content-addressed,
        so they would share it on any later run anyway."""
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} params")
        with self._lock:
            keys = [request_key(self.model_id, p, gp) for p, gp in zip(prompts, params)]
            found = self._lookup(keys)
            miss_index: dict[str, int] = {}
            for i, k in enumerate(keys):
                if k not in found and k not in miss_index:
                    miss_index[k] = i
            self.stats.hits += sum(1 for k in keys if k in found)
            self.stats.misses += len(keys) - sum(1 for k in keys if k in found)
            fresh: dict[str, Completion] = {}
            if miss_index:
                idx = list(miss_index.values())
                self.stats.engine_calls += 1
                try:
                    results = self.engine.generate([prompts[i] for i in idx], [params[i] for i in idx])
                except EngineUnavailable as exc:  # the completions that did come back are kept (resumes)
                    kept = [(keys[idx[j]], prompts[idx[j]], params[idx[j]], c) for j, c in exc.completed.items()]
                    if kept:
                        self._store(kept)
                    raise
                if len(results) != len(idx):
                    raise RuntimeError(f"engine returned {len(results)} completions for {len(idx)} prompts")
                self._store([(keys[i], prompts[i], params[i], c) for i, c in zip(idx, results)])
                faults.point("cache-commit")
                fresh = {keys[i]: c for i, c in zip(idx, results)}
            return [found[k] if k in found else fresh[k] for k in keys]

    # -- step loop (StepEngine): misses go to the inner engine's step loop, commits are grouped ---------
    def submit(self, requests: Sequence[Request]) -> None:
        """Hits are ready at the next `step()` without reaching the engine; a miss already in flight
        is shared; the other misses are submitted to the inner engine (its request id is the key)."""
        with self._lock:
            keys = [request_key(self.model_id, r.prompt, r.params) for r in requests]
            found = self._lookup(keys)
            # returned but not yet committed: already answered in this session, so a hit as well
            wanted = set(keys)
            found.update({k: dataclasses.replace(c, cached=True) for k, _, _, c in self._unsaved if k in wanted})
            fresh: list[Request] = []
            for r, k in zip(requests, keys):
                if k in found:
                    self.stats.hits += 1
                    self._ready.append((r.rid, found[k]))
                    continue
                self.stats.misses += 1
                if k not in self._waiting:
                    self._waiting[k] = []
                    self._asked[k] = (r.prompt, r.params)
                    fresh.append(Request(k, r.prompt, r.params, r.priority))
                self._waiting[k].append(r.rid)
            if fresh:
                self._stepper.submit(fresh)

    def step(self) -> list[tuple[str, Completion]]:
        """Ready hits, plus what one step of the inner engine finished (stored, committed in groups:
        every `group_rows` completions or `group_s` seconds, and at `flush()`)."""
        with self._lock:
            out, self._ready = self._ready, []
            if self._stepper.pending():
                for key, comp in self._stepper.step():
                    prompt, params = self._asked.pop(key)
                    self._unsaved.append((key, prompt, params, comp))
                    out.extend((rid, comp) for rid in self._waiting.pop(key))
            if len(self._unsaved) >= self.group_rows or (
                    self._unsaved and time.monotonic() - self._last_commit >= self.group_s):
                self._flush_locked()
            return out

    def pending(self) -> int:
        return len(self._ready) + sum(len(v) for v in self._waiting.values())

    def cancel(self) -> None:
        """Drop everything in flight (a stopped run): the inner engine aborts its requests; completions
        already returned stay queued for the next commit."""
        with self._lock:
            self._ready, self._waiting, self._asked = [], {}, {}
            self._stepper.cancel()

    def flush(self) -> None:
        """Commit every completion returned so far (one transaction)."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._unsaved:
            with stops.deferred():  # a stop signal waits for the commit
                self._store(self._unsaved)
                self._unsaved = []
            self.stats.commits += 1
            faults.point("cache-commit")
        self._last_commit = time.monotonic()

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM completions").fetchone()[0]

    def close(self) -> None:
        self.flush()
        self._db.close()
        for con in self._also:
            con.close()

    def __enter__(self) -> CachedEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
