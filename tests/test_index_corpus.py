"""Corpus reading, bad input, RRF, AC@k: pure parts of clarify.index (no JVM, no model)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from clarify.asqa_file import load_asqa
from clarify.errors import InputError
from clarify.index import BuildOptions, load_corpus, normalize_answer, open_index, read_passages, rrf_fuse
from clarify.index.coverage import answer_coverage, coverage_table, retrieval_inputs
from clarify.index.default import default_corpus_files
from clarify.schemas import check

from .fixtures_index import REPO


def _jsonl(path, rows):
    with open(path, "wb") as fh:
        for row in rows:
            fh.write(row if isinstance(row, bytes) else (json.dumps(row) + "\n").encode())
    return path


GOOD = [{"id": "a", "title": "Alpha", "text": "alpha text"}, {"id": "b", "title": "Beta", "text": "beta text"}]


def test_shipped_corpus_reads_completely():
    df = read_passages(default_corpus_files())
    check(df, "passages")
    lines = sum(sum(1 for _ in open(f, encoding="utf-8")) for f in default_corpus_files())
    assert df.height == lines == 10116
    assert df["passage_id"].n_unique() == df.height
    assert (df["text"].str.strip_chars().str.len_chars() > 0).all()


@pytest.mark.parametrize(
    "bad, line, needle",
    [
        (b'{"id": "c", "title": "C", "text": "broken\n', 3, "broken JSON"),
        ({"title": "C", "text": "no id"}, 3, "no id"),
        ({"id": "c", "title": "C"}, 3, "no text"),
        ({"id": "c", "title": "C", "text": "   "}, 3, "empty"),
        ({"id": "a", "title": "again", "text": "dup"}, 3, "duplicate id 'a'"),
        (b'{"id": "c", "title": "C", "text": "caf\xe9"}\n', 3, "not UTF-8"),
        (b"[1, 2]\n", 3, "JSON object"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, bad, line, needle):
    path = _jsonl(tmp_path / "c.jsonl", [*GOOD, bad, {"id": "z", "text": "last"}])
    with pytest.raises(InputError, match=needle) as err:
        read_passages(path)
    assert err.value.path == str(path) and err.value.line == line
    assert f"c.jsonl:{line}" in str(err.value)


def test_skip_bad_counts_rows(tmp_path):
    rows = [*GOOD, b"{oops\n", {"id": "a", "text": "dup"}, {"id": "e", "text": ""}, {"id": "f", "text": "fine"}]
    read = load_corpus(_jsonl(tmp_path / "c.jsonl", rows), skip_bad=True)
    assert read.passages["passage_id"].to_list() == ["a", "b", "f"]
    assert dict(read.skipped) == {"bad_json": 1, "duplicate_id": 1, "empty_text": 1}
    assert len(read.examples) == 3 and "c.jsonl:3" in read.examples[0]


def test_duplicates_across_files_name_first_place(tmp_path):
    a = _jsonl(tmp_path / "a.jsonl", GOOD)
    b = _jsonl(tmp_path / "b.jsonl", [{"id": "x", "text": "x"}, {"id": "b", "text": "again"}])
    with pytest.raises(InputError, match=r"duplicate id 'b' \(first seen at .*a.jsonl:2\)") as err:
        read_passages([a, b])
    assert err.value.line == 2 and err.value.path == str(b)


def test_all_rows_bad_is_an_error_not_an_empty_corpus(tmp_path):
    path = _jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": ""}, {"id": "b"}])
    with pytest.raises(InputError, match="no passages read"):
        read_passages(path, skip_bad=True)


def test_pyserini_contents_and_dpr_title(tmp_path):
    path = _jsonl(tmp_path / "p.jsonl", [
        {"id": "d1", "contents": '"Aaron"\nAaron is a prophet.'},
        {"id": 7, "contents": "plain contents, no title line"},
    ])
    df = read_passages(path)
    assert df.rows() == [("d1", "Aaron", "Aaron is a prophet."), ("7", "", "plain contents, no title line")]


def test_parquet_and_tsv(tmp_path):
    pq = tmp_path / "c.parquet"
    pl.DataFrame({"passage_id": ["p1", "p2"], "title": ["T1", None], "text": ["one", "two"]}).write_parquet(pq)
    assert read_passages(pq).rows() == [("p1", "T1", "one"), ("p2", "", "two")]
    pl.DataFrame({"id": ["p1", "p2"], "text": ["one", None]}).write_parquet(tmp_path / "bad.parquet")
    with pytest.raises(InputError, match="no text") as err:
        read_passages(tmp_path / "bad.parquet")
    assert err.value.line == 2
    pl.DataFrame({"id": ["p1"], "body": ["x"]}).write_parquet(tmp_path / "nocol.parquet")
    with pytest.raises(InputError, match="no text column"):
        read_passages(tmp_path / "nocol.parquet")
    tsv = tmp_path / "psgs.tsv"
    tsv.write_text('id\ttext\ttitle\n1\t"He said ""hi"" there"\tGreeting\n2\tsecond\tOther\n', encoding="utf-8")
    assert read_passages(tsv).rows() == [("1", "Greeting", 'He said "hi" there'), ("2", "Other", "second")]
    tsv.write_text("id\ttext\ttitle\n1\tonly two\n", encoding="utf-8")
    with pytest.raises(InputError, match="tab-separated") as err:
        read_passages(tsv)
    assert err.value.line == 2


def test_unknown_format_and_missing_file(tmp_path):
    (tmp_path / "c.csv").write_text("id,text\n")
    with pytest.raises(InputError, match="unknown corpus format"):
        read_passages(tmp_path / "c.csv")
    with pytest.raises(InputError, match="not found"):
        read_passages(tmp_path / "nope.jsonl")


def test_not_an_index_directory(tmp_path):
    with pytest.raises(InputError, match="not found"):
        open_index(tmp_path / "missing")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    with pytest.raises(InputError, match="not an index directory"):
        open_index(tmp_path / "junk")
    (tmp_path / "faiss").mkdir()
    (tmp_path / "faiss" / "index").write_bytes(b"x")
    (tmp_path / "faiss" / "docid").write_text("a\n")
    with pytest.raises(InputError, match="holds no passage text"):
        open_index(tmp_path / "faiss")
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "manifest.json").write_text('{"format": "something-else"}')
    with pytest.raises(InputError, match="not a clarify index manifest"):
        open_index(tmp_path / "fake")


def test_build_options_validate():
    with pytest.raises(InputError, match="FAISS"):
        BuildOptions(faiss="pq")
    with pytest.raises(InputError, match="nothing to build"):
        BuildOptions(bm25=False, dense=False)


def test_rrf_matches_formula():
    a = pl.DataFrame({"qid": ["q"] * 3, "passage_id": ["x", "y", "z"], "rank": [1, 2, 3]})
    b = pl.DataFrame({"qid": ["q"] * 3, "passage_id": ["y", "w", "x"], "rank": [1, 2, 3]})
    fused = rrf_fuse([a, b], k=10)
    check(fused, "hits")
    expected = {"x": 1 / 61 + 1 / 63, "y": 1 / 62 + 1 / 61, "z": 1 / 63, "w": 1 / 62}  # Cormack et al. 2009, k=60
    want = sorted(expected, key=lambda p: -expected[p])
    assert fused["passage_id"].to_list() == want
    assert fused["score"].to_list() == pytest.approx([expected[p] for p in want])
    assert fused["rank"].to_list() == [1, 2, 3, 4] and set(fused["retriever"]) == {"fused"}
    assert rrf_fuse([a, b], k=2)["passage_id"].to_list() == want[:2]


def test_normalize_and_whole_token_coverage():
    from clarify.normalize import normalize_answer as eval_normalize

    assert normalize_answer is eval_normalize  # one ASQA/SQuAD normaliser, re-exported by clarify.index
    assert normalize_answer("The  Beatles!") == "beatles"
    passages = pl.DataFrame({"passage_id": ["p1", "p2", "p3"], "title": ["", "", "Daei"],
                             "text": ["Alison scored 109 goals.", "Ali Daei scored 109 goals.", "Iran"]})
    hits = pl.DataFrame({"qid": ["q"] * 3, "passage_id": ["p1", "p2", "p3"], "rank": [1, 2, 3]})
    gold = pl.DataFrame({"qid": ["q", "q", "q", "r"], "pair_no": [0, 1, 2, 0],
                         "short_answers": [["Ali"], ["Daei"], ["Pelé"], ["x"]]})
    cov = answer_coverage(hits, passages, gold, ks=[1, 2, 3])
    got = {(r["qid"], r["k"]): r["n_covered"] for r in cov.iter_rows(named=True)}
    # "Ali" is not a whole token of "Alison" (rank 1); it is in p2 (rank 2). Question r has no hits.
    assert got == {("q", 1): 0, ("q", 2): 2, ("q", 3): 2, ("r", 1): 0, ("r", 2): 0, ("r", 3): 0}
    table = coverage_table(cov)
    assert table.filter(pl.col("k") == 2)["ac"].item() == pytest.approx(100 * 2 / 4)


def test_asqa_retrieval_inputs():
    queries, gold = retrieval_inputs(*load_asqa(REPO / "data" / "asqa" / "dev.json"), first=500)
    assert queries.height == 500 and queries["qid"].n_unique() == 500
    assert gold["qid"].n_unique() == 500 and gold.height >= 1000
    assert gold["short_answers"].list.len().min() >= 1


# ------------------------------------------------------------------ streaming reads (bounded memory)
def _dpr_tsv(path, rows):
    """DPR's psgs_w100.tsv layout: header `id text title`, text quoted with "" for a quote."""
    with open(path, "wb") as fh:
        fh.write(b"id\ttext\ttitle\n")
        for row in rows:
            if isinstance(row, bytes):
                fh.write(row)
            else:
                text = '"' + row["text"].replace('"', '""') + '"'
                fh.write(f"{row['id']}\t{text}\t{row['title']}\n".encode())
    return path


