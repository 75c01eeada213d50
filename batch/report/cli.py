"""`clarify report RUN_DIR [RUN_DIR...] [--out FILE]`: the command's arguments and where it writes by
default (batch/report/html.py writes the page)."""

from __future__ import annotations

import argparse
from pathlib import Path

from clarify.batch.report.html import write_report
from clarify.batch.run.rundir import RunDir


def default_out(run_dirs: list[Path]) -> Path:
    """RUN_DIR/report.html for one run; for several, report.html in the first run's parent directory."""
    if len(run_dirs) == 1:
        return RunDir(run_dirs[0]).report_file
    return Path(run_dirs[0]).parent / RunDir(run_dirs[0]).report_file.name


def _cmd_report(args: argparse.Namespace) -> int:
    run_dirs = [Path(d) for d in args.run_dirs]
    out = Path(args.out) if args.out else default_out(run_dirs)
    path = write_report(run_dirs, out, passages_per_node=args.passages, max_questions=args.max_questions,
                        common_questions=args.common_questions)
    print(path)
    return 0


def register(sub) -> None:
    """Add `clarify report RUN_DIR [RUN_DIR...] [--out FILE]` to the CLI subparsers."""
    p = sub.add_parser("report", help="write one self-contained HTML report for run directories",
                       epilog="examples:\n"
                              "  clarify report runs/demo                      writes runs/demo/report.html\n"
                              "  clarify report runs/a runs/b --out ab.html    one section per run + a comparison\n"
                              "  clarify report runs/big500 runs/small200 --common-questions\n"
                              "                                                paired on the 200 questions both answered\n\n"
                              "The file is self-contained (config, metrics, plots, a tree viewer per question):\n"
                              "open it in any browser, offline.")
    p.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories (several, over the same questions: one section each, a comparison with paired 95%% intervals and cost per run)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="HTML file to write (default: RUN_DIR/report.html, or report.html beside the runs); never a folder, "
             "nor a file inside a run directory other than its report.html",
    )
    p.add_argument(
        "--passages", type=int, default=5, help="retrieved passages shown per tree node (default 5)"
    )
    p.add_argument("--max-questions", type=int, default=None, help="show only the first N questions' trees")
    p.add_argument("--common-questions", action="store_true",
                   help="runs over different questions of one dataset: pair them on the questions every run "
                        "answered (said above the paired table); without it they are refused")
    p.set_defaults(func=_cmd_report)
