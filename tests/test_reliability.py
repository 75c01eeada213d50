"""Reliability: a run that cannot be wedged, a run directory that cannot be corrupted, inputs and configs
checked before anything loads. Scripted engine and the small stand-in index (fast); the crash and
resume properties with the real engine are in test_toc_real.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys

import polars as pl
import pytest

from clarify.batch import config
from clarify.batch.cli import main
from clarify.batch.run.pipeline import run
from clarify.errors import InputError
from clarify.index.manifest import IndexManifest, Passages
from clarify.local_llm.scripted import ScriptedEngine
from clarify.local_llm.settings import EngineOptions
from tests.fixtures_llm import write_fake_model
from tests.test_toc import make_responder
from tests.toc_fakes import FakeIndex

# --- one declared config schema -----------------------------------------------------------------------


def test_config_schema_names_every_bad_field_at_once(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('limit = "3"\n[toc]\ntemperature = 5\nverify = "no"\n'
                 '[model]\nmax_model_len = -1\ngpu_memory_utilization = 0\nstop = "###"\n')
    with pytest.raises(InputError) as err:
        config.load(p)
    msg = str(err.value)
    assert msg.startswith(f"{p}: 6 bad config fields")
    for part in ("limit: expected an integer, got str '3'", "toc.temperature: must be in [0, 2], got 5",
                 "toc.verify: expected a boolean (true or false), got str 'no'",
                 "model.max_model_len: must be >= 1, got -1", "model.gpu_memory_utilization: must be in (0, 1], got 0",
                 "model.stop: expected a list of strings, got str '###'"):
        assert part in msg


@pytest.mark.parametrize(("toml", "match"), [
    ("[toc]\nmax_depth = 2.5\n", r"field 'toc.max_depth'\): expected an integer"),
    ("[toc]\nmax_depth = true\n", r"field 'toc.max_depth'\): expected an integer, got bool"),
    ("[toc]\ntemperature = nan\n", r"field 'toc.temperature'\): expected a number"),
    ("[model]\ngpu_memory_utilization = 1.5\n", r"must be in \(0, 1\], got 1.5"),
    ("[model]\nstop = [\"a\", 3]\n", r"field 'model.stop'\): expected a list of strings"),
    ("[model]\ndtype = \"fp8\"\n", r"field 'model.dtype'\): unknown value 'fp8'"),
    ("toc = 3\n", r"field 'toc'\): must be a table"),
    ("[retrieval]\npool = 3\n", r"field 'retrieval.pool'\): must be >= retrieval.top_k \(5\), got 3"),
    ("offset = -1\n", r"field 'offset'\): must be >= 0, got -1"),
    ("[model]\nmodel = 3\n", r"field 'model.model'\): expected a string, got int 3"),
])
def test_config_schema_types_ranges_enums(tmp_path, toml, match):
    p = tmp_path / "c.toml"
    p.write_text(toml)
    with pytest.raises(InputError, match=match):
        config.load(p)


def test_every_setting_declares_what_the_config_page_and_the_resume_need():
    """Each setting is declared once, with its help; the resume comparison's result-free settings and the
    demo's decoding constraints are read from the declarations, so they name only settings that exist."""
    from clarify.options import spec

    keys = {key for key, _, _ in config.settings()}
    assert all(spec(f).help for _, f, _ in config.settings())
    assert set(config.RESULT_FREE) <= keys and set(config.CONSTRAINTS) <= keys
    assert "scheduler" in config.RESULT_FREE and "toc.max_depth" not in config.RESULT_FREE
    assert {k for k in keys if k.startswith("cluster.")} <= set(config.RESULT_FREE)


