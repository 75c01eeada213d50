"""The fingerprint of everything that turns a tree into model requests and the completions back into a tree.

A run pins it in inputs.json (batch/run/rundir.py `RunInputs`), so a resume by a clarify whose prompts, parser,
grammars, stop strings or quote checker differ is refused instead of finishing the run's other trees under
the new ones (its finished parts keep the old). One digest per component, so the refusal names what changed:

    prompt templates   batch/toc/prompts.py and the layout of batch/toc/format.py: every template rendered on
                       fixed inputs (the wording, the fields, demos, passages and DQ/DA lines, the verification)
    DQ/DA parser       batch/toc/format.py: the code of its parser (clarifications, verdicts, the long
                       answer's cleaning) and of every definition it reaches, the labels included
    grammars           batch/toc/format.py's clarification grammar and batch/toc/constraints.py's quotes
                       grammar, rendered
    stop strings       batch/toc/format.py CLARIFY_STOP and ANSWER_STOP
    quote checker      batch/toc/quotes.py: its code (the quoted answer's markers, repair and spans)

A template or grammar is hashed as rendered, so an edit that changes no prompt changes nothing. The parser
and the quote checker cannot be rendered: their code is hashed with comments and docstrings left out
(`ast.unparse`), so only a change of what the code does (or a Python whose `ast.unparse` writes it
differently) counts. The parser shares its module with the rest of the layout: only the definitions its
entry points reach are hashed (`PARSER`), so a grammar or template edit there is not called a parser change.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
from types import ModuleType

import clarify.batch.toc.constraints as constraints
import clarify.batch.toc.format as fmt
import clarify.batch.toc.prompts as prompts
import clarify.batch.toc.quotes as quotes
from clarify.batch.toc.format import Disambiguation
from clarify.batch.toc.prompts import Demo, QuotedDemo
from clarify.fewshot import QAPair
from clarify.schemas import Passage

# component -> the files a reader opens to see what changed
COMPONENTS = {"prompt templates": "batch/toc/prompts.py, batch/toc/format.py", "DQ/DA parser": "batch/toc/format.py",
              "grammars": "batch/toc/format.py, batch/toc/constraints.py", "stop strings": "batch/toc/format.py",
              "quote checker": "batch/toc/quotes.py"}
# The parser's entry points in batch/toc/format.py: what batch/toc/program.py and batch/config/schema.py use of it.
PARSER = ("parse_disambiguations", "official_pairs", "parse_verdict", "clean_long_answer", "split_answers",
          "da_text", "Disambiguation", "Parsed", "Parsing")

# Fixed inputs the templates and grammars are rendered on: every part of a prompt appears at least once.
_PASSAGES = (Passage("p1", "Title one", "First passage, with words."), Passage("p2", "Title two", "Second one."))
_PAIRS = (Disambiguation("Which reading?", ("one", "two"), "one; two"), Disambiguation("Other reading?", ("three",)))
# a demo's pairs as the datasets give them (fewshot.QAPair), so the demo text is hashed as a prompt renders it
_DEMO = Demo("d1", "An ambiguous question?", (QAPair("Which reading?", ("one", "two")), QAPair("Other reading?", ("three",))),
             "A long answer.")
_QUOTED = QuotedDemo("q1", "A question?", _PASSAGES, "[1 First passage] and [2 Second one].")


def _rendered_prompts() -> list[str]:
    q = "The question?"
    return [prompts.clarify_prompt(q, _PASSAGES, [_DEMO]),
            prompts.answer_prompt(q, _PAIRS, _PASSAGES, [_DEMO]),
            prompts.answer_prompt(q, (), _PASSAGES, [_DEMO], open_empty=True),
            prompts.answer_prompt(q, (), _PASSAGES, [_DEMO], open_empty=False),
            prompts.quoted_answer_prompt(q, _PAIRS, _PASSAGES, [_QUOTED]),
            prompts.quoted_answer_prompt(q, (), _PASSAGES, [_QUOTED]),
            prompts.verify_prompt(_PASSAGES[0], q, "one; two"),
            prompts.verify_prompt(None, q, "one")]


def _code(module: ModuleType, roots: tuple[str, ...] | None = None) -> str:
    """The module's code without comments and docstrings; with `roots`, only its top-level statements that
    define them and, transitively, every module-level name those statements use (a helper, a pattern, a
    label), in the module's order."""
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    if roots is None:
        return ast.unparse(tree)
    defines: dict[str, list[ast.stmt]] = {}
    for stmt in tree.body:
        for name in _defined(stmt):
            defines.setdefault(name, []).append(stmt)
    if missing := [name for name in roots if name not in defines]:  # a renamed entry point would drop out
        raise ValueError(f"{module.__name__} defines no {', '.join(missing)}: update the roots fingerprinted")
    kept: set[int] = set()
    todo = list(roots)
    while todo:
        for stmt in defines.get(todo.pop(), ()):
            if id(stmt) not in kept:
                kept.add(id(stmt))
                todo += [n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)]
    # imports always: what a name the parser uses is bound to (`re`, ...) is part of what it does
    kept |= {id(s) for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom)}
    return ast.unparse(ast.Module([s for s in tree.body if id(s) in kept], type_ignores=[]))


def _defined(stmt: ast.stmt) -> list[str]:
    """The module-level names a top-level statement binds (a def, a class, an assignment's targets)."""
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [stmt.name]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode("utf-8")).hexdigest()


def prompts_fingerprint() -> dict[str, str]:
    """{component: sha256} of COMPONENTS, computed from the code as loaded now (milliseconds)."""
    parts = {"prompt templates": _rendered_prompts(),
             "DQ/DA parser": _code(fmt, PARSER),
             "grammars": [fmt.format_grammar(), constraints.quotes_grammar(_PASSAGES)],
             "stop strings": [list(fmt.CLARIFY_STOP), list(fmt.ANSWER_STOP)],
             "quote checker": _code(quotes)}
    return {name: _digest(parts[name]) for name in COMPONENTS}


def changed(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """The components whose digest differs, each with its file ("the prompt templates (batch/toc/prompts.py)")."""
    return [f"the {name} ({path})" for name, path in COMPONENTS.items() if before.get(name) != now.get(name)]
