"""`clarify show RUN [QID]` and the end of `clarify demo`: one question's tree of clarifications as an
outline and its quoted answer, on a run directory written by the pipeline (scripted engine, stand-in
index over real passages: tests/toc_fakes.py)."""

from __future__ import annotations

import io
import re

import polars as pl
import pytest

from clarify.batch import config
from clarify.batch.cli.show import PICK_RULE, pick_question, show
from tests.run_fixtures import write_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from clarify.batch.run.pipeline import run
    from clarify.local_llm.scripted import ScriptedEngine
    from tests.test_toc import make_responder
    from tests.toc_fakes import FakeIndex

    out = tmp_path_factory.mktemp("show") / "run"
    cfg = config.load(None, {"dataset": "asqa", "limit": 4, "answer_style": "quoted", "toc.max_expansions": 4})
    run(cfg, out, engine_factory=lambda c: ScriptedEngine("s", make_responder()), index=FakeIndex(), progress=False)
    return out


def _tables(run_dir):
    return {n: pl.read_parquet(run_dir / f"{n}.parquet") for n in ("questions", "nodes", "spans", "passages",
                                                                   "answers", "scores")}


def _outline(text: str) -> list[tuple[int, str, str]]:
    """(indent, status, question) of each node line of the printed tree."""
    out = []
    for line in text.splitlines():
        if m := re.fullmatch(r"( *)- \[(\w+)\] DQ: (.*)", line):
            out.append((len(m[1]), m[2], m[3]))
        elif m := re.fullmatch(r"( *)ROOT: (.*)", line):
            out.append((len(m[1]), "root", m[2]))
    return out


def test_show_prints_the_chosen_question_its_tree_and_its_answer(run_dir):
    t = _tables(run_dir)
    valid = t["nodes"].group_by("qid").agg(n=(pl.col("status") == "valid").sum())
    best = valid["n"].max()
    assert valid.height == 4 and valid["n"].min() < best  # the rule has a choice to make
    buf = io.StringIO()
    qid = show(run_dir, out=buf)
    text = buf.getvalue()
    rouge = dict(t["scores"].filter(pl.col("metric") == "rouge_l").select("qid", "value").iter_rows())
    tied = [q for q in t["questions"]["qid"] if valid.filter(pl.col("qid") == q)["n"][0] == best]
    assert qid == max(tied, key=lambda q: (rouge[q], -tied.index(q)))
    assert f"question {qid}, chosen for the most valid nodes ({best}) of the run's 4 (rule: {PICK_RULE})" in text

    # every node of that question, once, indented under its parent, with its status and evidence passage
    nodes = t["nodes"].filter(pl.col("qid") == qid)
    shown = _outline(text)
    assert sorted((s, q) for _, s, q in shown) == sorted(zip(nodes["status"], nodes["question"]))
    assert {s for _, s, _ in shown} >= {"root", "valid", "pruned"}
    depth = dict(zip(nodes["question"], nodes["depth"]))
    assert all(indent == 2 + 2 * depth[q] for indent, _, q in shown)
    titles = dict(zip(t["passages"]["passage_id"], t["passages"]["title"]))
    for r in nodes.filter(pl.col("status") != "root").iter_rows(named=True):
        assert f"DA: {'; '.join(r['answers'])}" in text
        assert f"from: «{titles[r['evidence_passage_id']]}» ({r['evidence_passage_id']})" in text
    counts = dict(nodes.group_by("status").len().iter_rows())
    assert f"({nodes.height} nodes: {counts['valid']} valid, {counts['pruned']} pruned" in text

    # then the answer with its quotes resolved to their passages
    answer = t["answers"].filter(pl.col("qid") == qid)["answer"][0]
    assert f"\nA: {answer}" in text
    for s in t["spans"].filter(pl.col("qid") == qid).iter_rows(named=True):
        assert f"[{s['source_k']}] {s['text']!r} → {s['passage_id']} «{titles[s['passage_id']]}»" in text
    assert text.index("ROOT:") < text.index("\nA: ")


