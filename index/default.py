"""The embedded default index: the shipped Wikipedia passages (data/wiki) built once into
$CLARIFY_HOME/index/wiki-default (docs/getting-started.md)."""

from __future__ import annotations

from pathlib import Path

from clarify.errors import InputError
from clarify.files import data_dir, home
from clarify.index.build import BuildOptions, build_index, current_corpus, differences
from clarify.index.corpus import DEFAULT_CORPUS_FILES
from clarify.index.manifest import read_manifest


def default_index_dir() -> Path:
    return home() / "index" / "wiki-default"


def default_corpus_files() -> list[Path]:
    """The shipped Wikipedia passages (data/wiki, ≈10k): core, DPR extra, DPR random distractors."""
    data = data_dir()
    files = [data / "wiki" / name for name in DEFAULT_CORPUS_FILES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise InputError(f"shipped corpus files are missing: {missing} (set CLARIFY_DATA to the data/ folder)")
    return files


def ensure_default_index() -> Path:
    """Build the embedded default index once into $CLARIFY_HOME/index/wiki-default (progress bars);
    a no-op when built and unchanged, rebuilt when the shipped corpus changed. Returns its path."""
    return build_index(default_corpus_files(), default_index_dir(), options=BuildOptions(), force=True)


def default_index_status() -> dict:
    """The embedded index without opening it (for `clarify doctor`): path, whether built, whether it
    matches the shipped corpus and settings (the differences a rebuild would fix), and its manifest."""
    path = default_index_dir()
    manifest = read_manifest(path) if path.is_dir() else None
    status = {"path": str(path), "built": manifest is not None, "manifest": manifest, "differences": []}
    if manifest is not None:
        status["differences"] = differences(manifest, current_corpus(default_corpus_files(), manifest),
                                             BuildOptions())
    return status
