"""Prompt texts of Tree of Clarifications and of SEMQA quoted answers: the wording, put around the layout.

The shape follows the ToC paper's appendix and official templates (gankim/tree-of-clarifications
`toc/templates/load.py`): parts separated by `---` — instructions, demos, a format guide, the query. The
layout (fields, DQ/DA lines, format guides, separators) is batch/toc/format.py's; the wording is ours.
"""

from __future__ import annotations

from collections.abc import Sequence

import clarify.batch.toc.format as fmt
from clarify.batch.toc.format import Disambiguation
from clarify.fewshot import Demo, QuotedDemo
from clarify.schemas import Passage

CLARIFY_INSTRUCTIONS = (
    "The questions below are ambiguous: each can be read in several ways, and each reading has its own answer. "
    "Rewrite the question into disambiguated questions that each allow only one reading, and give each a short "
    "factoid answer. Then write a detailed long-form answer of at least three sentences that covers every "
    "reading. Here are some examples."
)

QUOTED_INSTRUCTIONS = (
    "Answer the question from the numbered sources. Every fact in your answer must be copied word for word from "
    "a source and marked as [k copied words], where k is the number of the source it was copied from; join the "
    "marked spans with a few words of your own. Cover each reading of the question that the sources support. "
    "Here are some examples."
)

VERIFY_INSTRUCTIONS = (
    "Below are a question, a context passage and a proposed answer to the question. Decide whether the proposed "
    "answer could be correct, using the context. Reply with only True or False."
)


def _clarify_parts(demos: Sequence[Demo]) -> list[str]:
    return [CLARIFY_INSTRUCTIONS, *(fmt.clarify_demo(d.question, d.pairs, d.answer) for d in demos), fmt.FORMAT_GUIDE]


def clarify_prompt(question: str, passages: Sequence[Passage], demos: Sequence[Demo]) -> str:
    """Retrieval-augmented clarification: ends open at `Disambiguations:` (ToC §3.1)."""
    return fmt.SEP.join([*_clarify_parts(demos), fmt.clarify_query(question, passages)])


def answer_prompt(question: str, pairs: Sequence[Disambiguation], passages: Sequence[Passage],
                  demos: Sequence[Demo], *, open_empty: bool = True) -> str:
    """The final long-form answer (free style): the clarify template with the tree's DQ/DA filled in,
    ending at `Answer:`. A tree without valid nodes gives the official code a DQ/DA field of "" (toc/tree.py:32-40
    `_get_tree`, toc/utils.py:12-22), which dsp treats as absent: the prompt ends open at
    `Disambiguations:` (dsp/templates/template_v2.py:73-83), the clarification prompt, and the model
    writes disambiguations, then its answer. `open_empty` False (toc.empty_tree_answer = "closed") asks
    for the answer directly instead."""
    if not pairs and open_empty:
        return clarify_prompt(question, passages, demos)
    return fmt.SEP.join([*_clarify_parts(demos), fmt.answer_query(question, pairs, passages)])


def quoted_answer_prompt(question: str, pairs: Sequence[Disambiguation], passages: Sequence[Passage],
                         demos: Sequence[QuotedDemo]) -> str:
    """SEMQA-style answer: factual spans copied from source k and marked `[k span]`. The tree's
    disambiguations (if any) are given as a guide to which readings to cover."""
    parts = [QUOTED_INSTRUCTIONS, *(fmt.quoted_demo(d.question, d.sources, d.answer) for d in demos),
             fmt.QUOTED_FORMAT_GUIDE]
    return fmt.SEP.join([*parts, fmt.quoted_query(question, pairs, passages)])


def verify_prompt(evidence: Passage | None, ambiguous_question: str, proposed_answer: str) -> str:
    """Self-verification (toc/templates/load.py get_ver_prompt shape): the ORIGINAL ambiguous question.
    No evidence (the tree has shown no passage) leaves the context empty."""
    context = f"{evidence.title} | {evidence.text}" if evidence is not None else ""
    return f"{VERIFY_INSTRUCTIONS}\n\n{fmt.verify_query(context, ambiguous_question, proposed_answer)}"
