"""Runs compared question by question (batch/report/comparison.py): the paired table, the cost table read
from what finalize really writes into summary.json, the report's forest plot and cost table, and runs
over different questions refused. The runs are real pipeline runs with a scripted model
(tests/fixtures_report.py `report_runs`); a test changes its own copies."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from clarify.batch.report import html as report
from clarify.batch.report.comparison import cost_row, fmt, paired_markdown, paired_notes, paired_table
from clarify.batch.run.rundir import Run
from clarify.errors import InputError
from clarify.eval.paired import MIN_N, holm, mde, paired_bootstrap
from tests.fixtures_report import copy_run
from tests.test_report import parse


def _on_devices(run_dir, device_count: int) -> None:
    """summary.json's engine facts as an engine on `device_count` CPU cores records them (a scripted model
    records none): what device-seconds are counted from."""
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    summary["engine"] = {"device": "cpu", "device_count": device_count}
    path.write_text(json.dumps(summary))


def _shift_scores(run_dir, metric: str, by: list[float]) -> None:
    path = run_dir / "scores.parquet"
    scores = pl.read_parquet(path)
    qids = scores["qid"].unique(maintain_order=True).to_list()
    shift = pl.DataFrame({"qid": qids, "metric": [metric] * len(qids), "shift": by})
    scores = (scores.join(shift, on=["qid", "metric"], how="left", maintain_order="left")
              .with_columns(value=pl.col("value") + pl.col("shift").fill_null(0.0)).drop("shift"))
    scores.write_parquet(path)


def _prepare(smol, gemma) -> list:
    # the two models write the same answers (their trees differ): equal STR-EM and length on every question
    for metric in ("str_em", "length"):
        a, b = (pl.read_parquet(d / "scores.parquet").filter(pl.col("metric") == metric) for d in (smol, gemma))
        assert a.equals(b), metric
    n = pl.read_parquet(gemma / "questions.parquet")["qid"].n_unique()
    _shift_scores(gemma, "str_em", [10.0 * (i + 1) for i in range(n)])  # gemma better on every question
    _shift_scores(gemma, "length", [[1.0, -1.0, 0.0][i % 3] for i in range(n)])  # wins, losses, ties
    _on_devices(smol, 2)
    _on_devices(gemma, 2)
    return [smol, gemma]


@pytest.fixture
def two_runs(report_runs, tmp_path):
    """Three questions: fewer than eval/paired.py MIN_N."""
    return _prepare(*(copy_run(d, tmp_path / d.name) for d in report_runs))


@pytest.fixture
def ten_runs(paired_runs, tmp_path):
    """Ten questions: the paired tests apply."""
    return _prepare(*(copy_run(d, tmp_path / d.name) for d in paired_runs))


def _per_question(runs: list[Run], metrics: list[str]) -> np.ndarray:
    """(questions, metrics) of b - a, in the questions table's order (the bootstrap's draw follows it)."""
    order = runs[0].questions.select("qid").unique(maintain_order=True)
    a, b = (order.join(r.scores.pivot(on="metric", index="qid", values="value"), on="qid", how="left",
                       maintain_order="left") for r in runs)
    return np.column_stack([(b[m] - a[m]).to_numpy() for m in metrics])


def test_paired_table_below_the_minimum_n_has_no_interval_and_no_star(two_runs):
    """Three questions, every one better: the difference and wins are shown, but no interval, p-value or
    star (one question used to give `+33.3 [+33.3, +33.3]*`)."""
    runs = [Run.open(d) for d in two_runs]
    table = paired_table(runs)
    em = table.filter(pl.col("metric") == "str_em").row(0, named=True)
    assert (em["a"], em["b"], em["questions"], em["diff"]) == ("smol", "gemma", 3, pytest.approx(20.0))
    assert (em["wins"], em["ties"], em["losses"]) == (3, 0, 0)
    assert table.select("ci_low", "ci_high", "excludes_zero", "p_perm", "p_holm", "significant", "mde").null_count().row(0) \
        == (table.height,) * 7
    text = paired_markdown(table)
    assert "| gemma − smol | str_em | 3 | " in text and "| +20.00 | — | — | — |" in text and " *" not in text
    assert f"rest on fewer than {MIN_N} questions" in text and "cannot be told from noise" not in text


def test_paired_table_of_ten_questions_tests_and_adjusts(ten_runs):
    runs = [Run.open(d) for d in ten_runs]
    table = paired_table(runs)
    metrics = table["metric"].to_list()
    diffs = _per_question(runs, metrics)
    em = table.filter(pl.col("metric") == "str_em").row(0, named=True)
    assert (em["questions"], em["diff"], em["wins"]) == (10, pytest.approx(55.0), 10)
    # the exact permutation test: every difference positive, 2 of the 2**10 sign assignments as extreme
    assert em["p_perm"] == pytest.approx(2 / 2**10) and em["excludes_zero"]
    # every column as scipy's permutation test and the bootstrap on the per-question differences
    from scipy import stats

    for k, row in enumerate(table.iter_rows(named=True)):
        want = stats.permutation_test((diffs[:, k],), np.mean, permutation_type="samples", n_resamples=10_000).pvalue
        assert row["p_perm"] == pytest.approx(want, abs=1e-12), row["metric"]
    got = paired_bootstrap(diffs)
    assert table["ci_low"].to_list() == pytest.approx(got.lo.tolist())
    # Holm over every tested row of the table; `significant` = survives at 5 %
    assert table["p_holm"].to_list() == pytest.approx(holm(table["p_perm"].to_numpy()).tolist())
    assert table["significant"].to_list() == [p < 0.05 for p in table["p_holm"].to_list()]
    assert em["significant"] and em["p_holm"] == pytest.approx(table.height * 2 / 2**10)
    words = table.filter(pl.col("metric") == "length").row(0, named=True)
    assert (words["wins"], words["ties"], words["losses"]) == (4, 3, 3) and not words["significant"]
    assert table["mde"].to_list() == pytest.approx(mde(diffs).tolist())
    text = paired_markdown(table)
    assert "| gemma − smol | str_em | 10 |" in text and "+55.00 *" in text
    assert f"with n = 10 a difference in str_em below {em['mde']:.2f} points cannot be told from noise" in text
    assert "over the " + str(table.height) + " tests shown" in text


def test_cost_reads_what_finalize_writes(two_runs):
    row = cost_row(Run.open(two_runs[0]))  # the model that prunes: re-expansions met its completion cache
    summary = json.loads((two_runs[0] / "summary.json").read_text())
    calls = pl.read_parquet(two_runs[0] / "llm_calls.parquet")
    computed = calls.filter(~pl.col("cached").fill_null(False))
    wall = summary["wall_s_total"]
    assert wall > 0 and row["wall_s"] == wall and row["wall_s_per_question"] == wall / 3
    assert row["device_s_per_question"] == wall * 2 / 3
    assert 0 < computed.height < calls.height  # some completions came from the cache
    assert row["engine_tokens_per_question"] == (computed["prompt_tokens"].sum() + computed["output_tokens"].sum()) / 3
    assert row["model_calls_per_question"] == computed.height / 3 and row["llm_calls_per_question"] == calls.height / 3
    assert row["tokens_per_s"] == summary["engine_tokens_per_s"] > 0
    assert row["peak_rss_gib"] == summary["peak_memory_last_session"]["rss_bytes"] / 2**30 > 0
    assert row["peak_gpu_gib"] is None  # no GPU


def _comparison(out) -> object:
    dom = parse(out.read_text())
    return next(n for n in dom.iter() if n.tag == "section" and n.attrs.get("id") == "comparison")


def test_report_shows_paired_table_forest_plot_and_cost(ten_runs, tmp_path):
    out = report.write_report(ten_runs, tmp_path / "cmp.html")
    section = _comparison(out)
    paired = next(t for t in section.iter() if t.tag == "table" and "paired" in t.classes)
    marked = [tr for tr in paired.iter() if tr.tag == "tr" and "significant" in tr.classes]
    table = paired_table([Run.open(d) for d in ten_runs])
    surviving = table.filter("significant")["metric"].to_list()
    assert [tr.attrs["data-metric"] for tr in marked] == surviving
    assert "str_em" in surviving and "length" not in surviving
    notes = [n.text() for n in section.iter() if n.tag == "p" and "paired-note" in n.classes]
    assert notes == paired_notes(table) and any(n.startswith("with n = 10 a difference in str_em") for n in notes)
    imgs = {n.attrs["alt"]: n.attrs["src"] for n in section.iter() if n.tag == "img"}
    forest = next(src for alt, src in imgs.items() if alt.startswith("forest plot"))
    assert forest.startswith("data:image/png;base64,")
    assert any("against device-seconds per question" in alt for alt in imgs)
    cost = next(t for t in section.iter() if t.tag == "table" and "cost" in t.classes)
    head = [th.text() for th in cost.iter() if th.tag == "th"]
    cells = [[td.text() for td in tr.iter() if td.tag == "td"] for tr in cost.iter() if tr.tag == "tr"][1:]
    walls = [json.loads((d / "summary.json").read_text())["wall_s_total"] / 10 for d in ten_runs]
    assert [c[head.index("wall_s_per_question")] for c in cells] == [fmt(w) for w in walls]


def test_report_of_three_questions_marks_nothing_and_says_why(two_runs, tmp_path):
    section = _comparison(report.write_report(two_runs, tmp_path / "cmp.html"))
    rows = [tr for tr in section.iter() if tr.tag == "tr" and tr.attrs.get("data-metric")]
    assert rows and all("untested" in tr.classes for tr in rows)
    assert not any(n.tag == "strong" and "sig" in n.classes for n in section.iter())
    notes = [n.text() for n in section.iter() if n.tag == "p" and "paired-note" in n.classes]
    assert any(f"fewer than {MIN_N} questions" in n for n in notes)
    assert not any(n.tag == "img" and n.attrs.get("alt", "").startswith("forest plot") for n in section.iter())


def test_runs_over_different_questions_are_refused_in_one_line(report_runs, tmp_path):
    copy_run(report_runs[0], tmp_path / "a")
    copy_run(report_runs[1], tmp_path / "b")
    questions = pl.read_parquet(tmp_path / "b" / "questions.parquet")
    questions.head(2).write_parquet(tmp_path / "b" / "questions.parquet")  # b answered only the first two
    with pytest.raises(InputError) as got:
        report.write_report([tmp_path / "a", tmp_path / "b"], tmp_path / "x.html")
    line = str(got.value)
    assert "\n" not in line and line.startswith(str(tmp_path / "b")) and "lacks 1 of" in line
    assert not (tmp_path / "x.html").exists()


def test_runs_in_folders_of_one_name_are_paired_as_two_runs(report_runs, tmp_path):
    """`clarify report cmpA/smollm2-135m-instruct cmpB/smollm2-135m-instruct`: the same folder name (and the
    same summary.json `name`) under two parents are two runs, each identified by its folder (Run.key) and
    labelled by the shortest end of its path that tells them apart (docs/running-toc.md#reading-the-report)."""
    folder = "smollm2-135m-instruct"
    a, b = (copy_run(report_runs[0], tmp_path / parent / folder) for parent in ("cmpA", "cmpB"))
    _shift_scores(b, "str_em", [10.0, 20.0, 30.0])  # b better on every question
    runs = [Run.open(a), Run.open(b)]
    assert runs[0].name == runs[1].name  # the summary's name cannot tell them apart
    labels = [f"cmpA/{folder}", f"cmpB/{folder}"]
    table = paired_table(runs)
    em = table.filter(pl.col("metric") == "str_em").row(0, named=True)
    assert [em["a"], em["b"]] == labels
    assert em["b_mean"] == pytest.approx(em["a_mean"] + 20.0) and em["diff"] == pytest.approx(20.0)
    assert (em["wins"], em["ties"], em["losses"]) == (3, 0, 0)
    dom = parse(report.write_report([a, b], tmp_path / "cmp.html").read_text())
    section = next(n for n in dom.iter() if n.tag == "section" and n.attrs.get("id") == "comparison")

    def rows(cls: str) -> list[list[str]]:
        grid = next(t for t in section.iter() if t.tag == "table" and cls in t.classes)
        return [[td.text() for td in tr.iter() if td.tag == "td"] for tr in grid.iter() if tr.tag == "tr"][1:]

    paired_em = next(r for r in rows("paired") if r[1] == "str_em")
    assert paired_em[0] == f"{labels[1]} − {labels[0]}" and paired_em[3] != paired_em[4]
    assert [r[0] for r in rows("cost")] == labels and [r[0] for r in rows("compare")] == labels
    heads = [n.text() for n in dom.iter() if n.tag == "h2" and n.text().startswith("Run ")]
    assert heads == [f"Run {label}" for label in labels]
    # folders of different names keep their names
    c = copy_run(report_runs[1], tmp_path / "other" / "gemma")
    assert paired_table([runs[0], Run.open(c)])["a"].unique().to_list() == [folder]


def test_one_run_directory_named_twice_is_refused_in_one_line(report_runs, tmp_path):
    run = copy_run(report_runs[0], tmp_path / "r")
    (tmp_path / "link").symlink_to(run, target_is_directory=True)
    for twice in ([run, run], [run, tmp_path / "link"], [run, tmp_path / "x" / ".." / "r"]):
        with pytest.raises(InputError) as got:
            report.write_report(twice, tmp_path / "x.html")
        line = str(got.value)
        assert "\n" not in line and line.startswith(f"{twice[0]} and {twice[1]} are the same run directory")
        assert not (tmp_path / "x.html").exists()
    with pytest.raises(InputError, match="are the same run directory"):  # the comparison of `clarify compare` too
        paired_table([Run.open(run), Run.open(tmp_path / "link")])


def _keep_questions(run_dir, n: int) -> list[str]:
    """The run as if it had answered only its first `n` questions: every table with a qid column cut to them."""
    qids = pl.read_parquet(run_dir / "questions.parquet")["qid"].unique(maintain_order=True).to_list()[:n]
    for path in run_dir.glob("*.parquet"):
        df = pl.read_parquet(path)
        if "qid" in df.columns:
            df.filter(pl.col("qid").is_in(qids)).write_parquet(path)
    return qids


def test_common_questions_pairs_a_subset_run_on_the_overlap_as_if_both_were_cut_to_it(ten_runs, tmp_path):
    """A large model run on 6 questions against a small one run on all 10: refused as before without the
    option; with it, the paired table is exactly that of both runs cut to the 6, and the page says so."""
    full, part = ten_runs
    qids = _keep_questions(part, 6)
    with pytest.raises(InputError, match="--common-questions"):
        report.write_report([full, part], tmp_path / "x.html")
    out = report.write_report([full, part], tmp_path / "cmp.html", common_questions=True)
    got = paired_table([Run.open(full), Run.open(part)], qids=qids)
    cut = copy_run(full, tmp_path / "cut" / full.name)
    _keep_questions(cut, 6)
    assert got["questions"].unique().to_list() == [6]
    assert got.drop("a", "b").equals(paired_table([Run.open(cut), Run.open(part)]).drop("a", "b"))
    notes = [n.text() for n in _comparison(out).iter() if n.tag == "p" and "paired-note" in n.classes]
    assert notes[0].startswith("Paired on the 6 questions every run answered") and ": 10" in notes[0]
    # each run's own section still shows every question it answered
    page = out.read_text()
    assert all(q in page for q in Run.open(full).questions["qid"].to_list())


def test_common_questions_with_nothing_in_common_is_refused_in_one_line(ten_runs, tmp_path):
    full, part = ten_runs
    questions = pl.read_parquet(part / "questions.parquet")
    questions.with_columns(qid=pl.lit("other-") + pl.col("qid")).write_parquet(part / "questions.parquet")
    with pytest.raises(InputError) as got:
        report.write_report([full, part], tmp_path / "x.html", common_questions=True)
    assert "no question in common" in str(got.value) and "\n" not in str(got.value)
