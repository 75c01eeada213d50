"""AC@k, answer coverage of retrieval (ToC, Kim et al. 2023, appendix B.1): the share of gold
disambiguations (ASQA `qa_pairs`) with at least one short answer found in the top-k passages
retrieved for the *ambiguous* question. Pure functions on tables.

Matching: answers and passages ("title text") are normalised as in the ASQA/SQuAD scorers (lower-case,
punctuation removed, articles a/an/the dropped, whitespace collapsed; SQuAD v1.1 `normalize_answer`,
reused by google-research/language `language/asqa/scoring.py`), then an answer counts when its token
sequence occurs as whole tokens in the passage (" ans " in " passage ").
AC@k = (pairs covered within top-k) / (all pairs), pooled over questions.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import polars as pl

from clarify.errors import InputError

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")

GOLD = {"qid": pl.String, "pair_no": pl.Int32, "short_answers": pl.List(pl.String)}


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 / ASQA normalisation: lower, drop punctuation, drop articles, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def load_asqa(path, *, first: int | None = None, split: str = "dev") -> tuple[pl.DataFrame, pl.DataFrame]:
    """ASQA json (official layout {split: {sample_id: {...}}}) -> (queries [qid, query], gold [qid, pair_no, short_answers])."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read ASQA json: {exc}", path=str(path)) from exc
    if not isinstance(data, dict) or split not in data:
        raise InputError(f"no '{split}' split in ASQA file", path=str(path), field=split)
    items = list(data[split].items())[: first if first is not None else None]
    qids, queries, g_qid, g_no, g_ans = [], [], [], [], []
    for sid, ex in items:
        if "ambiguous_question" not in ex or "qa_pairs" not in ex:
            raise InputError("ASQA sample lacks ambiguous_question/qa_pairs", path=str(path), field=str(sid))
        qids.append(str(sid))
        queries.append(ex["ambiguous_question"])
        for i, pair in enumerate(ex["qa_pairs"]):
            g_qid.append(str(sid))
            g_no.append(i)
            g_ans.append([str(a) for a in pair.get("short_answers", [])])
    return (pl.DataFrame({"qid": qids, "query": queries}),
            pl.DataFrame({"qid": g_qid, "pair_no": g_no, "short_answers": g_ans}, schema=GOLD))


def _first_cover_rank(answers: list[list[str]], ranked_texts: list[str]) -> list[int | None]:
    """For each answer set (already normalised), the first 1-based rank whose passage holds one of them."""
    out: list[int | None] = []
    padded = [f" {t} " for t in ranked_texts]
    for alts in answers:
        alts = [a for a in alts if a]
        rank = next((r for r, text in enumerate(padded, start=1) if any(f" {a} " in text for a in alts)), None)
        out.append(rank)
    return out


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
