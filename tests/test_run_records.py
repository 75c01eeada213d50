"""The run directory's JSON records (batch/run/records.py): inputs.json pins the prompts (batch/toc/fingerprint.py),
so a resume by other prompts is refused; summary.json is a `RunSummary`; both read their older layouts, and so
does a resume read an older config.json (rundir.config_changes).
Scripted engine and the small stand-in index."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from clarify import console
from clarify.batch import config
from clarify.batch.config import RESULT_FREE
from clarify.batch.run.records import INPUTS_SCHEMA, SUMMARY_SCHEMA, RunSummary
from clarify.batch.run.rundir import FINAL_TABLES, Run, RunDir
from clarify.batch.toc import fingerprint, prompts
from clarify.batch.toc import format as fmt
from clarify.errors import InputError
from tests.test_reliability import QS, _cfg, _Factory, _questions, _run


def test_a_prompt_edit_between_start_and_resume_is_refused_and_restart_recomputes(tmp_path, monkeypatch):
    cfg, out = _cfg(_questions(tmp_path, *QS)), tmp_path / "r"
    assert _run(cfg, out, stop_after_parts=1, part_trees=1) is None
    pinned = json.loads((out / "inputs.json").read_text())
    assert pinned["schema_version"] == INPUTS_SCHEMA and set(pinned["prompts"]) == set(fingerprint.COMPONENTS)

    monkeypatch.setattr(prompts, "CLARIFY_INSTRUCTIONS", prompts.CLARIFY_INSTRUCTIONS + " Be brief.")
    factory = _Factory()
    with pytest.raises(InputError) as err:
        _run(cfg, out, factory=factory)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{out / 'inputs.json'}: this run was started with other prompts")
    assert "the prompt templates (batch/toc/prompts.py, batch/toc/format.py) changed" in msg and "--restart" in msg
    assert "parser" not in msg and factory.made == []  # refused before the engine is built

    summary = _run(cfg, out, factory=factory, restart=True)
    assert summary.n_questions == 2 and factory.made[0].prompts_seen  # recomputed: new prompts, new calls
    clarify = pl.read_parquet(out / "llm_calls.parquet").filter(pl.col("step") == "clarify")
    assert clarify["prompt"].str.contains("Be brief.").all()


def test_a_finished_run_is_read_back_whatever_the_prompts_now(tmp_path, monkeypatch):
    """Nothing of a finished run is recomputed, so nothing can mix: a re-run returns its summary."""
    cfg, out = _cfg(_questions(tmp_path, *QS)), tmp_path / "r"
    summary = _run(cfg, out)
    monkeypatch.setattr(prompts, "CLARIFY_INSTRUCTIONS", "Other instructions.")
    factory = _Factory()
    assert _run(cfg, out, factory=factory) == summary and factory.made == []


def test_each_component_is_named_by_what_changed(monkeypatch):
    before = fingerprint.prompts_fingerprint()
    assert fingerprint.prompts_fingerprint() == before  # stable: computed from the code, nothing random
    monkeypatch.setattr(fmt, "ANSWER_STOP", (*fmt.ANSWER_STOP, "\nNote:"))
    assert fingerprint.changed(before, fingerprint.prompts_fingerprint()) == [
        "the stop strings (batch/toc/format.py)"]
    monkeypatch.setattr(prompts, "VERIFY_INSTRUCTIONS", "Say True or False.")
    assert fingerprint.changed(before, fingerprint.prompts_fingerprint()) == [
        "the prompt templates (batch/toc/prompts.py, batch/toc/format.py)", "the stop strings (batch/toc/format.py)"]


def test_code_is_fingerprinted_without_its_comments_and_docstrings(tmp_path, monkeypatch):
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    digests = []
    for n, text in enumerate(['"""Doc."""\n\ndef f(x):\n    return x + 1\n',
                              '"""Other doc."""\n\n\ndef f(x):  # why\n    """What f does."""\n    return x + 1\n',
                              'def f(x):\n    return x + 2\n']):
        (tmp_path / f"fp_probe{n}.py").write_text(text)
        digests.append(fingerprint._code(importlib.import_module(f"fp_probe{n}")))
    assert digests[0] == digests[1] != digests[2]


def test_an_unchanged_resume_makes_no_engine_call(tmp_path):
    """The last part lost after its completions reached the cache: the resume passes the prompts check and
    replays that tree from the completion cache, without one engine call."""
    cfg, out = _cfg(_questions(tmp_path, *QS)), tmp_path / "r"
    first = _run(cfg, out, part_trees=1)
    tables = {n: pl.read_parquet(out / f"{n}.parquet") for n in FINAL_TABLES}
    shutil.rmtree(out / "parts" / "0002")
    (out / "summary.json").unlink()
    factory = _Factory()
    again = _run(cfg, out, factory=factory)
    assert len(factory.made) == 1 and factory.made[0].calls == 0  # the engine was opened, never asked
    assert again.metrics == first.metrics and again.llm_calls == first.llm_calls
    for n in ("nodes", "hits", "answers", "spans", "passages", "scores"):
        assert pl.read_parquet(out / f"{n}.parquet").equals(tables[n]), n


def test_a_run_directory_without_the_prompts_fingerprint_resumes_says_so_and_records_it(tmp_path):
    cfg, out = _cfg(_questions(tmp_path, *QS)), tmp_path / "r"
    _run(cfg, out, stop_after_parts=1, part_trees=1)
    pinned = json.loads((out / "inputs.json").read_text())
    old = {k: v for k, v in pinned.items() if k not in ("schema_version", "prompts")}  # as clarify wrote it before
    (out / "inputs.json").write_text(json.dumps(old))
    console._notes.clear()
    assert _run(cfg, out).n_questions == 2
    assert any("did not record its prompts" in n for n in console.notes())
    assert json.loads((out / "inputs.json").read_text()) == pinned  # the old layout was read once, and upgraded


def test_summary_json_is_a_declared_record_and_older_ones_still_open(tmp_path):
    cfg, out = _cfg(_questions(tmp_path, *QS)), tmp_path / "r"
    summary = _run(cfg, out)
    written = json.loads((out / "summary.json").read_text())
    assert written == json.loads(json.dumps(summary.to_json())) and written["schema_version"] == SUMMARY_SCHEMA
    assert RunSummary.read(out / "summary.json", "").to_json() == written  # the reader and the writer agree
    # what wall time, calls and metrics are read under: the keys every reader of summary.json uses
    assert {"wall_s_total", "wall_s_last_session", "llm_calls_per_question", "metrics", "tokens"} <= set(written)

    del written["schema_version"]  # summary.json as clarify wrote it before the version existed
    (out / "summary.json").write_text(json.dumps(written))
    run = Run.open(out)
    assert run.summary.schema_version == 1 and run.summary.wall_s_total == summary.wall_s_total

    (out / "summary.json").write_text(json.dumps({**written, "schema_version": SUMMARY_SCHEMA + 1}))
    with pytest.raises(InputError, match=r"summary.json \(field 'schema_version'\): written by a newer clarify"):
        Run.open(out)


def test_inputs_json_of_a_newer_clarify_is_refused_by_name(tmp_path):
    cfg, out = _cfg(_questions(tmp_path, *QS)), tmp_path / "r"
    _run(cfg, out, stop_after_parts=1, part_trees=1)
    pinned = json.loads((out / "inputs.json").read_text())
    (out / "inputs.json").write_text(json.dumps({**pinned, "schema_version": INPUTS_SCHEMA + 1}))
    with pytest.raises(InputError, match=r"inputs.json \(field 'schema_version'\): written by a newer clarify"):
        _run(cfg, out)


def test_the_demo_text_is_fingerprinted_as_the_prompt_renders_it(monkeypatch):
    """A clarification demo's pairs are the datasets' QAPairs, whose DA lines the prompt renders from their
    short answers: an edit of that rendering changes the prompt templates' digest (a resume is refused)."""
    before = fingerprint.prompts_fingerprint()
    monkeypatch.setattr(fmt, "da_text", lambda answers: " / ".join(answers))
    assert fingerprint.changed(before, fingerprint.prompts_fingerprint()) == [
        "the prompt templates (batch/toc/prompts.py, batch/toc/format.py)"]


