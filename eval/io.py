"""Reading predictions (official files or clarify run directories) and lining them up with the gold ids.

Accepted prediction inputs:
- ASQA: the official JSON `{sample_id: long_answer}` (asqa/scoring.py `--predictions`), or JSONL lines
  with `qid` and one of `prediction` / `answer`;
- QuoteSum: JSONL lines with `qid` and the quoted answer in `prediction` (the field the official notebook
  evals/semqa_metrics.ipynb reads), `answer`, or `summary` (the dataset's own field); or a JSON object
  `{qid: answer}`;
- a clarify run directory, read by its one reader (`batch/run/rundir.py` Run.open): its answers, the questions
  it was asked, and its nodes (for Answer-F1).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from clarify import schemas
from clarify.errors import InputError
from clarify.jsonl import iter_jsonl, read_text, record_id

PRED_SCHEMA = schemas.PREDICTIONS
ANSWER_FIELDS = ("prediction", "answer", "summary")


def _read_text(path: Path) -> str:
    text = read_text(path)  # BOM dropped, non-UTF-8 named by line, like every JSONL reader
    if not text.strip():
        raise InputError("file is empty", path=str(path))
    return text


def _mapping_to_frame(obj: dict, path: Path) -> pl.DataFrame:
    rows = []
    for qid, answer in obj.items():
        if answer is not None and not isinstance(answer, str):
            raise InputError(f"the answer must be a string, got {type(answer).__name__}", path=str(path), field=qid)
        rows.append({"qid": str(qid), "answer": answer})
    return pl.DataFrame(rows, schema=PRED_SCHEMA)


def _jsonl_to_frame(path: Path) -> pl.DataFrame:
    rows, seen = [], {}
    for line_no, rec in iter_jsonl(path, wording={"bad_json": "bad JSON"}):
        qid = record_id(rec, path, line_no)
        if qid is None:
            raise InputError("no question id", path=str(path), line=line_no, field="qid")
        fld = next((f for f in ANSWER_FIELDS if f in rec), None)
        if fld is None:
            raise InputError(f"no answer field (one of {list(ANSWER_FIELDS)})", path=str(path), line=line_no)
        if rec[fld] is not None and not isinstance(rec[fld], str):
            raise InputError("the answer must be a string", path=str(path), line=line_no, field=fld)
        if qid in seen:
            raise InputError(f"qid '{qid}' given again (first at line {seen[qid]})", path=str(path), line=line_no)
        seen[qid] = line_no
        rows.append({"qid": qid, "answer": rec[fld]})
    return pl.DataFrame(rows, schema=PRED_SCHEMA)


def read_predictions(path: str | Path) -> pl.DataFrame:
    """A prediction file → [qid, answer] in file order. InputError (file, line, field) on bad input.

    A file whose whole text is one JSON object without a `qid` key is read as `{qid: answer}`; otherwise
    it is read as JSONL.
    """
    path = Path(path)
    text = _read_text(path)
    repeated: list[str] = []
    try:
        whole = json.loads(text, object_pairs_hook=lambda pairs: _keep_repeats(pairs, repeated))
    except json.JSONDecodeError as exc:
        # JSON lines when the first line is a JSON object by itself; else one broken JSON document.
        first = next(line for line in text.splitlines() if line.strip())
        try:
            is_jsonl = isinstance(json.loads(first), dict)
        except json.JSONDecodeError:
            is_jsonl = False
        if not is_jsonl:
            raise InputError(f"bad JSON: {exc.msg} (column {exc.colno})", path=str(path), line=exc.lineno) from exc
        return _jsonl_to_frame(path)
    if not isinstance(whole, dict):
        raise InputError(f"expected a JSON object {{id: answer}} or JSON lines, got {type(whole).__name__}",
                         path=str(path), line=1)
    if "qid" in whole or "id" in whole:  # a single JSON line
        return _jsonl_to_frame(path)
    if repeated:  # json.loads keeps the last of repeated keys: one answer would be dropped silently
        raise InputError(f"id '{repeated[0]}' is given twice" + (f" (and {len(repeated) - 1} more repeated id(s))"
                         if len(repeated) > 1 else ""), path=str(path), line=_second_key_line(text, repeated[0]))
    return _mapping_to_frame(whole, path)


def _keep_repeats(pairs: list[tuple[str, object]], repeated: list[str]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            repeated.append(key)
        out[key] = value
    return out


def _second_key_line(text: str, key: str) -> int | None:
    """The line of the second `"key":` in a JSON text (None when it is spelled with escapes)."""
    found = list(re.finditer(re.escape(json.dumps(key, ensure_ascii=False)) + r"\s*:", text))
    return text.count("\n", 0, found[1].start()) + 1 if len(found) > 1 else None


def check_prediction_ids(predictions: pl.DataFrame, known: set[str]) -> None:
    """A scorer's input: every predicted id is a gold id, and none is given twice (InputError otherwise)."""
    unknown = [q for q in predictions["qid"].to_list() if q not in known]
    if unknown:
        raise InputError(f"{len(unknown)} prediction id(s) not in the gold data, e.g. {unknown[:5]}", field="qid")
    dup = predictions.filter(pl.col("qid").is_duplicated())["qid"].unique().to_list()
    if dup:
        raise InputError(f"{len(dup)} prediction id(s) given more than once, e.g. {dup[:5]}", field="qid")


@dataclass
class Alignment:
    """Predictions lined up with the questions to score, and what did not fit."""

    predictions: pl.DataFrame  # [qid, answer, missing]
    unknown: list[str]  # predicted ids that are not in the gold data (ignored)
    missing: list[str]  # target ids without a prediction (scored as "")
    not_scored: int  # gold questions left out because only predicted questions were scored


def align(
    predictions: pl.DataFrame,
    gold_qids: list[str],
    *,
    targets: list[str] | None = None,
    only_predicted: bool = False,
    limit: int | None = None,
) -> Alignment:
    """Decide which questions are scored and fill the gaps.

    - default: every gold question is a target (`targets` narrows that, e.g. a run's questions); a target
      without a prediction is scored as an empty answer and listed in `missing`;
    - `only_predicted` / `limit`: the targets are exactly the predicted gold ids (the first `limit` of them in
      prediction order); `not_scored` counts the gold questions left out.
    Predicted ids not in the gold data are never scored; they are listed in `unknown`.
    """
    known = set(gold_qids)
    pred_ids = predictions["qid"].to_list()
    unknown = [q for q in pred_ids if q not in known]
    if only_predicted or limit is not None:
        chosen = [q for q in pred_ids if q in known]
        if limit is not None:
            chosen = chosen[:limit]
        order = chosen
    else:
        wanted = set(targets) if targets is not None else known
        unknown_targets = [q for q in (targets or []) if q not in known]
        unknown += [q for q in unknown_targets if q not in unknown]
        order = [q for q in (targets if targets is not None else gold_qids) if q in known and q in wanted]
    frame = pl.DataFrame({"qid": order}, schema={"qid": pl.String}).join(
        predictions.with_columns(pl.lit(False).alias("missing")), on="qid", how="left", maintain_order="left"
    )
    frame = frame.with_columns(pl.col("missing").fill_null(True), pl.col("answer").fill_null(""))
    missing = frame.filter(pl.col("missing"))["qid"].to_list()
    return Alignment(predictions=frame.select("qid", "answer", "missing"), unknown=unknown, missing=missing,
                     not_scored=len(known) - frame.height)
