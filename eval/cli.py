"""`clarify eval`: score predictions (an official prediction file or a clarify run directory).

examples:
    clarify eval --dataset asqa --predictions data/asqa/predictions/flare_replication_dev500.json --limit 500
    clarify eval --dataset quotesum --predictions preds.jsonl
    clarify eval --dataset asqa --predictions runs/my-run --reader /models/roberta-large-squad2

Writes into --out (default: <run>/eval for a run directory, <file stem>_eval beside a file):
per_question.parquet (one row per question, one column per metric), scores.parquet (schemas.SCORES),
summary.parquet and summary.txt; prints the summary table.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl

from clarify.errors import WRITE_ERRNOS, InputError
from clarify.eval import datasets
from clarify.files import make_dirs, write_parquet, write_text


def register(sub) -> None:
    p = sub.add_parser("eval", help="score predictions with the ASQA or QuoteSum/SEMQA metrics",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, choices=datasets.names(with_gold=True),
                   help="the dataset whose gold answers and metrics score the predictions")
    p.add_argument("--predictions", required=True, type=Path,
                   help="official prediction file (ASQA JSON {id: answer}; QuoteSum JSONL qid + prediction/"
                        "answer/summary) or a clarify run directory")
    p.add_argument("--gold", type=Path, help="gold file (default: the shipped dev set)")
    p.add_argument("--split", default=datasets.DEV, help=f"ASQA split inside the gold file (default {datasets.DEV})")
    p.add_argument("--reader", type=Path, help="SQuAD 2.0 QA model directory for ASQA Disambig-F1 / DR")
    p.add_argument("--limit", type=int, help="score only the first N predicted questions (0: all, as for run)")
    p.add_argument("--only-predicted", action="store_true",
                   help="score exactly the predicted questions (default: every gold question; missing = empty)")
    p.add_argument("--canonical-markers", action="store_true",
                   help="QuoteSum: rewrite `[k span]` into the official `[ k span ]` before scoring")
    p.add_argument("--out", type=Path, help="output directory")
    p.set_defaults(func=cmd_eval)


def _warn(msg: str) -> None:
    print(f"clarify eval: warning: {msg}", file=sys.stderr)


def evaluate(args: argparse.Namespace, *, before_scoring: Callable[[], object] | None = None,
             ) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """Run the evaluation described by the CLI arguments; return (per_question, summary, report).
    `before_scoring` runs once every input has been read and checked, before the scorers (which take
    minutes on a big file): `clarify eval` makes its output folder there."""
    from clarify.eval import io
    from clarify.eval.summary import score_predictions

    if args.limit is not None and args.limit < 0:
        raise InputError("--limit must be >= 0 (0 = every question, as for clarify run)", field="limit")
    ds = datasets.get(args.dataset)
    pred_path: Path = args.predictions
    run = None
    if pred_path.is_dir():
        from clarify.batch.run.rundir import Run

        run = Run.open(pred_path)
        if run.config.dataset != args.dataset:
            raise InputError(f"the run is a '{run.config.dataset}' run, not '{args.dataset}'",
                             path=str(run.layout.config_file), field="dataset")
        predictions = ds.predictions(run.table("answers", required=True))
    else:
        predictions = io.read_predictions(pred_path)
    if predictions.height == 0:
        raise InputError("no predictions", path=str(pred_path))

    gold_path = args.gold or ds.default_path()
    questions, gold = ds.load(gold_path, split=args.split)
    gold_qids = questions["qid"].to_list()

    # A run is scored on the questions it was asked (its questions table).
    targets = None
    if run is not None:
        targets = run.questions["qid"].to_list()
    known = set(gold_qids)
    if not any(q in known for q in predictions["qid"].to_list()):
        raise InputError(f"none of the predicted ids is in the gold data ({gold_path}), e.g. "
                         f"{predictions['qid'].head(3).to_list()}", path=str(pred_path), field="qid")
    al = io.align(predictions, gold_qids, targets=targets, only_predicted=args.only_predicted,
                  limit=args.limit or None)
    if al.unknown:
        _warn(f"{len(al.unknown)} predicted id(s) are not in the gold data and were ignored: {al.unknown[:5]}")
    if al.missing:
        _warn(f"{len(al.missing)} question(s) have no prediction and were scored as empty answers: {al.missing[:5]}")
    if al.not_scored:
        print(f"clarify eval: {al.predictions.height} question(s) scored; {al.not_scored} gold question(s) had no "
              f"prediction and were not scored", file=sys.stderr)

    if before_scoring is not None:
        before_scoring()
    preds = ds.canonical_markers(al.predictions) if args.canonical_markers else al.predictions
    if run is not None and not al.missing:
        # a run answered each question it was asked: scored exactly as `clarify run` scored it (batch/run/pipeline.py
        # score), with no missing-predictions count
        preds = preds.drop("missing")
    nodes = run.nodes if run is not None and "nodes.parquet" not in run.missing else None
    scored = score_predictions(ds, preds, gold, nodes=nodes, reader=args.reader)
    per_q, summary = scored.per_question, scored.summary
    report = {"scored": per_q.height, "unknown": al.unknown, "missing": al.missing, "not_scored": al.not_scored,
              "gold": str(gold_path), "predictions": str(pred_path)}
    return per_q, summary, report


def _out_path(args: argparse.Namespace) -> Path:
    """--out, default <run>/eval for a run directory, <file stem>_eval beside a file."""
    if args.out is not None:
        return args.out
    p = args.predictions
    return p / "eval" if p.is_dir() else p.with_name(p.stem + "_eval")


def _out_dir(args: argparse.Namespace) -> Path:
    """--out (`_out_path`), made and checked
    writable: a write failure (read-only, full, not ours) is the OSError batch/cli/__init__.py reports as every
    write failure (errors.write_failure, exit 1); --out under a file is an InputError naming --out."""
    out = _out_path(args)
    try:
        make_dirs(out)
    except OSError as exc:
        if exc.errno in WRITE_ERRNOS:  # a read-only or full disk: batch/cli/__init__.py says so in one line (exit 1)
            raise
        raise InputError(f"cannot make the output folder {out}: {exc.strerror or exc}", field="--out") from None
    if not os.access(out, os.W_OK | os.X_OK):  # an existing folder that is not ours to write
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(out))
    return out


def cmd_eval(args: argparse.Namespace) -> int:
    from clarify.eval.summary import format_table, to_scores

    out, made = None, []

    def make_out() -> None:  # once the inputs are good, before scoring: an unwritable --out fails early
        nonlocal out
        p = Path(os.path.abspath(_out_path(args)))
        while not os.path.lexists(p) and p != p.parent:  # the folders this command makes, innermost first
            made.append(p)
            p = p.parent
        out = _out_dir(args)

    try:
        per_q, summary, report = evaluate(args, before_scoring=make_out)
    except BaseException:  # a stop signal (stops.Stopped) or a failure while scoring: nothing is written,
        for d in made:     # so the folders made for the output go again (only while empty)
            try:
                d.rmdir()
            except OSError:
                break
        raise
    write_parquet(per_q, out / "per_question.parquet")
    write_parquet(to_scores(per_q), out / "scores.parquet")
    write_parquet(summary, out / "summary.parquet")
    table = format_table(summary)
    write_text(
        f"dataset: {args.dataset}\npredictions: {report['predictions']}\ngold: {report['gold']}\n"
        f"scored: {report['scored']}  missing (scored empty): {len(report['missing'])}  "
        f"unknown ids: {len(report['unknown'])}  gold not scored: {report['not_scored']}\n\n{table}\n",
        out / "summary.txt",
    )
    print(table)
    print(f"clarify eval: wrote {out}", file=sys.stderr)
    return 0