def test_the_parser_is_fingerprinted_by_the_code_it_reaches(tmp_path, monkeypatch):
    """The DQ/DA parser shares batch/toc/format.py with the templates and the grammar: its digest covers
    what its entry points reach (a helper, a label they read), not an edit of the module's other parts."""
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    base = ('import re\nDQ = "DQ"\nGUIDE = "DQ i: ..."\n\ndef _pattern():\n    return re.compile(DQ)\n\n'
            'def parse(text):\n    return _pattern().findall(text)\n\ndef grammar():\n    return GUIDE\n')
    variants = [base, base.replace('GUIDE = "DQ i: ..."', 'GUIDE = "Q i: ..."'),
                base.replace("return GUIDE", "return GUIDE + '!'"),
                base.replace('DQ = "DQ"', 'DQ = "Q"'), base.replace("re.compile(DQ)", "re.compile(DQ, re.I)")]
    digests = []
    for n, text in enumerate(variants):
        (tmp_path / f"fp_parser{n}.py").write_text(text)
        digests.append(fingerprint._code(importlib.import_module(f"fp_parser{n}"), ("parse",)))
    assert digests[0] == digests[1] == digests[2]  # the guide and the grammar are not the parser
    assert len({digests[0], digests[3], digests[4]}) == 3  # a label it reads, a helper it calls
    with pytest.raises(ValueError, match="defines no nope"):
        fingerprint._code(importlib.import_module("fp_parser0"), ("parse", "nope"))
