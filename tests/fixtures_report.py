"""Two real run directories for the tests of `clarify report` and of runs compared (batch/report/).

`report_runs` (SESSION-scoped) runs `clarify.batch.run.pipeline.run` twice over the first three ASQA dev
questions (`paired_runs`: the first ten, for the paired tests) (data/asqa/dev.json), each with a scripted model (local_llm/scripted.py) standing in for one
of two model folders of known size (`write_fake_model`): the same pipeline, tables and summary.json a
real run writes, wall times included. The index is the stand-in of the pipeline's other scripted tests
(tests/toc_fakes.py FakeIndex: token overlap over the shipped Wikipedia passages, no JVM or encoder to
start; with `default_local_index` instead every test passes too, several times slower). The tests read
what the runs wrote; a test that changes a run works on its own copy (`copy_run`), the session's
directories stay as written.

The scripted model answers from the prompt, as a model would:
- clarify, on an ambiguous question: the first four of its ASQA disambiguations (DQ, first short answer);
  the third one is doubtful: on the first question its DQ carries HOSTILE (model output that must be shown
  as text), and the verifier of the smaller model rejects it (a pruned node; the larger model keeps all).
  On a disambiguated question: that same pair again, which the tree records as a duplicate.
- verify: True, or False for a doubtful pair of the model that prunes.
- answer (quoted, SEMQA style): one verbatim span of source 1; on the first question also a verbatim
  span, a near miss the quote checker repairs, a quote of a source the prompt never had, a quote of no
  source, a source's title and an empty marker, around model text with markup.
"""

from __future__ import annotations

import json
import re
import shutil
from functools import lru_cache
from pathlib import Path

import polars as pl
import pytest

from tests.fixtures_llm import write_fake_model
from tests.toc_fakes import FakeIndex

DATA = Path(__file__).resolve().parent.parent / "data"
HOSTILE = "<script>alert('x')</script><img src=x onerror=alert(1)> True"
N_QUESTIONS = 3
# `paired_runs`: enough questions that the paired tests apply (eval/paired.py MIN_N) and that a difference on
# every question survives Holm over the table's tests (exact permutation p = 2 / 2**10 = 0.002)
N_PAIRED = 10
# (run name, model folder name, parameters, whether its verifier prunes the doubtful pair)
MODELS = (("smol", "SmolLM2-135M-Instruct", 135_000_000, True), ("gemma", "gemma-3-270m", 268_000_000, False))
SETTINGS = {"dataset": "asqa", "limit": N_QUESTIONS, "answer_style": "quoted", "toc.max_expansions": 4}
# `[k] «title | text»`, batch/toc/prompts.py format_context
SOURCE = re.compile(r"^\[(\d+)\] «(.*?) \| (.*)»$", re.M)
DOUBTFUL = 2  # the third proposed pair


@lru_cache(maxsize=1)
def _asqa() -> list[dict]:
    return list(json.loads((DATA / "asqa" / "dev.json").read_text(encoding="utf-8"))["dev"].values())


def proposed_pairs(question: str) -> list[tuple[str, str]]:
    """The (DQ, DA) pairs the scripted model proposes for an ASQA ambiguous question."""
    items = _asqa()
    item = next(i for i in items if i["ambiguous_question"] == question)
    pairs = [(p["question"], p["short_answers"][0]) for p in item["qa_pairs"][:4]]
    if item is items[0] and len(pairs) > DOUBTFUL:
        pairs[DOUBTFUL] = (f"{pairs[DOUBTFUL][0]} {HOSTILE}", pairs[DOUBTFUL][1])
    return pairs