def test_tsv_is_read_in_chunks_with_the_right_lines(tmp_path, monkeypatch):
    from clarify.index import corpus

    monkeypatch.setattr(corpus, "CHUNK_BYTES", 200)  # many chunks: line numbers carry across them
    rows = [{"id": str(i), "title": f"T{i}", "text": f'passage "{i}" with some words'} for i in range(1, 41)]
    path = _dpr_tsv(tmp_path / "psgs.tsv", rows)
    df = read_passages(path)
    assert df.rows() == [(r["id"], r["title"], r["text"]) for r in rows]
    for bad, needle in [(b"41\tcaf\xe9\tT\n", "not UTF-8"), (b"41\tonly two\n", "tab-separated"),
                        (b'\t"no id"\tT\n', "no id"), (b'41\t"  "\tT\n', "empty"),
                        (b'7\t"again"\tT\n', r"duplicate id '7' \(first seen at .*psgs.tsv:8\)")]:
        path = _dpr_tsv(tmp_path / "psgs.tsv", [*rows, bad, {"id": "99", "title": "Z", "text": "last"}])
        with pytest.raises(InputError, match=needle) as err:
            read_passages(path)
        assert err.value.path == str(path) and err.value.line == 42, (bad, err.value)
    read = load_corpus(path, skip_bad=True)  # the duplicate at line 42 dropped, its first row kept
    assert read.passages.height == 41 and dict(read.skipped) == {"duplicate_id": 1}
    assert read.passages.filter(pl.col("passage_id") == "7")["text"].to_list() == ['passage "7" with some words']


