"""Embeddings shipped beside a corpus (index/shipped.py): the embedded corpus' vectors in
data/wiki are what this machine's encoder computes, and a build takes shipped vectors only when they
are exactly for its corpus and reproduce here."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from clarify.files import sha256 as sha256_file
from clarify.index import build_index, open_index, shipped
from clarify.index.corpus import DEFAULT_CORPUS_FILES, LAYOUT, corpus_entries, load_corpus
from clarify.index.dense import Encoder, passage_texts

from .fixtures_index import WIKI, write_small_corpus

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def encoder():
    return Encoder("default", batch_size=16)


def test_shipped_vectors_match_the_corpus_and_this_machines_encoder(encoder):
    """The sidecar pins the shipped corpus files (sha256, order) and the .npy; a sample of rows spread
    over the corpus, re-encoded here, agrees within the tolerance (a rebuild differs only in float
    rounding from CPU to CPU; another model or another order differs at 1e-1)."""
    files = [WIKI / name for name in DEFAULT_CORPUS_FILES]
    passages = load_corpus(files).passages
    vectors, why = shipped.find(corpus_entries(files), encoder, LAYOUT, passages.height)
    assert vectors is not None, why
    npy, meta = shipped.paths(WIKI, encoder.name)
    side = json.loads(meta.read_text())
    assert side["sha256"] == sha256_file(npy) and vectors.shape == (passages.height, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    rows = np.unique(np.r_[shipped.sample_rows(passages.height, 128), np.arange(0, passages.height, 997)])
    assert shipped.check_sample(vectors, passage_texts(passages), encoder, rows) <= shipped.TOLERANCE
    # a row of another passage is far away: the check can fail
    assert np.abs(np.asarray(vectors[1]) - np.asarray(vectors[2])).max() > 100 * shipped.TOLERANCE


def test_the_embedded_corpus_builds_from_the_shipped_vectors(tmp_path):
    """What `make setup` does on a fresh machine (ensure_default_index): no corpus encoding, the
    shipped vectors in the index, the manifest saying so."""
    out = build_index([WIKI / name for name in DEFAULT_CORPUS_FILES], tmp_path / "wiki", bm25=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dense"]["embeddings"]["source"] == "shipped", manifest["dense"]["embeddings"]
    assert manifest["timings"]["encode_s"] < 60  # a sample of 64 passages, not 10,116 (~3-4 min on 2 cores)
    npy, _ = shipped.paths(WIKI, manifest["dense"]["encoder_name"])
    assert sha256_file(out / "dense" / "embeddings.npy") == sha256_file(npy)


def test_build_uses_shipped_vectors_only_when_they_fit(tmp_path, encoder):
    """A small corpus with its own shipped vectors: used (same index as encoding, no encode); a changed
    corpus, a damaged .npy or vectors of another model: encoded instead, and the manifest says why."""
    (tmp_path / "c").mkdir()
    corpus = write_small_corpus(tmp_path / "c" / "small.jsonl", n_core=40, n_random=20)
    encoded = build_index([corpus], tmp_path / "encoded", bm25=False)
    meta = shipped.write([corpus])
    npy, _ = shipped.paths(corpus.parent, encoder.name)
    used = build_index([corpus], tmp_path / "used", bm25=False)
    man = json.loads((used / "manifest.json").read_text())["dense"]
    assert man["embeddings"]["source"] == "shipped" and man["embeddings"]["sample_max_abs_diff"] <= shipped.TOLERANCE
    a, b = np.load(encoded / "dense" / "embeddings.npy"), np.load(used / "dense" / "embeddings.npy")
    assert np.abs(a - b).max() < 1e-5
    q = open_index(used).encoder.encode(["Who wrote the song?", "largest city in the country"])
    assert (np.argsort(-(q @ a.T), axis=1)[:, :10] == np.argsort(-(q @ b.T), axis=1)[:, :10]).all()

    # vectors that are not this encoder's (rows shuffled, sha256 updated): the sample check refuses them
    side = json.loads(meta.read_text())
    np.save(npy, np.load(npy)[::-1].copy())
    meta.write_text(json.dumps({**side, "sha256": sha256_file(npy)}))
    refused = build_index([corpus], tmp_path / "refused", bm25=False)
    man = json.loads((refused / "manifest.json").read_text())["dense"]
    assert man["embeddings"]["source"] == "encoded" and "sample differs" in man["embeddings"]["shipped"]
    assert np.abs(np.load(refused / "dense" / "embeddings.npy") - a).max() < 1e-5

    # a damaged file (sha256 no longer matches), and a corpus that changed since the vectors were made
    npy.write_bytes(npy.read_bytes()[:-8])
    assert "does not match its sha256" in shipped.find(corpus_entries([corpus]), encoder, LAYOUT, 60)[1]
    meta.write_text(json.dumps(side))
    shutil.copyfile(encoded / "dense" / "embeddings.npy", npy)
    meta.write_text(json.dumps({**side, "sha256": sha256_file(npy)}))
    with open(corpus, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "x-1", "title": "Zanzibar", "text": "Quetzalcoatl visited Zanzibar."}) + "\n")
    vectors, why = shipped.find(corpus_entries([corpus]), encoder, LAYOUT, 61)
    assert vectors is None and "another corpus, count" in why
