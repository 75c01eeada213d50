"""A real `clarify compare --models models.toml` of the two embedded models on CPU (tiny: 2 questions, short
outputs), one with its own non-default [model] settings: each run freezes its own settings, the paired
table and the cost come out of the real runs, and their report shows the paired and cost tables in
headless chromium (the forest plot, which needs more questions, from the scripted ten-question runs) (tests/cdp.py's Browser).

The second model is Gemma 3 270M where `make gemma` installed it; elsewhere (CI's `make test` does not)
it is SmolLM2 again under another name with the same non-default settings, so the per-model settings are
checked on every machine."""

from __future__ import annotations

import json
import subprocess
import sys

import polars as pl
import pytest

from clarify.batch.report import html as report
from tests.cdp import CHROMIUM, Browser

pytestmark = pytest.mark.integration

TOML = """\
[[model]]
model = "smollm2-135m-instruct"

[[model]]
name = "{name}"
model = "{model}"
dtype = "float32"
max_model_len = 4096
"""
SECOND = "second-4k-fp32"


@pytest.fixture(scope="module")
def second_model():
    """gemma3-270m when installed (make gemma), else smollm2-135m-instruct."""
    from clarify.errors import InputError
    from clarify.local_llm.models import prepare_model

    try:
        prepare_model("gemma3-270m")
        return "gemma3-270m"
    except InputError:  # its packages are optional (make gemma)
        return "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def real_compare(tmp_path_factory, llm_model_dir, second_model, default_index):
    tmp = tmp_path_factory.mktemp("cmp")
    (tmp / "models.toml").write_text(TOML.format(name=SECOND, model=second_model))
    (tmp / "small.toml").write_text("[toc]\nmax_expansions = 1\nclarify_max_tokens = 48\nanswer_max_tokens = 48\n"
                                    "n_demos = 2\n")
    out = tmp / "cmp"
    done = subprocess.run([sys.executable, "-m", "clarify.batch.cli", "compare", "--models", str(tmp / "models.toml"),
                           "--config", str(tmp / "small.toml"), "--dataset", "asqa", "--limit", "2",
                           "--index", str(default_index), "--out", str(out)],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stdout


def test_each_run_freezes_its_own_model_settings(real_compare, second_model):
    out, stdout = real_compare
    assert stdout.startswith(f"plan: no GPU; 2 models one after another: smollm2-135m-instruct, {SECOND}")
    smol, second = (json.loads((out / name / "config.json").read_text())["model"]
                    for name in ("smollm2-135m-instruct", SECOND))
    assert (smol["model"], smol["dtype"], smol["max_model_len"]) == ("smollm2-135m-instruct", "auto", 6144)
    assert (second["model"], second["dtype"], second["max_model_len"]) == (second_model, "float32", 4096)
    summary = json.loads((out / SECOND / "summary.json").read_text())
    assert summary["engine"]["dtype"] == "float32" and summary["engine"]["device_count"] >= 1
    assert summary["peak_memory_last_session"]["rss_bytes"] > 0
    table = pl.read_parquet(out / "comparison.parquet")
    assert table["model"].to_list() == ["smollm2-135m-instruct", SECOND]
    assert table["max_model_len"].to_list() == [6144, 4096] and (table["wall_s_per_question"] > 0).all()
    assert (table["engine_tokens_per_question"] > 0).all() and (table["device_s_per_question"] > 0).all()
    paired = pl.read_parquet(out / "paired.parquet")
    assert set(paired["metric"]) >= {"str_em", "rouge_l"} and "n_gold" not in set(paired["metric"])
    assert (paired["questions"] == 2).all()
    # 2 questions are fewer than eval/paired.py MIN_N: differences without an interval, test or star
    assert paired.select("ci_low", "ci_high", "p_perm", "p_holm", "significant").null_count().row(0) == (paired.height,) * 5
    assert (paired["wins"] + paired["ties"] + paired["losses"] == 2).all()
    assert "rest on fewer than 6 questions" in stdout and "| — | — | — |" in stdout
    print(stdout[stdout.index("paired differences"):])  # the paired table as the terminal shows it


@pytest.mark.skipif(CHROMIUM is None, reason="Debian package 'chromium' is not installed (make browser)")
def test_report_of_a_real_compare_shows_forest_plot_and_cost_table(real_compare, paired_runs, tmp_path):
    out, _ = real_compare
    page = report.write_report([out / "smollm2-135m-instruct", out / SECOND], tmp_path / "report.html")
    # the forest plot needs intervals: the real compare's 2 questions have none (eval/paired.py MIN_N), the
    # scripted pair of runs over 10 questions (tests/fixtures_report.py) has them
    ten = report.write_report(paired_runs, tmp_path / "ten.html")
    b = Browser(tmp_path / "profile")
    try:
        b.open_page(ten.resolve().as_uri())
        forest = b.js("(() => { const i = [...document.images].find(i => i.alt.startsWith('forest plot'));"
                      " return i && [i.complete, i.naturalWidth, i.naturalHeight]; })()")
        assert forest[0] and forest[1] > 300 and forest[2] > 100
        b.open_page(page.resolve().as_uri())
        assert b.js("[...document.images].some(i => i.alt.startsWith('forest plot'))") is False
        notes = b.js("[...document.querySelectorAll('p.paired-note')].map(p => p.textContent)")
        assert any("fewer than 6 questions" in n for n in notes)
        assert b.js("document.querySelector('table.paired').checkVisibility()") is True
        metrics = b.js("[...document.querySelectorAll('table.paired tbody tr')].map(r => r.dataset.metric)")
        assert "str_em" in metrics and len(metrics) == len(pl.read_parquet(out / "paired.parquet"))
        head = b.js("[...document.querySelectorAll('table.cost th')].map(t => t.textContent)")
        rows = b.js("[...document.querySelectorAll('table.cost tbody tr')].map(r => [...r.cells].map(c => c.textContent))")
        assert [r[head.index("run")] for r in rows] == ["smollm2-135m-instruct", SECOND]
        assert all(float(r[head.index("device_s_per_question")]) > 0 for r in rows)
        assert b.js("document.querySelector('table.cost').checkVisibility()") is True
        b.screenshot(tmp_path / "compare.png")
        assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"
    finally:
        b.close()
