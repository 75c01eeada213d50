"""Read passage corpora into the passage store (index/textstore.py) in bounded memory.

Accepted inputs (by file suffix):
- `.jsonl` / `.json` / `.jsonl.gz`: one JSON object per line, either `{id, title, text}` or Pyserini's
  `{id, contents}`. In `contents`, a first line written as a quoted title (`"Title"\\n...`, the DPR
  Wikipedia convention) becomes the title; otherwise the title is empty and `contents` is the text.
- `.parquet`: columns `id` or `passage_id`, `text` or `contents`, optional `title`.
- `.tsv`: DPR's `psgs_w100.tsv` layout, a header naming `id`, `text`, `title` (any order), one passage a
  line (fields may be quoted, `""` inside quotes is a quote; a quoted field does not span lines).

How (nothing holds the whole corpus as Python objects):
- Each file is read in chunks (CHUNK_BYTES of whole lines, or CHUNK_ROWS rows) that are appended to the
  store's Arrow file as they come (`textstore.StoreWriter`); peak memory is a few chunks.
- TSV chunks are parsed by pyarrow's CSV reader (vectorised); a chunk it refuses (bytes that are not
  UTF-8, a row with the wrong number of fields) is parsed again line by line in Python to name the line.
  Parquet is read by record batch (pyarrow). JSONL lines go through the one JSONL reader (jsonl.py).
- Missing/empty ids and texts are found per chunk with Polars expressions (Parquet, TSV) or while a line
  is parsed (JSONL, and the TSV fallback).
- Duplicate ids are found once, after the pass, from the store's id column: the ids as one fixed-width
  numpy bytes array, sorted (the same sort that makes the store's id -> row map), equal neighbours are
  duplicates. No dict of every id; the row -> (file, line) map is two numpy arrays.

Every bad row (broken JSON, non-UTF-8 bytes, missing id, missing/empty text, duplicate id) raises an
`InputError` naming the file and line (Parquet: row number, 1-based). With `skip_bad=True` bad rows are
skipped and counted instead; the counts are returned and printed by the CLI. Rows are checked in file
order, and duplicates after every other check (the first bad row found is the one named).

Also here: the layout constants of a corpus (`DEFAULT_CORPUS_FILES`, `LAYOUT`) and `corpus_entries`, the
identity of corpus files that index/build.py and index/shipped.py both use (no import between those two).
"""

from __future__ import annotations

import csv
import gzip
import io
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from clarify.errors import InputError, need_file
from clarify.index.manifest import CorpusEntry
from clarify.jsonl import STREAM_ERRORS, JsonlProblem, iter_jsonl, stream_error
from clarify.schemas import PASSAGES

# how passages become Lucene documents / encoder inputs; a change here forces a rebuild (index/build.py)
LAYOUT = 2
# the shipped Wikipedia passages (data/wiki, ≈10k): core, DPR extra, DPR random distractors
DEFAULT_CORPUS_FILES = ("passages.jsonl", "passages_retrieved_extra.jsonl", "passages_dpr_random1000.jsonl")
CHUNK_BYTES = 32 << 20  # TSV: bytes of whole lines parsed at once
CHUNK_ROWS = 65536  # JSONL and Parquet: rows handed to the store at once


# ------------------------------------------------------------------------------------ corpus identity
def corpus_entries(files, *, checksum: bool = True) -> list[CorpusEntry]:
    """Each corpus file's identity for a manifest: path, name, size, mtime and (`checksum`) sha256."""
    from clarify.files import sha256 as sha256_file

    out = []
    for f in map(Path, files):
        need_file(f, "corpus file")
        st = f.stat()
        entry = {"path": str(f.resolve()), "name": f.name, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
        if checksum:
            entry["sha256"] = sha256_file(f)
        out.append(CorpusEntry.of(entry))
    return out


# ---------------------------------------------------------------------------------------------- results
@dataclass
class CorpusRead:
    """The passages read, plus what was skipped (only with skip_bad=True)."""

    passages: pl.DataFrame
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    examples: list[str] = field(default_factory=list)  # first few "file:line: reason" strings

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())


