"""The index manifest as a declared record (index/manifest.py): its one reader checks every field, an index
whose manifest was written before `schema_version` still opens (and says so), and its identity — what a
run pins of the index — is the one the old dict gave."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import polars as pl
import pytest

from clarify import console
from clarify.batch.run.resources import index_identity
from clarify.errors import InputError
from clarify.files import sha256
from clarify.index.local import open_index
from clarify.index.manifest import SCHEMA, IndexManifest
from clarify.index.textstore import write_store

PASSAGES = pl.DataFrame({"passage_id": ["p1", "p2"], "title": ["Tea", "Rye"], "text": ["green tea", "rye bread"]})


def _old_index(folder: Path) -> tuple[Path, dict]:
    """A passages-only index whose manifest has the keys, in the order, that clarify's build wrote before
    the record (index/build.py `_build_into`: format, version, created, corpus, passages, build, bm25, dense,
    timings, path_built; no schema_version)."""
    folder.mkdir()
    store = write_store(PASSAGES, folder)
    manifest = {
        "format": "clarify-index", "version": 1, "created": "2026-12-07T03:19:34+0000",
        "corpus": [{"path": "/data/c.jsonl", "name": "c.jsonl", "bytes": 120, "mtime_ns": 1796613406001881130,
                    "sha256": "d2" * 32}],
        "passages": {"count": 2, **store, "sha256": sha256(folder / store["file"]), "skipped": {}},
        "build": {"layout": 2, "bm25": False, "dense": False, "encoder": "default", "faiss": "flat", "nlist": None,
                  "nprobe": None, "hnsw_m": 32, "skip_bad": False},
        "bm25": None, "dense": None, "timings": {"read_s": 0.01}, "path_built": str(folder),
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return folder, manifest


def test_an_index_of_the_old_layout_opens_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(console, "_notes", {})
    path, old = _old_index(tmp_path / "idx")
    idx = open_index(path)
    assert idx.manifest.schema_version == 1 and idx.manifest.passages.count == 2
    assert idx.passage_lookup(["p2"])["text"].to_list() == ["rye bread"] and idx.verify() == []
    (note,) = console.notes()
    assert str(path / "manifest.json") in note and "older clarify" in note
    # a run pins the index by the same fingerprint as before the record: resuming it is not refused
    before = json.dumps({k: old[k] for k in ("corpus", "build", "passages")}, sort_keys=True, default=str)
    assert index_identity(idx)["fingerprint"] == hashlib.sha256(before.encode()).hexdigest()


def test_the_current_layout_reads_back_as_written(tmp_path, monkeypatch):
    monkeypatch.setattr(console, "_notes", {})
    path, old = _old_index(tmp_path / "idx")
    m = IndexManifest.read(path / "manifest.json")
    m2 = IndexManifest(m.corpus, m.passages, m.build, m.bm25, m.dense, m.timings, m.created, m.path_built)
    m2.write(path / "manifest.json")
    written = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    assert written == {**old, "schema_version": SCHEMA}  # the old keys, unchanged, plus the version
    console._notes.clear()
    assert IndexManifest.read(path / "manifest.json") == m2 and console.notes() == []  # no old-layout note


@pytest.mark.parametrize(("change", "field", "says"), [
    (lambda m: m.pop("corpus"), "corpus", "'corpus' is missing"),
    (lambda m: m["passages"].pop("count"), "passages.count", "'passages.count' is missing"),
    (lambda m: m["passages"].update(count="2"), "passages.count", "'passages.count' is a JSON str ('2'), not an integer"),
    (lambda m: m.update(timings=[1.0]), "timings", "'timings' is a JSON list, not an object"),
    (lambda m: m.update(bm25={"dir": "lucene"}), "bm25.documents", "'bm25.documents' is missing"),
    (lambda m: m["corpus"][0].update(sha256=None), "corpus.0.sha256", "'corpus.0.sha256' is missing"),
    (lambda m: m.update(dense={"dir": "dense", "encoder": "default", "dim": True, "faiss": "flat", "vectors": 2}),
     "dense.dim", "'dense.dim' is a JSON bool (True), not an integer"),
    (lambda m: m.update(schema_version=SCHEMA + 1), "schema_version", "written by a newer clarify"),
])
def test_a_broken_current_manifest_is_one_line_naming_the_field(tmp_path, change, field, says):
    path, old = _old_index(tmp_path / "idx")
    manifest = {**old, "schema_version": SCHEMA}
    change(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(InputError) as err:
        open_index(path)
    assert str(err.value).startswith(f"{path / 'manifest.json'} (field '{field}'): ") and says in str(err.value)


def test_the_old_layout_accepts_what_older_builds_left_out(tmp_path, monkeypatch):
    """Layout 1 is read as the old reader read it: a part or fact an older build did not write is absent,
    not an error (here no timings, no passages count); a mistyped one is still refused."""
    monkeypatch.setattr(console, "_notes", {})
    path, old = _old_index(tmp_path / "idx")
    del old["timings"], old["passages"]["count"]
    (path / "manifest.json").write_text(json.dumps(old), encoding="utf-8")
    idx = open_index(path)
    assert idx.manifest.timings == {} and idx.manifest.passages.count is None
    (path / "manifest.json").write_text(json.dumps({**old, "bm25": ["lucene"]}), encoding="utf-8")
    with pytest.raises(InputError, match=r"\(field 'bm25'\): broken index manifest: 'bm25' is a JSON list"):
        open_index(path)
