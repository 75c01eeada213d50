"""Safe on a shared server, offline by construction.

Each test plants what another local user (or a hostile file) could, and checks the real outcome: the
target file untouched, the mode of what was created, the environment an engine starts with. The tests
that act as a second user fork a child that becomes `nobody` (they need root, and are skipped without it).
"""

from __future__ import annotations

import ast
import os
import stat
import sys
import tempfile
import tomllib
import types
from pathlib import Path

import polars as pl
import pytest

from clarify import console, files
from clarify.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
PRECIOUS = "precious bytes of the victim\n"


# ------------------------------------------------------------------------------------------ helpers
def _nobody() -> tuple[int, int]:
    import pwd

    if os.geteuid() != 0:
        pytest.skip("acting as a second user (nobody) needs root")
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    return pw.pw_uid, pw.pw_gid


def _as_nobody(fn) -> str | None:
    """Run `fn()` in a forked child that has become user nobody; its error as text, None when it worked.
    (A fork, not a new interpreter: nobody may not be able to read this interpreter's files.)"""
    uid, gid = _nobody()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            os.write(w, f"{type(exc).__name__}: {exc}".encode()[:4000])
            code = 1
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        said = fh.read().decode("utf-8", "replace")
    _, status = os.waitpid(pid, 0)
    return None if os.waitstatus_to_exitcode(status) == 0 else said or f"exit status {status}"