def scripted_model(prunes: bool):
    """The responder of the module docstring (`prunes`: the verifier rejects the doubtful pairs)."""
    first = _asqa()[0]["ambiguous_question"]

    def respond(prompt: str, params) -> str:
        query = prompt.rsplit("\n\n---\n\n", 1)[-1]  # the prompt's last part: after the demos
        question = re.findall(r"^Question: (.*)$", query, re.M)[-1]
        if params.choices:  # verification: the ambiguous question and one proposed DA
            da = re.search(r"^Proposed Answer: (.*)$", query, re.M).group(1)
            doubtful = [d for i, (_, d) in enumerate(proposed_pairs(question)) if i == DOUBTFUL]
            return "False" if prunes and da in doubtful else "True"
        if query.rstrip().endswith("Disambiguations:"):
            if any(i["ambiguous_question"] == question for i in _asqa()):
                pairs = proposed_pairs(question)
            else:  # a disambiguated question: its own pair again
                pairs = [p for q in (i["ambiguous_question"] for i in _asqa()[:max(N_QUESTIONS, N_PAIRED)])
                         for p in proposed_pairs(q) if p[0] == question][:1]
            return "\n".join(f"DQ {i}: {q}\nDA {i}: {a}" for i, (q, a) in enumerate(pairs, 1)) + "\nAnswer: -"
        sources = {int(k): (title, text) for k, title, text in SOURCE.findall(query)}
        t1 = sources[1][1].split()
        answer = f"It depends on the competition: [1 {' '.join(t1[:6])}]."
        if question == first:
            t2 = sources[2][1].split()
            near_miss = t2[8:14]
            near_miss[1] = near_miss[1].upper() + "S"  # one changed word: the checker repairs it
            answer += (f" Meanwhile <b>bold</b> & {HOSTILE[:40]} [2 {' '.join(t2[2:8])}], and [2 {' '.join(near_miss)}]"
                       " [7 a source the prompt never had] [3 zebra quantum marmalade orbit] "
                       f"[1 {' '.join(t1[2:9])}] [3 {sources[3][0]}] [1].")
        return answer

    return respond


def copy_run(run_dir: Path, to: Path) -> Path:
    """A copy of a session run directory that a test may change."""
    return Path(shutil.copytree(run_dir, to))


TABLES = ("questions", "nodes", "hits", "llm_calls", "answers", "spans", "scores", "passages")
PASSAGE_COLUMNS = ("passage_id", "evidence_passage_id")  # columns that name a passage (lists: passage_ids)


def _rekeyed(df: pl.DataFrame, c: int) -> pl.DataFrame:
    tag = f"~{c}"
    out = []
    for name, dtype in df.schema.items():
        col = pl.col(name)
        if name in ("qid", "call_id", *PASSAGE_COLUMNS) and dtype == pl.String:
            col = pl.when(col.is_null()).then(col).otherwise(col + tag)
        elif name == "passage_ids" and dtype == pl.List(pl.String):
            col = col.list.eval(pl.element() + tag)
        out.append(col.alias(name))
    return df.select(out)


def rekey(run: Path, to: Path, copies: int) -> Path:
    """`run`'s tables `copies` times, each copy's question, call and passage ids suffixed ~c; the frozen
    config, inputs and summary copied (n_questions updated)."""
    to.mkdir(parents=True)
    for f in ("config.json", "inputs.json"):
        shutil.copy2(run / f, to / f)
    for t in TABLES:
        df = pl.read_parquet(run / f"{t}.parquet")
        pl.concat([_rekeyed(df, c) for c in range(copies)]).write_parquet(to / f"{t}.parquet")
    summary = json.loads((run / "summary.json").read_text())
    summary["n_questions"] = summary["n_questions"] * copies
    (to / "summary.json").write_text(json.dumps(summary))
    return to


def _two_runs(root: Path, n_questions: int) -> list[Path]:
    """[smol, gemma] over the first `n_questions` ASQA dev questions, in `root` (module docstring)."""
    from clarify.batch import config
    from clarify.batch.run.pipeline import run
    from clarify.local_llm.scripted import ScriptedEngine

    out = []
    for name, folder, parameters, prunes in MODELS:
        model = write_fake_model(root / "models" / folder, parameters=parameters)
        cfg = config.load(None, {**SETTINGS, "limit": n_questions, "model.model": str(model)})
        engine = ScriptedEngine(f"scripted-{folder}", scripted_model(prunes))
        run(cfg, root / name, engine_factory=lambda c, e=engine: e, index=FakeIndex(), progress=False)
        out.append(root / name)
    return out


@pytest.fixture(scope="session")
def report_runs(tmp_path_factory) -> list[Path]:
    """[smol, gemma]: the two run directories of the module docstring (read them, do not change them)."""
    return _two_runs(tmp_path_factory.mktemp("report-runs"), N_QUESTIONS)


@pytest.fixture(scope="session")
def paired_runs(tmp_path_factory) -> list[Path]:
    """[smol, gemma] as `report_runs`, over the first N_PAIRED questions: paired tests apply (read them, do
    not change them)."""
    return _two_runs(tmp_path_factory.mktemp("paired-runs"), N_PAIRED)