@dataclass
class StoreRead:
    """A corpus read into a passage store: the store's manifest part, the passage count, what was skipped."""

    store: dict
    count: int
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())


class _Problems:
    """Bad rows: raised at once, or (skip_bad) counted with the first few examples."""

    def __init__(self, skip_bad: bool):
        self.skip_bad = skip_bad
        self.skipped: Counter = Counter()
        self.examples: list[str] = []

    def bad(self, reason: str, message: str, path: Path, line: int, field: str | None = None) -> None:
        if not self.skip_bad:
            raise InputError(message, path=str(path), line=line, field=field)
        self.skipped[reason] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{path}:{line}: {message}")


class _Rows:
    """Rows checked one at a time (JSONL, the TSV fallback), handed on as chunks."""

    def __init__(self, problems: _Problems):
        self.problems = problems
        self.ids: list[str] = []
        self.titles: list[str] = []
        self.texts: list[str] = []
        self.lines: list[int] = []

    def add(self, pid, title, text, path: Path, line: int) -> None:
        bad = self.problems.bad
        if pid is None or (isinstance(pid, str) and not pid.strip()):
            return bad("missing_id", "passage has no id", path, line, "id")
        if not isinstance(pid, str | int) or isinstance(pid, bool):
            return bad("bad_id", f"id must be a string or integer, got {type(pid).__name__}", path, line, "id")
        if text is None:
            return bad("missing_text", "passage has no text (need 'text' or 'contents')", path, line, "text")
        if not isinstance(text, str):
            return bad("bad_text", f"text must be a string, got {type(text).__name__}", path, line, "text")
        if not text.strip():
            return bad("empty_text", "passage text is empty", path, line, "text")
        if title is not None and not isinstance(title, str):
            return bad("bad_title", f"title must be a string, got {type(title).__name__}", path, line, "title")
        pid = str(pid).strip()
        if "\0" in pid or "\n" in pid:
            return bad("bad_id", "id contains a NUL or newline character", path, line, "id")
        self.ids.append(pid)
        self.titles.append(title or "")
        self.texts.append(text)
        self.lines.append(line)

    def __len__(self) -> int:
        return len(self.ids)

    def take(self) -> pl.DataFrame:
        df = pl.DataFrame({"passage_id": self.ids, "title": self.titles, "text": self.texts,
                           "line": self.lines}, schema={**PASSAGES, "line": pl.Int64})
        self.ids, self.titles, self.texts, self.lines = [], [], [], []
        return df


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


# ------------------------------------------------------------------------------------------- readers
def _read_jsonl(path: Path, problems: _Problems) -> Iterator[pl.DataFrame]:
    def bad_line(p: JsonlProblem) -> None:  # a non-object line is counted as bad JSON
        problems.bad("non_utf8" if p.kind == "non_utf8" else "bad_json", p.message, path, p.line)

    rows = _Rows(problems)
    for lineno, obj in iter_jsonl(path, on_error=bad_line, wording={"bad_json": "broken JSON"}):
        rows.add(*_row_fields(obj), path, lineno)
        if len(rows) >= CHUNK_ROWS:
            yield rows.take()
    if len(rows):
        yield rows.take()


def _checked(df: pl.DataFrame, path: Path, problems: _Problems) -> pl.DataFrame:
    """Vectorised row checks of a chunk [passage_id, title, text, line] (strings, nulls allowed): the bad rows
    raise (the first by line) or are counted and dropped."""
    df = df.with_columns(pl.col("passage_id").str.strip_chars())
    checks = [  # reason, message, field, condition (first match wins, as in _Rows.add)
        ("missing_id", "passage has no id", "id",
         pl.col("passage_id").is_null() | (pl.col("passage_id") == "")),
        ("bad_id", "id contains a NUL or newline character", "id", pl.col("passage_id").str.contains(r"[\x00\n]")),
        ("missing_text", "passage has no text (need 'text' or 'contents')", "text", pl.col("text").is_null()),
        ("empty_text", "passage text is empty", "text", pl.col("text").str.strip_chars() == ""),
    ]
    reason = pl.lit(None, dtype=pl.String)
    for name, _, _, cond in reversed(checks):
        reason = pl.when(cond.fill_null(False)).then(pl.lit(name)).otherwise(reason)
    df = df.with_columns(reason.alias("_bad"))
    bad = df.filter(pl.col("_bad").is_not_null())
    if bad.height:
        how = {name: (message, fld) for name, message, fld, _ in checks}
        for name, line in bad.sort("line").select("_bad", "line").iter_rows():
            problems.bad(name, how[name][0], path, line, how[name][1])  # raises unless skip_bad
        df = df.filter(pl.col("_bad").is_null())
    return df.drop("_bad").with_columns(pl.col("title").fill_null(""))


