"""ToC end to end on Pyserini's prebuilt layouts (tests/prebuilt_layouts.py: Anserini's collection
indexer, Pyserini's FAISS writer, a tiny DPR question encoder) with the real engine."""

from __future__ import annotations

import json

import polars as pl
import pytest

from clarify.batch import config
from tests.prebuilt_layouts import build_layouts
from tests.run_fixtures import SMALL

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    return build_layouts(tmp_path_factory.mktemp("prebuilt"), n=200)


def test_toc_runs_end_to_end_on_prebuilt_layouts_with_a_dpr_encoder(layouts, tmp_path, llm_engine):
    """`clarify run` on a Pyserini Lucene index + Pyserini FAISS directory + DPR question encoder, attached
    by `[retrieval]` settings: one ASQA question, small trees, the real engine. The inputs are pinned,
    every hit comes from the prebuilt corpus and the passages table holds its stored text."""
    from clarify.batch.run.pipeline import run

    settings = {"limit": 1, "answer_style": "free", "index": str(layouts["lucene"]),
                "retrieval.faiss_index": str(layouts["faiss"]), "retrieval.encoder": str(layouts["query_encoder"]),
                **SMALL, "toc.max_expansions": 2}
    cfg = config.load(None, settings)
    summary = run(cfg, tmp_path / "run", engine_factory=lambda c: llm_engine, progress=False)
    assert summary.n_questions == 1 and summary.llm_calls > 0
    inputs = json.loads((tmp_path / "run" / "inputs.json").read_text())
    assert inputs["faiss_index"]["path"] == str(layouts["faiss"]) and len(inputs["faiss_index"]["fingerprint"]) == 64
    assert inputs["encoder"]["kind"] == "dpr-question"
    frozen = json.loads((tmp_path / "run" / "config.json").read_text())
    assert frozen["retrieval"]["faiss_index"] == str(layouts["faiss"])
    hits = pl.read_parquet(tmp_path / "run" / "hits.parquet")
    by_id = {r["id"]: r for r in layouts["rows"]}
    assert hits.height > 0 and set(hits["passage_id"]) <= set(by_id)
    passages = pl.read_parquet(tmp_path / "run" / "passages.parquet")
    assert all(by_id[r["passage_id"]]["text"] == r["text"] for r in passages.iter_rows(named=True))
    # the same run again: finished, nothing opened, nothing changed
    again = run(cfg, tmp_path / "run", engine_factory=lambda c: llm_engine, progress=False)
    assert again.llm_calls == summary.llm_calls
