"""docs/reproduce.md and README.md's measured blocks are generated from bench/results/*.json by
bench/reproduce_doc.py: a figure a user compares with cannot drift from the file that measured it. Fast: reads
JSON only."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(results: Path | None = None):
    spec = importlib.util.spec_from_file_location("reproduce_doc", ROOT / "bench" / "reproduce_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if results is not None:
        mod.RESULTS = results
    return mod


def test_the_page_and_the_readme_blocks_are_regenerated_identically():
    mod = _script()
    assert (ROOT / "docs" / "reproduce.md").read_text(encoding="utf-8") == mod.page(), (
        "docs/reproduce.md differs from bench/results/*.json: run `python bench/reproduce_doc.py --write`")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert mod.readme(text) == text, "README.md's generated blocks differ: run `python bench/reproduce_doc.py --write`"


def test_every_score_on_the_page_is_a_measured_one():
    """Each row of the expected-score tables is an arm of bench/results/constrained.json, to two decimals."""
    arms = json.loads((ROOT / "bench" / "results" / "constrained.json").read_text(encoding="utf-8"))["arms"]
    page = (ROOT / "docs" / "reproduce.md").read_text(encoding="utf-8")
    for a in arms:
        row = next(line for line in page.splitlines()
                   if line.startswith(f"| {a['model']} | {a['setting']} | {a['questions']} |"))
        assert f"{a['metrics']['rouge_l']:.2f}" in row and f"{a['engine_tokens_per_s']:.0f}" in row
        # the command that produced the row is on the page
        flags = {"off": "", "format": " --constrain-format", "format+quotes": " --constrain-format --constrain-quotes"}
        assert (f"--dataset {a['dataset']} --limit {a['questions']} --answer-style quoted --model {a['model']}"
                f"{flags[a['setting']]} --out") in page
    assert "not yet measured" in page and "bench/gpu_check.py" in page


def test_the_readme_demo_transcript_is_the_recorded_run():
    demo = json.loads((ROOT / "bench" / "results" / "demo.json").read_text(encoding="utf-8"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split(_script().DEMO_START, 1)[1].split(_script().DEMO_END, 1)[0]
    shown = [line for line in block.split("```")[1].splitlines() if line and line not in ("  ...", "...")]
    assert shown and all(line in demo["stdout"] for line in shown)
    assert demo["provenance"]["commit"] in block and demo["provenance"]["date"] in block


def test_a_changed_number_changes_the_page_and_the_readme(tmp_path):
    for p in (ROOT / "bench" / "results").glob("*.json"):
        (tmp_path / p.name).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    doc = json.loads((tmp_path / "constrained.json").read_text(encoding="utf-8"))
    doc["arms"][0]["metrics"]["rouge_l"] = 98.7654
    (tmp_path / "constrained.json").write_text(json.dumps(doc), encoding="utf-8")
    sched = json.loads((tmp_path / "sched48.json").read_text(encoding="utf-8"))
    sched["runs"]["48"]["ratios"]["continuous_over_ceiling_tokens_per_s"] = 3.21
    (tmp_path / "sched48.json").write_text(json.dumps(sched), encoding="utf-8")
    mod = _script(tmp_path)
    assert "98.77" in mod.page()
    assert re.search(r"ToC at 3\.21×", mod.readme((ROOT / "README.md").read_text(encoding="utf-8")))