@pytest.fixture
def shared_tmp(monkeypatch):
    """A sticky world-writable folder like /tmp, made the temp folder of this process (`tempfile`)."""
    base = Path(tempfile.mkdtemp(prefix="clarify-shared-", dir="/tmp"))
    os.chmod(base, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base
    import shutil

    shutil.rmtree(base, ignore_errors=True)


def _victim(folder: Path) -> Path:
    v = folder / "victim.txt"
    v.write_text(PRECIOUS)
    return v


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ------------------------------------------------------------------------ point 5: the CPU core locks
def test_core_lock_folder_planted_by_another_user_is_never_used(shared_tmp):
    """Protects against another local user who makes the core-lock folder first and plants
    `core-N.lock -> a file of yours`: the lock never writes through it (main overwrote the file)."""
    from clarify.local_llm import hardware

    _nobody()
    folder = hardware.lock_dir()  # its name; emptied and made again by the other user
    folder.rmdir()
    victim = _victim(shared_tmp)

    def plant():
        folder.mkdir(mode=0o777)
        os.chmod(folder, 0o777)
        (folder / "core-931.lock").symlink_to(victim)

    assert _as_nobody(plant) is None
    with pytest.raises(InputError, match="CPU core lock"), hardware.CoreLock({931}, mode="refuse"):
        pass
    assert victim.read_text() == PRECIOUS


def test_core_lock_never_follows_a_link_in_its_own_folder(shared_tmp):
    """Protects a file that a link named like a core lock points to: not truncated, not written."""
    from clarify.local_llm import hardware

    victim = _victim(shared_tmp)
    (hardware.lock_dir() / "core-932.lock").symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link"), hardware.CoreLock({932}, mode="refuse"):
        pass
    assert victim.read_text() == PRECIOUS
    assert _mode(hardware.lock_dir()) == 0o700


def test_a_second_user_takes_core_locks_too(shared_tmp):
    """Protects the second user of a machine: the first user's lock folder no longer refuses them
    (main: PermissionError on the first user's 0755 folder)."""
    from clarify.local_llm import hardware

    with hardware.CoreLock({933}, mode="refuse"):  # root's folder and lock exist
        def second_user():
            hardware._held.clear()  # a process of its own: the fork's copy of root's held locks is not its
            with hardware.CoreLock({933}, mode="refuse"):
                assert hardware.core_holders({933})[933] is not None  # its own engine holds it

        assert _as_nobody(second_user) is None


def test_lock_holder_text_reaches_the_terminal_escaped(tmp_path, monkeypatch):
    """Protects the terminal from the holder's command line: an escape sequence in another process's
    argv is shown escaped in the refusal, not interpreted."""
    from clarify.batch.run.rundir import RunDir

    monkeypatch.setattr(sys, "argv", ["clarify", "run", "\x1b]0;owned\x07\x1b[2J"])
    with RunDir(tmp_path / "run").lock():
        with pytest.raises(InputError, match="in use by") as err, RunDir(tmp_path / "run").lock():
            pass
    assert "\x1b" not in str(err.value) and "\x07" not in str(err.value) and "\\x1b]0;owned" in str(err.value)


# ------------------------------------------------------------------------- point 5: run directories
def test_run_directory_of_another_user_is_refused(shared_tmp):
    """Protects against writing into a run directory another user made (they could read it, or plant
    links in it): one line naming the owner (main used it)."""
    from clarify.batch.run.rundir import RunDir

    run = shared_tmp / "theirs"
    assert _as_nobody(lambda: run.mkdir(mode=0o777) or os.chmod(run, 0o777)) is None
    with pytest.raises(InputError, match="belongs to user nobody"), RunDir(run).lock():
        pass
    assert not (run / ".lock").exists()


def test_run_lock_never_follows_a_planted_link(tmp_path):
    """Protects the file a planted `.lock` link points to: main truncated it and wrote its pid there."""
    from clarify.batch.run.rundir import RunDir

    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link"), RunDir(run).lock():
        pass
    assert victim.read_text() == PRECIOUS


def test_atomic_writes_never_follow_a_planted_temp_name(tmp_path):
    """Protects against a link at write_atomic's temp name (main: `.NAME.tmpPID`, written through and
    then renamed into place): the victim is untouched and the file is written."""
    victim = _victim(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    (out / f".config.json.tmp{os.getpid()}").symlink_to(victim)
    files.write_json({"a": 1}, out / "config.json")
    assert victim.read_text() == PRECIOUS
    assert (out / "config.json").read_text() == '{\n  "a": 1\n}\n' and not (out / "config.json").is_symlink()


def test_compare_log_never_follows_a_planted_link(tmp_path, monkeypatch):
    """Protects the file a planted `<out>/<model>.log` link points to (main opened it with "w")."""
    from clarify.batch import config
    from clarify.batch.compare import compare

    victim = _victim(tmp_path)
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "m1.log").symlink_to(victim)
    monkeypatch.setattr(compare, "device_groups", lambda n: [{}] * n)
    monkeypatch.setattr(compare.subprocess, "Popen", lambda *a, **k: pytest.fail("a run was started"))
    with pytest.raises(InputError, match="symbolic link"):
        compare._launch({m: config.load(None, {"model.model": f"/models/{m}"}) for m in ("m1", "m2")}, out,
                        parallel=True, verbose=False)
    assert victim.read_text() == PRECIOUS


def test_console_log_never_follows_a_planted_link(tmp_path, monkeypatch):
    """Protects the file a link at the session's log name points to (main appended the log to it)."""
    import time

    victim = _victim(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20260101-000000")
    (tmp_path / f"boom-20260101-000000-{os.getpid()}.log").symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link"), console.session(tmp_path, "boom"):
        pass
    assert victim.read_text() == PRECIOUS


def test_run_dirs_caches_and_logs_are_private_by_default(tmp_path, monkeypatch, echo_engine):
    """Protects prompts, completions and logs from other users: a new run directory, its cache and its
    log are 0700/0600, and so is a new $CLARIFY_HOME (main: 0755/0644). CLARIFY_FILE_MODE=umask gives the
    old modes back."""
    from clarify.batch.run.rundir import RunDir
    from clarify.local_llm.cache import CachedEngine
    from clarify.local_llm.engine import GenParams

    monkeypatch.delenv("CLARIFY_FILE_MODE", raising=False)
    monkeypatch.setenv("CLARIFY_HOME", str(tmp_path / "home"))
    run = tmp_path / "runs" / "r1"
    with console.session(run / "logs", "run") as log:
        with RunDir(run).lock() as rd:
            rd.write_table("questions", pl.DataFrame({"qid": ["q"]}))
            with CachedEngine(echo_engine, rd.cache_dir) as cached:
                cached.generate(["hello"], [GenParams(max_tokens=4)])
                made = [rd.cache_dir / "completions.sqlite", rd.cache_dir / "completions.sqlite-wal"]
                assert all(p.exists() for p in made)
                assert {_mode(p) for p in made} == {0o600}
    assert (_mode(tmp_path / "runs"), _mode(run), _mode(run / "logs"), _mode(rd.cache_dir)) == (0o700,) * 4
    assert (_mode(log), _mode(run / ".lock"), _mode(run / "questions.parquet")) == (0o600,) * 3
    with console.session(console.home_logs(), "index-build") as home_log:
        pass
    assert (_mode(tmp_path / "home"), _mode(tmp_path / "home" / "logs"), _mode(home_log)) == (0o700, 0o700, 0o600)

    monkeypatch.setenv("CLARIFY_FILE_MODE", "umask")
    umask = os.umask(0o022)
    try:
        with RunDir(tmp_path / "runs" / "r2").lock() as rd2:
            rd2.write_table("questions", pl.DataFrame({"qid": ["q"]}))
        assert (_mode(rd2.path), _mode(rd2.path / "questions.parquet")) == (0o755, 0o644)
    finally:
        os.umask(umask)
    monkeypatch.setenv("CLARIFY_FILE_MODE", "everyone")
    with pytest.raises(InputError, match="CLARIFY_FILE_MODE must be one of private, group, umask"):
        files.modes()


def _register_touch(sub) -> None:
    """A `clarify touch-test OUT` command that writes as libraries do (Polars' Parquet writer, a mkdir)."""
    p = sub.add_parser("touch-test")
    p.add_argument("out")
    p.set_defaults(func=lambda a: pl.DataFrame({"a": [1]}).write_parquet(a.out) or Path(a.out + "-dir").mkdir())


def test_a_clarify_command_makes_library_files_private(tmp_path, monkeypatch):
    """Protects what other libraries write for a command (Parquet, Lucene, SQLite's journal): the
    command's umask keeps group and others out (main: 0644/0755 under the usual umask 022)."""
    from clarify.batch import cli

    monkeypatch.delenv("CLARIFY_FILE_MODE", raising=False)
    monkeypatch.setattr(cli, "REGISTRARS", [(__name__, "_register_touch")])
    umask = os.umask(0o022)
    try:
        assert cli.main(["touch-test", str(tmp_path / "by-polars.parquet")]) == 0
    finally:
        os.umask(umask)
    assert (_mode(tmp_path / "by-polars.parquet"), _mode(tmp_path / "by-polars.parquet-dir")) == (0o600, 0o700)


# ------------------------------------------------------------------------------- point 5: small items
def test_compare_slug_never_names_a_folder_outside_out():
    """Protects `<out>`: a model path ending in `/..` (or `.`) no longer makes the run directory `..`."""
    from clarify.batch.compare.compare import _slug

    assert _slug("/models/foo/..") == "models"
    assert _slug("..") == _slug(".") == "model"
    assert _slug("/models/smollm2-135m-instruct/") == "smollm2-135m-instruct"


def test_read_only_cache_uri_escapes_the_path(tmp_path, echo_engine):
    """Protects the other caches a run reads: `w#x.sqlite` is opened read-only as itself (main opened
    `w`, read-write, creating it)."""
    from clarify.local_llm.cache import CachedEngine
    from clarify.local_llm.engine import GenParams

    other = tmp_path / "w#x.sqlite"
    with CachedEngine(echo_engine, other) as cache:
        cache.generate(["hi"], [GenParams(max_tokens=4)])
    with CachedEngine(echo_engine, tmp_path / "own.sqlite", also=[other]) as cache:
        assert cache.generate(["hi"], [GenParams(max_tokens=4)])[0].cached
        assert cache.stats.engine_calls == 0
    assert not (tmp_path / "w").exists()


def test_show_answer_escapes_control_characters(tmp_path, capsys):
    """Protects the terminal from the data: a question, answer or title with escape sequences is shown
    escaped by `clarify demo`'s and `clarify show`'s printout."""
    from clarify.batch.cli.show import show
    from tests.run_fixtures import write_run

    run = write_run(tmp_path / "run",
                    questions=pl.DataFrame({"qid": ["q1"], "question": ["who\x1b[2J?"]}),
                    answers=pl.DataFrame({"qid": ["q1"], "answer": ["it\x1b]0;x\x07 is \u202eher"]}),
                    spans=pl.DataFrame({"qid": ["q1"], "span_no": [0], "source_k": [1], "text": ["her"],
                                        "passage_id": ["p1"], "start": [0], "end": [3], "status": ["verbatim"]}),
                    passages=pl.DataFrame({"passage_id": ["p1"], "title": ["T\x1b[31mitle"], "text": ["her"]}))
    show(run, "q1")
    show(run)  # the question chosen by the rule: the same one
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "who\\x1b[2J?" in out and "\\u202eher" in out and "T\\x1b[31mitle" in out


def test_log_pruning_deletes_only_clarifys_own_logs(tmp_path):
    """Protects a user's own `*.log` files in a logs folder: only clarify's log names are pruned (main
    deleted the oldest `*.log` of any name)."""
    mine = tmp_path / "notes.log"
    mine.write_text(PRECIOUS)
    os.utime(mine, (1, 1))
    for i in range(console.KEEP_LOGS + 5):
        p = tmp_path / f"run-20260101-0000{i:02d}-{100 + i}.log"
        p.write_text("x")
        os.utime(p, (1000 + i, 1000 + i))
    new = console.log_file_for(tmp_path, "run")
    clarify_logs = [p for p in tmp_path.glob("run-*.log")]
    assert mine.read_text() == PRECIOUS
    assert len(clarify_logs) == console.KEEP_LOGS and new in clarify_logs
    assert not (tmp_path / "run-20260101-000000-100.log").exists()


def _manifest_index(path: Path, **parts) -> Path:
    from clarify.files import write_json
    from clarify.index.manifest import FORMAT, MANIFEST, VERSION

    path.mkdir(parents=True)
    pl.DataFrame({"passage_id": ["p"], "title": ["t"], "text": ["x"]}).write_parquet(path / "passages.parquet")
    manifest = {"format": FORMAT, "version": VERSION, "corpus": [], "build": {},
                "passages": {"count": 1, "file": "passages.parquet"}, "bm25": None, "dense": None} | parts
    write_json(manifest, path / MANIFEST)
    return path


def test_index_manifest_paths_stay_inside_the_index(tmp_path):
    """Protects against an index whose manifest names files or an encoder folder elsewhere (main read
    and loaded them): a clear error naming the manifest."""
    from clarify.index.local import open_index

    pl.DataFrame({"passage_id": ["s"], "title": ["secret"], "text": ["s"]}).write_parquet(tmp_path / "out.parquet")
    (tmp_path / "enc").mkdir()
    outside = _manifest_index(tmp_path / "a", passages={"count": 1, "file": "../out.parquet"})
    with pytest.raises(InputError, match="names the passages file '../out.parquet', outside the index folder"):
        open_index(outside)
    linked = _manifest_index(tmp_path / "b")
    (linked / "passages.parquet").unlink()
    (linked / "passages.parquet").symlink_to(tmp_path / "out.parquet")
    with pytest.raises(InputError, match="outside the index folder"):
        open_index(linked)
    (tmp_path / "c-dense").mkdir()
    for name, dense in (("c", {"dir": "../c-dense", "encoder": "default"}),
                        ("d", {"dir": "dense", "encoder": str(tmp_path / "enc")})):
        idx = _manifest_index(tmp_path / name, dense=dense)
        (idx / "dense").mkdir()
        with pytest.raises(InputError, match="outside the index folder"):
            open_index(idx)
    # the caller's own encoder is theirs to choose: not refused as outside the index, but checked before
    # anything loads (an encoder folder whose dimension matches the FAISS index; here there is none)
    with pytest.raises(InputError) as err:
        open_index(tmp_path / "d", encoder=str(tmp_path / "enc"))
    assert "outside" not in str(err.value)


def test_an_index_holds_its_own_encoder(tmp_path):
    """Protects indexes built with `--encoder DIR` from the confinement above: the build copies the
    encoder into the index, which opens and encodes with it once the original folder is gone (main
    recorded the outside path, which then failed)."""
    import shutil

    from clarify.index.build import build_index
    from clarify.index.dense import resolve_encoder_path
    from clarify.index.local import open_index

    enc = tmp_path / "my-encoder"
    shutil.copytree(resolve_encoder_path("default")[1], enc)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(f'{{"id": "p{i}", "title": "T{i}", "text": "passage number {i}"}}\n' for i in range(4)))
    out = build_index(corpus, tmp_path / "idx", bm25=False, dense=True, encoder=str(enc))
    shutil.rmtree(enc)
    idx = open_index(out)
    assert idx.manifest.dense.encoder == "encoders/my-encoder"
    assert idx.encoder.encode(["hello"]).shape == (1, idx.encoder.dim) and idx.encoder.name == "my-encoder"
    # an index of an older clarify (the encoder named outside) is rebuilt by --force, not kept as up to date
    import json

    manifest = json.loads((out / "manifest.json").read_text())
    manifest["dense"]["encoder"] = str(enc)
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="does not hold a copy of its encoder"):
        build_index(corpus, out, bm25=False, dense=True, encoder=str(out / "encoders" / "my-encoder"))


