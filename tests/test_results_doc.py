"""docs/results.md is generated from bench/results/*.json by bench/results_doc.py: a number on the page cannot
drift from its file. Fast: reads JSON only."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("results_doc", ROOT / "bench" / "results_doc.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_results_page_is_regenerated_identically():
    assert (ROOT / "docs" / "results.md").read_text(encoding="utf-8") == _script().render(), (
        "docs/results.md differs from bench/results/*.json: run `python bench/results_doc.py --write`")


def test_every_results_file_states_where_it_came_from():
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        prov = json.loads(path.read_text(encoding="utf-8")).get("provenance") or {}
        assert all(prov.get(k) for k in ("date", "cpu", "command", "commit")), path.name


def test_a_changed_number_changes_the_page(tmp_path, monkeypatch):
    mod = _script()
    for p in (ROOT / "bench" / "results").glob("*.json"):
        (tmp_path / p.name).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    doc = json.loads((tmp_path / "sched48.json").read_text(encoding="utf-8"))
    doc["capacity"] = 12345
    (tmp_path / "sched48.json").write_text(json.dumps(doc), encoding="utf-8")
    monkeypatch.setattr(mod, "RESULTS", tmp_path)
    assert "| capacity | 12345 |" in mod.render()
