"""Prompt texts of Tree of Clarifications and of SEMQA quoted answers.

The shape follows the ToC paper's appendix and official templates (gankim/tree-of-clarifications
`toc/templates/load.py`): parts separated by `---` — instructions, demos, a format guide, the query.
The wording is ours.
"""

from __future__ import annotations

from collections.abc import Sequence

from clarify.batch.toc.parse import Disambiguation
from clarify.fewshot import Demo, QAPair, QuotedDemo
from clarify.schemas import Passage

SEP = "\n\n---\n\n"

CLARIFY_INSTRUCTIONS = (
    "The questions below are ambiguous: each can be read in several ways, and each reading has its own answer. "
    "Rewrite the question into disambiguated questions that each allow only one reading, and give each a short "
    "factoid answer. Then write a detailed long-form answer of at least three sentences that covers every "
    "reading. Here are some examples."
)

FORMAT_GUIDE = """Follow the following format.

Context:
${sources that may contain relevant content}

Question: ${ambiguous question to be disambiguated}

Disambiguations:
${the disambiguated pairs of questions and answers, one per line}
DQ i: ${(i)-th disambiguated question that clarifies the ambiguous question}
DA i: ${short factoid answers to the (i)-th question, separated by semicolons (;), often 1 to 5 words}

Answer: ${a detailed answer that explains the readings of the question and answers each, at least three sentences}"""

QUOTED_INSTRUCTIONS = (
    "Answer the question from the numbered sources. Every fact in your answer must be copied word for word from "
    "a source and marked as [k copied words], where k is the number of the source it was copied from; join the "
    "marked spans with a few words of your own. Cover each reading of the question that the sources support. "
    "Here are some examples."
)

QUOTED_FORMAT_GUIDE = """Follow the following format.

Sources:
${numbered sources}

Question: ${the question}

Answer: ${an answer whose factual spans are copied verbatim from the sources and marked [k span]}"""

VERIFY_INSTRUCTIONS = (
    "Below are a question, a context passage and a proposed answer to the question. Decide whether the proposed "
    "answer could be correct, using the context. Reply with only True or False."
)


def format_pairs(pairs: Sequence[Disambiguation | QAPair]) -> str:
    """`DQ i:` / `DA i:` lines; each DA is the whole string as written (toc/utils.py:12-22 make_str_disambig:
    a demo's first short answer, a tree node's `disambig['answer']`)."""
    lines = []
    for i, p in enumerate(pairs, 1):
        lines.append(f"DQ {i}: {p.question}")
        lines.append(f"DA {i}: {p.da}")
    return "\n".join(lines)


def format_context(passages: Sequence[Passage]) -> str:
    """Numbered passages `[k] «title | text»` (dsp's passages2text layout, as in the ToC prompts)."""
    return "\n".join(f"[{k}] «{p.title} | {p.text}»" for k, p in enumerate(passages, 1))


def _demo_block(d: Demo) -> str:
    return f"Question: {d.question}\n\nDisambiguations:\n{format_pairs(d.pairs)}\n\nAnswer: {d.answer}"


def clarify_prompt(question: str, passages: Sequence[Passage], demos: Sequence[Demo]) -> str:
    """Retrieval-augmented clarification: ends open at `Disambiguations:` (ToC §3.1)."""
    parts = [CLARIFY_INSTRUCTIONS, *(_demo_block(d) for d in demos), FORMAT_GUIDE]
    query = f"Context:\n{format_context(passages)}\n\nQuestion: {question}\n\nDisambiguations:\n"
    return SEP.join(parts + [query])


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
    parts = [CLARIFY_INSTRUCTIONS, *(_demo_block(d) for d in demos), FORMAT_GUIDE]
    query = (f"Context:\n{format_context(passages)}\n\nQuestion: {question}\n\n"
             f"Disambiguations:\n{format_pairs(pairs)}\n\nAnswer:")
    return SEP.join(parts + [query])


def _quoted_demo_block(d: QuotedDemo) -> str:
    return f"Sources:\n{format_context(d.sources)}\n\nQuestion: {d.question}\n\nAnswer: {d.answer}"


def quoted_answer_prompt(question: str, pairs: Sequence[Disambiguation], passages: Sequence[Passage],
                         demos: Sequence[QuotedDemo]) -> str:
    """SEMQA-style answer: factual spans copied from source k and marked `[k span]`. The tree's
    disambiguations (if any) are given as a guide to which readings to cover."""
    parts = [QUOTED_INSTRUCTIONS, *(_quoted_demo_block(d) for d in demos), QUOTED_FORMAT_GUIDE]
    guide = ""
    if pairs:
        guide = f"Readings to cover:\n{format_pairs(pairs)}\n\n"
    query = f"Sources:\n{format_context(passages)}\n\nQuestion: {question}\n\n{guide}Answer:"
    return SEP.join(parts + [query])


def verify_prompt(evidence: Passage | None, ambiguous_question: str, proposed_answer: str) -> str:
    """Self-verification (toc/templates/load.py get_ver_prompt shape): the ORIGINAL ambiguous question.
    No evidence (the tree has shown no passage) leaves the context empty."""
    context = f"{evidence.title} | {evidence.text}" if evidence is not None else ""
    return (f"{VERIFY_INSTRUCTIONS}\n\nContext: {context}\n"
            f"Question: {ambiguous_question}\nProposed Answer: {proposed_answer}\nTrue or False:")
