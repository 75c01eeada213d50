"""The one JSONL reader: `iter_jsonl(path)` yields (line number, object) for every JSON-object line.

Line handling shared by every JSONL input of clarify (prompts, questions, predictions, QuoteSum rows,
corpora): lines are split on b"\\n" and decoded as UTF-8 one at a time (a UTF-8 byte-order mark on line 1
is dropped), blank lines are skipped, `.gz` files are read through gzip. A line that is not UTF-8, not
JSON, or not a JSON object is a *problem* of kind "non_utf8", "bad_json" or "not_object". By default the
first problem raises `InputError` naming file and line; a caller that reports every bad line or skips
bad lines passes `on_error`, which gets each `JsonlProblem` and reading goes on. Field-level checks
(missing id, empty prompt, ...) stay with the callers.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from clarify.errors import InputError

# The phrase that opens each problem's message; a caller may reword it (`wording=`), the details stay.
DEFAULT_WORDING = {"non_utf8": "not UTF-8", "bad_json": "malformed JSON", "not_object": "expected a JSON object"}


@dataclass(frozen=True)
class JsonlProblem:
    """One bad line: kind is "non_utf8", "bad_json" or "not_object"; message has no file/line prefix."""

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
) -> Iterator[tuple[int, dict]]:
    """Yield (1-based line number, dict) for each JSON-object line of `path`.

    InputError("file not found") when `path` is not a file (or "cannot read" when it cannot be opened). A bad line raises InputError(path, line) unless
    `on_error` is given, in which case it is called with the `JsonlProblem` and the line is skipped.
    `skip_blank=False` treats blank lines as malformed JSON. `wording` overrides DEFAULT_WORDING phrases.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("file not found", path=str(path))
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
        for line_no, raw in enumerate(fh, start=1):
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
            if not isinstance(obj, dict):
                problem(line_no, "not_object", f"got {type(obj).__name__}")
                continue
            yield line_no, obj