# ------------------------------------------------------------------------------------ point 6: offline
def _fake_model(folder: Path) -> Path:
    import json
    import struct

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float32"}))
    header = b'{"__metadata__":{}}'
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    (folder / "tokenizer_config.json").write_text("{}")
    return folder


def test_engine_starts_with_usage_stats_off_and_no_remote_code(tmp_path, monkeypatch):
    """Protects against vLLM's usage statistics (posted from a GPU engine every 10 min, written to
    ~/.config/vllm/usage_stats.json) and a model folder's own code: the engine is built with
    VLLM_NO_USAGE_STATS=1 and DO_NOT_TRACK=1, even over a user's 0, and trust_remote_code=False."""
    from clarify.local_llm import vllm_engine

    seen = {}

    class FakeLLM:
        def __init__(self, **settings):
            seen["env"], seen["settings"] = dict(os.environ), settings
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(dtype="torch.float32"))

        def get_tokenizer(self):
            return None

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM))
    for key in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "RAY_USAGE_STATS_ENABLED"):
        monkeypatch.setenv(key, "0" if key != "RAY_USAGE_STATS_ENABLED" else "1")
    for key in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "934")  # a core lock no real engine uses
    monkeypatch.setattr(vllm_engine, "detect_device", lambda: "cpu")
    vllm_engine.VLLMEngine(_fake_model(tmp_path / "m"), progress=False)
    env = seen["env"]
    assert (env["VLLM_NO_USAGE_STATS"], env["DO_NOT_TRACK"], env["RAY_USAGE_STATS_ENABLED"]) == ("1", "1", "0")
    assert seen["settings"]["trust_remote_code"] is False
    with pytest.raises(ValueError, match="trust_remote_code"):
        vllm_engine.VLLMEngine(tmp_path / "m", progress=False, trust_remote_code=True)


