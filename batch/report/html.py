"""`clarify report`: one self-contained HTML file for one or more run directories
(docs/architecture.md#reports-and-comparisons).

The file needs no network: CSS and JS are inline, plots are PNGs embedded as base64 `data:` URIs.
Per run it shows the frozen config, the summary metrics, plots (`batch/report/plots.py`), an index of the
questions, and a tree viewer per question: the ambiguous question, its tree of disambiguations
(root / valid / pruned / duplicate / pending, colour + text label, collapsible `<details>`), each
node's retrieved passages, and the final answer as the model wrote it with each quoted `[k span]`
linked to the span's offsets highlighted inside source passage k. Spans that are not verbatim are
marked. Several runs over the same questions get one section each plus a comparison table
(`batch/report/comparison.py`: paired-bootstrap intervals, cost per run, and a metric-vs-size plot when
parameter counts are known); runs over different questions are refused, unless `common_questions` pairs
them on the questions every run answered (said above the paired table).

The HTML comes from Jinja2 templates in `batch/report/templates/` (`report.html.j2`, its macros in
`macros.html.j2`; `report.css` and `report.js` are inlined). The environment autoescapes: every value
from a run file is HTML-escaped, since model output is untrusted; the only markup built here is the
passage highlighting (`_highlight`, which escapes every text segment).

Runs are read by the one run reader (`batch/run/rundir.py` Run.open: config.json, summary.json and every
table, checked against its schema in `schemas.py`; a table not written yet is shown empty and named).
Every marker of answer_raw (the model's text) is shown with its check, placed by its span's
marker_start/marker_end (`quotes.check_answers`); spans' `field` ("text" | "title") says which
passage field start/end index; start/end of -1 or null = not anchored.
"""
from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

from clarify.batch.report import plots
from clarify.batch.report.comparison import compare_stats, comparison_table, paired_questions, plotted_metrics
from clarify.batch.report.render import data_uri, environment
from clarify.batch.report.shape import run_section
from clarify.batch.run.rundir import Run, RunDir, check_distinct, enclosing_run, run_labels
from clarify.errors import InputError
from clarify.files import write_text


def render_report(runs: list[Run], *, passages_per_node: int = 5, max_questions: int | None = None,
                  common_questions: bool = False) -> str:
    """The whole HTML document for loaded runs (see the module docstring)."""
    comparison = None
    if len(runs) > 1:
        qids = paired_questions(runs, common=common_questions)  # refused first, before anything is drawn
        table = comparison_table(runs)
        metric_cols = plotted_metrics(runs, table)
        plot = None
        if table["params"].drop_nulls().len() >= 2 and metric_cols:
            plot = data_uri(plots.compare_png(table, metric_cols))
        stats = compare_stats(runs, table, metric_cols, qids)
        stats.update(forest=data_uri(stats["forest"]), quality_cost=data_uri(stats["quality_cost"]))
        comparison = {"columns": table.columns, "rows": list(table.iter_rows()), "plot": plot, **stats}
    return environment().get_template("report.html.j2").render(
        written=_dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        runs=[run_section(run, ri, label, passages_per_node, max_questions)
              for ri, (run, label) in enumerate(zip(runs, run_labels([r.path for r in runs])))],
        comparison=comparison,
    )


def write_report(
    run_dirs: list[Path], out: Path, *, passages_per_node: int = 5, max_questions: int | None = None,
    common_questions: bool = False,
) -> Path:
    """Write one self-contained HTML report for `run_dirs` to `out` (atomically) and return `out`. The same
    folder named twice, and an `out` that is a folder or a run's own file (`check_out`), are refused first."""
    if not run_dirs:
        raise InputError("no run directory given", field="run_dirs")
    check_distinct(run_dirs)  # one run twice would be compared with itself
    check_out(out)
    runs = [Run.open(d) for d in run_dirs]
    doc = render_report(runs, passages_per_node=passages_per_node, max_questions=max_questions,
                        common_questions=common_questions)
    return write_text(doc, out)


def check_out(out: Path) -> None:
    """InputError, in one line naming --out, when `out` is a folder, or a file inside a run directory
    (rundir.enclosing_run: config.json, summary.json, a table, a part, a log, ...) other than its report.html
    (`RunDir.report_file`, where `clarify report RUN` writes by default): the report is written by renaming
    onto that path (files.write_text), so it would replace the run's file and Run.open would then refuse the
    run as damaged (docs/running-toc.md#reading-the-report)."""
    if Path(out).is_dir():
        raise InputError("is a folder; give the HTML file to write (e.g. report.html in it)", path=str(out),
                         field="--out")
    run = enclosing_run(out)
    if run is not None and Path(os.path.realpath(out)) != RunDir(run).report_file:
        raise InputError(f"is inside the run directory {run}, and would replace one of its files; write the report "
                         f"to {RunDir(run).report_file} or outside the run", path=str(out), field="--out")
