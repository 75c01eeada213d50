"""Encoding that resumes and shards (index/encode.py): a build killed with SIGKILL mid-encoding
resumes to the same vectors and FAISS index as an uninterrupted build; two shards merged equal one build.

Every build runs as `clarify index build` in a child process with the same environment (the same torch
threads), small checkpoint chunks ($CLARIFY_ENCODE_CHUNK) and no BM25 part."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .fixtures_index import REPO, write_small_corpus

pytestmark = pytest.mark.integration

CHUNK = 16


def _env(tmp: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "CLARIFY_HOME": str(tmp / "home"),
            "CLARIFY_ENCODE_CHUNK": str(CHUNK), "OMP_WAIT_POLICY": "PASSIVE"}


def _build(tmp: Path, corpus: Path, out: Path, *extra: str, env: dict | None = None, code: int = 0):
    cmd = [sys.executable, "-m", "clarify.batch.cli", "index", "build", "--corpus", str(corpus), "--out", str(out),
           "--no-bm25", *extra]
    proc = subprocess.run(cmd, env={**_env(tmp), **(env or {})}, cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == code, proc.stderr[-3000:]
    return proc


def _same_index(a: Path, b: Path) -> None:
    assert np.array_equal(np.load(a / "dense" / "embeddings.npy"), np.load(b / "dense" / "embeddings.npy"))
    for name in ("index", "docid"):
        assert (a / "dense" / name).read_bytes() == (b / "dense" / name).read_bytes(), name


@pytest.fixture(scope="module")
def corpus_and_reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("encode")
    corpus = write_small_corpus(tmp / "c.jsonl", n_core=120, n_random=40)  # 160 passages: 10 chunks
    ref = tmp / "reference"
    _build(tmp, corpus, ref)
    return tmp, corpus, ref


def test_a_build_killed_mid_encoding_resumes_to_the_same_index(corpus_and_reference):
    """SIGKILL after the 4th chunk (faults.py point `encoded-chunk:4`), again after 3 more chunks of the
    resumed build, then a build to the end: the same embeddings, FAISS index and docid as one build."""
    tmp, corpus, ref = corpus_and_reference
    first, second = 4, 3
    out, ckpt = tmp / "killed", tmp / ".killed.encoding"
    _build(tmp, corpus, out, env={"CLARIFY_KILL_AT": f"encoded-chunk:{first}"}, code=-signal.SIGKILL)
    assert len(list(ckpt.glob("chunk-*.npy"))) == first and not out.exists()  # checkpoints kept, no index
    proc = _build(tmp, corpus, out, env={"CLARIFY_KILL_AT": f"encoded-chunk:{second}"}, code=-signal.SIGKILL)
    assert f"resuming the encoding: {first} of 10 chunks" in proc.stderr
    assert len(list(ckpt.glob("chunk-*.npy"))) == first + second and not list(ckpt.glob("*.tmp"))
    resumed = _build(tmp, corpus, out)
    assert f"resuming the encoding: {first + second} of 10 chunks" in resumed.stderr
    _same_index(out, ref)
    facts = json.loads((out / "manifest.json").read_text())["dense"]["embeddings"]
    assert facts["chunks"] == 10 and facts["chunks_resumed"] == first + second
    assert facts["chunks_encoded"] == 10 - first - second
    assert not ckpt.exists()  # removed once the index is in place


def test_two_shards_merged_build_the_same_index_as_one_build(corpus_and_reference):
    tmp, corpus, ref = corpus_and_reference
    for i in (0, 1):
        proc = _build(tmp, corpus, tmp / f"node{i}", "--shard", f"{i}/2")
        assert f"shard {i}/2: encoded chunks in" in proc.stdout
        assert len(list((tmp / f".node{i}.encoding").glob("chunk-*.npy"))) == 5 and not (tmp / f"node{i}").exists()
    merge = subprocess.run([sys.executable, "-m", "clarify.batch.cli", "index", "merge-shards", "--out",
                            str(tmp / "merged"), str(tmp / ".node0.encoding"), str(tmp / ".node1.encoding")],
                           env=_env(tmp), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert merge.returncode == 0 and "10 encoded chunks" in merge.stdout, merge.stderr[-2000:]
    _build(tmp, corpus, tmp / "merged")
    facts = json.loads((tmp / "merged" / "manifest.json").read_text())["dense"]["embeddings"]
    assert facts["chunks_encoded"] == 0 and facts["chunks_resumed"] == 10  # the merge step only assembled
    _same_index(tmp / "merged", ref)


def test_shards_of_another_corpus_are_not_merged(corpus_and_reference, tmp_path):
    from clarify.errors import InputError
    from clarify.index.encode import merge_shards

    for name, job in (("a", {"corpus": [["c.jsonl", "1"]]}), ("b", {"corpus": [["c.jsonl", "2"]]})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "job.json").write_text(json.dumps(job))
    with pytest.raises(InputError, match="different corpora"):
        merge_shards(tmp_path / "target", [tmp_path / "a", tmp_path / "b"])
    from clarify.index import build_index
    from clarify.index.encode import parse_shard

    with pytest.raises(InputError, match="needs the dense part"):
        build_index([corpus_and_reference[1]], tmp_path / "idx", dense=False, shard=(0, 2))
    assert parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "x", "1/0"):
        with pytest.raises(InputError, match="--shard"):
            parse_shard(bad)


def test_worker_processes_encode_the_same_passages(corpus_and_reference):
    """--processes 2: two worker processes split the chunks; the vectors agree with one process's to float
    rounding (a worker has 1 thread instead of 2) and the index holds every passage in corpus order."""
    tmp, corpus, ref = corpus_and_reference
    _build(tmp, corpus, tmp / "two", "--processes", "2")
    a, b = np.load(tmp / "two" / "dense" / "embeddings.npy"), np.load(ref / "dense" / "embeddings.npy")
    assert a.shape == b.shape and np.abs(a - b).max() < 1e-5
    assert (tmp / "two" / "dense" / "docid").read_text() == (ref / "dense" / "docid").read_text()
    facts = json.loads((tmp / "two" / "manifest.json").read_text())["dense"]["embeddings"]
    assert facts["workers"] == 2 and facts["chunks_encoded"] == 10
