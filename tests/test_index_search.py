"""Searching the embedded default index (≈10k real Wikipedia passages): BM25, dense, hybrid, rerank, AC@k."""

from __future__ import annotations

import json
import re

import numpy as np
import polars as pl
import pytest

from clarify.asqa_file import load_asqa
from clarify.batch.cli import main as clarify_main
from clarify.errors import InputError
from clarify.index.coverage import answer_coverage, coverage_table, retrieval_inputs
from clarify.schemas import check

from .fixtures_index import REPO, WIKI

pytestmark = pytest.mark.integration


def _known_items(passages: pl.DataFrame, n: int = 60) -> pl.DataFrame:
    """[qid=passage_id, query=its longest sentence], keeping sentences that occur in exactly one passage."""
    rows = []
    texts = passages["text"]
    for pid, text in passages.sample(4 * n, seed=11).select("passage_id", "text").iter_rows():
        sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if len(s.split()) >= 8]
        if not sentences:
            continue
        sentence = max(sentences, key=len)
        if texts.str.contains(sentence, literal=True).sum() == 1:
            rows.append((pid, sentence))
        if len(rows) == n:
            break
    return pl.DataFrame(rows, schema={"qid": pl.String, "query": pl.String}, orient="row")


def test_bm25_known_items_rank_first(default_local_index):
    queries = _known_items(default_local_index.passages)
    assert queries.height == 60
    hits = default_local_index.searcher("bm25").search(queries, 5)
    check(hits, "hits")
    top = hits.filter(pl.col("rank") == 1)
    assert top.height == 60 and (top["qid"] == top["passage_id"]).all(), top.filter(pl.col("qid") != pl.col("passage_id"))


def test_dense_finds_passages_by_their_own_text(default_local_index):
    sample = default_local_index.passages.sample(40, seed=3)
    queries = pl.DataFrame({"qid": sample["passage_id"], "query": sample["text"]})
    hits = default_local_index.searcher("dense").search(queries, 3)
    top = hits.filter(pl.col("rank") == 1)
    assert (top["qid"] == top["passage_id"]).mean() >= 0.95