# config.json as the clarify of commit cb8692c wrote it (`clarify run` of 1 ASQA question, free answers, one
# expansion; scripted engine): the last clarify before the decoding constraints and every setting added since.
OLD_CONFIG = Path(__file__).with_name("old_layouts") / "config-cb8692c.json"
# The settings that clarify lacked, each of which it ran as the current default (decoding unconstrained, the
# engine in this process with its own batch size and chat template, the index's own parts, the DQ/DA parser
# reading every official pair: docs/fidelity.md#the-differences). A setting added later shows up here: if its
# default is not what older clarify did, an older run must not resume under it, and the normalised
# comparison (rundir.config_changes) cannot see that by itself.
ADDED_SINCE = {"toc.constrain_format", "toc.parsing", "answer.constrain_quotes", "retrieval.faiss_index",
               "retrieval.encoder", "retrieval.nprobe", "retrieval.ef_search", "model.batch_invariant",
               "model.max_num_seqs", "model.backend", "model.base_url", "model.api_key_env", "model.endpoint",
               "model.max_concurrency", "model.request_timeout_s", "model.max_retries", "model.quantization",
               "model.chat_template", "model.check_timeout_s", "model.reply_bytes_per_token"}


def _keys(d: dict, prefix: str = "") -> set[str]:
    return {k for key, v in d.items() for k in (_keys(v, f"{prefix}{key}.") if isinstance(v, dict) else {prefix + key})}


def _checkpointed(tmp_path, raw: dict) -> RunDir:
    """A run directory whose config.json is `raw` and which holds a finished part, so its config is binding."""
    rd = RunDir(tmp_path / "old")
    (rd.parts_dir / "0001").mkdir(parents=True)
    (rd.path / "config.json").write_text(json.dumps(raw))
    (rd.path / "inputs.json").write_text(json.dumps({}))
    return rd


def test_an_older_config_json_reads_as_what_that_clarify_did_and_resumes(tmp_path):
    raw = json.loads(OLD_CONFIG.read_text())
    same = config.load(None, {"limit": 1, "answer_style": "free", "toc.max_expansions": 1,
                              "demo_pool": "asqa:dev[500:]"})
    now = json.loads(same.to_json())
    assert _keys(now) - _keys(raw) == ADDED_SINCE
    assert config.from_dict(raw) == same  # every setting it lacks reads as its default

    rd = _checkpointed(tmp_path, raw)
    rd.freeze(now, {})  # resumes, and records the settings in full
    assert json.loads(rd.config_file.read_text()) == now
    rd.config_file.write_text(json.dumps(raw))
    for key, value, said in (("toc.constrain_format", True, "toc.constrain_format: False → True"),
                             ("toc.max_depth", 2, "toc.max_depth: 3 → 2"),
                             ("answer_style", "quoted", "answer_style: 'free' → 'quoted'")):
        other = json.loads(config.load(None, {"limit": 1, "answer_style": "free", "toc.max_expansions": 1,
                                              "demo_pool": "asqa:dev[500:]", key: value}).to_json())
        with pytest.raises(InputError) as err:
            rd.freeze(other, {})
        assert str(err.value).endswith(f"Differences: {said}"), str(err.value)
    # a setting that never changes results resumes under another value, as before
    rd.freeze(json.loads(config.load(None, {"limit": 1, "answer_style": "free", "toc.max_expansions": 1,
                                            "demo_pool": "asqa:dev[500:]", "scheduler": "waves"}).to_json()),
              {}, ignore=RESULT_FREE)


