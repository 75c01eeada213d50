"""Golden trace: clarify's default trees against trees derived BY HAND from the official code
(gankim/tree-of-clarifications `run_toc.py`, with --verify, i.e. pruning on until it is switched off).

Everything the official loop depends on is fixed here: a pool of passages with a stated reranker score
per (query, passage), a demo pool, scripted completions per asked question and verdicts per proposed
answer. The engine sits behind the completion cache, as a run's does, so a byte-identical prompt is
answered from the cache (dsp's request cache in the official run). Each expectation cites the official
line that causes it; none was read off clarify's output.

Official depth counts from 1 at the root (`if cur_node.depth > max_depth: continue`, run_toc.py:216);
clarify counts from 0 and skips depth >= max_depth: the same nodes are expanded.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import polars as pl
import pytest

from clarify.batch import config
from clarify.batch.run.scheduler import SCHEDULERS, drive
from clarify.batch.toc.demos import KnnPool
from clarify.batch.toc.format import Disambiguation
from clarify.batch.toc.program import Resources
from clarify.batch.toc.prompts import Demo
from clarify.batch.toc.settings import TreeSettings
from clarify.batch.toc.tree import Tree
from clarify.local_llm.cache import CachedEngine
from clarify.local_llm.scripted import ScriptedEngine
from clarify.schemas import Passage
from tests.toc_fakes import HashEncoder

R1 = "Who won the cup?"
Q2010 = "Who won the cup in 2010?"
Q2014 = "Who won the cup in 2014?"
QFINAL = "Who won the 2010 cup final?"
R2 = "When was the bridge built?"
QOLD = "When was the old bridge built?"

PASSAGES = {
    "p1": ("Cup 2010", "Spain won the 2010 cup."),
    "p2": ("Cup 2014", "Germany won the 2014 cup."),
    "p3": ("Spain", "Spain is a country in Europe."),
    "p4": ("Cup history", "The cup is held every four years."),
    "p5": ("Germany", "The German team is called Die Mannschaft."),  # "Germany" only in the title
    "b1": ("Harbour bridge", "The bridge opened in 1932."),
    "b2": ("Old bridge", "The old bridge was built in 1850."),
    "b3": ("Bridges", "Bridges cross rivers."),
}
POOL = {R1: ["p1", "p2", "p3", "p4", "p5"], R2: ["b1", "b2", "b3"]}  # the question's retrieval, k=100
# The reranker (run_toc.py:164 dsp's cross-encoder): unlisted pairs score 0; ties keep pool order.
SCORES = {
    R1: {"p1": 0.9, "p2": 0.8, "p3": 0.1, "p4": 0.5, "p5": 0.2},
    Q2010: {"p1": 0.6, "p2": 0.65, "p3": 0.7, "p4": 0.3, "p5": 0.1},
    QFINAL: {"p3": 0.2, "p4": 0.4},
    R2: {"b1": 0.9, "b2": 0.5, "b3": 0.4},
}
# Each demo: one DQ with its first short answer (toc/utils.py:18 make_str_disambig, ambigQA=True).
DEMOS = [Demo(f"D{i}", q, (Disambiguation(q + " exactly?", (a,)),), f"{a}.")
         for i, (q, a) in enumerate([("Which team won most often?", "Spain"), ("Who hosted it?", "Brazil"),
                                     ("Who lost the final?", "Netherlands"), ("Who won in 2014?", "Germany")], 1)]


def _pairs(*qa: tuple[str, str]) -> str:
    return "\n".join(f"DQ {i}: {q}\nDA {i}: {a}" for i, (q, a) in enumerate(qa, 1)) + "\nAnswer: long answer"


# Successive completions per asked question (a cache miss takes the next one).
CLARIFY = {
    R1: [_pairs((Q2010, "Spain"), (Q2014, "Germany"), (Q2010, "Spain")),
         _pairs((Q2014, "Germany"), ("Who won the cup in 2018?", "France")),
         _pairs((Q2014, "Germany"))],
    Q2010: [_pairs((Q2010, "Spain; Netherlands"), (QFINAL, "La Roja"))],
    QFINAL: [_pairs(("Who scored in the 2010 cup final?", "Iniesta"))],
    R2: [_pairs((R2, "1932"), (QOLD, "1850")), _pairs((R2, "1932"))],
    QOLD: [_pairs(("When was the old bridge rebuilt?", "1901"))],
}
TRUE_ANSWERS = {"Spain", "1932", "1850", "1901"}  # the verifier says True to these, False otherwise


class Script:
    def __init__(self):
        self.asked: Counter = Counter()

    def __call__(self, prompt: str, params) -> str:
        if params.choices:
            proposed = re.search(r"Proposed Answer: (.*)", prompt).group(1)
            return "True" if proposed in TRUE_ANSWERS else "False"
        if prompt.rstrip().endswith("Disambiguations:"):
            q = re.findall(r"Question: (.*)", prompt)[-1]
            self.asked[q] += 1
            return CLARIFY[q][self.asked[q] - 1]
        return "The final answer."


class PoolSearcher:
    name = "fixed"

    def search(self, queries: pl.DataFrame, k: int) -> pl.DataFrame:
        rows = [{"qid": qid, "passage_id": p, "score": 1.0 - r / 100, "rank": r, "retriever": "fixed"}
                for qid, q in zip(queries["qid"], queries["query"]) for r, p in enumerate(POOL[q][:k], 1)]
        return pl.DataFrame(rows, schema={"qid": pl.String, "passage_id": pl.String, "score": pl.Float64,
                                          "rank": pl.Int32, "retriever": pl.String})


def _rerank(queries: list[str], ids: list[list[str]]) -> list[np.ndarray]:
    return [np.array([SCORES.get(q, {}).get(p, 0.0) for p in ps]) for q, ps in zip(queries, ids)]


def _resources(tmp_path, script: Script) -> Resources:
    enc = HashEncoder()
    return Resources(
        engine=CachedEngine(ScriptedEngine("golden", script), tmp_path / "cache"), searcher=PoolSearcher(),
        passages=lambda ids: {i: Passage(i, *PASSAGES[i]) for i in ids}, embed=enc.encode,
        demos=KnnPool(DEMOS, enc.encode, name="golden-demos", encoder_id="hash"), rerank=_rerank)


def _cfg(**overrides):
    # top_k (--top_k_reranked) 2 and one demo (--n_shot 1) keep the hand derivation small
    return TreeSettings.of(config.load(None, {"answer_style": "free", "retrieval.top_k": 2, "toc.n_demos": 1,
                                              "toc.answer_passages": 2, **overrides}))


def _run(tmp_path, question, scheduler="continuous", **overrides):
    script = Script()
    tree = Tree.new("q", question, verify=True)
    rec = drive(scheduler, [tree], _resources(tmp_path, script), _cfg(**overrides))
    return tree, rec, script


def _statuses(tree: Tree) -> dict[str, tuple[str, str, str]]:
    return {n.node_id: (n.question, "; ".join(n.answers), n.status) for n in tree.nodes if n.node_id != "0"}


# --- question 1: restarts, duplicates, pruning switched off, demo and passage removal -----------------

# Expansion by expansion (official loop, run_toc.py:204-254; E = n_expansions, R = n_restarts):
#  E1  root. Context = rerank(R1, pool p1..p5) top 2 = [p1, p2] (:219, :61-64). Three pairs parsed.
#      Removal (:229-231, with all parsed pairs): demos D1 (Spain) and D4 (Germany) by F1 > 0.8 over the
#      WHOLE demo list (:94-108; only one demo was shown); passages p1, p2 hold "Spain"/"Germany" (:110-123).
#      check_unique against valid_qas = [] for every sibling (valid_qas grows only at :247), so the repeated
#      (Q2010, Spain) is not a duplicate: verified True and kept. Germany: False → pruned.
#  E2  0.1 (Q2010). Pool minus p1, p2 reranked by Q2010 → [p3, p4]. (Q2010, "Spain; Netherlands"): same
#      question as valid 0.1 and "Spain" in "Spain; Netherlands" (toc/pruning.py:10-11) → duplicate.
#      (QFINAL, La Roja) → False → pruned. Removal with whole DA strings: "Netherlands" vs "Spain;
#      Netherlands" has F1 0.67 (D3 stays); p3 holds "Spain" but not "spain netherlands" (stays).
#  E3  0.3 (Q2010): byte-identical prompt to E2 (same context, same demos) → the cached completion.
#  E4  queue empty → restart (R=1, :209-212), root. Pool [p3, p4, p5] by R1 → [p4, p5]. Germany, France
#      both False. p5 goes: "Germany" is in its TITLE ("title | text", dsp long_text).
#  E5, E6  0.1, 0.3: context still [p3, p4] → cached E2 completion again (duplicate + pruned).
#  E7  restart (R=2), root: pool [p3, p4] by R1 → [p4, p3] (new prompt): Germany → False.
#  E8, E9  0.1, 0.3 cached.   E10 restart (R=3), root: same prompt as E7 → cached → False;
#      nothing kept and R >= max_trials → R = 0, pruning off (:250-254).
#  E11 0.1: cached completion; no check_unique without pruning (:233): both pairs valid (0.1.7, 0.1.8).
#  E12 0.3: same → 0.3.7, 0.3.8.   E13 0.1.7 (depth 3 official, not > 3): Q2010 again → cached → 2 valid.
#  E14 0.1.8 (QFINAL): context = pool [p3, p4] by QFINAL → [p4, p3]; one pair (Iniesta) valid.
#  E15 0.3.7 → cached → 2 valid: 11 valid >= max_nodes 10 → the loop ends (:204-206).
EXPECTED_Q1 = {
    "0.1": (Q2010, "Spain", "valid"), "0.2": (Q2014, "Germany", "pruned"), "0.3": (Q2010, "Spain", "valid"),
    "0.1.1": (Q2010, "Spain; Netherlands", "duplicate"), "0.1.2": (QFINAL, "La Roja", "pruned"),
    "0.3.1": (Q2010, "Spain; Netherlands", "duplicate"), "0.3.2": (QFINAL, "La Roja", "pruned"),
    "0.4": (Q2014, "Germany", "pruned"), "0.5": ("Who won the cup in 2018?", "France", "pruned"),
    "0.1.3": (Q2010, "Spain; Netherlands", "duplicate"), "0.1.4": (QFINAL, "La Roja", "pruned"),
    "0.3.3": (Q2010, "Spain; Netherlands", "duplicate"), "0.3.4": (QFINAL, "La Roja", "pruned"),
    "0.6": (Q2014, "Germany", "pruned"),
    "0.1.5": (Q2010, "Spain; Netherlands", "duplicate"), "0.1.6": (QFINAL, "La Roja", "pruned"),
    "0.3.5": (Q2010, "Spain; Netherlands", "duplicate"), "0.3.6": (QFINAL, "La Roja", "pruned"),
    "0.7": (Q2014, "Germany", "pruned"),
    "0.1.7": (Q2010, "Spain; Netherlands", "valid"), "0.1.8": (QFINAL, "La Roja", "valid"),
    "0.3.7": (Q2010, "Spain; Netherlands", "valid"), "0.3.8": (QFINAL, "La Roja", "valid"),
    "0.1.7.1": (Q2010, "Spain; Netherlands", "valid"), "0.1.7.2": (QFINAL, "La Roja", "valid"),
    "0.1.8.1": ("Who scored in the 2010 cup final?", "Iniesta", "valid"),
    "0.3.7.1": (Q2010, "Spain; Netherlands", "valid"), "0.3.7.2": (QFINAL, "La Roja", "valid"),
}
# Expansion order (the official leaf_nodes queue, popped from the front, :214)
ORDER_Q1 = ["0", "0.1", "0.3", "0", "0.1", "0.3", "0", "0.1", "0.3", "0", "0.1", "0.3", "0.1.7", "0.1.8",
            "0.3.7"]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_golden_q1_matches_official_tree(tmp_path, scheduler):
    tree, rec, script = _run(tmp_path, R1, scheduler)
    assert _statuses(tree) == EXPECTED_Q1
    # valid_qas order (:247 add_nodes appends), the answer gets the first max_nodes of them (:256)
    assert tree.valid == ["0.1", "0.3", "0.1.7", "0.1.8", "0.3.7", "0.3.8", "0.1.7.1", "0.1.7.2", "0.1.8.1",
                          "0.3.7.1", "0.3.7.2"]
    assert (tree.n_expansions, tree.pruning) == (15, False)
    clarify = [c for c in rec.llm_calls if c.step == "clarify"]
    assert [c.node_id for c in clarify] == ORDER_Q1
    # contexts shown, in expansion order (E1..E15), from the pool reranked per node minus exhausted
    hits = pl.DataFrame(rec.hits).group_by("wave", maintain_order=True).agg("passage_id")["passage_id"].to_list()
    ctx2010, ctx_root = ["p3", "p4"], ["p4", "p3"]
    assert hits == [["p1", "p2"], ctx2010, ctx2010, ["p4", "p5"], ctx2010, ctx2010, ctx_root, ctx2010, ctx2010,
                    ctx_root, ctx2010, ctx2010, ctx2010, ["p4", "p3"], ctx2010]
    assert tree.exhausted_passages == ["p1", "p2", "p5"]  # E1 (answers in text), E4 (answer in the title)
    assert tree.removed_demos == ["D1", "D4"]  # E1, over the whole demo pool
    # a byte-identical prompt is one request: the model was asked R1 three times (E1, E4, E7; E10 is
    # E7's prompt again), Q2010 once (E2; E3, E5, E6, E8, E9, E11-E13, E15 are cached), QFINAL once
    assert script.asked == Counter({R1: 3, Q2010: 1, QFINAL: 1})
    ids = [c.call_id for c in clarify]  # E2 and E3 are one request (seed from the prompt alone)
    assert ids[1] == ids[2] and ids[6] == ids[9] and [c.cached for c in clarify[1:3]] == [False, True]
    # final answer (:259): the question's whole pool, exhaustion NOT applied, reranked by R1, top 2
    assert rec.answers[0].passage_ids == ("p1", "p2")
    answer_prompt = [c for c in rec.llm_calls if c.step == "answer"][0].prompt
    assert answer_prompt.count("DQ ") - answer_prompt.count("DQ i") == 10 + 1  # 10 pairs (+1 in the demo)


def test_golden_q1_evidence(tmp_path):
    # intended get_evidence (toc/pruning.py:17-25): shown passages holding the answer, reranker top-1
    tree, _, _ = _run(tmp_path, R1)
    assert tree.node("0.1").evidence_passage_id == "p1"  # only p1 holds "Spain"
    assert tree.node("0.2").evidence_passage_id == "p2"  # only p2 holds "Germany"
    # as published the filter matches the DA string's characters (toc/pruning.py:20): "Spain" and "Germany"
    # hold an "a", which normalises to nothing and is in every passage: the reranker's top-1 of all shown
    tree, _, _ = _run(tmp_path / "official", R1, **{"toc.evidence": "official"})
    assert tree.node("0.1").evidence_passage_id == "p2"  # Q2010 scores p2 0.65 > p1 0.6
    assert tree.node("0.2").evidence_passage_id == "p1"  # Q2014 scores nothing: first shown


def test_golden_q1_restart_resample_switch(tmp_path):
    """toc.restart_resample = true: every expansion is a new request (seed includes the expansion count)."""
    script = Script()
    CLARIFY_ALL = {q: v + [v[-1]] * 20 for q, v in CLARIFY.items()}
    tree = Tree.new("q", R1, verify=True)
    orig = dict(CLARIFY)
    try:
        CLARIFY.update(CLARIFY_ALL)
        rec = drive("continuous", [tree], _resources(tmp_path, script), _cfg(**{"toc.restart_resample": True}))
    finally:
        CLARIFY.update(orig)
    clarify = [c for c in rec.llm_calls if c.step == "clarify"]
    assert len({c.call_id for c in clarify}) == len(clarify)  # no two expansions share a request
    assert not any(c.cached for c in clarify)
    assert script.asked[Q2010] > 1


# --- question 2: a DQ equal to the root question, fewer passages than top_k, the answer's pool -----------

#  E1  root. Context [b1, b2]. (R2, 1932): check_unique compares with valid_qas only, never the root
#      (toc/pruning.py:9), so repeating the root question is not a duplicate: True → valid. (QOLD, 1850) True.
#      Removal: b1 holds 1932, b2 holds 1850 → the pool keeps b3 only.
#  E2  0.1 (R2 again): context = [b3], one passage (min(top_k_reranked, len(passages)), :62); a new prompt
#      → the second R2 completion: (R2, 1932) — same question as valid 0.1 and "1932" in "1932" → duplicate.
#  E3  0.2 (QOLD): context [b3]; (rebuilt, 1901) True → valid: 3 valid = max_nodes 3 → the loop ends.
EXPECTED_Q2 = {
    "0.1": (R2, "1932", "valid"), "0.2": (QOLD, "1850", "valid"),
    "0.1.1": (R2, "1932", "duplicate"), "0.2.1": ("When was the old bridge rebuilt?", "1901", "valid"),
}


def test_golden_q2_matches_official_tree(tmp_path):
    tree, rec, script = _run(tmp_path, R2, **{"toc.max_nodes": 3})
    assert _statuses(tree) == EXPECTED_Q2
    assert [c.node_id for c in rec.llm_calls if c.step == "clarify"] == ["0", "0.1", "0.2"]
    hits = pl.DataFrame(rec.hits).group_by("wave", maintain_order=True).agg("passage_id")["passage_id"].to_list()
    assert hits == [["b1", "b2"], ["b3"], ["b3"]]
    # the answer reranks the whole pool by the question (:259): the exhausted b1, b2 come back
    assert rec.answers[0].passage_ids == ("b1", "b2")


def test_golden_switches_build_clarify_trees(tmp_path):
    """The strict duplicate rule on the same script: a repeated sibling (0.3) and a DQ equal to the root
    (Q2: 0.1) are duplicates; per-node answer passages pick one answer-holding passage per valid node."""
    # `n_expansions <= max_expansions` is checked before the increment (run_toc.py:206): 1 → 2 expansions
    tree, rec, _ = _run(tmp_path, R2, **{"toc.max_expansions": 1, "toc.duplicates": "strict",
                                         "toc.answer_passages_from": "nodes"})
    assert tree.node("0.1").status == "duplicate" and tree.node("0.2").status == "valid"
    assert rec.answers[0].passage_ids == ("b2", "b1")  # b2 holds 1850 (0.2), then the root's own top
    tree, rec, _ = _run(tmp_path / "b", R1, **{"toc.duplicates": "strict", "toc.max_expansions": 1})
    assert [tree.node(i).status for i in ("0.1", "0.2", "0.3")] == ["valid", "pruned", "duplicate"]
