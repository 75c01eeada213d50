"""Tree of Clarifications: parsing, tree bookkeeping, the schedulers vs the per-question loop,
run directories and resume — with a scripted engine and a small stand-in index (fast).
The same properties with the real vLLM engine and the real index are in test_toc_real.py."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re

import polars as pl
import pytest

from clarify.batch import config
from clarify.batch.run.pipeline import nodes_table, run
from clarify.batch.run.scheduler import SCHEDULERS, drive
from clarify.batch.toc.format import parse_disambiguations, parse_verdict
from clarify.batch.toc.program import Resources
from clarify.batch.toc.settings import TreeSettings
from clarify.batch.toc.tree import Tree
from clarify.errors import InputError
from clarify.eval.datasets.jsonl import read_questions_jsonl
from clarify.local_llm.scripted import ScriptedEngine
from tests.toc_fakes import FakeIndex

# --- parsing ----------------------------------------------------------------------------------------

def test_parse_pairs_official_layout_and_variants():
    text = "DQ 1: Who won in 2010?\nDA 1: Spain\n- DQ2. Who won in 2014?\n- DA2. Germany; Die Mannschaft\nAnswer: x\nDQ 3: no"
    p = parse_disambiguations(text)
    assert [(d.question, d.answers) for d in p.pairs] == [
        ("Who won in 2010?", ("Spain",)), ("Who won in 2014?", ("Germany", "Die Mannschaft"))]
    assert p.error is None


def test_parse_garbage_is_recorded_not_raised():
    assert parse_disambiguations("I don't know.").error == "no DQ/DA lines"
    p = parse_disambiguations("DQ 1: a?\nDQ 2: b?\nDA 2: x\nDA 3: y\nDQ 4:\nDA 4: z")
    # lines 5-6 are the official parser's pair (toc/utils.py:37-41 keeps an empty question); lines 2-3
    # are recovered (the official i / i+1 pairing drops them)
    assert [(d.question, d.da) for d in p.pairs] == [("b?", "x"), ("", "z")]
    assert "DQ without DA: 'a?'" in p.error and "DA without DQ on line 4" in p.error
    # half a line at max_tokens: the last pair is dropped and noted
    p = parse_disambiguations("DQ 1: a?\nDA 1: x\nDQ 2: b?\nDA 2: Jo", finish_reason="length")
    assert [d.question for d in p.pairs] == ["a?"] and "cut at max_tokens" in p.error
    # an official pair whose DA holds no answer is kept as the official code keeps it, and noted
    p = parse_disambiguations("DQ 1: a?\nDA 1: ;  ;")
    assert [(d.question, d.answers, d.da) for d in p.pairs] == [("a?", (), ";  ;")] and "empty DA" in p.error
    # a recovered pair (not the official one's) with no answer is dropped
    assert parse_disambiguations("x\nDQ 1: a?\nDA 1: ;  ;").pairs == []


def test_parse_verdict():
    assert parse_verdict("True") == (True, None)
    assert parse_verdict(" false.") == (False, None)
    assert parse_verdict("False. True would need...")[0] is False
    keep, err = parse_verdict("Maybe")
    assert keep is False and "neither True nor False" in err


def test_questions_jsonl_errors_name_file_and_line(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_bytes(b'{"qid": "a", "question": "Who?"}\n{"qid": "b", "question": ""}\n')
    with pytest.raises(InputError, match=r"q.jsonl:2 \(field 'question'\)"):
        read_questions_jsonl(p)
    p.write_bytes(b'{"qid": "a", "question": "Who?"}\n{oops\n')
    with pytest.raises(InputError, match=r"q.jsonl:2: malformed JSON"):
        read_questions_jsonl(p)
    p.write_bytes(b'{"qid": "a", "question": "Caf\xe9?"}\n')
    with pytest.raises(InputError, match=r"q.jsonl:1: not UTF-8"):
        read_questions_jsonl(p)
    p.write_text(json.dumps({"qid": "a", "question": "x" * 5000}) + "\n")
    with pytest.raises(InputError, match="5000 characters"):
        read_questions_jsonl(p)
    p.write_text('{"qid": "a", "question": "Who?"}\n{"qid": "a", "question": "What?"}\n')
    with pytest.raises(InputError, match="duplicate qid"):
        read_questions_jsonl(p)


# --- a scripted model -------------------------------------------------------------------------------

def _h(*parts) -> int:
    return int(hashlib.sha1("|".join(map(str, parts)).encode()).hexdigest(), 16)


def make_responder(verdict="hash", garbage=False, fanout=2):
    """Clarify: `fanout` pairs derived from the asked question and the seed; verify: by `verdict`."""

    def respond(prompt: str, params) -> str:
        if params.choices:  # verification
            if verdict == "hash":
                return "True" if _h(prompt) % 3 else "False"
            return verdict
        if "DQ i:" in prompt and prompt.rstrip().endswith("Disambiguations:"):
            q = re.findall(r"Question: (.*)", prompt)[-1]
            h = _h(q, params.seed)
            if garbage and h % 2:
                return ["Sorry, no idea.", "DQ 1: half a line", "DA 1: orphan"][h % 3]
            return "\n".join(f"DQ {i}: {q.rstrip('?')} in reading {h % 97 + i}?\nDA {i}: answer {h % 89 + i}"
                             for i in range(1, fanout + 1)) + "\nAnswer: ignored"
        return "[1 some words] and more."

    return respond


def _resources(engine, index=None):
    from clarify.batch.toc.demos import KnnPool
    from clarify.eval import datasets

    index = index or FakeIndex()
    embed = index.encoder.encode
    store = {r["passage_id"]: r for r in index.passages.iter_rows(named=True)}
    from clarify.schemas import Passage

    return Resources(
        engine=engine, searcher=index.searcher(), embed=embed,
        passages=lambda ids: {i: Passage(i, store[i]["title"], store[i]["text"]) for i in ids},
        demos=KnnPool(datasets.get("asqa").demos(start=500, stop=560), embed, name="t-asqa", encoder_id="hash"),
        quoted_demos=KnnPool(datasets.get("quotesum").demos(), embed, name="t-qs", encoder_id="hash"),
        rerank=index.scorer().score)


QUESTIONS = ["Who has the highest goals in world football?", "When did the last world cup take place?",
             "Who played the mother in how i met your mother?", "What is the capital of georgia?"]


def _trees(verify=True):
    return [Tree.new(f"q{i}", q, verify=verify) for i, q in enumerate(QUESTIONS)]


def _cfg(**toc) -> TreeSettings:
    return TreeSettings.of(config.load(None, {"answer_style": "free", **{f"toc.{k}": v for k, v in toc.items()}}))


def test_bfs_limits_depth_and_max_nodes():
    cfg = _cfg()
    eng = ScriptedEngine("scripted", make_responder(verdict="True", fanout=2))
    trees = _trees()
    rec = drive("waves", trees, _resources(eng), cfg)
    for t in trees:
        # breadth first (run_toc.py:214 pops the queue's front): the root, its children in order, then
        # the grandchildren; two children per expansion reach 10 valid nodes after five expansions
        order = [c.node_id for c in rec.llm_calls if c.step == "clarify" and c.qid == t.qid]
        assert order == ["0", "0.1", "0.2", "0.1.1", "0.1.2"]
        depths = [n.depth for n in t.nodes]
        assert max(depths) <= cfg.toc.max_depth
        assert len(t.valid) >= cfg.toc.max_nodes  # stops once 10 valid nodes exist (may overshoot in one step)
        assert len(t.valid) < cfg.toc.max_nodes + 3
        assert t.n_expansions <= cfg.toc.max_expansions + 1
        assert all(n.status in ("root", "valid") for n in t.nodes)


def test_depth_limit_stops_expansion():
    cfg = _cfg(max_depth=1, max_nodes=50)
    eng = ScriptedEngine("scripted", make_responder(verdict="True", fanout=2))
    trees = _trees()
    drive("waves", trees, _resources(eng), cfg)
    for t in trees:
        assert max(n.depth for n in t.nodes) == 1
        # only the root is ever expanded: once per restart (max_restarts=3 → 1 + 2 restarts... until limits)
    assert all(n.parent_id in (None, "0") for t in trees for n in t.nodes)


def test_all_pruned_then_pruning_undone():
    cfg = _cfg()
    eng = ScriptedEngine("scripted", make_responder(verdict="False"))
    trees = _trees()
    rec = drive("waves", trees, _resources(eng), cfg)
    for t in trees:
        statuses = [n.status for n in t.nodes]
        assert "pruned" in statuses
        # after max_restarts fruitless restarts the verifier is switched off and nodes survive
        assert t.pruning is False and "valid" in statuses
    calls = pl.DataFrame(rec.llm_calls)
    assert set(calls["step"]) == {"clarify", "verify", "answer"}


def test_restarts_from_root_when_queue_empties():
    cfg = _cfg(max_depth=1, max_nodes=100, max_expansions=100)
    eng = ScriptedEngine("scripted", make_responder(verdict="True", fanout=1))
    trees = _trees()
    drive("waves", trees, _resources(eng), cfg)
    for t in trees:
        # depth-1 children are never expanded (depth limit), so every expansion is the root, each time
        # after a restart: the loop ends when restarts reach max_restarts
        assert t.n_restarts == cfg.toc.max_restarts
        assert {n.parent_id for n in t.nodes if n.parent_id} == {"0"}


def test_garbage_output_never_crashes_and_is_recorded():
    cfg = _cfg()
    eng = LooseEngine("scripted", make_responder(verdict="Maybe", garbage=True))
    trees = _trees()
    rec = drive("waves", trees, _resources(eng), cfg)
    calls = pl.DataFrame(rec.llm_calls)
    errs = calls.filter(pl.col("parse_error").is_not_null())
    assert errs.height > 0
    assert errs.filter(pl.col("step") == "verify")["parse_error"].str.contains("neither True nor False").all()
    assert len(rec.answers) == len(QUESTIONS)


def _calls(calls: list[dict]) -> pl.DataFrame:
    # `cached` says whether THIS run computed a row; everything else must match row for row
    return pl.DataFrame(calls).drop("cached")


@pytest.mark.parametrize("responder", [make_responder(), make_responder(verdict="False"),
                                       make_responder(garbage=True, verdict="Maybe")])
def test_every_scheduler_equals_the_per_question_loop(tmp_path, responder):
    cfg = _cfg()
    got = {}
    for name in SCHEDULERS:
        engine = LooseEngine("scripted", responder)
        trees = _trees()
        got[name] = (engine, trees, drive(name, trees, _resources(engine), cfg))
    _, seq_trees, seq = got["sequential"]
    for name in ("waves", "continuous"):
        _, trees, rec = got[name]
        assert nodes_table(trees).equals(nodes_table(seq_trees)), name
        assert pl.DataFrame(rec.answers).equals(pl.DataFrame(seq.answers)), name
        assert pl.DataFrame(rec.hits).equals(pl.DataFrame(seq.hits)), name
        assert _calls(rec.llm_calls).equals(_calls(seq.llm_calls)), name
    # batching: waves made one generate call per wave, the loop one per request of each question
    assert got["waves"][0].calls < got["sequential"][0].calls / 2


def _run_cfg(tmp_path, **kw):
    return config.load(None, {"dataset": "asqa", "limit": 3, "answer_style": "free", "toc.max_expansions": 4,
                              **kw})


def test_run_dir_resume_and_rerun_makes_zero_calls(tmp_path):
    index = FakeIndex()
    cfg = _run_cfg(tmp_path)
    made = []

    def factory(_cfg):
        eng = ScriptedEngine("scripted", make_responder())
        made.append(eng)
        return eng

    full = run(cfg, tmp_path / "full", engine_factory=factory, index=index, progress=False)
    out = tmp_path / "resumed"
    assert run(cfg, out, engine_factory=factory, index=index, progress=False, stop_after_parts=2,
               part_trees=1) is None
    assert len(list((out / "parts").iterdir())) == 2 and not (out / "summary.json").exists()
    resumed = run(cfg, out, engine_factory=factory, index=index, progress=False)
    for name in ("nodes", "answers", "hits"):
        a = pl.read_parquet(tmp_path / "full" / f"{name}.parquet")
        b = pl.read_parquet(out / f"{name}.parquet")
        assert a.equals(b), name
    a = pl.read_parquet(tmp_path / "full" / "llm_calls.parquet").drop("cached")
    b = pl.read_parquet(out / "llm_calls.parquet").drop("cached")
    assert a.equals(b)
    assert full.metrics == resumed.metrics
    # the resumed run asked the model only for what the first part had not done
    assert len(made[1].prompts_seen) + len(made[2].prompts_seen) == len(made[0].prompts_seen)

    # a finished run again: zero model calls (no engine is even built), nothing rewritten
    def mtimes():  # the lock file names its latest holder; no data file is rewritten
        return {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != ".lock"}

    before = mtimes()
    n_made = len(made)
    again = run(cfg, out, engine_factory=factory, index=index, progress=False)
    assert again == resumed and len(made) == n_made
    assert before == mtimes()


def test_rerun_with_fresh_state_hits_cache_only(tmp_path):
    """Delete every table but keep the cache: the whole run is answered from the cache."""
    import shutil

    index = FakeIndex()
    cfg = _run_cfg(tmp_path)
    engines = []

    def factory(_cfg):
        engines.append(CountingScripted())
        return engines[-1]

    run(cfg, tmp_path / "r", engine_factory=factory, index=index, progress=False)
    for p in (tmp_path / "r").iterdir():
        if p.name != "cache" and p.name != "config.json":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    run(cfg, tmp_path / "r", engine_factory=factory, index=index, progress=False)
    assert engines[0].prompts_seen and not engines[1].prompts_seen
    calls = pl.read_parquet(tmp_path / "r" / "llm_calls.parquet")
    assert calls["cached"].all()


class CountingScripted(ScriptedEngine):
    def __init__(self):
        super().__init__("scripted", make_responder())


class LooseEngine(ScriptedEngine):
    """An engine without constrained decoding: `choices` is not enforced, so a verifier may ramble."""

    def generate(self, prompts, params):
        return super().generate(prompts, [dataclasses.replace(p, choices=None) for p in params])


def test_changed_config_is_refused(tmp_path):
    index = FakeIndex()
    run(_run_cfg(tmp_path), tmp_path / "r", engine_factory=lambda c: ScriptedEngine("s", make_responder()),
        index=index, progress=False)
    with pytest.raises(InputError, match="toc.max_depth: 3 → 2"):
        run(_run_cfg(tmp_path, **{"toc.max_depth": 2}), tmp_path / "r",
            engine_factory=lambda c: ScriptedEngine("s", make_responder()), index=index, progress=False)


def test_config_errors_name_the_field(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[toc]\nmax_dept = 2\n")
    with pytest.raises(InputError, match=r"c.toml \(field 'toc'\): unknown key\(s\) \['max_dept'\]"):
        config.load(p)
    p.write_text("limit = [\n")
    with pytest.raises(InputError, match="not valid TOML"):
        config.load(p)
    with pytest.raises(InputError, match="overlap the demo pool"):
        from clarify.batch.run.resources import load_questions

        load_questions(config.load(None, {"offset": 490, "limit": 20}))


def test_part_tables_follow_schemas():
    from clarify import schemas
    from clarify.batch.run.resources import tables
    from clarify.batch.toc.program import TreeRows

    eng = ScriptedEngine("scripted", make_responder())
    trees = _trees()[:2]
    got = drive("continuous", trees, _resources(eng), _cfg(max_expansions=2))
    schemas.check(tables([TreeRows(llm_calls=got.llm_calls)])["llm_calls"], "llm_calls")
    schemas.check(nodes_table(trees), "nodes")
    assert got.tokens > 0 and got.stats.trees == 2


def test_row_records_are_the_tables_schemas():
    """The tree's rows are declared once (schemas.py row records, each table's schema taken from its record):
    the tables a part writes from them hold what Polars makes of the same rows as plain dicts (how the
    tables were built before the records), nulls, lists and enum values included."""
    from clarify import schemas
    from clarify.batch.run.resources import tables
    from clarify.batch.toc.program import TreeRows

    eng = ScriptedEngine("scripted", make_responder(garbage=True))
    trees = _trees()[:2]
    got = drive("continuous", trees, _resources(eng), _cfg(max_expansions=3))
    part = tables([TreeRows(got.llm_calls, got.hits, got.answers)])
    nodes = [row for t in trees for row in t.node_rows()]
    for df, rows, record, name in ((part["llm_calls"], got.llm_calls, schemas.LlmCall, "llm_calls"),
                                   (part["hits"], got.hits, schemas.RunHit, "run_hits"),
                                   (part["answers"], got.answers, schemas.TreeAnswer, "tree_answers"),
                                   (nodes_table(trees), nodes, schemas.NodeRow, "nodes")):
        assert schemas.SCHEMAS[name] == schemas.table_schema(record) and df.schema == schemas.SCHEMAS[name]
        as_dicts = pl.DataFrame([dataclasses.asdict(r) for r in rows], schema=schemas.SCHEMAS[name])
        assert df.height == len(rows) > 0 and df.equals(as_dicts), name
        assert schemas.frame(schemas.rows(df, record), record).equals(df), name  # read back as they were written
    calls = part["llm_calls"]
    assert 0 < calls["parse_error"].null_count() < calls.height  # rows with and without a parse error


def test_rows_read_a_table_into_its_records():
    """The tables a run's readers read (the report, `clarify show`) are declared by row records too, and
    `schemas.rows` reads a table into them: the records' columns in their order, a column the record does not
    declare left out, one an older table lacks read as None."""
    from clarify import schemas

    for name, record in {"questions": schemas.QuestionRow, "passages": schemas.Passage, "answers": schemas.AnswerRow,
                         "spans": schemas.SpanRow, "scores": schemas.ScoreRow}.items():
        assert schemas.SCHEMAS[name] == schemas.table_schema(record), name
    scores = pl.DataFrame({"note": ["x", "y"], "qid": ["q0", "q1"], "metric": ["rougeL"] * 2, "value": [0.5, None]})
    assert schemas.rows(scores, schemas.ScoreRow) == [schemas.ScoreRow("q0", "rougeL", 0.5),
                                                      schemas.ScoreRow("q1", "rougeL", None)]
    older = scores.drop("value")
    assert [r.value for r in schemas.rows(older, schemas.ScoreRow)] == [None, None]
    assert schemas.rows(schemas.empty("spans"), schemas.SpanRow) == []


# --- bugs found reading the official code (docs/fidelity.md) --------------------------------------------------

class _NoHits:
    """A searcher that finds nothing (a stop-word-only question, a tiny index)."""

    name = "empty"

    def search(self, queries, k):
        return pl.DataFrame(schema={"qid": pl.String, "passage_id": pl.String, "score": pl.Float64,
                                    "rank": pl.Int32, "retriever": pl.String})


def test_no_passages_shown_does_not_crash_verification():
    # _evidence took np.argmax([]) when a tree had pending children but had shown no passage
    res = _resources(ScriptedEngine("scripted", make_responder(verdict="True")))
    res.searcher = _NoHits()
    trees = _trees()[:1]
    rec = drive("continuous", trees, res, _cfg(max_expansions=2))
    verify = [c for c in rec.llm_calls if c.step == "verify"]
    assert verify and all("Context:" in c.prompt for c in verify)
    assert all(n.evidence_passage_id is None for n in trees[0].nodes)
    assert len(rec.answers) == 1


def test_fits_counts_exactly_when_characters_underestimate_tokens():
    from clarify.batch.run.scheduler import Resolver, SchedStats

    class ByteTokens:  # byte-level BPE at worst: one token per UTF-8 byte
        max_model_len = 2048

        def count_tokens(self, prompt):
            return len(prompt.encode("utf-8"))

    prompts = ["日本語" * 400, "plain text " * 100]  # 1200 characters but 3600 tokens; 1100 and 1100
    res = Resources(engine=ByteTokens(), searcher=None, passages=None, embed=None, demos=None)
    assert Resolver(res, SchedStats()).fits(prompts, [64, 64]) == [False, True]


def _pair(q, *answers):
    from clarify.batch.toc.format import Disambiguation

    return Disambiguation(q, answers)


@pytest.mark.parametrize("verify", [True, False])
def test_strict_duplicates_treat_siblings_alike_with_or_without_pruning(verify):
    # a sibling whose answers an earlier sibling already gave was a duplicate only when pruning was off
    t = Tree.new("q", "Who won?", verify=verify)
    kids = t.add_candidates(t.node("0"), [_pair("Who won in 2010?", "Spain"), _pair("Who won the final?", "Spain"),
                                          _pair("Who won?", "Italy")], 1, "strict")
    first = "pending" if verify else "valid"
    assert [k.status for k in kids] == [first, "duplicate", "duplicate"]  # answer covered; root's question


def test_official_duplicates_check_unique():
    """toc/pruning.py:7-15: same question AND an earlier VALID answer inside this one; only while pruning."""
    t = Tree.new("q", "Who won?", verify=True)
    kids = t.add_candidates(t.node("0"), [_pair("Who won in 2010?", "Spain"), _pair("Who won in 2010?", "Spain"),
                                          _pair("Who won?", "Italy")], 1)
    assert [k.status for k in kids] == ["pending"] * 3  # siblings and the root are never compared
    t.settle(kids, {k.node_id: (True, "True", None) for k in kids}, _cfg().toc)
    more = t.add_candidates(kids[0], [_pair("Who won in 2010?", "Spain", "Netherlands"),
                                      _pair("who won in 2010?", "Spain"), _pair("Who won in 2010?", "Spai")], 2)
    # raw substring "Spain" in "Spain; Netherlands"; raw == is case-sensitive; "Spain" not in "Spai"
    assert [k.status for k in more] == ["duplicate", "pending", "pending"]
    t.pruning = False
    assert [k.status for k in t.add_candidates(kids[1], [_pair("Who won in 2010?", "Spain")], 3)] == ["valid"]


def test_previous_preset_restores_every_switch():
    """batch/config/previous.toml: every fidelity switch set to clarify's earlier choice (docs/fidelity.md)."""
    from pathlib import Path

    prev, default = config.load(Path(config.__file__).with_name("previous.toml")), config.load(None)
    assert (prev.retrieval.node_passages, prev.retrieval.pool) == ("search", 20)
    assert (default.retrieval.node_passages, default.retrieval.pool) == ("pool", 100)
    switches = ("duplicates", "removal", "answer_passages_from", "restart_resample", "evidence", "matching",
                "empty_tree_answer")
    assert [getattr(prev.toc, k) for k in switches] == ["strict", "shown", "nodes", True, "filter-embed", "squad",
                                                        "closed"]
    assert [getattr(default.toc, k) for k in switches] == ["official", "official", "pool", False, "filter", "dsp",
                                                           "open"]
    with pytest.raises(InputError, match=r"toc.evidence"):
        config.load(None, {"toc.evidence": "best"})
    with pytest.raises(InputError, match=r"2 bad config fields: toc.matching: .*; toc.empty_tree_answer"):
        config.load(None, {"toc.matching": "exact", "toc.empty_tree_answer": "none"})