def _asqa_relevance(n: int = 200) -> tuple[pl.DataFrame, dict[str, set[str]]]:
    """First n ASQA dev questions and, per question, the shipped passages that came from its annotations."""
    rel: dict[str, set[str]] = {}
    with open(WIKI / "passages_provenance.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            for origin in row["origins"]:
                if origin.startswith("asqa_dev:"):
                    rel.setdefault(origin.split(":")[1], set()).add(row["id"])
    queries, _ = retrieval_inputs(*load_asqa(REPO / "data" / "asqa" / "dev.json"), first=n)
    queries = queries.filter(pl.col("qid").is_in(list(rel)))
    return queries, rel


def _recall(hits: pl.DataFrame, rel: dict[str, set[str]], k: int) -> float:
    got = hits.filter(pl.col("rank") <= k).group_by("qid").agg("passage_id")
    found = {q: set(p) for q, p in got.iter_rows()}
    return float(np.mean([len(found.get(q, set()) & r) / len(r) for q, r in rel.items()]))


@pytest.fixture(scope="module")
def recall_at_10(default_local_index):
    """recall@10 of each retriever on the first 200 ASQA dev questions, two ways: the shipped passages that
    came from each question's annotations (knowledge / qa contexts), and AC@10 (gold short answers)."""
    queries, rel = _asqa_relevance()
    rel = {q: rel[q] for q in queries["qid"]}
    assert len(rel) >= 150
    _, gold = retrieval_inputs(*load_asqa(REPO / "data" / "asqa" / "dev.json"), first=200)
    gold = gold.filter(pl.col("qid").is_in(queries["qid"].to_list()))
    out = {}
    for kind in ("bm25", "dense", "hybrid"):
        hits = default_local_index.searcher(kind).search(queries, 10)
        ac = coverage_table(answer_coverage(hits, default_local_index.passages, gold, [10]))["ac"].item() / 100
        out[kind] = {"passages": _recall(hits, rel, 10), "answers": ac}
    print("recall@10 on 200 ASQA dev questions:", out)
    return out


def test_hybrid_recall_at_least_bm25(recall_at_10):
    for measure in ("passages", "answers"):
        assert recall_at_10["hybrid"][measure] >= recall_at_10["bm25"][measure], measure
    assert recall_at_10["bm25"]["passages"] > 0.3 and recall_at_10["dense"]["passages"] > 0.3


@pytest.mark.xfail(strict=True, reason=(
    "measured: on the shipped corpus MiniLM dense beats BM25 by ~10-20 points at k<=20, and equal-weight "
    "RRF (k=60) lands between them (passages 0.60/0.80/0.71, AC@10 59.9/70.6/66.0 bm25/dense/hybrid); "
    "strict, so a change that makes hybrid win is noticed"))
def test_hybrid_recall_at_least_dense(recall_at_10):
    for measure in ("passages", "answers"):
        assert recall_at_10["hybrid"][measure] >= recall_at_10["dense"][measure], measure


def test_rerank_rescores_the_fused_candidates(default_local_index):
    queries, _ = _asqa_relevance(30)
    hybrid = default_local_index.searcher("hybrid", candidates=50)
    rerank = default_local_index.searcher("rerank", candidates=50)
    assert rerank.name.startswith("rerank:dense-cosine:")
    top = rerank.search(queries, 5)
    check(top, "hits")
    assert set(top["retriever"]) == {"rerank"} and top.group_by("qid").len()["len"].max() == 5
    union = hybrid.fused(queries, depth=50)  # BM25 top-50 ∪ dense top-50
    assert union.group_by("qid").len()["len"].max() <= 100
    assert top.join(union, on=["qid", "passage_id"], how="anti").height == 0  # only fused candidates
    # scores are the cosine of query and passage vectors, best first
    enc = default_local_index.encoder
    row = top.row(0, named=True)
    qv = enc.encode([queries.filter(pl.col("qid") == row["qid"])["query"].item()])[0]
    pv = default_local_index.dense_index.vectors([row["passage_id"]])[0]
    assert row["score"] == pytest.approx(float(qv @ pv), abs=1e-5)
    assert (top.group_by("qid").agg(pl.col("score").diff().max())["score"].fill_null(0) <= 1e-9).all()


def test_batch_search_handles_duplicates_and_empty_queries(default_local_index):
    queries = pl.DataFrame({"qid": ["a", "a", "e", "b"], "query": ["Ali Daei goals", "world cup football", "", "Ali Daei goals"]})
    for kind in ("bm25", "dense", "hybrid", "rerank"):
        hits = default_local_index.searcher(kind).search(queries, 3)
        sizes = dict(hits.group_by("qid").len().iter_rows())
        assert sizes["a"] == 6 and sizes["b"] == 3, kind
        assert hits.filter(pl.col("qid") == "a")["rank"].to_list() == [1, 2, 3, 1, 2, 3], kind
        assert hits.filter(pl.col("qid") == "a").head(3)["passage_id"].equals(
            hits.filter(pl.col("qid") == "b")["passage_id"]), kind
    assert default_local_index.searcher("bm25").search(queries, 3).filter(pl.col("qid") == "e").height == 0
    with pytest.raises(InputError, match=r"missing column\(s\) \['query'\]"):
        default_local_index.searcher("bm25").search(pl.DataFrame({"qid": ["x"]}), 3)
    for kind in ("bm25", "dense", "hybrid", "rerank"):
        with pytest.raises(InputError, match="k must be a positive integer"):
            default_local_index.searcher(kind).search(queries, 0)
    with pytest.raises(InputError, match="unknown searcher"):
        default_local_index.searcher("splade")


def test_encoder_and_lookup(default_local_index):
    emb = default_local_index.encoder.encode(["Who has the highest goals in world football?", "zebra"])
    assert emb.dtype == np.float32 and emb.shape == (2, 384)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    ids = ["dpr-random:3", "08d3267226e13985"]
    assert default_local_index.passage_lookup(ids)["passage_id"].to_list() == ids


def test_answer_coverage_on_asqa(default_local_index):
    queries, gold = retrieval_inputs(*load_asqa(REPO / "data" / "asqa" / "dev.json"), first=100)
    hits = default_local_index.searcher("bm25").search(queries, 100)
    cov = answer_coverage(hits, default_local_index.passages, gold, [5, 20, 100])
    ac = dict(coverage_table(cov).select("k", "ac").iter_rows())
    assert 0 < ac[5] <= ac[20] <= ac[100] <= 100
    # cross-check one question by hand: a pair counts iff a short answer is a whole-token match in top-5 text
    from clarify.index import normalize_answer

    qid = queries["qid"][0]
    top5 = hits.filter((pl.col("qid") == qid) & (pl.col("rank") <= 5))
    texts = default_local_index.passage_lookup(top5["passage_id"].to_list())
    blob = [f" {normalize_answer(t + ' ' + x)} " for t, x in zip(texts["title"], texts["text"])]
    pairs = gold.filter(pl.col("qid") == qid)["short_answers"].to_list()
    expect = sum(any(any(f" {normalize_answer(a)} " in b for b in blob) for a in alts) for alts in pairs)
    assert cov.filter((pl.col("qid") == qid) & (pl.col("k") == 5))["n_covered"].item() == expect


def test_cli_search_and_coverage(default_index, tmp_path, capsys):
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "q1", "question": "Who has the highest goals in world football?"}\n')
    out = tmp_path / "hits.parquet"
    assert clarify_main(["index", "search", "--index", str(default_index), "--queries", str(queries),
                         "--k", "7", "--retriever", "hybrid", "--out", str(out)]) == 0
    hits = pl.read_parquet(out)
    assert hits.height == 7 and set(hits["qid"]) == {"q1"}
    assert clarify_main(["index", "coverage", "--index", str(default_index), "--first", "20", "--k", "5,20",
                         "--retrievers", "bm25,hybrid"]) == 0
    printed = capsys.readouterr().out
    assert "AC@5" in printed and "AC@20" in printed and "hybrid" in printed
    assert clarify_main(["index", "search", "--index", str(tmp_path), "--query", "x"]) == 2
    assert "not an index directory" in capsys.readouterr().err