def _read_parquet(path: Path, problems: _Problems) -> Iterator[pl.DataFrame]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a broken file
        raise InputError(f"cannot read Parquet: {exc}", path=str(path)) from exc
    names = pf.schema_arrow.names
    id_col = next((c for c in ("passage_id", "id", "docid") if c in names), None)
    text_col = "text" if "text" in names else ("contents" if "contents" in names else None)
    if id_col is None:
        raise InputError(f"no id column (need 'id' or 'passage_id'); columns are {names}", path=str(path))
    if text_col is None:
        raise InputError(f"no text column (need 'text' or 'contents'); columns are {names}", path=str(path))
    start = 1
    for batch in pf.iter_batches(batch_size=CHUNK_ROWS, columns=[id_col, text_col] + (["title"] if "title" in names else [])):
        df = pl.from_arrow(batch)
        for col, want in ((id_col, "id"), (text_col, "text"), ("title", "title")):
            dtype = df.schema.get(col)
            # a dictionary-encoded string column (what pandas writes for a `category`, or Arrow's
            # dictionary_encode) reads as Categorical: strings all the same
            if dtype is None or dtype in (pl.String, pl.Null, pl.Categorical, pl.Enum) or (
                    col == id_col and dtype.is_integer()):
                continue
            for line in range(start, start + df.height):  # every row of a wrongly typed column is bad
                problems.bad(f"bad_{want}", f"{want} must be a string, got {dtype}", path, line, want)
            df = df.clear()
            break
        df = df.select(pl.col(id_col).cast(pl.String).alias("passage_id"),
                       (pl.col("title").cast(pl.String) if "title" in df.columns else pl.lit("")).alias("title"),
                       pl.col(text_col).cast(pl.String).alias("text"),
                       pl.int_range(start, start + df.height, dtype=pl.Int64).alias("line"))
        if text_col == "contents":
            df = _split_contents_column(df)
        start += batch.num_rows
        yield _checked(df, path, problems)


def _split_contents_column(df: pl.DataFrame) -> pl.DataFrame:
    """`split_contents` as Polars expressions over the `text` column (title kept where one is given)."""
    head = pl.col("text").str.extract(r"^([^\n]*)\n", 1)
    rest = pl.col("text").str.replace(r"^[^\n]*\n", "")
    titled = (head.str.len_chars() >= 2) & head.str.starts_with('"') & head.str.ends_with('"') & (
        rest.str.strip_chars() != "")
    titled = titled.fill_null(False)
    return df.with_columns(
        pl.when(pl.col("title").is_null() | (pl.col("title") == "")).then(
            pl.when(titled).then(head.str.slice(1, head.str.len_chars() - 2).str.replace_all('""', '"', literal=True))
            .otherwise(pl.lit(""))).otherwise(pl.col("title")).alias("title"),
        pl.when(titled).then(rest).otherwise(pl.col("text")).alias("text"))


def _line_chunks(fh, first_line: int, size: int, path: Path) -> Iterator[tuple[int, bytes]]:
    """(number of its first line, bytes of whole lines) chunks of a binary stream. A `.gz` cut short (a
    download that stopped) is an InputError naming the first line not read whole (jsonl.stream_error)."""
    rest, line = b"", first_line
    while True:
        try:
            block = fh.read(size)
        except STREAM_ERRORS as exc:
            raise stream_error(exc, path, line + rest.count(b"\n")) from None
        if not block:
            if rest:
                yield line, rest if rest.endswith(b"\n") else rest + b"\n"
            return
        block = rest + block
        cut = block.rfind(b"\n") + 1
        if cut == 0:
            rest = block
            continue
        chunk, rest = block[:cut], block[cut:]
        yield line, chunk
        line += chunk.count(b"\n")


