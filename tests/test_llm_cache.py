"""CachedEngine with a scripted inner engine: hits/misses, one call for the misses, corruption, kills."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from clarify.errors import InputError
from clarify.local_llm.cache import CachedEngine
from clarify.local_llm.engine import GenParams, request_key
from clarify.local_llm.scripted import ScriptedEngine


def test_second_identical_run_makes_zero_engine_calls(tmp_path, echo_engine):
    prompts = [f"question {i}" for i in range(20)]
    params = [GenParams(temperature=0.7, seed=i) for i in range(20)]
    first = CachedEngine(echo_engine, tmp_path / "cache")
    out1 = first.generate(prompts, params)
    assert echo_engine.calls == 1 and echo_engine.batch_sizes == [20]
    assert not any(c.cached for c in out1)
    first.close()

    again = CachedEngine(echo_engine, tmp_path / "cache")  # a new process would open the file like this
    out2 = again.generate(prompts, params)
    assert echo_engine.calls == 1  # zero new calls
    assert again.stats.as_dict() == {"hits": 20, "misses": 0, "engine_calls": 0, "corrupt": 0, "commits": 0,
                                     "corrupt_reasons": {}}
    assert [c.texts for c in out2] == [c.texts for c in out1]
    assert [c.output_tokens for c in out2] == [c.output_tokens for c in out1]
    # a scripted engine knows no context, capacity or device: the cache says None, never guesses
    assert (again.max_model_len, again.count_tokens("x"), again.capacity(), again.facts(), again.engine_stats) == (
        None, None, None, None, None)
    assert all(c.cached for c in out2)


def test_only_misses_reach_the_engine_in_one_call_in_order(tmp_path, echo_engine):
    cache = CachedEngine(echo_engine, tmp_path / "c.sqlite")
    cache.generate(["a", "b"], [GenParams()] * 2)
    out = cache.generate(["x", "a", "y", "b", "x"], [GenParams()] * 5)
    assert echo_engine.batch_sizes == [2, 2]  # second call: only x and y; the duplicate x computed once
    assert echo_engine.prompts_seen[2:] == ["x", "y"]
    assert [c.text for c in out] == ["echo:x", "echo:a", "echo:y", "echo:b", "echo:x"]
    assert [c.cached for c in out] == [False, True, False, True, False]
    assert cache.stats.hits == 2 and cache.stats.misses == 2 + 3 and cache.stats.engine_calls == 2


def test_key_covers_model_prompt_and_every_param(tmp_path):
    base = GenParams(temperature=0.7, seed=1, max_tokens=10)
    k = request_key("m", "p", base)
    variants = [
        request_key("m2", "p", base),
        request_key("m", "p ", base),
        request_key("m", "p", GenParams(temperature=0.7, seed=2, max_tokens=10)),
        request_key("m", "p", GenParams(temperature=0.7, seed=1, max_tokens=11)),
        request_key("m", "p", GenParams(temperature=0.7, seed=1, max_tokens=10, stop=("\n",))),
        request_key("m", "p", GenParams(temperature=0.7, seed=1, max_tokens=10, choices=("True", "False"))),
    ]
    assert len({k, *variants}) == 7
    assert request_key("m", "p", GenParams(temperature=0.7, seed=1, max_tokens=10, stop=["\n"])) == variants[4]


def _corrupt(path, key, sql):
    db = sqlite3.connect(path)
    db.execute(sql, (key,))
    db.commit()
    db.close()


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE completions SET payload = substr(payload, 1, 10) WHERE key = ?",  # truncated entry
        "UPDATE completions SET payload = replace(payload, 'echo', 'ECHO') WHERE key = ?",  # altered, still JSON
    ],
)
def test_corrupt_entry_is_detected_and_recomputed(tmp_path, echo_engine, sql):
    path = tmp_path / "c.sqlite"
    cache = CachedEngine(echo_engine, path)
    params = [GenParams(seed=i) for i in range(3)]
    cache.generate(["p0", "p1", "p2"], params)
    _corrupt(path, request_key("scripted-echo", "p1", params[1]), sql)

    out = cache.generate(["p0", "p1", "p2"], params)
    assert [c.text for c in out] == ["echo:p0", "echo:p1", "echo:p2"]
    assert [c.cached for c in out] == [True, False, True]
    assert cache.stats.corrupt == 1 and echo_engine.batch_sizes == [3, 1]
    # the recomputed entry replaced the bad one
    out = cache.generate(["p1"], params[1:2])
    assert out[0].cached and out[0].text == "echo:p1" and cache.stats.corrupt == 1


def test_a_file_that_is_not_a_cache_is_an_input_error(tmp_path, echo_engine):
    bad = tmp_path / "notes.sqlite"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(InputError, match="notes.sqlite"):
        CachedEngine(echo_engine, bad).generate(["p"], [GenParams()])


def test_caches_created_side_by_side_are_never_seen_without_their_table(tmp_path, echo_engine):
    """The workers of a cluster run start together in one cache folder, each creating its own file and
    reading every other `*.sqlite` there (local_llm/cache.py `union_of`). A file visible under its name
    before its table existed stopped a starting worker with "no such table: completions"."""
    import threading

    from clarify.local_llm.cache import union_of

    folder = tmp_path / "cache"
    folder.mkdir()
    done, seen, errors = threading.Event(), [], []

    def create():
        for i in range(60):
            CachedEngine(echo_engine, folder / f"worker-{i:02d}.sqlite").close()
        done.set()

    creator = threading.Thread(target=create)
    creator.start()
    while not done.is_set():
        own = folder / "reader.sqlite"
        try:
            others = union_of(folder, own)
            CachedEngine(echo_engine, own, also=others).close()
            seen.append(len(others))
        except InputError as exc:
            errors.append(str(exc))
            break
    creator.join()
    assert errors == [] and seen and max(seen) > 0
    assert sorted(p.name for p in folder.glob("*.sqlite")) == ["reader.sqlite"] + [f"worker-{i:02d}.sqlite"
                                                                                  for i in range(60)]
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file left
    empty = folder / "worker-60.sqlite"
    empty.touch()  # what a creation stopped midway leaves: holds nothing, read as nothing
    with CachedEngine(echo_engine, folder / "reader.sqlite", also=union_of(folder, folder / "reader.sqlite")) as c:
        assert c.generate(["p"], [GenParams()])[0].text == "echo:p"


_WRITER = textwrap.dedent(
    """
    import sys
    from clarify.local_llm.cache import CachedEngine
    from clarify.local_llm.engine import GenParams
    from clarify.local_llm.scripted import ScriptedEngine

    engine = ScriptedEngine("scripted-echo", lambda p, g: "echo:" + p * 20)
    cache = CachedEngine(engine, sys.argv[1])
    batch = 0
    while True:  # the parent kills this process with SIGKILL somewhere in here
        prompts = [f"b{batch}-{i}" for i in range(200)]
        cache.generate(prompts, [GenParams(seed=i) for i in range(200)])
        batch += 1
        if batch == 2:
            print("ready", flush=True)
    """
)


def test_sigkill_mid_write_leaves_a_usable_cache(tmp_path):
    path = tmp_path / "c.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)  # let it get well into later batches
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    n = db.execute("SELECT COUNT(*) FROM completions").fetchone()[0]
    db.close()
    assert n >= 400 and n % 200 == 0  # whole batches only: a killed transaction leaves nothing behind

    engine = ScriptedEngine("scripted-echo", lambda p, g: "echo:" + p * 20)
    cache = CachedEngine(engine, path)
    done = n // 200
    prompts = [f"b{b}-{i}" for b in range(done + 1) for i in range(200)]
    params = [GenParams(seed=i) for b in range(done + 1) for i in range(200)]
    out = cache.generate(prompts, params)
    assert cache.stats.corrupt == 0 and cache.stats.hits == n and cache.stats.misses == 200
    assert engine.batch_sizes == [200]  # only the batch that was being written when killed
    assert all(c.text == "echo:" + p * 20 for c, p in zip(out, prompts))


def test_a_full_disk_keeps_the_completions_queued_and_says_so(tmp_path):
    """SQLite's "database or disk is full" (SQLITE_FULL: here a page limit stands in for the disk) was
    hidden behind "cannot rollback - no transaction is active", and the group of completions that failed
    was dropped before it was stored. Now it is an OSError ENOSPC naming the cache file (one
    line at the command line: errors.write_failure), and the completions wait for the next commit."""
    import errno

    from clarify.local_llm.engine import Request
    from clarify.local_llm.scripted import ScriptedStepEngine

    inner = ScriptedStepEngine("scripted", lambda p, gp: "word " * 400)
    cache = CachedEngine(inner, tmp_path / "c", group_rows=10_000, group_s=3600)
    pages = cache._db.execute("PRAGMA page_count").fetchone()[0]
    cache._db.execute(f"PRAGMA max_page_count = {pages + 1}")  # room for no more than one page of rows
    cache.submit([Request(str(i), f"prompt {i} " * 50, GenParams(max_tokens=8)) for i in range(20)])
    while cache.pending():
        cache.step()
    with pytest.raises(OSError) as err:
        cache.flush()
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(cache.path)
    assert "disk is full" in str(err.value)
    cache._db.execute("PRAGMA max_page_count = 1000000")  # space again: the same completions are stored
    cache.flush()
    assert len(cache) == 20 and len(inner.returned) == 20  # none computed twice
    cache.close()
