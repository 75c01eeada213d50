"""`clarify show RUN [QID]`: one question of a run on the terminal, as `clarify demo` ends — the tree of
clarifications as an indented outline (the ambiguous question, then each disambiguated question with its
answer, marked valid / pruned / duplicate, and the passage the verifier saw), then the long answer with
its `[k span]` quotes resolved to their passages.

Reads the run with the one run reader (batch/run/rundir.py `Run.open`): questions, nodes, answers, spans,
passages and scores. Every text from the run reaches the terminal through `errors.printable` (model
output and data may hold escape sequences).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

import polars as pl

from clarify.batch.toc.tree import Status
from clarify.errors import InputError, printable
from clarify.eval.metrics import Metric
from clarify.schemas import NodeRow, SpanRow, rows

# Which question the demo shows when none is named: the one whose tree shows most of what ToC does.
PICK_RULE = "the most valid nodes, ties broken by ROUGE-L, then by question order"
PICK_METRIC = Metric.ROUGE_L  # the per-question ROUGE-L of the ASQA and QuoteSum scorers (scores.parquet)
STATUS_WORDS = {s: "ROOT" if s is Status.ROOT else s.value for s in Status}  # batch/toc/tree.py
TEXT_CLIP = 160  # characters of a node's question or answer on one line


def pick_question(run) -> tuple[str, int]:
    """The qid `PICK_RULE` chooses, and its number of valid nodes. In: run.questions, run.nodes,
    run.scores[qid, metric, value]."""
    from clarify.schemas import KEPT_STATUSES

    order = run.questions.select("qid").unique("qid", keep="first", maintain_order=True).with_row_index("_pos")
    if not order.height:
        raise InputError("the run has no questions", path=str(run.path))
    valid = run.nodes.group_by("qid").agg(valid=pl.col("status").is_in(list(KEPT_STATUSES)).sum())
    rouge = (run.scores.filter(pl.col("metric") == PICK_METRIC).group_by("qid").agg(rouge=pl.col("value").max()))
    ranked = (order.join(valid, on="qid", how="left").join(rouge, on="qid", how="left")
              .with_columns(pl.col("valid").fill_null(0), pl.col("rouge").fill_null(float("-inf")).fill_nan(float("-inf")))
              .sort(["valid", "rouge", "_pos"], descending=[True, True, False]))
    return ranked["qid"][0], int(ranked["valid"][0])


def _clip(text: str | None, n: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= n else text[: n - 1] + "…"


def tree_lines(nodes: pl.DataFrame, titles: dict[str, str]) -> list[str]:
    """The question's nodes as an indented outline, children under their parent in the order the tree
    made them (depth, wave, row). In: nodes[node_id, parent_id, depth, question, answers, status, wave,
    evidence_passage_id] of one question."""
    made = rows(nodes, NodeRow)
    ids = {r.node_id for r in made}
    children: dict[str | None, list[NodeRow]] = {}
    for _, r in sorted(enumerate(made), key=lambda ir: (ir[1].depth or 0, ir[1].wave or 0, ir[0])):
        parent = r.parent_id if r.parent_id in ids else None
        children.setdefault(parent, []).append(r)
    lines: list[str] = []
    seen: set[str] = set()

    def walk(r: NodeRow, indent: int) -> None:
        if r.node_id in seen:  # a parent cycle in a damaged table: each node once
            return
        seen.add(r.node_id)
        pad = "  " * indent
        status = r.status or Status.PENDING
        word = STATUS_WORDS.get(status, status)
        if status == Status.ROOT or (r.parent_id is None and indent == 0):
            lines.append(f"{pad}{word}: {printable(_clip(r.question, TEXT_CLIP))}")
        else:
            answers = "; ".join(r.answers or []) or "(no answer)"
            lines.append(f"{pad}- [{word}] DQ: {printable(_clip(r.question, TEXT_CLIP))}")
            lines.append(f"{pad}    DA: {printable(_clip(answers, TEXT_CLIP))}")
            pid = r.evidence_passage_id
            if pid is not None:
                lines.append(f"{pad}    from: «{printable(_clip(titles.get(pid, '?'), 80))}» ({printable(pid)})")
        for c in children.get(r.node_id, []):
            walk(c, indent + 1)

    for top in children.get(None, []):
        walk(top, 0)
    for r in made:  # nodes on a parent cycle are never reached from a top node: still shown
        walk(r, 0)
    return lines


def show(run_dir: Path | str, qid: str | None = None, out: TextIO | None = None) -> str:
    """Print one question of the run: how it was chosen (when `qid` is None: `PICK_RULE`), its tree as an
    outline, its answer with the quotes resolved. Returns the qid shown."""
    from clarify.batch.run.rundir import Run

    out = out or sys.stdout  # looked up now: a quiet session (console.session) swaps sys.stdout
    run = Run.open(run_dir)
    questions, nodes = run.questions, run.nodes
    if qid is None:
        qid, n_valid = pick_question(run)
        print(f"\nquestion {printable(qid)}, chosen for the most valid nodes ({n_valid}) of the run's "
              f"{questions['qid'].n_unique()} (rule: {PICK_RULE}); `clarify show {printable(run.path)} QID` "
              f"shows any other", file=out)
    elif qid not in set(questions["qid"]):
        raise InputError(f"no question {qid!r} in this run (questions.parquet has {questions.height})",
                         path=str(run.path), field="QID")
    question = questions.filter(pl.col("qid") == qid)["question"][0]
    titles = dict(zip(run.passages["passage_id"], run.passages["title"]))
    mine = nodes.filter(pl.col("qid") == qid)
    print(f"\nQ: {printable(question)}", file=out)
    if mine.height:
        counts = dict(mine.group_by("status").len().iter_rows())
        said = ", ".join(f"{counts[s]} {s}" for s in (Status.VALID, Status.PRUNED, Status.DUPLICATE, Status.PENDING) if counts.get(s))
        print(f"tree of clarifications ({mine.height} nodes{': ' + said if said else ''}):", file=out)
        for line in tree_lines(mine, titles):
            print(f"  {line}", file=out)
    else:
        print("tree of clarifications: none (nodes.parquet has no row for this question)", file=out)
    answers = run.answers.filter(pl.col("qid") == qid)
    if not answers.height:
        print("A: none (answers.parquet has no row for this question)", file=out)
        return qid
    print(f"A: {printable(_clip(answers['answer'][0], 600))}", file=out)
    spans = run.spans.filter(pl.col("qid") == qid).sort("span_no")
    for s in rows(spans, SpanRow):
        where = f"chars {s.start}-{s.end}" if s.start is not None and s.start >= 0 else "not found"
        print(f"  [{s.source_k}] {printable(repr(_clip(s.text, 120)))} → {printable(s.passage_id)} "
              f"«{printable(titles.get(s.passage_id, ''))}» {where} ({s.status})", file=out)
    return qid


def cmd_show(args: argparse.Namespace) -> int:
    show(Path(args.run_dir), args.qid)
    return 0


def register(sub) -> None:
    p = sub.add_parser("show", help="one question of a run: its tree of clarifications and its quoted answer",
                       description="One question of a run on the terminal: the tree of clarifications as an\n"
                                   "outline (each disambiguated question with its answer, valid / pruned /\n"
                                   "duplicate, the passage it came from), then the answer with its quotes\n"
                                   "resolved to their passages.",
                       epilog="examples:\n"
                              "  clarify show runs/demo                         the question the demo shows:\n"
                              f"                                                 {PICK_RULE}\n"
                              "  clarify show runs/demo -7013890438520559398    any question, by its qid\n")
    p.add_argument("run_dir", metavar="RUN", help="a run directory (clarify run / demo --out)")
    p.add_argument("qid", nargs="?", metavar="QID", help=f"the question's id (default: {PICK_RULE})")
    p.set_defaults(func=cmd_show)