def test_previous_preset_runs_continuous_equal_loop():
    from pathlib import Path

    cfg = TreeSettings.of(config.load(Path(config.__file__).with_name("previous.toml"), {"answer_style": "free"}))
    t1, t2 = _trees(), _trees()
    rec1 = drive("continuous", t1, _resources(LooseEngine("s", make_responder())), cfg)
    rec2 = drive("sequential", t2, _resources(LooseEngine("s", make_responder())), cfg)
    assert nodes_table(t1).equals(nodes_table(t2))
    assert _calls(rec1.llm_calls).equals(_calls(rec2.llm_calls))


def test_parsing_switch_reaches_the_tree():
    """toc.parsing: "official" keeps only the official parser's pairs (toc/utils.py:25-46), the default also
    the pairs it drops; on a completion both read alike, the trees are the same."""
    def respond(prompt: str, params) -> str:
        if params.choices:
            return "True"
        # both read the first pair, its label after the echoed context number; a stray line shifts the
        # official i / i+1 pairing, which then loses the second pair
        return "[1] DQ 1: Who scored most in a World Cup?\n[2] DA 1: Miroslav Klose\n" \
               "DQ 2: Who scored most for a country?\n(men's football)\nDA 2: Cristiano Ronaldo"

    questions = {}
    for parsing in ("clarify", "official"):
        cfg = TreeSettings.of(config.load(None, {"answer_style": "free", "toc.parsing": parsing,
                                                 "toc.max_expansions": 1}))
        trees = [Tree.new("q0", QUESTIONS[0])]
        drive("waves", trees, _resources(ScriptedEngine("scripted", respond)), cfg)
        questions[parsing] = [n.question for n in trees[0].nodes if n.parent_id == "0"]
    assert questions["official"] == ["Who scored most in a World Cup?"]
    assert questions["clarify"] == ["Who scored most in a World Cup?", "Who scored most for a country?"]
    with pytest.raises(InputError, match=r"toc.parsing"):
        config.load(None, {"toc.parsing": "lenient"})