def test_duplicates_are_found_across_chunks_and_files_without_a_dict(tmp_path, monkeypatch):
    from clarify.index import corpus
    from clarify.index.textstore import PassageStore

    monkeypatch.setattr(corpus, "CHUNK_ROWS", 3)
    a = _jsonl(tmp_path / "a.jsonl", [{"id": f"p{i}", "text": f"text {i}"} for i in range(10)])
    b = _jsonl(tmp_path / "b.jsonl", [{"id": "q1", "text": "x"}, {"id": "p8", "text": "late"},
                                      {"id": "p2", "text": "later"}])
    with pytest.raises(InputError, match=r"duplicate id 'p8' \(first seen at .*a.jsonl:9\)") as err:
        corpus.read_corpus_into([a, b], tmp_path)
    assert err.value.path == str(b) and err.value.line == 2  # the first repeat in file order
    out = tmp_path / "store"
    out.mkdir()
    read = corpus.read_corpus_into([a, b], out, skip_bad=True)
    assert read.count == 11 and dict(read.skipped) == {"duplicate_id": 2}
    assert [e.split(": ")[0].rsplit("/", 1)[1] for e in read.examples] == ["b.jsonl:2", "b.jsonl:3"]
    store = PassageStore(out, read.store)
    assert len(store) == 11
    assert store.lookup(["p8", "q1", "p2"])["text"].to_list() == ["text 8", "x", "text 2"]


def test_a_dpr_tsv_gz_cut_short_is_an_input_error_naming_the_line(tmp_path, monkeypatch):
    import gzip

    from clarify.index import corpus

    monkeypatch.setattr(corpus, "CHUNK_BYTES", 4096)  # several chunks are read before the cut
    rows = [{"id": str(i), "title": f"T{i}", "text": f"passage {i * 7919:x} " * 8} for i in range(1, 3001)]
    whole = gzip.compress(_dpr_tsv(tmp_path / "psgs.tsv", rows).read_bytes())
    cut = tmp_path / "psgs_w100.tsv.gz"  # the DPR download stopped half way
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match="compressed file ended early") as err:
        read_passages(cut)
    assert err.value.path == str(cut) and 2 < err.value.line < 3002
    cut.write_bytes(whole[:20])  # cut inside the header
    with pytest.raises(InputError, match="compressed file ended early") as err:
        read_passages(cut)
    assert err.value.line == 1
