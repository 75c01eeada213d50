"""ASQA metrics: hand-checked cases and the published FLARE-replication numbers on the shipped data."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from clarify.asqa_file import load_asqa
from clarify.errors import InputError
from clarify.eval.asqa import GOLD_SCHEMA, NO_READER, ambigqa_answer_f1, answer_f1, score_asqa, str_em
from clarify.eval.rouge import _write_punkt_english, asqa_rouge_l, bootstrap_mid, sent_split
from clarify.eval.summary import summarize, to_scores
from clarify.index.coverage import answer_coverage, coverage_table
from clarify.normalize import exact_presence, normalize_answer, normalize_answer_quotesum, token_f1
from tests.fixtures_eval import ASQA_DEV, FLARE_PREDICTIONS


def _gold(rows):
    """rows: (qid, [short answers per pair], [long answers])."""
    out = []
    for qid, pairs, longs in rows:
        for i, sa in enumerate(pairs):
            out.append({"qid": qid, "pair_no": i, "dq": f"dq {qid} {i}", "short_answers": sa, "long_answers": longs})
    return pl.DataFrame(out, schema=GOLD_SCHEMA)


def test_normalisations_follow_their_scorers():
    assert normalize_answer("The U.S. Army, an   army!") == "us army army"
    assert normalize_answer_quotesum("The U.S. Army, an   army!") == "u s army army"
    assert normalize_answer("Anne-the Great") == "annethe great"  # '-' is deleted first, so no article is left
    assert normalize_answer_quotesum("Anne-the Great") == "anne great"  # '-' becomes a space: 'the' is a word
    assert normalize_answer("a") == ""


def test_token_f1_hand_cases():
    assert token_f1("Paris, France", "paris") == pytest.approx(2 / 3)  # P=1, R=1/2
    assert token_f1("the Eiffel Tower", "Eiffel tower in Paris") == pytest.approx(2 * (2 / 4) * 1 / (2 / 4 + 1))
    assert token_f1("Paris", "") == 0.0
    assert token_f1("", "") == 1.0  # both no-answer agree
    assert token_f1("The", "") == 1.0  # normalises to nothing on both sides


def test_str_em_is_substring_of_normalised_text():
    pred = "The film was released on 3 May 2019 in the U.S. by Disney."
    assert exact_presence(["May 3, 2019", "3 May 2019"], pred)
    assert exact_presence(["US"], pred)  # "u.s." → "us"
    assert not exact_presence(["Warner Bros."], pred)
    # mean over pairs, ×100: 2 of 3 pairs found
    assert str_em(pred, [["3 May 2019"], ["Disney"], ["Pixar"]]) == pytest.approx(200 / 3)


def test_load_asqa_counts_match_the_source_notes(asqa_dev):
    questions, gold = asqa_dev
    assert questions.height == 948 and questions["qid"].n_unique() == 948
    assert set(questions["dataset"]) == {"asqa"}
    assert gold.height == 3184  # qa_pairs
    assert gold["short_answers"].list.len().sum() == 4494
    assert gold.group_by("qid").agg(pl.col("long_answers").first().list.len())["long_answers"].unique().to_list() == [2]


def test_punkt_written_in_nltk_layout_loads_back_identically(tmp_path, monkeypatch):
    import nltk
    from nltk.data import FileSystemPathPointer
    from nltk.tokenize.punkt import load_punkt_params
    from punkt.data import load_module

    lang_dir = tmp_path / "tokenizers" / "punkt_tab" / "english"
    _write_punkt_english(lang_dir)
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path), *nltk.data.path])  # NLTK only reads inside its path
    params = load_punkt_params(FileSystemPathPointer(str(lang_dir)))
    mod = load_module("english")
    assert params.abbrev_types == set(mod.ABBREV_TYPES)
    assert params.sent_starters == set(mod.SENT_STARTERS)
    assert params.collocations == set(mod.COLLOCATIONS)
    assert dict(params.ortho_context) == dict(mod.ORTHO_CONTEXT)


def test_sentence_split_knows_english_abbreviations():
    text = "Mr. Smith went to Washington, D.C. on Jan. 5. He arrived at 5 p.m. and left."
    assert sent_split(text) == ["Mr. Smith went to Washington, D.C. on Jan. 5.", "He arrived at 5 p.m. and left."]


def test_rouge_l_takes_the_best_reference():
    pred = "Paris is the capital of France. It is on the Seine."
    refs = ["The capital of France is Paris.", "Lyon is a city."]
    each = [asqa_rouge_l(pred, [r]) for r in refs]
    assert asqa_rouge_l(pred, refs) == max(each)
    assert each[0] > each[1] > 0
    assert asqa_rouge_l(pred, [pred]) == pytest.approx(100.0)


def test_flare_replication_reproduces_published_scores(asqa_dev):
    """SOURCE.md: official scorer on these 500 predictions → str_em 40.75, length 136.802, rougeLsum 27.630."""
    _, gold = asqa_dev
    preds = json.loads(FLARE_PREDICTIONS.read_text())
    frame = pl.DataFrame({"qid": list(preds), "answer": list(preds.values())})
    per_q = score_asqa(frame, gold, progress=False)
    assert per_q.height == 500
    assert round(per_q["str_em"].mean(), 2) == 40.75
    assert per_q["length"].mean() == pytest.approx(136.802, abs=1e-9)
    assert per_q["rouge_l"].mean() == pytest.approx(27.63, abs=0.05)
    summary = {r["metric"]: r for r in summarize(per_q).iter_rows(named=True)}
    assert summary["rouge_l"]["value"] == pytest.approx(27.630, abs=0.05)  # bootstrap mid, as published
    assert summary["str_em"]["value"] == pytest.approx(40.75, abs=5e-3)
    # no reader: D-F1 and DR are reported as not computed, never as 0
    assert per_q["d_f1"].null_count() == 500
    assert summary["d_f1"]["value"] is None and summary["d_f1"]["note"] == NO_READER
    assert summary["dr"]["value"] is None and NO_READER in summary["dr"]["note"]
    long = to_scores(per_q)
    assert set(long["metric"]) == {"rouge_l", "str_em", "length"}
    assert long.height == 1500


def test_bootstrap_mid_is_close_to_the_mean_and_seeded():
    vals = [float(i % 7) for i in range(300)]
    assert bootstrap_mid(vals) == bootstrap_mid(vals)
    assert bootstrap_mid(vals) == pytest.approx(sum(vals) / len(vals), abs=0.1)
    assert math.isnan(bootstrap_mid([]))


def test_score_asqa_rejects_unknown_and_duplicate_ids():
    gold = _gold([("q1", [["Paris"]], ["Paris."])])
    with pytest.raises(InputError, match="not in the gold"):
        score_asqa(pl.DataFrame({"qid": ["zz"], "answer": ["x"]}), gold, progress=False)
    with pytest.raises(InputError, match="more than once"):
        score_asqa(pl.DataFrame({"qid": ["q1", "q1"], "answer": ["x", "y"]}), gold, progress=False)


def test_missing_answer_scores_as_empty():
    gold = _gold([("q1", [["Paris"], ["Lyon"]], ["Paris and Lyon.", "Lyon, Paris."])])
    per_q = score_asqa(pl.DataFrame({"qid": ["q1"], "answer": [None], "missing": [True]}), gold, progress=False)
    row = per_q.row(0, named=True)
    assert row["rouge_l"] == 0.0 and row["str_em"] == 0.0 and row["length"] == 0.0
    assert row["missing"] is True and row["n_pairs"] == 2


def test_score_asqa_with_a_callable_reader_hand_checked():
    gold = _gold([("q1", [["Paris, France"], ["Lyon"]], ["Paris and Lyon."]),
                  ("q2", [["1998"]], ["In 1998."])])
    seen = []

    def reader(questions, contexts):
        seen.extend(zip(questions, contexts))
        return [{"dq q1 0": "Paris", "dq q1 1": "", "dq q2 0": "1998"}[q] for q in questions]

    preds = pl.DataFrame({"qid": ["q1", "q2"], "answer": ["Paris is big.", "It was 1998."]})
    per_q = score_asqa(preds, gold, reader=reader, progress=False)
    # the reader sees each disambiguated question with the prediction as its context
    assert seen == [("dq q1 0", "Paris is big."), ("dq q1 1", "Paris is big."), ("dq q2 0", "It was 1998.")]
    q1, q2 = per_q.row(0, named=True), per_q.row(1, named=True)
    assert q1["d_f1"] == pytest.approx(100 * (2 / 3 + 0) / 2)  # "Paris" vs "Paris, France": F1 2/3; "" vs Lyon: 0
    assert q1["qa_em"] == 0.0 and q1["qa_hit"] == 0.0
    assert q2["d_f1"] == 100.0 and q2["qa_em"] == 100.0 and q2["qa_hit"] == 100.0
    summary = {r["metric"]: r["value"] for r in summarize(per_q).iter_rows(named=True)}
    assert summary["d_f1"] == pytest.approx((100 / 3 + 100) / 2)
    assert summary["dr"] == pytest.approx(math.sqrt(summary["d_f1"] * summary["rouge_l"]))


def test_ambigqa_answer_f1_greedy_matching():
    gold = [["Paris", "City of Paris"], ["Lyon"], ["Nice"]]
    assert ambigqa_answer_f1(gold, [["paris"], ["Lyon"]]) == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    assert ambigqa_answer_f1(gold, [["the city of Paris"], ["Marseille"]]) == pytest.approx(2 * 0.5 * (1 / 3) / (0.5 + 1 / 3))
    # one prediction can match only one gold cluster
    assert ambigqa_answer_f1([["Paris"], ["Paris"]], [["Paris"]]) == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert ambigqa_answer_f1(gold, []) == 0.0


def test_answer_f1_uses_kept_non_root_nodes():
    gold = _gold([("q1", [["Paris"], ["Lyon"]], ["x"]), ("q2", [["1998"]], ["y"])])
    nodes = pl.DataFrame(
        {
            "qid": ["q1", "q1", "q1", "q1", "q1", "q2"],
            "node_id": ["r", "a", "b", "c", "d", "r"],
            "depth": [0, 1, 1, 2, 1, 0],
            "status": ["root", "valid", "pruned", "valid", "duplicate", "root"],
            "answers": [["Paris"], ["Paris", "City of Paris"], ["Lyon"], ["Marseille"], ["Lyon"], []],
        },
        schema={"qid": pl.String, "node_id": pl.String, "depth": pl.Int32, "status": pl.String,
                "answers": pl.List(pl.String)},
    )
    out = answer_f1(nodes, gold)
    q1 = out.filter(pl.col("qid") == "q1").row(0, named=True)
    # kept: a (matches Paris) and c (Marseille, matches nothing): P = 1/2, R = 1/2
    assert q1["n_predicted"] == 2 and q1["n_gold"] == 2
    assert q1["answer_f1"] == pytest.approx(50.0)
    assert out.filter(pl.col("qid") == "q2")["answer_f1"].item() == 0.0  # no kept node


def test_answer_coverage_whole_tokens_by_rank():
    gold = _gold([("q1", [["Paris"], ["Lyon"], ["2"]], ["x"])])
    passages = pl.DataFrame({"passage_id": ["p1", "p2", "p3"], "title": ["", "", ""],
                             "text": ["Lyon is a city.", "Paris in 2019.", "Route 2 goes to Paris."]})
    hits = pl.DataFrame({"qid": ["q1"] * 3, "passage_id": ["p1", "p2", "p3"], "rank": [1, 2, 3]},
                        schema_overrides={"rank": pl.Int32})
    # AC@k has one implementation, clarify.index.coverage; it takes eval's gold table as it is.
    ac = dict(coverage_table(answer_coverage(hits, passages, gold, ks=(1, 2, 3))).select("k", "ac").iter_rows())
    assert ac[1] == pytest.approx(100 / 3)  # Lyon
    assert ac[2] == pytest.approx(200 / 3)  # + Paris ("2" is not a whole token of "2019")
    assert ac[3] == pytest.approx(100.0)  # + "2" in p3


def test_load_asqa_bad_input(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    with pytest.raises(InputError, match="empty.json: file is empty"):
        load_asqa(empty)
    bad = tmp_path / "bad.json"
    bad.write_text('{"dev": {\n  "q1": {,}\n}}')
    with pytest.raises(InputError, match=r"bad.json:2: bad JSON"):
        load_asqa(bad)
    with pytest.raises(InputError, match="no split 'train'"):
        load_asqa(ASQA_DEV, split="train")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"dev": {"q1": {"ambiguous_question": "?", "qa_pairs": []}}}))
    with pytest.raises(InputError, match="dev.q1"):
        load_asqa(broken)
