"""Fixtures for index tests (and for anyone who needs the embedded default index).

default_index        Path of the embedded default index, built once per machine into $CLARIFY_HOME
                     (≈10k shipped Wikipedia passages; first build: seconds, from the shipped vectors).
default_local_index  that index opened once per session (LocalIndex; JVM and encoder shared).
small_corpus         a 300-passage JSONL slice of the shipped corpus (200 core + 100 DPR distractors).
small_index          that slice built (BM25 + flat FAISS) into a session tmp dir.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WIKI = REPO / "data" / "wiki"


@pytest.fixture(scope="session")
def default_index() -> Path:
    from clarify.index import ensure_default_index

    return ensure_default_index()


@pytest.fixture(scope="session")
def default_local_index(default_index):
    from clarify.index import open_index

    return open_index(default_index)


def write_small_corpus(path: Path, n_core: int = 200, n_random: int = 100) -> Path:
    lines = (WIKI / "passages.jsonl").read_text(encoding="utf-8").splitlines()[:n_core]
    lines += (WIKI / "passages_dpr_random1000.jsonl").read_text(encoding="utf-8").splitlines()[:n_random]
    with open(path, "w", encoding="utf-8") as fh:
        for line in lines:
            obj = json.loads(line)
            fh.write(json.dumps({"id": obj["id"], "title": obj["title"], "text": obj["text"]}) + "\n")
    return path


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    return write_small_corpus(tmp_path_factory.mktemp("corpus") / "small.jsonl")


@pytest.fixture(scope="session")
def small_index(tmp_path_factory, small_corpus) -> Path:
    from clarify.index import build_index

    return build_index([small_corpus], tmp_path_factory.mktemp("idx") / "small")