def test_a_choice_setting_is_its_enum_and_reads_and_writes_as_its_string(tmp_path):
    """Each choice setting's type is a StrEnum, the one declaration of its values: the schema's choices come
    from it, a TOML string or a plain string given in code becomes its member, and config.json, TOML and the
    TOML printout hold the plain string."""
    import dataclasses
    import typing
    from enum import StrEnum

    choices = {"answer_style", "retrieval.searcher", "retrieval.node_passages", "toc.duplicates", "toc.removal",
               "toc.answer_passages_from", "toc.evidence", "toc.matching", "toc.empty_tree_answer", "toc.parsing"}
    for key in choices:
        section, _, name = key.rpartition(".")
        enum = typing.get_type_hints(config._SECTIONS[section] if section else config.RunConfig)[name]
        assert issubclass(enum, StrEnum), key
        assert config.choices_of(key) == tuple(m.value for m in enum), key
        last = list(enum)[-1]
        cfg = config.load(None, {key: last.value})
        got = getattr(getattr(cfg, section) if section else cfg, name)
        assert got is last, key
        assert config.from_dict(json.loads(cfg.to_json())) == cfg
        assert f" = {json.dumps(last.value)}" in cfg.to_toml()
    p = tmp_path / "c.toml"
    p.write_text('[toc]\nevidence = "filter-embed"\n')
    assert config.load(p).toc.evidence is config.Evidence.FILTER_EMBED
    assert dataclasses.replace(config.TocConfig(), removal="shown").removal is config.Removal.SHOWN
    with pytest.raises(InputError, match=r"field 'toc.removal'\): unknown value 'all'; choose one of \('official', 'shown'\)"):
        config.TocConfig(removal="all")