def test_ray_workers_start_with_telemetry_off(monkeypatch):
    """Protects the Ray path: the driver's local cluster (which inherits its environment) starts with
    vLLM's and Ray's usage statistics off, and each worker is handed the same settings."""
    from clarify.batch.config import ClusterConfig
    from clarify.batch.run import cluster

    seen = {}
    fake = types.SimpleNamespace(is_initialized=lambda: False, init=lambda **kw: seen.update(env=dict(os.environ)))
    monkeypatch.setitem(sys.modules, "ray", fake)
    for key in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
        monkeypatch.setenv(key, "0")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "1")
    assert cluster._start_ray(ClusterConfig()) is True
    assert {k: seen["env"][k] for k in ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "RAY_USAGE_STATS_ENABLED")} == {
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    monkeypatch.setenv("DO_NOT_TRACK", "0")  # a joined cluster's workers do not inherit the driver's environment
    env = cluster.worker_env()
    assert (env["VLLM_NO_USAGE_STATS"], env["DO_NOT_TRACK"], env["RAY_USAGE_STATS_ENABLED"]) == ("1", "1", "0")


LOADERS = {"from_pretrained", "SentenceTransformer", "CrossEncoder"}


def test_every_hf_loader_refuses_remote_code_explicitly():
    """Protects against a model or encoder folder's own Python code running (transformers' default asks
    on a terminal; sentence-transformers 5.x ran it): every loader call in clarify's source passes
    trust_remote_code=False."""
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        if {".venv", "tests", "bench"} & set(path.relative_to(ROOT).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in LOADERS and not any(
                        k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False
                        for k in node.keywords):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not missing, missing


def test_dependency_floors_and_the_pins_meet_them():
    """Protects installs from sentence-transformers 5.x (custom encoder code), jinja2 < 3.1.6 and older Ray:
    pyproject.toml's ranges exclude them, and requirements/*.txt's pins lie inside the ranges."""
    from packaging.requirements import Requirement

    deps = {Requirement(d).name: Requirement(d).specifier
            for d in tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]}
    for name, too_old, floor in (("sentence-transformers", "5.9.9", "6.0.0"), ("jinja2", "3.1.5", "3.1.6"),
                                 ("ray", "2.59.0", "2.60.0")):
        assert not deps[name].contains(too_old) and deps[name].contains(floor), (name, deps[name])
    from clarify.batch.cli.offline import lock_pins

    for req in (ROOT / "requirements").glob("*.txt"):  # the locks (`make lock`)
        for name, version in lock_pins(req.read_text(encoding="utf-8")).items():
            if name in deps:
                assert deps[name].contains(version), (req.name, name, version)