def test_a_config_json_with_a_setting_since_removed_is_refused_in_one_line(tmp_path):
    raw = json.loads(OLD_CONFIG.read_text())
    raw["toc"]["prune_twice"] = True  # a setting this clarify does not have
    raw["retrieval"]["searcher"] = "splade"  # and a value it does not know
    rd = _checkpointed(tmp_path, raw)
    with pytest.raises(InputError) as err:
        rd.freeze(json.loads(config.load(None).to_json()), {})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{rd.config_file}: 2 bad config fields")
    assert "unknown key(s) ['prune_twice']" in msg and "unknown value 'splade'" in msg
    assert "made by a clarify with other settings" in msg and "--restart" in msg
    rd.config_file.write_text("[]")
    with pytest.raises(InputError, match=r"config.json:1: expected a JSON object, got list"):
        rd.freeze(json.loads(config.load(None).to_json()), {})


def test_a_run_directory_that_lost_its_config_json_is_refused_and_restart_starts_over(tmp_path):
    """config.json is the run's first file (RunDir.freeze), so parts without it have lost the settings and
    prompts that made them: a resume under other settings (here another answer style) would mix trees of
    both in one run. Refused in one line naming --restart, before any engine is built and without touching
    inputs.json; --restart then starts over."""
    cfg, out = _cfg(_questions(tmp_path, *QS)), tmp_path / "r"
    assert _run(cfg, out, stop_after_parts=1, part_trees=1) is None
    (out / "config.json").unlink()
    pinned = (out / "inputs.json").read_bytes()
    factory = _Factory()
    with pytest.raises(InputError) as err:
        _run(_cfg(_questions(tmp_path, *QS), answer_style="quoted"), out, factory=factory)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{out}: damaged run directory: it holds inputs.json, questions.parquet, "
                                              f"parts but no config.json")
    assert "--restart" in msg and factory.made == []
    assert (out / "inputs.json").read_bytes() == pinned and not (out / "config.json").exists()
    summary = _run(cfg, out, restart=True)
    assert summary.n_questions == 2 and config.load(out / "config.json").answer_style == "free"
    assert set(pl.read_parquet(out / "answers.parquet")["qid"]) == {"q0", "q1"}


@pytest.mark.parametrize("leftover", ["inputs.json", "parts/0001/", "questions.parquet", "summary.json"])
def test_freeze_without_config_json_refuses_any_file_of_the_run_but_not_an_empty_directory(tmp_path, leftover):
    """What a run makes under its config, without that config, is refused; a new or empty directory (logs
    and the lock come before the freeze) or one holding only a completion cache (valid under any config:
    its keys name model, prompt and parameters) starts fresh."""
    now = json.loads(config.load(None).to_json())
    (tmp_path / "r" / "cache").mkdir(parents=True)
    (tmp_path / "r" / "cache" / "completions.sqlite").write_bytes(b"")
    rd = RunDir(tmp_path / "r")
    path = rd.path / leftover
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir() if leftover.endswith("/") else path.write_text("{}")
    with pytest.raises(InputError, match=rf"damaged run directory: it holds {path.parts[len(rd.path.parts)]} but "
                                         r"no config.json .*rerun with --restart"):
        rd.freeze(now, {})
    assert not rd.config_file.exists()
    rd.clear()  # --restart: keeps the completion cache only
    rd.freeze(now, {})
    assert json.loads(rd.config_file.read_text()) == now and (rd.cache_dir / "completions.sqlite").exists()
    fresh = RunDir(tmp_path / "fresh")
    fresh.logs_dir.mkdir(parents=True)  # a session's logs and the lock come before the freeze
    fresh.lock_file.touch()
    fresh.freeze(now, {})
    assert fresh.inputs_file.exists() and fresh.config_file.exists()
