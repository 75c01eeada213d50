"""The fingerprint of everything that turns a tree into model requests and the completions back into a tree.

A run pins it in inputs.json (batch/rundir.py `RunInputs`), so a resume by a clarify whose prompts, parser,
grammars, stop strings or quote checker differ is refused instead of finishing the run's other trees under
the new ones (its finished parts keep the old). One digest per component, so the refusal names what changed:

    prompt templates   batch/toc/prompts.py: every template rendered on fixed inputs (the wording, the
                       layout of demos, passages and DQ/DA lines, the verification prompt)
    DQ/DA parser       batch/toc/parse.py: its code (clarifications, verdicts, the long answer's cleaning)
    grammars           batch/toc/constraints.py: the clarification grammar and a quotes grammar, rendered
    stop strings       batch/toc/program.py CLARIFY_STOP and ANSWER_STOP
    quote checker      batch/toc/quotes.py: its code (the quoted answer's markers, repair and spans)

A template or grammar is hashed as rendered, so an edit that changes no prompt changes nothing. The parser
and the quote checker cannot be rendered: their code is hashed with comments and docstrings left out
(`ast.unparse`), so only a change of what the code does (or a Python whose `ast.unparse` writes it
differently) counts.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
from types import ModuleType

import clarify.batch.toc.constraints as constraints
import clarify.batch.toc.parse as parse
import clarify.batch.toc.program as program
import clarify.batch.toc.prompts as prompts
import clarify.batch.toc.quotes as quotes
from clarify.batch.toc.parse import Disambiguation
from clarify.batch.toc.prompts import Demo, QuotedDemo
from clarify.schemas import Passage

# component -> the file a reader opens to see what changed
COMPONENTS = {"prompt templates": "batch/toc/prompts.py", "DQ/DA parser": "batch/toc/parse.py",
              "grammars": "batch/toc/constraints.py", "stop strings": "batch/toc/program.py",
              "quote checker": "batch/toc/quotes.py"}

# Fixed inputs the templates and grammars are rendered on: every part of a prompt appears at least once.
_PASSAGES = (Passage("p1", "Title one", "First passage, with words."), Passage("p2", "Title two", "Second one."))
_PAIRS = (Disambiguation("Which reading?", ("one", "two"), "one; two"), Disambiguation("Other reading?", ("three",)))
_DEMO = Demo("d1", "An ambiguous question?", _PAIRS, "A long answer.")
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


def _code(module: ModuleType) -> str:
    """The module's code without comments and docstrings."""
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode("utf-8")).hexdigest()


def prompts_fingerprint() -> dict[str, str]:
    """{component: sha256} of COMPONENTS, computed from the code as loaded now (milliseconds)."""
    parts = {"prompt templates": _rendered_prompts(),
             "DQ/DA parser": _code(parse),
             "grammars": [constraints.format_grammar(), constraints.quotes_grammar(_PASSAGES)],
             "stop strings": [list(program.CLARIFY_STOP), list(program.ANSWER_STOP)],
             "quote checker": _code(quotes)}
    return {name: _digest(parts[name]) for name in COMPONENTS}


def changed(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """The components whose digest differs, each with its file ("the prompt templates (batch/toc/prompts.py)")."""
    return [f"the {name} ({path})" for name, path in COMPONENTS.items() if before.get(name) != now.get(name)]
