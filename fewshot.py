"""The few-shot demo records, declared once for the datasets that read them from their files (eval/datasets
`Dataset.demos`) and the tree program that picks and shows them (batch/toc/demos.py, batch/toc/prompts.py).
They live at the top so that eval/ need not import batch/ (tests/test_layout.py)."""

from __future__ import annotations

from dataclasses import dataclass

from clarify.schemas import Passage


@dataclass(frozen=True)
class QAPair:
    """A disambiguated question with its short answers, as a dataset holds it (an ASQA qa_pair).

    A demo's pairs are these; a tree's pairs are the parser's `Disambiguation` (batch/toc/format.py), which
    also keeps the DA line as the model wrote it. The DA string a prompt shows for either is batch/toc/format.py's
    (`shown_da`: the layout is declared there, and fingerprinted with the run)."""

    question: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class Demo:
    """A clarification demo: question → DQ/DA pairs → long answer (demos carry no context)."""

    demo_id: str
    question: str
    pairs: tuple[QAPair, ...]
    answer: str


@dataclass(frozen=True)
class QuotedDemo:
    """A SEMQA demo: numbered sources, question, answer with `[k span]` markers."""

    demo_id: str
    question: str
    sources: tuple[Passage, ...]
    answer: str
