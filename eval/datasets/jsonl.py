"""A user's questions: JSONL of {qid, question}, searched in the index like ASQA; no gold, so a run
writes no scores and `clarify eval` does not offer it."""

from __future__ import annotations

from pathlib import Path

from clarify.errors import InputError
from clarify.eval.datasets import DEV, Dataset, register

MAX_QUESTION_CHARS = 2000  # a "question" longer than this is almost surely a broken input line


def read_questions_jsonl(path: str | Path):
    """JSONL of {qid, question}: every bad line is reported with its number; nothing is dropped silently."""
    import polars as pl

    from clarify import schemas
    from clarify.jsonl import iter_jsonl, record_id

    rows, errors = [], []
    for no, obj in iter_jsonl(path, on_error=lambda p: errors.append(p.error())):
        try:
            qid = record_id(obj, path, no)
        except InputError as exc:
            errors.append(exc)
            continue
        question = obj.get("question")
        if qid is None or qid.strip() == "":
            errors.append(InputError("missing", path=str(path), line=no, field="qid"))
        elif not isinstance(question, str) or not question.strip():
            errors.append(InputError("missing or empty", path=str(path), line=no, field="question"))
        elif len(question) > MAX_QUESTION_CHARS:
            errors.append(InputError(f"question of {len(question)} characters (limit {MAX_QUESTION_CHARS})",
                                     path=str(path), line=no, field="question"))
        else:
            rows.append({"qid": qid, "question": " ".join(question.split()), "dataset": "jsonl"})
    if errors:
        more = f" (and {len(errors) - 1} more bad line(s))" if len(errors) > 1 else ""
        raise InputError(str(errors[0]) + more)
    if not rows:
        raise InputError("no questions", path=str(path))
    df = pl.DataFrame(rows, schema=schemas.QUESTIONS)
    dup = df.filter(pl.col("qid").is_duplicated())["qid"].unique().to_list()
    if dup:
        raise InputError(f"duplicate qid(s) {dup[:5]}", path=str(path), field="qid")
    return df


class QuestionsJSONL(Dataset):
    name = "jsonl"

    def load(self, path, *, split: str = DEV):
        return read_questions_jsonl(path), None


register(QuestionsJSONL())
