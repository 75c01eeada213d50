"""The second fidelity pass (docs/fidelity.md): the tree's answer-matching primitives, empty trees and DA strings as
the official code has them (gankim/tree-of-clarifications `run_toc.py`, `toc/`, and the dsp it ships).

Every expectation is read off the official code, cited beside it, never off clarify's output. The passages
are real (data/wiki): "2015–16 Cleveland Cavaliers season" (dpr:18833851) and two DPR passages with one
title and text (dpr:8753847, dpr:8753913, "History of the St. Louis Rams").
"""

from __future__ import annotations

import json
import re
import unicodedata

import numpy as np
import polars as pl
import pytest

from clarify import normalize
from clarify.batch import config
from clarify.batch.run.scheduler import drive
from clarify.batch.toc.demos import KnnPool
from clarify.batch.toc.format import Disambiguation, parse_disambiguations
from clarify.batch.toc.match import MATCHING, dpr_tokens, dsp_f1, dsp_has_answers, dsp_normalize_text
from clarify.batch.toc.program import Resources, passage_string, removed_by
from clarify.batch.toc.prompts import Demo
from clarify.batch.toc.settings import TreeSettings
from clarify.batch.toc.tree import Tree
from clarify.local_llm.cache import CachedEngine
from clarify.local_llm.scripted import ScriptedEngine
from clarify.schemas import Passage
from tests.toc_fakes import DATA, HashEncoder

CAV = "dpr:18833851"  # "2015–16 Cleveland Cavaliers season | ... a 3–1 series deficit ..."
RAMS, RAMS2 = "dpr:8753847", "dpr:8753913"  # one text: "... from the 1995 through the 2015 seasons ..."
SINCLAIR, DAEI = "08d3267226e13985", "31640d9ce19dca34"  # "... with 187 goals ...", "... with 109 goals ..."


def _corpus() -> dict[str, Passage]:
    out = {}
    for name in ("passages.jsonl", "passages_retrieved_extra.jsonl", "passages_dpr_random1000.jsonl"):
        for line in (DATA / "wiki" / name).read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            out[r["id"]] = Passage(r["id"], r["title"] or "", r["text"])
    return out


CORPUS = _corpus()


def _s(pid: str) -> str:
    return passage_string(CORPUS[pid])  # "title | text", dsp's long_text


# --- the primitives -------------------------------------------------------------------------------------

def test_dpr_tokens_are_dsps_simple_tokenizer_on_the_shipped_corpus():
    """dsp/utils/dpr.py:144-183, 219-224: NFD, then `(ALPHA_NUM+)|(NON_WS)` with the `regex` module's Unicode
    classes, lower-cased. clarify reads the same classes from unicodedata; both agree on real text."""
    regex = pytest.importorskip("regex")  # nltk's dependency; the same pattern and flags as dpr.py:153-156
    pat = regex.compile(r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
                        flags=regex.IGNORECASE + regex.UNICODE + regex.MULTILINE)
    asqa = json.loads((DATA / "asqa" / "dev.json").read_text(encoding="utf-8"))["dev"]
    answers = [a for ex in asqa.values() for p in ex["qa_pairs"] for a in p["short_answers"]]
    texts = [passage_string(p) for p in list(CORPUS.values())[::4]] + answers
    for t in texts + [dsp_normalize_text(t) for t in texts]:
        assert dpr_tokens(t) == tuple(m.group().lower() for m in pat.finditer(unicodedata.normalize("NFD", t))), t


def test_passage_holds_answer_as_dsp_tokenises():
    """dsp/primitives/demonstrate.py:129-134 → dsp/utils/dpr.py:186-194: normalize_text keeps the en dash
    (not ASCII punctuation), DPR's tokenizer makes it a token of its own, so "16" is a token run of
    "2015–16 Cleveland Cavaliers season"; the metrics' rule splits on whitespace only."""
    assert dsp_has_answers(_s(CAV), ["16"]) and MATCHING["dsp"].has_answer(_s(CAV), ["16"])
    assert not MATCHING["squad"].has_answer(_s(CAV), ["16"])
    assert dsp_has_answers(_s(CAV), ["Golden State Warriors", "x"]) and not dsp_has_answers(_s(CAV), ["Warrior"])
    assert dsp_has_answers(_s(CAV), ["the 2016 NBA Finals."]) and not dsp_has_answers(_s(CAV), ["NBA Finals 2016"])


