"""User-facing errors. Raise `InputError` for anything caused by the user's input (a file, a line,
a field, a model directory): the CLI prints it as one line and exits 2, without a traceback."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input. The message names the file and line (or field) at fault."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None, field: str | None = None):
        where = ""
        if path is not None:
            where = f"{path}"
            if line is not None:
                where += f":{line}"
            if field is not None:
                where += f" (field '{field}')"
            where += ": "
        elif field is not None:
            where = f"field '{field}': "
        super().__init__(where + message)
        self.path, self.line, self.field = path, line, field


def need_file(path, what: str = "file") -> None:
    """InputError unless `path` is a file: "<what> not found", or "is a directory" when it is one."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise InputError("is a directory, not a file", path=str(p))
    if not p.is_file():
        raise InputError(f"{what} not found", path=str(p))