def _tsv_fast(header: list[str], chunk: bytes, first_line: int) -> pl.DataFrame | None:
    """A chunk of TSV lines parsed by pyarrow (one row a line), or None where it cannot say which line is
    wrong (then the caller parses the chunk line by line)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    invalid = []

    def refuse(row):  # a row with the wrong field count (pyarrow ignores an exception raised here)
        invalid.append(row)
        return "skip"

    try:
        table = pacsv.read_csv(
            io.BytesIO(chunk),
            read_options=pacsv.ReadOptions(column_names=header, use_threads=False, block_size=len(chunk) + 1),
            parse_options=pacsv.ParseOptions(delimiter="\t", ignore_empty_lines=False, newlines_in_values=False,
                                              invalid_row_handler=refuse),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in header},
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False))
    except pa.ArrowInvalid:
        return None
    lines = chunk.count(b"\n")
    if invalid or table.num_rows != lines:
        return None
    df = pl.from_arrow(table)
    return df.select(pl.col("id").alias("passage_id"),
                     (pl.col("title") if "title" in header else pl.lit("")).alias("title"),
                     pl.col("text"), pl.int_range(first_line, first_line + lines, dtype=pl.Int64).alias("line"))


def _tsv_slow(header: list[str], chunk: bytes, first_line: int, path: Path, problems: _Problems) -> pl.DataFrame:
    pos = {name: i for i, name in enumerate(header)}
    rows = _Rows(problems)
    for lineno, raw in enumerate(chunk.split(b"\n")[:-1], start=first_line):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.bad("non_utf8", f"bytes that are not UTF-8: {exc.reason} at byte {exc.start} of the line",
                         path, lineno)
            continue
        try:
            row = next(csv.reader([text.removesuffix("\r")], delimiter="\t"), [])
        except csv.Error as exc:  # a bare carriage return inside an unquoted field
            problems.bad("bad_row", f"cannot split the line into fields: {_csv_reason(exc)}", path, lineno)
            continue
        if len(row) != len(header):
            problems.bad("bad_row", f"expected {len(header)} tab-separated fields, got {len(row)}", path, lineno)
            continue
        rows.add(row[pos["id"]], row[pos["title"]] if "title" in pos else None, row[pos["text"]], path, lineno)
    return rows.take()


def _csv_reason(exc: csv.Error) -> str:
    why = str(exc).split(" - ")[0]  # the csv module's hint about universal-newline mode is no help here
    return "a carriage return (\\r) inside a field" if "new-line" in why else why


def _tsv_header(first: bytes, path: Path) -> list[str]:
    """The header line's column names: UTF-8, splittable, each named once, with `id` and `text`."""
    try:
        text = first.decode("utf-8").removeprefix("\ufeff").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise InputError(f"bytes that are not UTF-8 in the header: {exc}", path=str(path), line=1) from exc
    try:
        header = next(csv.reader([text], delimiter="\t"), [])
    except csv.Error as exc:
        raise InputError(f"cannot split the header into fields: {_csv_reason(exc)}", path=str(path), line=1) from None
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise InputError(f"the header names {', '.join(repr(n) for n in twice)} more than once; each column once",
                         path=str(path), line=1, field=twice[0])
    if not {"id", "text"} <= set(header):
        raise InputError(f"TSV needs a header naming 'id' and 'text' (and 'title'); got {header}",
                         path=str(path), line=1)
    return header


