"""clarify.jsonl.iter_jsonl: the one JSONL reader (raise on the first bad line, or report every one)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from clarify.errors import InputError
from clarify.jsonl import iter_jsonl

GOOD = b'{"id": "a"}\n\n  \n{"id": "b"}\n'


def test_reads_objects_with_line_numbers_skipping_blanks(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + GOOD)  # a byte-order mark on line 1 is dropped
    assert list(iter_jsonl(p)) == [(1, {"id": "a"}), (4, {"id": "b"})]
    g = tmp_path / "x.jsonl.gz"
    g.write_bytes(gzip.compress(GOOD))
    assert list(iter_jsonl(g)) == [(1, {"id": "a"}), (4, {"id": "b"})]
    with pytest.raises(InputError, match=r"x.jsonl:2: malformed JSON"):
        list(iter_jsonl(p, skip_blank=False))


@pytest.mark.parametrize(
    "bad, needle",
    [(b"{oops", "malformed JSON"), (b'{"t": "caf\xe9"}', "not UTF-8"), (b"[1, 2]", "expected a JSON object \\(got list\\)")],
)
def test_first_bad_line_raises_with_file_and_line(tmp_path, bad, needle):
    p = tmp_path / "x.jsonl"
    p.write_bytes(GOOD + bad + b"\n")
    with pytest.raises(InputError, match=needle) as err:
        list(iter_jsonl(p))
    assert err.value.path == str(p) and err.value.line == 5 and str(err.value).startswith(f"{p}:5: ")


def test_on_error_collects_every_bad_line_and_keeps_reading(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{oops\n{"id": 1}\n"str"\n\xff\n{"id": 2}\n')
    problems = []
    rows = list(iter_jsonl(p, on_error=problems.append, wording={"bad_json": "bad JSON"}))
    assert rows == [(2, {"id": 1}), (5, {"id": 2})]
    assert [(q.line, q.kind) for q in problems] == [(1, "bad_json"), (3, "not_object"), (4, "non_utf8")]
    assert problems[0].message.startswith("bad JSON (")
    assert str(problems[2].error()).startswith(f"{p}:4: not UTF-8")


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="nope.jsonl: file not found"):
        list(iter_jsonl(tmp_path / "nope.jsonl"))
    with pytest.raises(InputError, match="is a directory, not a file"):  # said as it is, not as "not found"
        list(iter_jsonl(tmp_path))


def test_a_cut_short_or_foreign_gz_is_an_input_error_at_the_line_being_read(tmp_path):
    rows = b"".join(b'{"id": %d, "text": "%s"}\n' % (i, b"%x" % (i * 7919) * 20) for i in range(2000))
    whole = gzip.compress(rows)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])  # a download or copy that stopped half way
    seen = []
    with pytest.raises(InputError, match="compressed file ended early") as err:
        for line, obj in iter_jsonl(cut, on_error=lambda p: None):  # no on_error can skip past the end
            seen.append((line, obj["id"]))
    # every whole line before the cut was read, in order, and the error names the line after them
    assert seen and seen == [(i + 1, i) for i in range(len(seen))] and len(seen) < 2000
    assert err.value.path == str(cut) and err.value.line == len(seen) + 1
    foreign = tmp_path / "plain.jsonl.gz"  # not gzip at all, though it says so
    foreign.write_bytes(rows[:200])
    with pytest.raises(InputError, match="cannot read on") as err:
        list(iter_jsonl(foreign))
    assert err.value.path == str(foreign) and err.value.line == 1


def test_a_json_document_over_the_cap_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from clarify import jsonl

    p = tmp_path / "preds.json"
    p.write_text('{"a": "x"}' + " " * 3 * 2**20)  # 3 MiB
    with pytest.raises(InputError, match="too large for one JSON document") as err:
        jsonl.read_text(p, max_bytes=2**20)
    assert err.value.path == str(p)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read before the size check"))
    with pytest.raises(InputError, match="3 MiB is too large"):
        jsonl.read_text(p, max_bytes=2**20)
    monkeypatch.undo()
    assert jsonl.read_text(p).startswith('{"a": "x"}')  # under the default cap


def test_every_json_file_is_read_by_one_rule(tmp_path):
    """A dataset's JSON file, a run directory's records and an index manifest are read alike
    (jsonl.read_json): a byte-order mark is dropped, and bad JSON is named by file and line."""
    from clarify.batch.run.records import read_json as run_record
    from clarify.index.manifest import IndexManifest
    from clarify.jsonl import read_json

    p = tmp_path / "summary.json"
    p.write_bytes("\ufeff".encode() + b'{"name": "r"}')
    assert read_json(p) == run_record(p, "delete it") == {"name": "r"}
    p.write_text('{"name": "r",\n oops}')
    for read, words in ((read_json, "bad JSON"), (lambda f: run_record(f, "delete it"), "damaged (bad JSON"),
                        (IndexManifest.read, "broken index manifest: bad JSON")):
        with pytest.raises(InputError) as err:
            read(p)
        assert (err.value.path, err.value.line) == (str(p), 2) and err.value.reason.startswith(words)
