"""User-facing errors. Raise `InputError` for anything caused by the user's input (a file, a line,
a field, a model directory): the CLI prints it as one line and exits 2, without a traceback."""

from __future__ import annotations

import errno
import re


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
        self.reason = message  # the message without where: a caller that words it in its own terms


def need_file(path, what: str = "file") -> None:
    """InputError unless `path` is a file: "<what> not found", or "is a directory" when it is one."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise InputError("is a directory, not a file", path=str(p))
    if not p.is_file():
        raise InputError(f"{what} not found", path=str(p))


# Failures to write that the user fixes outside clarify: the disk (or quota) is full, the file system is
# read-only, the folder is not writable. The command line says them in one line (write_failure), never as
# a traceback; what was written before stays, and the same command resumes.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
_WHAT_TO_DO = {
    errno.ENOSPC: "free space on that disk (df -h) or write elsewhere (--out), then run the same command again",
    errno.EDQUOT: "free space in your quota or write elsewhere (--out), then run the same command again",
    errno.EROFS: "the file system is read-only: write elsewhere (--out, or $CLARIFY_HOME for logs and models)",
    errno.EACCES: "that folder is not writable by you: write elsewhere (--out)",
    errno.EPERM: "that folder is not writable by you: write elsewhere (--out)",
}


def write_failure(exc: OSError) -> str:
    """One line for a failed write: the path, the system's reason and what to do."""
    where = f"{exc.filename}: " if exc.filename else ""
    return f"cannot write {where}{exc.strerror or exc}; {_WHAT_TO_DO.get(exc.errno, 'write elsewhere (--out)')}"


class EngineBusy(RuntimeError):
    """The cores or GPU memory an engine needs are taken by another process (local_llm/hardware.py, with
    CLARIFY_ENGINE_BUSY=refuse or a full GPU): one line saying by whom, and nothing started (batch/cli/__init__.py)."""


class EngineUnavailable(RuntimeError):
    """An engine stopped answering, or answered with something that is not a completion (a server after
    every retry, a malformed reply: local_llm/openai_engine.py): the run stops with one line, keeps what
    finished, and the same command resumes (batch/cli/__init__.py). `completed`: the completions of the same
    `generate` call that did come back, by position (a completion cache stores them before re-raising)."""

    completed: dict = {}


# A URL's userinfo (`scheme://user:password@`): up to the authority's last `@`, as URL parsers read it
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")


def redacted(text: object, secrets=()) -> str:
    """`text` with the credentials in any URL (`http://user:pass@host` -> `http://***@host`) and every one
    of `secrets` (an API key, a password: strings of 4 characters or more) replaced by `***`. Everything
    clarify prints or writes that may hold them goes through it: error lines, logs, run configs."""
    out = _USERINFO.sub(r"\1***@", str(text))
    for secret in secrets:
        if secret and len(secret) >= 4:
            out = out.replace(secret, "***")
    return out


# C0 and C1 control characters, DEL, the bidirectional overrides and isolates, line/paragraph separators
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """`text` safe for a terminal: control characters (an escape sequence, a carriage return, a bidi
    override) shown escaped, as Python writes them (`\\x1b`, `\\n`, `\\u202e`), so text from the data
    (a question, an answer, a title) or from another process (a lock's holder) cannot move the cursor,
    recolour, retitle or reorder what the terminal shows. One character class: linear time."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