def test_an_answer_that_normalises_to_nothing_is_in_every_passage():
    """dsp/utils/dpr.py:189-192: an answer with no token is compared as `[] == text[i:i]`, True at i = 0,
    for every passage (dsp/utils/metrics.py:36-49 drops articles and ASCII punctuation first)."""
    for pid in (CAV, RAMS, SINCLAIR, DAEI):
        for nothing in ("", "The", "a", "  ", '"'):
            assert dsp_has_answers(_s(pid), [nothing]), (pid, nothing)
            assert not MATCHING["squad"].has_answer(_s(pid), [nothing])
    assert dsp_has_answers("", ["The"]) and not dsp_has_answers("", ["x"])


def test_f1_of_two_empty_answers():
    """dsp/utils/metrics.py:60-79 f1_score: `num_same == 0` → 0, also when both sides are empty (:67-73);
    the ASQA/SQuAD scorer (normalize.py token_f1) gives 1.0, and the metrics keep it."""
    assert dsp_f1("The", "a") == 0.0 and dsp_f1("", "") == 0.0
    assert normalize.token_f1("The", "a") == 1.0
    assert dsp_f1("Netherlands", "Spain; Netherlands") == pytest.approx(2 / 3)
    assert dsp_f1("Netherlands", "Spain; Netherlands") == normalize.token_f1("Netherlands", "Spain; Netherlands")


def test_demo_removal_by_an_empty_da():
    """run_toc.py:94-108 remove_dup_demos: `dsp.metrics.F1(da['answer'], answers) > 0.8` (:103). A DA "The"
    has F1 0 with a demo whose first short answer also normalises to nothing (a grade "A"): kept by dsp,
    removed under the metrics' F1 (toc.matching = "squad")."""
    grade = Demo("g", "Which grade did the hotel get?", (Disambiguation("Which grade in 2010?", ("A",)),), "A.")
    cavs = Demo("c", "Who won the 2016 NBA Finals?", (Disambiguation("Who won in 2016?", ("Cleveland Cavaliers",)),),
                "The Cavaliers.")
    found = [Disambiguation("Who won?", ("The",), "The")]
    assert removed_by(found, [], [grade, cavs], "official", MATCHING["dsp"]) == []
    assert removed_by(found, [], [grade, cavs], "official", MATCHING["squad"]) == ["g"]


# --- the tree ----------------------------------------------------------------------------------------------

ROOT_Q = "Who won the 2016 NBA Finals?"
DEMOS = [Demo(f"D{i}", q, (Disambiguation(q + " exactly?", (a,)),), f"{a}.")
         for i, (q, a) in enumerate([("Which team won the title?", "Golden State Warriors"),
                                     ("Who was the finals MVP?", "LeBron James")], 1)]


class Script:
    """Clarifications by the asked question (successive completions), verdicts by the proposed answer."""

    def __init__(self, clarify: dict[str, list[str]], answer: str = "The final answer.", true=()):
        self.clarify, self.answer, self.true = clarify, answer, set(true)
        self.asked: dict[str, int] = {}

    def __call__(self, prompt: str, params) -> str:
        if params.choices:
            proposed = re.search(r"Proposed Answer: (.*)", prompt).group(1)
            return "True" if proposed in self.true else "False"
        if params.temperature == 0:  # the final answer
            return self.answer
        q = re.findall(r"Question: (.*)", prompt)[-1]
        i = self.asked[q] = self.asked.get(q, -1) + 1
        texts = self.clarify.get(q, ["I do not know."])
        return texts[min(i, len(texts) - 1)]


class Pool:
    name = "fixed"

    def __init__(self, ids):
        self.ids = ids

    def search(self, queries: pl.DataFrame, k: int) -> pl.DataFrame:
        rows = [{"qid": qid, "passage_id": p, "score": 1.0 - r / 100, "rank": r, "retriever": "fixed"}
                for qid in queries["qid"] for r, p in enumerate(self.ids[:k], 1)]
        return pl.DataFrame(rows, schema={"qid": pl.String, "passage_id": pl.String, "score": pl.Float64,
                                          "rank": pl.Int32, "retriever": pl.String})


def _run(tmp_path, pool, scores, script, **overrides):
    """One tree over a fixed pool; the reranker scores each passage by `scores` (ties keep pool order).
    Returns the tree, its rows and the reranker's calls (queries, candidate ids)."""
    calls = []

    def rerank(queries, ids):
        calls.extend(zip(queries, ids))
        return [np.array([scores.get(p, 0.0) for p in ps]) for ps in ids]

    enc = HashEncoder()
    res = Resources(engine=CachedEngine(ScriptedEngine("m", script), tmp_path / "cache"), searcher=Pool(pool),
                    passages=lambda ids: {i: CORPUS[i] for i in ids}, embed=enc.encode,
                    demos=KnnPool(DEMOS, enc.encode, name="match-demos", encoder_id="hash"), rerank=rerank)
    cfg = config.load(None, {"answer_style": "free", "toc.n_demos": 1, **overrides})
    tree = Tree.new("q", ROOT_Q, verify=True)
    return tree, drive("continuous", [tree], res, TreeSettings.of(cfg)), calls


