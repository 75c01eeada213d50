"""Read passage corpora into the `passages` table (schemas.PASSAGES: passage_id, title, text).

Accepted inputs (by file suffix):
- `.jsonl` / `.json` / `.jsonl.gz`: one JSON object per line, either `{id, title, text}` or Pyserini's
  `{id, contents}`. In `contents`, a first line written as a quoted title (`"Title"\\n...`, the DPR
  Wikipedia convention) becomes the title; otherwise the title is empty and `contents` is the text.
- `.parquet`: columns `id` or `passage_id`, `text` or `contents`, optional `title`.
- `.tsv`: DPR's `psgs_w100.tsv` layout, a header naming `id`, `text`, `title` (any order).

Every bad row (broken JSON, non-UTF-8 bytes, missing id, missing/empty text, duplicate id) raises an
`InputError` naming the file and line (Parquet: row number, 1-based). With `skip_bad=True` bad rows are
skipped and counted instead; the counts are returned by `load_corpus` and printed by the CLI.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from clarify.errors import InputError, need_file
from clarify.jsonl import JsonlProblem, iter_jsonl
from clarify.schemas import PASSAGES


@dataclass
class CorpusRead:
    """The passages read, plus what was skipped (only with skip_bad=True)."""

    passages: pl.DataFrame
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    examples: list[str] = field(default_factory=list)  # first few "file:line: reason" strings

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())


class _Collector:
    def __init__(self, skip_bad: bool):
        self.skip_bad = skip_bad
        self.ids: list[str] = []
        self.titles: list[str] = []
        self.texts: list[str] = []
        self.seen: dict[str, str] = {}  # id -> "file:line" of first occurrence
        self.skipped: Counter = Counter()
        self.examples: list[str] = []

    def bad(self, reason: str, message: str, path: Path, line: int, field: str | None = None) -> None:
        if not self.skip_bad:
            raise InputError(message, path=str(path), line=line, field=field)
        self.skipped[reason] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{path}:{line}: {message}")

    def add(self, pid, title, text, path: Path, line: int) -> None:
        if pid is None or (isinstance(pid, str) and not pid.strip()):
            return self.bad("missing_id", "passage has no id", path, line, "id")
        if not isinstance(pid, str | int) or isinstance(pid, bool):
            return self.bad("bad_id", f"id must be a string or integer, got {type(pid).__name__}", path, line, "id")
        if text is None:
            return self.bad("missing_text", "passage has no text (need 'text' or 'contents')", path, line, "text")
        if not isinstance(text, str):
            return self.bad("bad_text", f"text must be a string, got {type(text).__name__}", path, line, "text")
        if not text.strip():
            return self.bad("empty_text", "passage text is empty", path, line, "text")
        if title is not None and not isinstance(title, str):
            return self.bad("bad_title", f"title must be a string, got {type(title).__name__}", path, line, "title")
        pid = str(pid).strip()
        if pid in self.seen:
            return self.bad("duplicate_id", f"duplicate id '{pid}' (first seen at {self.seen[pid]})", path, line, "id")
        self.seen[pid] = f"{path}:{line}"
        self.ids.append(pid)
        self.titles.append(title or "")
        self.texts.append(text)


def split_contents(contents: str) -> tuple[str, str]:
    """Pyserini `contents` -> (title, text). DPR-style `"Title"\\ntext` gives the title; else ("", contents)."""
    head, sep, rest = contents.partition("\n")
    if sep and len(head) >= 2 and head.startswith('"') and head.endswith('"') and rest.strip():
        return head[1:-1].replace('""', '"'), rest
    return "", contents


def _row_fields(obj: dict) -> tuple[object, object, object]:
    pid = obj.get("id", obj.get("passage_id", obj.get("docid")))
    if "text" in obj:
        return pid, obj.get("title"), obj["text"]
    if "contents" in obj and isinstance(obj["contents"], str):
        title, text = split_contents(obj["contents"])
        return pid, obj.get("title", title), text
    return pid, obj.get("title"), obj.get("contents")


def _read_jsonl(path: Path, col: _Collector) -> None:
    def bad_line(p: JsonlProblem) -> None:  # a non-object line is counted as bad JSON
        col.bad("non_utf8" if p.kind == "non_utf8" else "bad_json", p.message, path, p.line)

    for lineno, obj in iter_jsonl(path, on_error=bad_line, wording={"bad_json": "broken JSON"}):
        col.add(*_row_fields(obj), path, lineno)


def _read_parquet(path: Path, col: _Collector) -> None:
    try:
        df = pl.read_parquet(path)
    except Exception as exc:  # polars raises several types for a broken file
        raise InputError(f"cannot read Parquet: {exc}", path=str(path)) from exc
    id_col = next((c for c in ("passage_id", "id", "docid") if c in df.columns), None)
    text_col = "text" if "text" in df.columns else ("contents" if "contents" in df.columns else None)
    if id_col is None:
        raise InputError(f"no id column (need 'id' or 'passage_id'); columns are {df.columns}", path=str(path))
    if text_col is None:
        raise InputError(f"no text column (need 'text' or 'contents'); columns are {df.columns}", path=str(path))
    cols = [id_col, text_col] + (["title"] if "title" in df.columns else [])
    for rowno, row in enumerate(df.select(cols).iter_rows(named=True), start=1):
        obj = {"id": row[id_col], text_col: row[text_col]}
        if "title" in row:
            obj["title"] = row["title"]
        col.add(*_row_fields(obj), path, rowno)


def _read_tsv(path: Path, col: _Collector) -> None:
    try:
        fh = io.TextIOWrapper(open(path, "rb"), encoding="utf-8", newline="")
        reader = csv.reader(fh, delimiter="\t")
        header = next(reader, None)
    except UnicodeDecodeError as exc:
        raise InputError(f"bytes that are not UTF-8 in the header: {exc}", path=str(path), line=1) from exc
    with fh:
        if header is None or not {"id", "text"} <= set(header):
            raise InputError(f"TSV needs a header naming 'id' and 'text' (and 'title'); got {header}", path=str(path), line=1)
        pos = {name: i for i, name in enumerate(header)}
        lineno = 1
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except UnicodeDecodeError as exc:
                raise InputError(f"bytes that are not UTF-8: {exc}", path=str(path), line=reader.line_num + 1) from exc
            lineno = reader.line_num
            if len(row) != len(header):
                col.bad("bad_row", f"expected {len(header)} tab-separated fields, got {len(row)}", path, lineno)
                continue
            title = row[pos["title"]] if "title" in pos else None
            col.add(row[pos["id"]], title, row[pos["text"]], path, lineno)


def load_corpus(paths, *, skip_bad: bool = False) -> CorpusRead:
    """Read one or more corpus files (in order) into a `passages` table; ids must be unique across files."""
    if isinstance(paths, str | Path):
        paths = [paths]
    paths = [Path(p) for p in paths]
    if not paths:
        raise InputError("no corpus files given")
    col = _Collector(skip_bad)
    for path in paths:
        need_file(path, "corpus file")
        name = path.name.lower()
        if name.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
            _read_jsonl(path, col)
        elif name.endswith(".parquet"):
            _read_parquet(path, col)
        elif name.endswith(".tsv"):
            _read_tsv(path, col)
        else:
            raise InputError("unknown corpus format (use .jsonl, .parquet or .tsv)", path=str(path))
    if not col.ids:
        where = ", ".join(str(p) for p in paths)
        raise InputError(f"no passages read from {where}" + (f" ({col.skipped and dict(col.skipped)} skipped)" if col.skipped else ""))
    df = pl.DataFrame({"passage_id": col.ids, "title": col.titles, "text": col.texts}, schema=PASSAGES)
    return CorpusRead(df, col.skipped, col.examples)


def read_passages(paths, *, skip_bad: bool = False) -> pl.DataFrame:
    """Read corpus files into a `passages` table [passage_id, title, text]. See `load_corpus`."""
    return load_corpus(paths, skip_bad=skip_bad).passages
