"""`clarify compare`: shared retrieval between runs, and a real two-model comparison end to end."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import polars as pl
import pytest

from clarify.batch.search_cache import CachingSearcher
from tests.toc_fakes import FakeIndex


def test_caching_searcher_searches_each_query_once(tmp_path):
    inner = FakeIndex().searcher()
    queries = pl.DataFrame({"qid": ["a", "b", "c"], "query": ["world cup winner", "harry potter actor", "world cup winner"]})
    first = CachingSearcher(inner, tmp_path / "sc").search(queries, k=5)
    assert inner.calls == 1
    # another process (a new wrapper over the same folder) re-uses every result
    again = CachingSearcher(inner, tmp_path / "sc")
    second = again.search(queries, k=5)
    assert inner.calls == 1 and again.searched == 0 and again.reused == 3
    assert first.equals(second)
    assert first.filter(pl.col("qid") == "a").drop("qid").equals(first.filter(pl.col("qid") == "c").drop("qid"))
    # a new query is searched alone; a different k is a different result
    mixed = again.search(pl.DataFrame({"qid": ["d", "e"], "query": ["world cup winner", "capital of georgia"]}), k=5)
    assert again.searched == 1 and mixed["qid"].unique().sort().to_list() == ["d", "e"]
    again.search(queries.head(1), k=3)
    assert again.searched == 2


@pytest.mark.integration
def test_compare_two_models_real_runs(tmp_path, llm_model_dir, default_index):
    """Two model directories (the embedded SmolLM2 and a second folder of the same weights, so the test
    needs no second download) over the same 2 questions: one run directory each, a comparison table with
    parameter counts, a plot, and retrieval for identical queries computed once."""
    from clarify.batch.compare import compare

    twin = tmp_path / "twin-model"
    twin.mkdir()
    for f in llm_model_dir.iterdir():
        os.symlink(f, twin / f.name)
    toml = tmp_path / "small.toml"
    toml.write_text("[toc]\nmax_expansions = 2\nclarify_max_tokens = 64\nanswer_max_tokens = 64\nn_demos = 2\n")
    args = argparse.Namespace(config=str(toml), dataset="asqa", questions=None, limit=2, offset=None,
                              index=str(default_index), answer_style="quoted", seed=None, no_verify=False)
    out = tmp_path / "cmp"
    table = compare([str(llm_model_dir), str(twin)], args, out)
    assert table.height == 2 and table["params"].to_list() == [134515008, 134515008]
    for col in ("rouge_l", "str_em", "llm_calls_per_question", "prompt_tokens", "wall_s", "quote_n_spans"):
        assert col in table.columns
    assert (out / "comparison.png").stat().st_size > 0 and (out / "comparison.md").exists()
    runs = [Path(p) for p in table["run_dir"]]
    for run_dir in runs:
        assert json.loads((run_dir / "summary.json").read_text())["n_questions"] == 2
    # the root questions are searched by both runs, but stored (searched) once
    cached = pl.concat([pl.read_parquet(f) for f in (out / "search_cache").glob("*.parquet")])
    per_query = cached.group_by("query", "k").agg(pl.col("rank").n_unique().alias("n"), pl.len().alias("rows"))
    assert (per_query["n"] == per_query["rows"]).all()  # no query stored twice
    hits = [set(pl.read_parquet(r / "hits.parquet")["query"]) for r in runs]
    assert hits[0] & hits[1] and (hits[0] | hits[1]) <= set(cached["query"])