def _read_tsv(path: Path, problems: _Problems) -> Iterator[pl.DataFrame]:
    with (gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")) as fh:
        try:
            first = fh.readline()
        except STREAM_ERRORS as exc:
            raise stream_error(exc, path, 1) from None
        header = _tsv_header(first, path)
        for first_line, chunk in _line_chunks(fh, 2, CHUNK_BYTES, path):
            df = _tsv_fast(header, chunk, first_line)
            if df is None:
                yield _tsv_slow(header, chunk, first_line, path, problems)
            else:
                yield _checked(df, path, problems)


def _reader(path: Path):
    name = path.name.lower()
    if name.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return _read_jsonl
    if name.endswith(".parquet"):
        return _read_parquet
    if name.endswith((".tsv", ".tsv.gz")):
        return _read_tsv
    raise InputError("unknown corpus format (use .jsonl, .parquet or .tsv)", path=str(path))


# ------------------------------------------------------------------------------------------ the pass
def _first_of_each(ids_sorted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions (in the sorted array) of every repeated id, and of the first occurrence of its value."""
    if len(ids_sorted) < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    same = ids_sorted[1:] == ids_sorted[:-1]
    dup = np.flatnonzero(same) + 1
    starts = np.where(np.concatenate([[True], ~same]), np.arange(len(ids_sorted)), 0)
    return dup, np.maximum.accumulate(starts)[dup]


def read_corpus_into(paths, out: Path, *, skip_bad: bool = False) -> StoreRead:
    """Read corpus files (in order) into a passage store in folder `out` (index/textstore.py), written once
    as the chunks come; ids must be unique across files. See the module docstring."""
    from clarify.index.textstore import StoreWriter

    paths = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    if not paths:
        raise InputError("no corpus files given")
    for path in paths:
        need_file(path, "corpus file")
        _reader(path)
    problems = _Problems(skip_bad)
    writer = StoreWriter(Path(out))
    lines, files = [], []  # row -> line and file index, one small array per chunk
    try:
        for i, path in enumerate(paths):
            for chunk in _reader(path)(path, problems):
                if chunk.height:
                    writer.write(chunk.select(list(PASSAGES)))
                    lines.append(chunk["line"].to_numpy().astype(np.int64))
                    files.append(np.full(chunk.height, i, dtype=np.int32))
    finally:
        writer.close()
    if writer.count == 0:
        where = ", ".join(str(p) for p in paths)
        raise InputError(f"no passages read from {where}"
                         + (f" ({dict(problems.skipped)} skipped)" if problems.skipped else ""))
    ids, order = writer.sorted_ids()
    dup, first = _first_of_each(ids)
    keep = None
    if len(dup):
        line = np.concatenate(lines)
        file_of = np.concatenate(files)
        rows, first_rows = order[dup], order[first]
        for k in np.argsort(rows, kind="stable"):  # in row (file, line) order
            r, f = int(rows[k]), int(first_rows[k])
            problems.bad("duplicate_id", f"duplicate id '{ids[dup[k]].decode('utf-8')}' (first seen at "
                         f"{paths[file_of[f]]}:{line[f]})", paths[file_of[r]], int(line[r]), "id")
        keep = np.ones(writer.count, dtype=bool)
        keep[rows] = False
    store = writer.finish(ids, order, keep)
    return StoreRead(store, int(writer.count if keep is None else keep.sum()), problems.skipped, problems.examples)


def load_corpus(paths, *, skip_bad: bool = False) -> CorpusRead:
    """Read corpus files (in order) into a `passages` table in RAM (small corpora, tools and tests; an index
    build streams them into its store instead: `read_corpus_into`). Same checks and errors."""
    import pyarrow as pa

    from clarify.index.textstore import TEXT_FILE

    tmp = Path(tempfile.mkdtemp(prefix="clarify-corpus-"))
    try:
        read = read_corpus_into(paths, tmp, skip_bad=skip_bad)
        with pa.OSFile(str(tmp / TEXT_FILE), "rb") as fh:  # read, not mapped: the folder goes away
            table = pa.ipc.open_file(fh).read_all()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return CorpusRead(pl.from_arrow(table).cast(PASSAGES), read.skipped, read.examples)


def read_passages(paths, *, skip_bad: bool = False) -> pl.DataFrame:
    """Read corpus files into a `passages` table [passage_id, title, text]. See `load_corpus`."""
    return load_corpus(paths, skip_bad=skip_bad).passages