def test_show_any_question_from_the_cli(run_dir, capsys):
    from clarify.batch.cli import main

    other = pl.read_parquet(run_dir / "questions.parquet").row(3, named=True)
    assert main(["show", str(run_dir), other["qid"]]) == 0
    out = capsys.readouterr().out
    assert f"Q: {other['question']}" in out and "ROOT: " in out and "chosen for" not in out
    assert main(["show", str(run_dir), "no-such-qid"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("clarify show: error: ") and "'no-such-qid'" in err and len(err.splitlines()) == 1
    assert main(["show", str(run_dir.parent / "nope")]) == 2


def test_ties_in_valid_nodes_go_to_rouge_l_then_question_order(tmp_path):
    def node(qid, nid, status, parent="n0"):
        return {"qid": qid, "node_id": nid, "parent_id": None if status == "root" else parent,
                "depth": 0 if status == "root" else 1, "question": f"{qid} {nid}", "answers": ["x"],
                "status": status}

    nodes = [node(q, "n0", "root") for q in ("a", "b", "c")]
    nodes += [node("a", "n1", "valid"), node("b", "n1", "valid"), node("b", "n2", "pruned"), node("c", "n1", "valid")]
    questions = pl.DataFrame({"qid": ["a", "b", "c"], "question": ["qa", "qb", "qc"]})
    scores = pl.DataFrame({"qid": ["a", "b", "c"], "metric": ["rouge_l"] * 3, "value": [10.0, 30.0, 20.0]})
    run = write_run(tmp_path / "r", questions=questions, nodes=pl.DataFrame(nodes), scores=scores)
    from clarify.batch.run.rundir import Run

    assert pick_question(Run.open(run)) == ("b", 1)
    write_run(tmp_path / "r2", questions=questions, nodes=pl.DataFrame(nodes))  # no scores: question order
    assert pick_question(Run.open(tmp_path / "r2")) == ("a", 1)


def test_demo_ends_with_the_tree_and_answer_of_the_chosen_question(tmp_path, monkeypatch, capsys):
    """`clarify demo` on the scripted engine: the estimate before the run, its re-estimate once the first
    tree is done, and at the end the question the rule chooses, as `clarify show` prints it."""
    import dataclasses

    from clarify.batch.cli import build_parser, commands
    from clarify.batch.run import pipeline, resources
    from clarify.local_llm.scripted import ScriptedEngine
    from tests.test_toc import make_responder
    from tests.toc_fakes import FakeIndex

    class Reporting(ScriptedEngine):  # reports its work to the run's display, as VLLMEngine.on_progress does
        on_progress = None
        cpu, device, dtype = None, "cpu", "float32"

        def generate(self, prompts, params):
            out = super().generate(prompts, params)
            if self.on_progress:
                self.on_progress(len(out), sum(c.prompt_tokens + c.output_tokens for c in out))
            return out

    engine = Reporting("s", make_responder())
    real_run = pipeline.run

    def run_on_fakes(cfg, out, **kw):
        return real_run(dataclasses.replace(cfg, index=""), out, engine_factory=lambda _c: engine,
                        index=FakeIndex(), **kw)

    monkeypatch.setattr(pipeline, "run", run_on_fakes)
    monkeypatch.setattr(resources, "engine_for", lambda model, tree: engine)
    monkeypatch.setattr("clarify.index.ensure_default_index", lambda: tmp_path / "index")
    out = tmp_path / "demo"
    assert commands.cmd_demo(build_parser().parse_args(["demo", "--limit", "3", "--out", str(out)])) == 0
    printed = capsys.readouterr()
    assert re.search(r"-> 3 ASQA questions, expected ~[\d.]+ min of ToC \(re-estimated once the first tree",
                     printed.out)
    assert "ToC re-estimated after the first tree" in printed.err
    shown = io.StringIO()
    qid = show(out, out=shown)
    assert shown.getvalue() in printed.out  # the same renderer, the same question
    assert f"question {qid}, chosen for the most valid nodes" in printed.out and "ROOT: " in printed.out
    assert re.search(r"demo took [\d.]+ min \(ToC took [\d.]+ min, expected ~[\d.]+ min: [+-]\d+%\)", printed.out)
    assert (out / "report.html").is_file()
