"""Every reader of untrusted input gives one line naming the file and the line or field, exit 2, and writes
nothing: corpora (TSV, JSONL, Parquet), QuoteSum questions, `index search` queries files, encoded shards and
chunks, index manifests, an attached FAISS folder, the offline bundle's manifest, the demo pool's file; and
a stopped `clarify eval` leaves no empty output folder. No engine, no JVM: the readers fail before either."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest

from clarify.batch.cli import main
from clarify.errors import InputError
from clarify.files import data_dir


def one_line(capsys, argv: list[str], code: int = 2) -> str:
    """Run the command line; it exits `code` with one error line on stderr (after any progress lines), no
    traceback. Returns that line."""
    assert main(argv) == code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and ": error: " in lines[-1], err
    assert not any(": error: " in line for line in lines[:-1]), err
    return lines[-1]


# -- corpora -------------------------------------------------------------------------------------------
def test_a_carriage_return_inside_a_tsv_field_names_its_line(tmp_path, capsys):
    tsv = tmp_path / "psgs.tsv"
    tsv.write_bytes(b"id\ttext\ttitle\n1\tfine text\tA\n2\tbroken\rfield\tB\n")
    err = one_line(capsys, ["index", "build", "--corpus", str(tsv), "--out", str(tmp_path / "idx"), "--no-dense"])
    assert f"{tsv}:3:" in err and "carriage return" in err
    assert not (tmp_path / "idx").exists()


def test_a_tsv_header_naming_a_column_twice_is_refused(tmp_path):
    from clarify.index.corpus import read_passages

    tsv = tmp_path / "psgs.tsv"
    tsv.write_text("id\ttext\ttext\n1\tone\ttwo\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"psgs.tsv:1 \(field 'text'\): the header names 'text' more than once"):
        read_passages(tsv)


def test_a_lone_surrogate_in_a_jsonl_corpus_names_line_and_field(tmp_path):
    from clarify.index.corpus import read_passages

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "title": "A", "text": "fine"}\n{"id": "b", "title": "B", "text": "x \\ud800 y"}\n'
                      '{"id": "c", "title": "C", "text": "a pair \\ud83d\\ude00 is one character"}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"c.jsonl:2: not UTF-8 \(field 'text' holds \\ud800"):
        read_passages(corpus)
    got = read_passages(corpus, skip_bad=True)  # skipped and counted like any bad line; the pair is kept
    assert got["passage_id"].to_list() == ["a", "c"] and "\U0001f600" in got["text"][1]


def test_a_lone_surrogate_in_a_quotesum_questions_file_names_line_and_field(tmp_path):
    from clarify.eval import datasets

    rows = (data_dir() / "quotesum" / "dev.jsonl").read_text(encoding="utf-8").splitlines()[:3]
    bad = json.loads(rows[1])
    bad["question"] = "who \ud800?"
    q = tmp_path / "qs.jsonl"
    q.write_text("\n".join([rows[0], json.dumps(bad), rows[2]]) + "\n", encoding="utf-8")  # json escapes it
    with pytest.raises(InputError, match=r"qs.jsonl:2: not UTF-8 \(field 'question' holds \\ud800"):
        datasets.get("quotesum").load(q)


def test_a_categorical_parquet_id_column_is_read_as_strings(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from clarify.index.corpus import read_passages

    pq.write_table(pa.table({"id": pa.array(["a", "b", "a2"]).dictionary_encode(),
                             "title": pa.array(["A", "B", "A"]).dictionary_encode(), "text": ["one", "two", "three"]}),
                   tmp_path / "c.parquet")
    got = read_passages(tmp_path / "c.parquet")
    assert got.rows() == [("a", "A", "one"), ("b", "B", "two"), ("a2", "A", "three")]


# -- index search --queries ------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "content", "where", "what"), [
    ("q.tsv", b"qid\tquery\nq1\thello\nq2\thi\textra\n", ":3:", "expected 2 tab-separated fields"),
    ("q.jsonl", b'{"qid": "q1", "query": "a"}\n[1, 2]\n', ":2:", "expected a JSON object (got list)"),
    ("q.jsonl", b'{"qid": "q1", "query": 3}\n', ":1 (field 'query')", "a query must be a string"),
    ("q.parquet", b"PAR1 not a parquet file PAR1", ": cannot read Parquet", ""),
])
def test_a_bad_queries_file_is_one_line(tmp_path, capsys, name, content, where, what):
    q = tmp_path / name
    q.write_bytes(content)
    err = one_line(capsys, ["index", "search", "--queries", str(q), "--index", str(tmp_path / "no-index")])
    assert f"{q}{where}" in err and what in err


# -- encoded shards and chunks -----------------------------------------------------------------------------
JOB = {"corpus": [["c.jsonl", "0" * 64]], "count": 40, "chunk": 16, "dim": 4, "layout": 2}


def _shard(folder: Path, chunks) -> Path:
    from clarify.index.encode import Checkpoints

    ckpt = Checkpoints(folder, JOB)
    for k in chunks:
        ckpt.save(k, np.random.default_rng(k).random((ckpt.rows(k), 4)))
    return folder


@pytest.mark.parametrize("damage", ["flip", "truncate", "shape", "old-layout"])
def test_a_damaged_chunk_is_not_merged_and_is_named(tmp_path, capsys, damage):
    from clarify.index.encode import encoding_dir

    a, b = _shard(tmp_path / "a", [0, 2]), _shard(tmp_path / "b", [1])
    bad = b / "chunk-000001.npy"
    raw = bytearray(bad.read_bytes())
    if damage == "flip":  # same size, other bytes: only the checksum recorded at write time sees it
        raw[-5] ^= 0xFF
        bad.write_bytes(bytes(raw))
    elif damage == "truncate":
        bad.write_bytes(bytes(raw[:-64]))
    elif damage == "shape":  # a whole .npy, of another chunk's size
        np.save(bad, np.zeros((3, 4), dtype=np.float32))
    else:  # a chunk written before records existed (no chunk-NNNNNN.json), cut short
        (b / "chunk-000001.json").unlink()
        bad.write_bytes(bytes(raw[:100]))
    out = tmp_path / "idx"
    err = one_line(capsys, ["index", "merge-shards", "--out", str(out), str(a), str(b)])
    assert f"{bad}:" in err and "remove it and encode again" in err
    assert not encoding_dir(out).exists()  # nothing copied, nothing counted


def test_merged_chunks_are_checked_again_when_assembled(tmp_path, capsys):
    from clarify.index.encode import Checkpoints, assemble, encoding_dir

    a, b = _shard(tmp_path / "a", [0, 2]), _shard(tmp_path / "b", [1])
    out = tmp_path / "idx"
    assert main(["index", "merge-shards", "--out", str(out), str(a), str(b)]) == 0
    assert "3 encoded chunks" in capsys.readouterr().out
    target = encoding_dir(out)
    assert sorted(p.name for p in target.glob("chunk-*")) == [f"chunk-00000{k}.{x}" for k in range(3)
                                                              for x in ("json", "npy")]
    ckpt = Checkpoints(target, JOB)
    emb = assemble(ckpt, np.arange(40), 16, 4, tmp_path / "e.npy")
    assert np.array_equal(emb[16:32], np.load(b / "chunk-000001.npy"))
    raw = bytearray(ckpt.path(2).read_bytes())
    raw[-1] ^= 0x01
    ckpt.path(2).write_bytes(bytes(raw))
    with pytest.raises(InputError, match=r"chunk-000002.npy: its bytes differ from those recorded"):
        assemble(ckpt, np.arange(40), 16, 4, tmp_path / "e2.npy")


def test_a_broken_job_record_is_one_line(tmp_path, capsys):
    a = _shard(tmp_path / "a", [0])
    (a / "job.json").write_text('{"corpus": [', encoding="utf-8")
    err = one_line(capsys, ["index", "merge-shards", "--out", str(tmp_path / "idx"), str(a)])
    assert f"{a / 'job.json'}:1: not a JSON job record" in err  # named by file and line (clarify.jsonl read_json)


# -- index manifests and an attached FAISS folder ------------------------------------------------------------
@pytest.mark.parametrize(("manifest", "match"), [
    ({"bm25": ["lucene"]}, r"\(field 'bm25'\): broken index manifest: 'bm25' is a JSON list, not an object"),
    ({"version": "1"}, r"\(field 'version'\): broken index manifest: 'version' is a JSON str \('1'\), not an integer"),
    ({"dense": 3}, r"'dense' is a JSON int \(3\), not an object"),
])
def test_a_manifest_of_the_wrong_shape_is_one_line(tmp_path, capsys, manifest, match):
    import re

    idx = tmp_path / "idx"
    idx.mkdir()
    (idx / "manifest.json").write_text(json.dumps({"format": "clarify-index", "version": 1, "passages": {"file": "p"},
                                                   **manifest}), encoding="utf-8")
    err = one_line(capsys, ["index", "search", "--index", str(idx), "--query", "x", "--retriever", "bm25"])
    assert re.search(match, err), err


def _faiss_dir(folder: Path, ids: list[str], vectors: int) -> Path:
    import faiss

    folder.mkdir()
    index = faiss.IndexFlatIP(384)  # the embedded encoder's dimension
    index.add(np.random.default_rng(0).random((vectors, 384), dtype=np.float32))
    faiss.write_index(index, str(folder / "index"))
    (folder / "docid").write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    return folder


def test_an_attached_faiss_folder_is_checked_before_the_run_directory_is_made(tmp_path, default_local_index):
    from clarify.batch import config
    from clarify.batch.run.pipeline import run

    ids = default_local_index.passages["passage_id"].to_list()[:10]
    cases = [
        (_faiss_dir(tmp_path / "short", ids[:9], 10), r"docid:? \(field 'faiss_index'\): 'docid' has 9 lines but the "
                                                      r"index holds 10 vectors"),
        (_faiss_dir(tmp_path / "other", ids[:5] + [f"other-{i}" for i in range(5)], 10),
         r"docid:6 \(field 'faiss_index'\): id 'other-0' is not a passage of the index"),
    ]
    for faiss_dir, match in cases:
        cfg = config.load(None, {"limit": 1, "index": str(default_local_index.path),
                                 "retrieval.faiss_index": str(faiss_dir)})
        out = tmp_path / f"run-{faiss_dir.name}"
        with pytest.raises(InputError, match=match):
            run(cfg, out, engine_factory=lambda c: None, progress=False)
        assert not out.exists()  # no config, inputs, questions or cache written
    good = _faiss_dir(tmp_path / "good", ids, 10)
    cfg = config.load(None, {"limit": 1, "index": str(default_local_index.path), "retrieval.faiss_index": str(good)})
    from clarify.batch.run.resources import open_run_index

    assert open_run_index(cfg.index, cfg.retrieval).dense_dir == good  # the docids of its own corpus pass


# -- the offline bundle --------------------------------------------------------------------------------------
def _bundle_manifest(tmp_path: Path, **change) -> Path:
    b = tmp_path / "bundle"
    (b / "wheels").mkdir(parents=True)
    (b / "wheels" / "a.whl").write_bytes(b"wheel")
    m = {"format": 1, "created": "x", "lock": {"name": "cpu.txt", "sha256": "0" * 64, "pins": {}},
         "files": {"wheels/a.whl": {"size": 5, "sha256": "0" * 64}}}
    for key, value in change.items():
        if value is None:
            m.pop(key)
        else:
            m[key] = value
    (b / "manifest.json").write_text(json.dumps(m), encoding="utf-8")
    return b


@pytest.mark.parametrize(("change", "match"), [
    ({"lock": None}, r"\(field 'lock'\): not a clarify bundle manifest: the lock the wheels came from"),
    ({"files": {"wheels/a.whl": {"sha256": "0" * 64}}}, r"\(field 'files.wheels/a.whl.size'\)"),
    ({"files": {"wheels/a.whl": {"size": "5", "sha256": "0" * 64}}}, r"a file's size is a number of bytes"),
    ({"lock": {"name": "cpu.txt", "pins": ["polars"]}}, r"\(field 'lock.pins'\)"),
])
def test_a_bundle_manifest_of_the_wrong_shape_is_one_line(tmp_path, capsys, change, match):
    import re

    b = _bundle_manifest(tmp_path, **change)
    err = one_line(capsys, ["doctor", "--offline", str(b)])
    assert re.search(match, err), err


def test_a_bundle_path_that_is_a_file_and_escapes_in_names(tmp_path, capsys):
    from clarify.batch.cli.offline import check_bundle

    f = tmp_path / "bundle.tar"
    f.write_text("x")
    assert f"{f}: not a folder" in one_line(capsys, ["doctor", "--offline", str(f)])
    b = _bundle_manifest(tmp_path, files={"wheels/a.whl": {"size": 5, "sha256": "0" * 64},
                                          "\x1b]0;owned\x07\x1b[2J.whl": {"size": 1, "sha256": "1" * 64}})
    problems = check_bundle(b)["problems"]
    assert "missing: \\x1b]0;owned\\x07\\x1b[2J.whl" in problems
    assert not any("\x1b" in p or "\x07" in p for p in problems)
    assert main(["doctor", "--offline", str(b)]) == 1
    assert "\x1b" not in capsys.readouterr().out


# -- the demo pool ----------------------------------------------------------------------------------------------
def test_a_demo_pool_file_that_is_not_there_names_the_field(tmp_path, capsys):
    err = one_line(capsys, ["run", "--demo-pool", f"asqa:dev@{tmp_path / 'nope.json'}", "--limit", "1",
                            "--out", str(tmp_path / "run")])
    assert f"{tmp_path / 'nope.json'} (field 'demo_pool'): the demo pool" in err and "not found" in err
    assert not (tmp_path / "run").exists()


def test_a_train_split_that_is_a_list_is_named(tmp_path, capsys):
    asqa = tmp_path / "ASQA.json"
    dev = json.loads((data_dir() / "asqa" / "dev.json").read_text(encoding="utf-8"))["dev"]
    asqa.write_text(json.dumps({"train": list(dev.values())[:3], "dev": dict(list(dev.items())[:5])}), encoding="utf-8")
    err = one_line(capsys, ["run", "--dataset", "asqa", "--questions", str(asqa), "--limit", "1",
                            "--out", str(tmp_path / "run")])
    assert f"{asqa} (field 'train'): split 'train' is a JSON list" in err and "dev[500:]" not in err


def test_a_demo_pool_instance_unfit_for_a_demo_is_named_by_the_asqa_reader(tmp_path, capsys):
    """A demo pool's file is read by the ASQA dataset's one reader (asqa_file.py `read_asqa`): a train
    instance without annotations is the error `clarify eval` would give for it, naming file and instance."""
    asqa = tmp_path / "ASQA.json"
    dev = json.loads((data_dir() / "asqa" / "dev.json").read_text(encoding="utf-8"))["dev"]
    sid, inst = next(iter(dev.items()))
    asqa.write_text(json.dumps({"train": {sid: {k: v for k, v in inst.items() if k != "annotations"}}}), encoding="utf-8")
    err = one_line(capsys, ["run", "--demo-pool", f"asqa:train@{asqa}", "--limit", "1", "--out", str(tmp_path / "run")])
    assert err.endswith(f"{asqa} (field 'train.{sid}'): ASQA instance lacks 'annotations'"), err
    assert not (tmp_path / "run").exists()


def test_a_pool_spec_is_frozen_without_its_surrounding_spaces():
    from clarify.batch import config
    from clarify.batch.run.resources import prepare

    prep = prepare(config.load(None, {"demo_pool": "  asqa:dev[500:]  ", "limit": 1}), index=object(),
                   engine_factory=lambda c: None)
    assert prep.pool.spec == "asqa:dev[500:]"


# -- a stopped clarify eval -------------------------------------------------------------------------------------
def test_a_stop_before_scoring_leaves_no_empty_output_folder(tmp_path, monkeypatch, capsys):
    from clarify import stops
    from clarify.eval import datasets

    def stopped(*a, **k):  # what SIGTERM raises in the main thread while the scorers run
        raise stops.Stopped(signal.SIGTERM)

    monkeypatch.setattr(type(datasets.get("asqa")), "score", stopped)
    preds = tmp_path / "preds.json"
    gold = json.loads((data_dir() / "asqa" / "dev.json").read_text(encoding="utf-8"))["dev"]
    preds.write_text(json.dumps({k: "an answer" for k in list(gold)[:3]}), encoding="utf-8")
    out = tmp_path / "scores" / "deeper"
    assert main(["eval", "--dataset", "asqa", "--predictions", str(preds), "--only-predicted", "--out", str(out)]) == 143
    capsys.readouterr()
    assert not (tmp_path / "scores").exists()
    (tmp_path / "kept").mkdir()  # a folder that was there before stays
    assert main(["eval", "--dataset", "asqa", "--predictions", str(preds), "--only-predicted",
                 "--out", str(tmp_path / "kept")]) == 143
    assert (tmp_path / "kept").is_dir()
