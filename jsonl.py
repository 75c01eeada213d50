"""The one JSONL reader: `iter_jsonl(path)` yields (line number, object) for every JSON-object line.

Line handling shared by every JSONL input of clarify (prompts, questions, predictions, QuoteSum rows,
corpora): lines are split on b"\\n" and decoded as UTF-8 one at a time (a UTF-8 byte-order mark on line 1
is dropped), blank lines are skipped, `.gz` files are read through gzip, as a stream. A line is read
into memory only up to `max_line_bytes` (MAX_LINE_BYTES, 64 MiB, by default): a longer one is skipped
in bounded chunks, so a small `.gz` that inflates to one huge line cannot take the machine's memory
(a 407 KB one took the reader to 1.3 GB). A line that is too long, not UTF-8, not JSON (nested too
deeply included), not a JSON object, or holding a lone surrogate (a `\\ud800` escape: no UTF-8 form,
reported as "non_utf8" naming the field) is a *problem* of kind "too_long", "non_utf8", "bad_json" or
"not_object". By default the
first problem raises `InputError` naming file and line; a caller that reports every bad line or skips
bad lines passes `on_error`, which gets each `JsonlProblem` and reading goes on. Field-level checks
(missing id, empty prompt, ...) stay with the callers.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from clarify.errors import InputError, need_file, printable

# The phrase that opens each problem's message; a caller may reword it (`wording=`), the details stay.
DEFAULT_WORDING = {"too_long": "line too long", "non_utf8": "not UTF-8", "bad_json": "malformed JSON",
                   "not_object": "expected a JSON object"}
MAX_LINE_BYTES = 64 * 2**20  # far above any line clarify reads (a QuoteSum row: ~10 KB)
_SKIP_CHUNK = 2**20  # the rest of an over-long line is read and dropped in pieces this size


@dataclass(frozen=True)
class JsonlProblem:
    """One bad line: kind is "too_long", "non_utf8", "bad_json" or "not_object"; message has no
    file/line prefix."""

    path: str
    line: int
    kind: str
    message: str

    def error(self) -> InputError:
        return InputError(self.message, path=self.path, line=self.line)


def iter_jsonl(
    path: str | Path,
    *,
    skip_blank: bool = True,
    on_error: Callable[[JsonlProblem], None] | None = None,
    wording: Mapping[str, str] | None = None,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, dict]]:
    """Yield (1-based line number, dict) for each JSON-object line of `path`.

    InputError("file not found") when `path` is not a file (or "cannot read" when it cannot be opened). A bad line raises InputError(path, line) unless
    `on_error` is given, in which case it is called with the `JsonlProblem` and the line is skipped.
    `skip_blank=False` treats blank lines as malformed JSON. `wording` overrides DEFAULT_WORDING phrases.
    A line of more than `max_line_bytes` bytes (its newline not counted) is a "too_long" problem.
    """
    path = Path(path)
    need_file(path)
    words = {**DEFAULT_WORDING, **(wording or {})}

    def problem(line_no: int, kind: str, detail: str) -> None:
        p = JsonlProblem(str(path), line_no, kind, f"{words[kind]} ({detail})")
        if on_error is None:
            raise p.error()
        on_error(p)

    opener = gzip.open if path.suffix == ".gz" else open
    try:
        fh = opener(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path=str(path)) from exc
    with fh:
        for line_no, raw in enumerate(_lines(fh, max_line_bytes, path), start=1):
            if raw is None:
                problem(line_no, "too_long", f"more than {max_line_bytes:,} bytes")
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                problem(line_no, "non_utf8", f"{exc.reason} at byte {exc.start} of the line")
                continue
            if line_no == 1:
                line = line.removeprefix("\ufeff")  # a UTF-8 byte-order mark written by some editors
            if skip_blank and not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                problem(line_no, "bad_json", f"{exc.msg}, column {exc.colno}")
                continue
            except RecursionError:  # the C decoder's limit on nesting depth
                problem(line_no, "bad_json", "nested too deeply")
                continue
            except ValueError as exc:  # e.g. an integer of more than 4,300 digits
                problem(line_no, "bad_json", str(exc).split(";")[0])
                continue
            if not isinstance(obj, dict):
                problem(line_no, "not_object", f"got {type(obj).__name__}")
                continue
            if _SURROGATE_ESCAPE.search(raw) and (where := lone_surrogate(obj)):
                problem(line_no, "non_utf8", where)
                continue
            yield line_no, obj


# A JSON `\\ud800`-`\\udfff` escape: the only way a line that is UTF-8 can give a lone surrogate, which has no
# UTF-8 form (writing it to Parquet, Arrow or SQLite fails: UnicodeEncodeError); lines without one are not walked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE = re.compile("[\ud800-\udfff]")


def lone_surrogate(obj: object) -> str | None:
    """Where a decoded JSON value holds a lone surrogate (half of a UTF-16 pair, from a `\\ud800` escape),
    as "field 'a.b[2]' holds \\ud800, half of a UTF-16 pair: no character" (the field's name shown through
    errors.printable: it is the data's), or None. Keys are checked too."""
    stack: list[tuple[str, object]] = [("", obj)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if m := _LONE.search(value):
                return f"field '{printable(where) or '(top)'}' holds {m.group().encode('unicode_escape').decode()}, half of " \
                       f"a UTF-16 pair: no character"
        elif isinstance(value, dict):
            for key, v in reversed(list(value.items())):
                if m := _LONE.search(key):
                    return f"a key holds {m.group().encode('unicode_escape').decode()}, half of a UTF-16 pair: no character"
                stack.append((f"{where}.{key}" if where else key, v))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def _lines(fh: BinaryIO, limit: int, path: Path) -> Iterator[bytes | None]:
    """The lines of a binary stream, each with at most `limit` bytes before its newline; None stands for
    a longer line, whose rest is read and dropped in _SKIP_CHUNK pieces (memory stays bounded).

    A `.gz` that is cut short or is not gzip at all fails inside readline (EOFError, BadGzipFile,
    zlib.error): that is an InputError naming the file and the line being read, raised whatever
    `on_error` says, since no line after it can be read."""
    line_no = 1  # the line being read

    def read(n: int) -> bytes:
        try:
            return fh.readline(n)
        except STREAM_ERRORS as exc:
            raise stream_error(exc, path, line_no) from None

    while raw := read(limit + 1):
        line_no += 1
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield raw
            continue
        rest = raw[-1:]
        while rest and not rest.endswith(b"\n"):
            rest = read(_SKIP_CHUNK)
        yield None


STREAM_ERRORS = (EOFError, OSError, zlib.error)  # what reading a cut-short or foreign .gz raises (BadGzipFile: OSError)


def stream_error(exc: BaseException, path: str | Path, line: int) -> InputError:
    """The InputError for one of STREAM_ERRORS met while reading `line` of `path` (a truncated download
    of a .gz corpus is the common case): every reader of compressed input words it the same way."""
    why = "compressed file ended early" if isinstance(exc, EOFError) else f"cannot read on: {exc}"
    return InputError(f"{why} (the file is cut short or damaged)", path=str(path), line=line)


MAX_DOCUMENT_BYTES = 2**30  # one JSON document (ASQA dev, 948 questions: 2.9 MB); json.loads takes ~10x in memory


def read_text(path: str | Path, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """A whole UTF-8 text file (JSON documents), read as `iter_jsonl` reads lines: a byte-order mark is
    dropped; bytes that are not UTF-8 are named by line and column, a missing file or a directory too.
    A file over `max_bytes` is an InputError before anything is read (JSONL is read line by line)."""
    path = Path(path)
    need_file(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise InputError(f"{size / 2**20:,.0f} MiB is too large for one JSON document (at most "
                         f"{max_bytes / 2**20:,.0f} MiB); give it as JSONL, one object a line", path=str(path))
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        at = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1)  # as iter_jsonl counts: from 0
        raise InputError(f"not UTF-8 ({exc.reason} at byte {at} of the line)", path=str(path), line=line) from None


def read_json(path: str | Path, *, max_bytes: int = MAX_DOCUMENT_BYTES) -> object:
    """The one reader of a whole JSON file (a dataset's, a run directory's records, an index manifest): its
    text as `read_text` reads it (a byte-order mark dropped, at most `max_bytes`, bytes that are not UTF-8
    named by line), then parsed. An empty file or bad JSON is an InputError naming file and line."""
    text = read_text(path, max_bytes=max_bytes)
    if not text.strip():
        raise InputError("file is empty", path=str(path))
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"bad JSON: {exc.msg} (column {exc.colno})", path=str(path), line=exc.lineno) from None
    except RecursionError:
        raise InputError("bad JSON: nested too deeply", path=str(path)) from None


def record_id(obj: Mapping, path: str | Path, line: int, keys: tuple[str, ...] = ("qid", "id")) -> str | None:
    """A record's id as a string, from the first of `keys` present; None when absent. Only a JSON
    string or integer is an id: a float, boolean, list or object would become one through str()
    silently ("1.0", "True"), so it is an InputError naming file, line and field."""
    for key in keys:
        if key in obj:
            value = obj[key]
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise InputError(f"an id must be a string or an integer, got {type(value).__name__} {value!r}",
                                 path=str(path), line=line, field=key)
            return str(value)
    return None
