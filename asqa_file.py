"""ASQA's file in the official layout (`{split: {sample_id: instance}}`; Stelmakh et al. 2022,
google-research/language `language/asqa`): the one reader of ASQA files, and where the shipped one lies.

`read_asqa` gives the instances (the clarification demos of eval/datasets/asqa.py read them), `load_asqa`
the questions and gold tables the metrics (eval/asqa.py) and retrieval's AC@k (index/coverage.py) take.
It lives at the top, below both `eval/` and `index/`, so that index/ need not import eval/
(docs/architecture.md, tests/test_layout.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import polars as pl

from clarify import schemas
from clarify.errors import InputError, need_file
from clarify.fewshot import QAPair
from clarify.jsonl import read_json

SHIPPED = ("asqa", "dev.json")  # the shipped dev set, under files.data_dir() (data/asqa/SOURCE.md)


def shipped_path() -> Path:
    """The shipped ASQA dev file (`$CLARIFY_DATA` honoured)."""
    from clarify.files import data_dir

    return data_dir().joinpath(*SHIPPED)


@dataclass(frozen=True)
class Instance:
    """One ASQA instance of the official layout, as every reader of ASQA files gets it (`read_asqa`)."""

    sample_id: str
    question: str  # ambiguous_question
    qa_pairs: tuple[QAPair, ...]  # each qa_pair's question ("" when it has none) and short answers
    long_answers: tuple[str, ...]  # the annotations' long answers


def asqa_splits(path: str | Path) -> tuple[str, ...]:
    """The splits of an ASQA file in the official layout (`{split: {sample_id: {...}}}`): its top-level keys
    that hold an object. A `train` or `dev` key that holds something else is an InputError, never skipped."""
    return tuple(k for k, v in _document(*_stamp(path)).items() if isinstance(v, dict))


def read_asqa(path: str | Path, split: str = "dev") -> tuple[Instance, ...]:
    """The instances of `split` in file order: the one reader of ASQA files (the gold of `load_asqa`, the
    clarification demos of eval/datasets/asqa.py `ASQA.demos`). Read once per file version (its path,
    mtime and size); every bad instance is an InputError naming the file and `split.sample_id`."""
    return _instances(*_stamp(path), split)


def _stamp(path: str | Path) -> tuple[str, str, int, int]:
    """The cache key of a file version: the path as given (what errors name), resolved, mtime and size."""
    need_file(path)
    st = os.stat(path)
    return str(path), str(Path(path).resolve()), st.st_mtime_ns, st.st_size


@lru_cache(maxsize=4)
def _document(path: str, resolved: str, mtime_ns: int, size: int) -> dict:
    data = read_json(Path(path))
    if not isinstance(data, dict):
        raise InputError("not an ASQA file in the official layout ({split: {sample_id: {...}}})", path=path)
    for split in ("train", "dev"):  # the splits a run or a demo pool names: never skipped in silence
        if split in data:
            _need_object(data, split, path)
    return data


def _need_object(data: dict, split: str, path: str) -> None:
    if split not in data:
        raise InputError(f"no split '{split}' in the ASQA file (top level: {list(data)[:5]})", path=path, field=split)
    if not isinstance(data[split], dict):
        raise InputError(f"split '{split}' is a JSON {type(data[split]).__name__}, not an object of sample_id -> "
                         f"instance (the official ASQA layout)", path=path, field=split)


@lru_cache(maxsize=8)
def _instances(path: str, resolved: str, mtime_ns: int, size: int, split: str) -> tuple[Instance, ...]:
    data = _document(path, resolved, mtime_ns, size)
    _need_object(data, split, path)
    return tuple(_instance(str(qid), inst, path, f"{split}.{qid}") for qid, inst in data[split].items())


def _instance(qid: str, inst: object, path: str, where: str) -> Instance:
    if not isinstance(inst, dict):
        raise InputError("an ASQA instance must be an object", path=path, field=where)
    try:
        question = inst["ambiguous_question"]
        pairs = inst["qa_pairs"]
        longs = tuple(a["long_answer"] for a in inst["annotations"])
    except (KeyError, TypeError) as exc:
        raise InputError(f"ASQA instance lacks {exc}", path=path, field=where) from exc
    if not isinstance(question, str) or not all(isinstance(a, str) for a in longs):
        raise InputError("ambiguous_question and every long_answer must be strings", path=path, field=where)
    if not isinstance(pairs, list):
        raise InputError(f"qa_pairs is a JSON {type(pairs).__name__}, not a list", path=path, field=where)
    out = []
    for i, p in enumerate(pairs):
        if not isinstance(p, dict) or not isinstance(p.get("short_answers"), list):
            raise InputError("qa_pair without a short_answers list", path=path, field=f"{where}.qa_pairs[{i}]")
        out.append(QAPair(str(p.get("question") or ""), tuple(str(a) for a in p["short_answers"])))
    return Instance(qid, question, tuple(out), longs)


def load_asqa(path: str | Path, split: str = "dev") -> tuple[pl.DataFrame, pl.DataFrame]:
    """`split` of an ASQA file in the official layout (`read_asqa`) as tables; every instance needs qa_pairs
    and annotations.

    Returns
      questions: [qid, question, dataset="asqa"]  (file order)
      gold:      one row per qa_pair: [qid, pair_no, dq, short_answers: list[str],
                 long_answers: list[str]] (the annotations' long answers, repeated on every pair of a qid).
    """
    q_rows, g_rows = [], []
    for inst in read_asqa(path, split):
        if not inst.qa_pairs or not inst.long_answers:
            raise InputError("an ASQA instance needs qa_pairs and annotations", path=str(path),
                             field=f"{split}.{inst.sample_id}")
        q_rows.append({"qid": inst.sample_id, "question": inst.question, "dataset": "asqa"})
        g_rows.extend({"qid": inst.sample_id, "pair_no": i, "dq": p.question, "short_answers": list(p.answers),
                       "long_answers": list(inst.long_answers)} for i, p in enumerate(inst.qa_pairs))
    questions = pl.DataFrame(q_rows, schema=schemas.QUESTIONS)
    gold = pl.DataFrame(g_rows, schema=schemas.ASQA_GOLD)
    return questions, gold