def _hits(rec) -> list[list[str]]:
    return pl.DataFrame(rec.hits).group_by("wave", maintain_order=True).agg("passage_id")["passage_id"].to_list()


@pytest.mark.parametrize("matching", ["dsp", "squad"])
def test_exhaustion_matches_answers_as_dsp(tmp_path, matching):
    """run_toc.py:117-118: a shown passage goes when dsp.passage_has_answers finds a whole DA string in it.
    "16" is in "2015–16 Cleveland Cavaliers season" for dsp, so the next expansion of the root (a restart,
    :209-212) sees the rest of the pool; under the metrics' rule nothing goes and the prompt repeats."""
    script = Script({ROOT_Q: ["DQ 1: Which season did they win?\nDA 1: 16"]})
    tree, rec, _ = _run(tmp_path, [CAV, SINCLAIR, DAEI], {CAV: 0.9, SINCLAIR: 0.5, DAEI: 0.1}, script,
                        **{"toc.matching": matching, "retrieval.top_k": 2, "toc.max_expansions": 1})
    if matching == "dsp":
        assert tree.exhausted_passages == [CAV]
        assert _hits(rec) == [[CAV, SINCLAIR], [SINCLAIR, DAEI]]
    else:
        assert tree.exhausted_passages == []
        assert _hits(rec) == [[CAV, SINCLAIR], [CAV, SINCLAIR]]


def test_two_passages_with_one_text_are_exhausted_together(tmp_path):
    """run_toc.py:116-118 works on strings: `passage in contexts` drops from the pool every passage whose text
    is a shown one's that holds an answer, so RAMS2 (never shown) goes with RAMS; clarify used to keep it
    and show it next."""
    script = Script({ROOT_Q: ["DQ 1: When did the Rams move to St. Louis?\nDA 1: 1995"]})
    tree, rec, _ = _run(tmp_path, [RAMS, RAMS2, SINCLAIR, DAEI], {RAMS: 0.9, RAMS2: 0.9, SINCLAIR: 0.5},
                        script, **{"retrieval.top_k": 1, "toc.max_expansions": 1})
    assert tree.exhausted_passages == [RAMS, RAMS2]
    assert _hits(rec) == [[RAMS], [SINCLAIR]]


def test_evidence_among_shown_passages_deduplicated_by_text(tmp_path):
    """toc/pruning.py:18 `passages = deduplicate(tree.slt_psgs)`: strings, so five shown passages with two of
    one text give the evidence 4 candidates (the first of the two kept); clarify kept 5 ids."""
    script = Script({ROOT_Q: ["DQ 1: Who won the 2016 NBA title?\nDA 1: Cleveland Cavaliers"]},
                    true={"Cleveland Cavaliers"})
    pool = [RAMS, RAMS2, CAV, SINCLAIR, DAEI]
    tree, _, calls = _run(tmp_path, pool, {}, script, **{"toc.max_nodes": 1, "toc.evidence": "official"})
    shown = calls[0][1]
    assert sorted(shown) == sorted(pool)
    evidence = [ids for q, ids in calls if q == "Who won the 2016 NBA title?"]
    assert evidence == [[RAMS, CAV, SINCLAIR, DAEI]]  # "Cleveland Cavaliers" has an "a": no filter (below)


@pytest.mark.parametrize("da, expected", [("16", [CAV]), ("Cleveland Cavaliers", [CAV, RAMS, SINCLAIR, DAEI])])
def test_official_evidence_filter_matches_the_das_characters(tmp_path, da, expected):
    """toc/pruning.py:19-20 passes the DA *string* to passage_has_answers (dsp/primitives/demonstrate.py:132
    iterates it): its characters are the answers. "16": the passages holding a token "1" or "6" — only the
    Cavaliers' ("3–1 series": the en dash splits); "Cleveland Cavaliers" holds a space and an "a", which
    normalise to nothing and are in every passage: no filter."""
    script = Script({ROOT_Q: [f"DQ 1: Which season?\nDA 1: {da}"]}, true={da})
    pool = [CAV, RAMS, SINCLAIR, DAEI]
    _, _, calls = _run(tmp_path, pool, {}, script, **{"toc.max_nodes": 1, "toc.evidence": "official",
                                                       "retrieval.top_k": 4})
    assert [ids for q, ids in calls if q == "Which season?"] == [expected]