def test_config_values_take_their_declared_types(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[toc]\ntemperature = 1\n[model]\nstop = ["###"]\n')
    cfg = config.load(p)
    assert cfg.toc.temperature == 1.0 and isinstance(cfg.toc.temperature, float)
    assert cfg.model.stop == ("###",)
    assert config.load(None).toc.verify is True


def test_config_overrides_are_checked_too():
    with pytest.raises(InputError, match=r"field 'limit'\): must be >= 0, got -2"):
        config.load(None, {"limit": -2})
    # a table given as a scalar in the file and a dotted override under it: named, not a traceback
    with pytest.raises(InputError, match=r"field 'toc'\): must be a table"):
        config.from_dict({"toc": 1})


def test_cli_config_directory_and_bad_values_one_line(tmp_path, capsys):
    assert main(["run", "--config", str(tmp_path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "is a directory; --config takes a TOML file" in err and "Traceback" not in err
    bad = tmp_path / "bad.toml"
    bad.write_text("[toc]\nverify = \"no\"\ntemperature = 9\n")
    assert main(["run", "--config", str(bad), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "toc.verify" in err and "toc.temperature" in err
    assert not (tmp_path / "r").exists()  # refused before the run directory is touched


# --- inputs checked before freezing, pinned, refused when changed; --restart -------------------------

def _questions(tmp_path, *texts):
    p = tmp_path / "questions.jsonl"
    p.write_text("".join(json.dumps({"qid": f"q{i}", "question": t}) + "\n" for i, t in enumerate(texts)))
    return p


QS = ("Who has the highest goals in world football?", "When did the last world cup take place?")


def _cfg(questions, **kw):
    return config.load(None, {"dataset": "jsonl", "questions": str(questions), "answer_style": "free",
                              "toc.max_expansions": 3, **kw})


class _Factory:
    """Counts the engines built: a check that must happen before the model loads builds none."""

    def __init__(self):
        self.made = []

    def __call__(self, _cfg):
        self.made.append(ScriptedEngine("scripted", make_responder()))
        return self.made[-1]


_INDEX = FakeIndex()


def _run(cfg, out, factory=None, index=None, **kw):
    return run(cfg, out, engine_factory=factory or _Factory(), index=index or _INDEX, progress=False, **kw)


def test_failed_start_does_not_block_its_run_directory(tmp_path):
    q = _questions(tmp_path, *QS)
    out = tmp_path / "r"
    with pytest.raises(InputError, match="file not found"):
        _run(_cfg(tmp_path / "typo.jsonl"), out)
    with pytest.raises(InputError, match="model directory does not exist"):
        _run(_cfg(q, **{"model.model": str(tmp_path / "no-model")}), out)
    assert not out.exists()  # nothing frozen by a start that could not begin
    # a start that got as far as freezing but made no checkpoint (killed while loading) blocks nothing
    out.mkdir()
    (out / "config.json").write_text(json.dumps(json.loads(_cfg(q, seed=7).to_json())))
    assert _run(_cfg(q), out).n_questions == 2


def test_changed_questions_file_is_refused_then_restart_starts_over(tmp_path):
    q = _questions(tmp_path, *QS)
    out = tmp_path / "r"
    assert _run(_cfg(q), out, stop_after_parts=1, part_trees=1) is None
    pinned = json.loads((out / "inputs.json").read_text())
    assert pinned["questions"]["sha256"] == hashlib.sha256(q.read_bytes()).hexdigest()
    q.write_text(q.read_text().replace("world football", "world hockey"))
    with pytest.raises(InputError, match=r"inputs of this run changed.*questions .*questions.jsonl changed \(sha256"):
        _run(_cfg(q), out)
    factory = _Factory()
    summary = _run(_cfg(q), out, factory, restart=True)
    assert summary.n_questions == 2
    asked = pl.read_parquet(out / "questions.parquet")["question"].to_list()
    assert asked[0] == "Who has the highest goals in world hockey?"
    assert "world hockey" in pl.read_parquet(out / "nodes.parquet")["question"][0]
    # finished: an edited input is refused as well (its summary would disagree with the file)
    q.write_text(q.read_text() + json.dumps({"qid": "q9", "question": "Who?"}) + "\n")
    with pytest.raises(InputError, match="changed"):
        _run(_cfg(q), out)


def test_changed_model_folder_is_refused(tmp_path):
    q = _questions(tmp_path, *QS)
    model = write_fake_model(tmp_path / "model", 64)
    cfg = _cfg(q, **{"model.model": str(model)})
    _run(cfg, tmp_path / "r", stop_after_parts=1, part_trees=1)
    write_fake_model(model, 65)
    with pytest.raises(InputError, match=r"model .*model changed \(fingerprint"):
        _run(cfg, tmp_path / "r")


def test_changed_index_is_refused(tmp_path):
    class BuiltIndex(FakeIndex):  # what pins a clarify index: its manifest (index/build.py)
        def __init__(self, corpus_sha):
            super().__init__()
            self.path = tmp_path / "index"
            self.manifest = IndexManifest(({"name": "passages.jsonl", "sha256": corpus_sha},), Passages(40, "p"),
                                          {"bm25": True})

    q = _questions(tmp_path, *QS)
    _run(_cfg(q), tmp_path / "r", index=BuiltIndex("a" * 64), stop_after_parts=1, part_trees=1)
    assert _run(_cfg(q), tmp_path / "r", index=BuiltIndex("a" * 64), stop_after_parts=2, part_trees=1) is None
    with pytest.raises(InputError, match=r"index .*index changed \(fingerprint"):
        _run(_cfg(q), tmp_path / "r", index=BuiltIndex("b" * 64))


def test_restart_flag_on_the_command_line():
    from clarify.batch.cli import build_parser

    assert build_parser().parse_args(["run", "--out", "x", "--restart"]).restart is True


# --- one process per run directory ---------------------------------------------------------------------

HOLD = """
import sys, time
from clarify.batch.run.rundir import RunDir
with RunDir(sys.argv[1]).lock():
    print("held", flush=True)
    time.sleep(600)
"""


def test_second_process_on_a_run_directory_is_refused_naming_the_holder(tmp_path):
    q = _questions(tmp_path, *QS)
    out = tmp_path / "r"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=":".join(sys.path)))
    try:
        assert holder.stdout.readline().strip() == "held"
        factory = _Factory()
        with pytest.raises(InputError, match=rf"in use by pid {holder.pid} on {socket.gethostname()}"):
            _run(_cfg(q), out, factory)
        assert not factory.made and not (out / "config.json").exists()
    finally:
        holder.kill()  # SIGKILL: the holder never unlocks; the kernel frees its flock
        holder.wait()
    assert _run(_cfg(q), out).n_questions == 2  # a dead holder's lock does not block


# --- checkpoints: atomic, checksummed, verified before the model loads ---------------------------------

def _stopped_run(tmp_path):
    q = _questions(tmp_path, *QS)
    out = tmp_path / "r"
    _run(_cfg(q), out, stop_after_parts=2, part_trees=1)  # both trees written, the final tables not
    return q, out


@pytest.mark.parametrize(("target", "damage", "why"), [
    ("0001/state.json", lambda p: p.write_bytes(p.read_bytes()[:100]), "not valid JSON"),
    ("0002/state.json", lambda p: p.write_text(p.read_text().replace('"qid": "q', '"qid": "Q')),
     "does not match its checksum"),
    ("0002/llm_calls.parquet", lambda p: p.write_bytes(p.read_bytes()[:-40]), "does not match its sha256"),
    ("0001/hits.parquet", lambda p: p.unlink(), "the file is missing"),
])
def test_damaged_checkpoint_is_one_line_before_the_model_loads(tmp_path, target, damage, why):
    q, out = _stopped_run(tmp_path)
    damage(out / "parts" / target)
    factory = _Factory()
    with pytest.raises(InputError) as err:
        _run(_cfg(q), out, factory)
    msg = str(err.value)
    assert msg.startswith(f"{out / 'parts' / target}: damaged checkpoint") and why in msg and "\n" not in msg
    assert "--restart" in msg and not factory.made  # no engine built: reported before loading


def test_following_the_damage_advice_resumes_from_the_cache(tmp_path):
    q, out = _stopped_run(tmp_path)
    full = _run(_cfg(q), tmp_path / "full")
    (out / "parts" / "0002" / "state.json").write_text("{")
    shutil.rmtree(out / "parts" / "0002")  # what the message says to do
    factory = _Factory()
    resumed = _run(_cfg(q), out, factory)
    assert resumed.metrics == full.metrics
    for name in ("nodes", "answers", "hits"):
        assert pl.read_parquet(out / f"{name}.parquet").equals(pl.read_parquet(tmp_path / "full" / f"{name}.parquet"))


def test_parts_are_appended_never_replaced(tmp_path):
    from clarify.batch.run.rundir import RunDir

    _, out = _stopped_run(tmp_path)
    before = (out / "parts" / "0002" / "state.json").read_bytes()
    assert RunDir(out).write_part({}, []) == 3
    assert (out / "parts" / "0002" / "state.json").read_bytes() == before


def test_damaged_summary_and_config_are_one_line(tmp_path):
    q = _questions(tmp_path, *QS)
    out = tmp_path / "r"
    _run(_cfg(q), out)
    (out / "summary.json").write_text('{"name": ')
    with pytest.raises(InputError, match=r"summary.json:1: damaged \(bad JSON: .*delete it"):
        _run(_cfg(q), out)
    (out / "config.json").write_text("{")
    with pytest.raises(InputError, match=r"config.json:1: damaged \(bad JSON: .*--restart"):
        _run(_cfg(q), out)


# --- corruption repaired silently is still reported ------------------------------------------------------

def test_recomputed_cache_rows_are_reported_in_summary_and_terminal(tmp_path):
    import io
    import sqlite3

    from clarify.batch.cli.commands import print_summary
    from clarify.batch.run.records import CacheRecomputed

    q = _questions(tmp_path, *QS)
    out = tmp_path / "r"
    assert _run(_cfg(q), out).cache_recomputed == CacheRecomputed(rows=0, reasons={})
    db = sqlite3.connect(out / "cache" / "completions.sqlite")
    db.execute("UPDATE completions SET payload = replace(payload, 'answer', 'ANSWER') "
               "WHERE rowid IN (SELECT rowid FROM completions WHERE payload LIKE '%answer%' LIMIT 2)")
    db.commit()
    db.close()
    factory = _Factory()
    summary = _run(_cfg(q), out, factory, restart=True)
    assert summary.cache_recomputed.to_json() == {"rows": 2, "reasons": {"checksum mismatch": 2}}
    assert len(factory.made[0].prompts_seen) == 2  # exactly the damaged rows were asked again
    assert json.loads((out / "summary.json").read_text())["cache_recomputed"]["rows"] == 2
    text = io.StringIO()
    print_summary(summary, out=text)
    assert "cache rows recomputed        2 (checksum mismatch: 2;" in text.getvalue()


# --- smaller items ----------------------------------------------------------------------------------------

def _asqa_ids(n):
    from clarify.asqa_file import load_asqa
    from clarify.files import data_dir

    return load_asqa(data_dir() / "asqa" / "dev.json")[0]["qid"].head(n).to_list()


def test_eval_predictions_bom_repeated_ids_and_non_utf8_by_line(tmp_path):
    from clarify.eval.io import read_predictions

    a, b = _asqa_ids(2)
    p = tmp_path / "p.json"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({a: "x", b: "y"}).encode())  # a BOM, as every other reader takes
    assert read_predictions(p)["qid"].to_list() == [a, b]
    p.write_text(f'{{\n "{a}": "first",\n "{b}": "y",\n "{a}": "second"\n}}\n')
    with pytest.raises(InputError, match=rf"p.json:4: id '{a}' is given twice"):
        read_predictions(p)
    p.write_bytes(f'{{\n "{a}": "caf'.encode() + b"\xe9" + b'"\n}\n')
    with pytest.raises(InputError, match=rf"p.json:2: not UTF-8 \(invalid continuation byte at byte {9 + len(a)} of"):
        read_predictions(p)


def test_eval_limit_zero_means_every_question_as_for_run(tmp_path, capsys):
    a, b = _asqa_ids(2)
    p = tmp_path / "p.json"
    p.write_text(json.dumps({a: "an answer", b: "another"}))
    args = ["eval", "--dataset", "asqa", "--predictions", str(p), "--only-predicted", "--out", str(tmp_path / "e")]
    assert main([*args, "--limit", "0"]) == 0
    assert pl.read_parquet(tmp_path / "e" / "per_question.parquet").height == 2
    assert main([*args, "--limit", "-1"]) == 2
    assert "--limit must be >= 0" in capsys.readouterr().err


def test_ids_must_be_strings_or_integers(tmp_path):
    from clarify.eval.datasets.jsonl import read_questions_jsonl
    from clarify.eval.io import read_predictions

    p = tmp_path / "q.jsonl"
    p.write_text('{"qid": 7, "question": "Who?"}\n{"qid": 1.5, "question": "What?"}\n')
    with pytest.raises(InputError, match=r"q.jsonl:2 \(field 'qid'\): an id must be a string or an integer, got float"):
        read_questions_jsonl(p)
    p.write_text('{"qid": 7, "question": "Who?"}\n')
    assert read_questions_jsonl(p)["qid"].to_list() == ["7"]
    p.write_text('{"qid": true, "answer": "x"}\n')
    with pytest.raises(InputError, match=r"q.jsonl:1 \(field 'qid'\): an id must be a string or an integer, got bool"):
        read_predictions(p)


def test_a_directory_given_as_a_file_is_named_so(tmp_path):
    from clarify.asqa_file import load_asqa
    from clarify.eval.datasets.jsonl import read_questions_jsonl
    from clarify.local_llm.cli import read_prompts

    for reader in (read_questions_jsonl, load_asqa, read_prompts):
        with pytest.raises(InputError, match="is a directory, not a file"):
            reader(tmp_path)


def test_offset_past_the_end_is_named_so():
    from clarify.batch.run.resources import load_questions

    with pytest.raises(InputError, match=r"offset 5000 is past the end: .*dev.json has 948 question"):
        load_questions(config.load(None, {"offset": 5000, "limit": 3}))
    with pytest.raises(InputError, match="overlap the demo pool"):  # inside the file, still the pool guard
        load_questions(config.load(None, {"offset": 600, "limit": 3}))


@pytest.mark.parametrize("dataset", ["jsonl", "quotesum"])  # searched passages; a question's own sources
def test_answered_but_unfinalized_run_writes_its_tables_without_a_model(tmp_path, dataset):
    from clarify.batch.run.rundir import FINAL_TABLES

    q = _questions(tmp_path, *QS)
    cfg = _cfg(q) if dataset == "jsonl" else config.load(None, {"dataset": "quotesum", "limit": 2})
    out = tmp_path / "r"
    first = _run(cfg, out)
    tables = {n: pl.read_parquet(out / f"{n}.parquet") for n in FINAL_TABLES}
    (out / "summary.json").unlink()  # as a crash between the last checkpoint and the summary leaves it
    for n in FINAL_TABLES:
        (out / f"{n}.parquet").unlink()

    def no_model(_cfg):
        raise AssertionError("the model was loaded to write tables")

    again = run(cfg, out, engine_factory=no_model, index=_INDEX, progress=False)
    timing = ("wall_s_last_session", "wall_s_total", "seconds_last_session", "engine_tokens_per_s",
              "engine_usage_last_session", "peak_memory_last_session", "toc_s_last_session")
    assert {k: v for k, v in again.to_json().items() if k not in timing} == {k: v for k, v in first.to_json().items() if k not in timing}
    for n in FINAL_TABLES:
        assert pl.read_parquet(out / f"{n}.parquet").equals(tables[n]), n


def test_generate_refuses_an_over_long_prompt_by_line_before_loading(tmp_path, capsys, monkeypatch):
    from clarify.local_llm import vllm_engine

    def no_engine(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(vllm_engine, "get_engine", no_engine)
    p = tmp_path / "prompts.jsonl"
    p.write_text(json.dumps({"id": "short", "prompt": "Say hi."}) + "\n"
                 + json.dumps({"id": "long", "prompt": "word " * 8000}) + "\n")
    assert main(["generate", "--prompts", str(p), "--out", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err
    assert f"{p}:2 (field 'prompt'): prompt 'long' has 80" in err and f"max_model_len) is {EngineOptions.max_model_len}" in err
    assert "Traceback" not in err


def test_wave_checkpoints_of_older_clarify_say_restart_and_restart_finishes(tmp_path):
    q = _questions(tmp_path, *QS)
    out = tmp_path / "r"
    _run(_cfg(q), out, stop_after_parts=1, part_trees=1)
    (out / "parts").rename(out / "waves")  # what clarify wrote before continuous scheduling
    factory = _Factory()
    with pytest.raises(InputError, match=r"waves: this run directory was written by an older clarify.*--restart"):
        _run(_cfg(q), out, factory)
    assert not factory.made
    assert _run(_cfg(q), out, factory, restart=True).n_questions == 2
    assert not (out / "waves").exists()


def test_demo_with_a_damaged_frozen_config_is_one_line(tmp_path, capsys):
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "config.json").write_text('{"limit": ')
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err
    assert "config.json:1: damaged" in err and "Traceback" not in err


def test_out_under_a_file_is_one_line(tmp_path):
    q = _questions(tmp_path, *QS)
    (tmp_path / "afile").write_text("")
    with pytest.raises(InputError, match=r"afile/r: cannot use as a run directory: Not a directory"):
        _run(_cfg(q), tmp_path / "afile" / "r")


def test_a_damaged_completion_cache_is_named_before_anything_loads(tmp_path):
    """A cache SQLite cannot read was found only after the engine had loaded: now before the
    run directory is written and before any engine, in one line with what to do."""
    q = _questions(tmp_path, *QS)
    out = tmp_path / "r"
    (out / "cache").mkdir(parents=True)
    (out / "cache" / "completions.sqlite").write_bytes(b"this is not SQLite" * 100)
    factory = _Factory()
    with pytest.raises(InputError, match=r"completions.sqlite: not a usable completion cache .*move it aside") as err:
        _run(_cfg(q), out, factory)
    assert not factory.made and not (out / "config.json").exists()
    assert "\n" not in str(err.value)
    (out / "cache" / "completions.sqlite").rename(out / "cache" / "completions.sqlite.bad")  # what it says
    _run(_cfg(q), out, factory)
    assert (out / "summary.json").exists()


def test_a_finished_run_missing_a_final_table_rebuilds_it_with_no_engine(tmp_path):
    """Final tables deleted from a finished run: the same command wrote nothing and exited 0 while
    `clarify eval` asked "has it finished?". Now it rebuilds them from the parts (no engine)."""
    q = _questions(tmp_path, *QS)
    out = tmp_path / "r"
    _run(_cfg(q), out)
    before = {name: pl.read_parquet(out / f"{name}.parquet") for name in ("answers", "nodes", "llm_calls")}
    for name in before:
        (out / f"{name}.parquet").unlink()
    factory = _Factory()
    summary = _run(_cfg(q), out, factory)
    assert not factory.made and summary.n_questions == 2
    for name, table in before.items():
        assert pl.read_parquet(out / f"{name}.parquet").equals(table), name


# --- a full disk and a read-only file system on the real command line: one line naming the path
# and what to do, never pages of tracebacks. A small tmpfs mounted for the test stands in for the disk
# (root only; elsewhere these skip, saying why).

@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs (a disk that fills, a file system made read-only)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


FILL_AFTER_PART = """
import sys
from clarify.batch import cli
from clarify.batch.run import resources, rundir
from clarify.local_llm.engine import request_key
from clarify.local_llm.scripted import ScriptedEngine
from clarify.local_llm.settings import EngineOptions
from tests.test_toc import make_responder

resources.engine_for = lambda model, tree, **kw: ScriptedEngine("scripted", make_responder())
filler = sys.argv[1]
if filler != "-":  # the disk fills up right after part 1 is written
    write_part = rundir.RunDir.write_part
    def fill_after(self, *a, **kw):
        n = write_part(self, *a, **kw)
        if n == 1:
            try:
                with open(filler, "wb") as fh:
                    while True:
                        fh.write(b"\\0" * 2**20)
            except OSError:
                pass
        return n
    rundir.RunDir.write_part = fill_after
sys.exit(cli.main(sys.argv[2:]))
"""


def _cli_run(filler, argv):
    env = {**os.environ, "PYTHONPATH": ":".join(sys.path)}
    return subprocess.run([sys.executable, "-c", FILL_AFTER_PART, str(filler), *argv], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.integration
def test_a_full_disk_is_one_line_and_the_run_resumes(tmp_path, small_disk, default_index):
    """Was ~100 lines, printed twice, the real cause hidden (measured on 2548218)."""
    q = _questions(tmp_path, *QS, "Who won the most recent Tour de France?")
    out = small_disk / "run"
    argv = ["run", "--dataset", "jsonl", "--questions", str(q), "--index", str(default_index), "--out", str(out),
            "--answer-style", "free", "--no-progress", "--part-trees", "1"]
    proc = _cli_run(small_disk / "filler", argv)
    assert proc.returncode == 1, proc.stderr[-3000:]
    line, = proc.stderr.strip().splitlines()
    assert line.startswith(f"clarify run: error: cannot write {out}") and "No space left on device" in line
    assert "free space on that disk" in line and (out / "parts" / "0001").exists()
    (small_disk / "filler").unlink()
    proc = _cli_run("-", argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["n_questions"] == 3


@pytest.mark.integration
def test_a_read_only_finished_run_is_one_line(tmp_path, small_disk, default_index):
    """A finished run on a file system made read-only (they raised OSError from the log handler and from
    eval's output folder): `clarify run` shows its results (nothing to write; its log goes to
    $CLARIFY_HOME/logs), `clarify eval`, which writes beside it by default, says so in one line."""
    out = small_disk / "run"
    argv = ["run", "--dataset", "asqa", "--limit", "2", "--index", str(default_index), "--out", str(out),
            "--answer-style", "free", "--no-progress"]
    assert _cli_run("-", argv).returncode == 0
    assert subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True).returncode == 0
    proc = _cli_run("-", argv)
    assert proc.returncode == 0 and "valid nodes / question" in proc.stdout, proc.stderr[-3000:]
    proc = _cli_run("-", ["eval", "--dataset", "asqa", "--predictions", str(out)])
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]  # after its progress: one line, no traceback
    assert "Traceback" not in proc.stderr and line == (
        f"clarify eval: error: cannot write {out / 'eval'}: Read-only file system; the file system is "
        "read-only: write elsewhere (--out, or $CLARIFY_HOME for logs and models)")
