"""AC@k, answer coverage of retrieval (ToC, Kim et al. 2023, appendix B.1): the share of gold
disambiguations (ASQA `qa_pairs`) with at least one short answer found in the top-k passages
retrieved for the *ambiguous* question. Pure functions on tables.

Matching: answers and passages ("title text", the title counts too) are normalised with
`clarify.normalize.normalize_answer`, the ASQA/SQuAD rule (lower-case, punctuation removed, articles
a/an/the dropped, whitespace collapsed; google-research/language `language/asqa/scoring.py`), then an
answer counts when its token sequence occurs as whole tokens in the passage (" ans " in " passage ").
AC@k = (pairs covered within top-k) / (all pairs), pooled over questions.
This is clarify's only AC@k; clarify.eval reports it from here (docs/architecture.md#the-index).
"""

from __future__ import annotations

import polars as pl

from clarify.errors import InputError
from clarify.normalize import (  # the ASQA/SQuAD rule; re-exported by clarify.index
    holds_answer,
    normalize_answer,
)


def retrieval_inputs(questions: pl.DataFrame, gold: pl.DataFrame, *, first: int | None = None
                     ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What AC@k needs from `clarify.asqa_file.load_asqa`'s tables (the one ASQA reader, which checks the
    file and names the bad field): the first `first` questions in file order (all when None) as search
    queries [qid, query], and their gold pairs [qid, pair_no, short_answers]."""
    if first is not None:
        questions = questions.head(first)
        gold = gold.join(questions.select("qid"), on="qid", how="semi")
    return questions.select("qid", pl.col("question").alias("query")), gold.select("qid", "pair_no", "short_answers")


def _first_cover_rank(answers: list[list[str]], ranked_texts: list[str]) -> list[int | None]:
    """For each answer set (already normalised), the first 1-based rank whose passage holds one of them."""
    return [next((r for r, text in enumerate(ranked_texts, start=1) if holds_answer(text, alts)), None)
            for alts in answers]


def answer_coverage(hits: pl.DataFrame, passages: pl.DataFrame, gold: pl.DataFrame, ks=(5, 10, 20, 100)) -> pl.DataFrame:
    """Per question and k: how many gold pairs are covered by the top-k hits.

    hits [qid, passage_id, rank, (retriever)], passages [passage_id, title, text] (at least the hit ids),
    gold [qid, pair_no, short_answers] -> [qid, k, n_pairs, n_covered]. A question with no hits covers nothing.
    Answer-less pairs count as uncovered.
    """
    for name, df, cols in (("hits", hits, ["qid", "passage_id", "rank"]), ("passages", passages, ["passage_id", "text"]),
                           ("gold", gold, ["qid", "short_answers"])):
        missing = [c for c in cols if c not in df.columns]
        if missing:
            raise InputError(f"{name} table lacks column(s) {missing}")
    ks = sorted({int(k) for k in ks})
    needed = hits.select("passage_id").unique()
    psg = passages.join(needed, on="passage_id", how="semi")
    titles = psg["title"].to_list() if "title" in psg.columns else [""] * psg.height
    norm = {pid: normalize_answer(f"{t or ''} {x}") for pid, t, x in zip(psg["passage_id"].to_list(), titles, psg["text"].to_list())}
    ranked = (hits.sort("qid", "rank").group_by("qid", maintain_order=True).agg("passage_id"))
    lists = dict(zip(ranked["qid"].to_list(), ranked["passage_id"].to_list()))
    per_q = gold.group_by("qid", maintain_order=True).agg("short_answers")
    rows = {"qid": [], "k": [], "n_pairs": [], "n_covered": []}
    for qid, pairs in zip(per_q["qid"].to_list(), per_q["short_answers"].to_list()):
        texts = [norm.get(p, "") for p in lists.get(qid, [])[: ks[-1]]]
        first = _first_cover_rank([[normalize_answer(a) for a in alts] for alts in pairs], texts)
        for k in ks:
            rows["qid"].append(qid)
            rows["k"].append(k)
            rows["n_pairs"].append(len(pairs))
            rows["n_covered"].append(sum(1 for r in first if r is not None and r <= k))
    return pl.DataFrame(rows, schema={"qid": pl.String, "k": pl.Int32, "n_pairs": pl.Int32, "n_covered": pl.Int32})


def coverage_table(per_question: pl.DataFrame) -> pl.DataFrame:
    """[.., k, n_pairs, n_covered] (optionally with `retriever`) -> [retriever?, k, ac, n_questions, n_pairs],
    ac = pooled share of pairs covered (×100)."""
    keys = [c for c in ("retriever", "k") if c in per_question.columns]
    return (
        per_question.group_by(keys, maintain_order=True)
        .agg(
            (100.0 * pl.col("n_covered").sum() / pl.col("n_pairs").sum()).alias("ac"),
            pl.len().alias("n_questions"),
            pl.col("n_pairs").sum().alias("n_pairs"),
        )
        .sort(keys)
    )