def test_empty_tree_free_answer_prompt_ends_open(tmp_path):
    """toc/tree.py:32-40 `_get_tree` of no valid node gives `disambig` = "" (toc/utils.py:12-22), which
    dsp's template treats as absent (dsp/templates/template_v2.py:73-83): the answer prompt ends open at
    `Disambiguations:` — the clarification prompt, at temperature 0 (run_toc.py:259-261) — and the
    answer is the whole completion (template_v2.py:146-176: `answer` is the first field not given)."""
    script = Script({}, answer="DQ 1: Who won in 2016?\nDA 1: Cleveland Cavaliers\n\nAnswer: The Cavaliers won.")
    pool = [CAV, SINCLAIR]
    tree, rec, _ = _run(tmp_path, pool, {CAV: 0.9}, script, **{"toc.max_expansions": 1, "retrieval.top_k": 2,
                                                                "toc.answer_passages": 2})
    assert tree.valid == []
    asked, _, answer = [c.prompt for c in rec.llm_calls]  # E2 restarts at the root: the same prompt
    assert answer == asked  # the root's clarification: the same passages (reranked by the question) and demo
    assert answer.endswith(f"Question: {ROOT_Q}\n\nDisambiguations:\n")
    assert rec.answers[0].answer == "DQ 1: Who won in 2016? DA 1: Cleveland Cavaliers Answer: The Cavaliers won."
    # toc.empty_tree_answer = "closed" (clarify's earlier choice): the answer is asked for directly
    _, rec, _ = _run(tmp_path / "closed", pool, {CAV: 0.9}, script,
                     **{"toc.max_expansions": 1, "toc.empty_tree_answer": "closed"})
    assert [c for c in rec.llm_calls if c.step == "answer"][0].prompt.endswith("Disambiguations:\n\n\nAnswer:")


def test_da_as_written_for_duplicates_verification_and_the_answer(tmp_path):
    """toc/utils.py:38 keeps the DA text after `DA i:` (stripped), and the official code compares it raw
    (toc/pruning.py:10-11 `prev_qa['answer'] in cur_qa['answer']`), proposes it raw (toc/templates/load.py:46)
    and lists it raw in the answer prompt (toc/tree.py:34, toc/utils.py:20). Its quotes and stray spaces
    stay; clarify used to re-join the split answers (`Spain; Italy`), which contains `Spain`."""
    p = parse_disambiguations('DQ 1: Who won?\nDA 1:  "Spain"  \nDQ 2: Who won?\nDA 2: Spain ;  Italy;')
    assert [d.text for d in p.pairs] == ['"Spain"', "Spain ;  Italy;"]
    assert [d.answers for d in p.pairs] == [("Spain",), ("Spain", "Italy")]
    t = Tree.new("q", "Who?", verify=True)
    (first,) = t.add_candidates(t.node("0"), p.pairs[:1], 1)
    t.settle([first], {first.node_id: (True, "True", None)}, config.load(None).toc)
    (second,) = t.add_candidates(first, p.pairs[1:], 2)
    assert second.status == "pending"  # '"Spain"' is not a substring of 'Spain ;  Italy;'
    (third,) = t.add_candidates(first, [Disambiguation("Who won?", ("Spain", "x"), '"Spain" or x')], 3)
    assert third.status == "duplicate"

    script = Script({ROOT_Q: ['DQ 1: Who won in 2016?\nDA 1:  "Cleveland Cavaliers" ;  LeBron  ']},
                    true={'"Cleveland Cavaliers" ;  LeBron'})
    tree, rec, _ = _run(tmp_path, [CAV, SINCLAIR], {}, script, **{"toc.max_nodes": 1})
    verify = [c for c in rec.llm_calls if c.step == "verify"][0]
    assert verify.prompt.endswith('Proposed Answer: "Cleveland Cavaliers" ;  LeBron\nTrue or False:')
    assert tree.node("0.1").status == "valid" and tree.node("0.1").answers == ["Cleveland Cavaliers", "LeBron"]
    answer = [c for c in rec.llm_calls if c.step == "answer"][0].prompt
    assert answer.endswith('DQ 1: Who won in 2016?\nDA 1: "Cleveland Cavaliers" ;  LeBron\n\nAnswer:')
