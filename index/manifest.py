"""manifest.json of an index built by clarify: a declared record with one writer and one reader.

    IndexManifest   written by the index build (index/build.py `_build_into`), read by `IndexManifest.read`
                    (every open, every build that finds an index in place)

Two numbers: `version` is the layout of the index folder (passages, lucene/, dense/), checked by every
clarify that opens it; `schema_version` is the layout of this file. A manifest without `schema_version`
was written by a clarify before this record (layout 1, the same keys without it): it is read through
`_layout_1`, which says so once per index (console note) and accepts the parts older builds left out;
the next build into that folder writes it again as the current layout (`build_index`, nothing rebuilt).
A current manifest with a missing or mistyped field is one InputError naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clarify import console
from clarify.errors import InputError
from clarify.files import write_json
from clarify.jsonl import read_json
from clarify.options import TYPE_WORDS, JsonObject, base_type, declared, json_type_ok, spec

MANIFEST = "manifest.json"
FORMAT = "clarify-index"
VERSION = 1  # the index folder's layout; a clarify from before `schema_version` checks this one
SCHEMA = 2  # this file's layout: 1 = no schema_version key (clarify before this record); 2 = + schema_version
REQUIRED = object()  # a field a current manifest must hold (a layout-1 one may lack it)


class _Fields:
    """Reads one JSON object's fields for a record, each checked against its JSON type; a missing required
    field (current layout) or a mistyped one is an InputError naming the manifest and the field."""

    def __init__(self, data: object, source: str, prefix: str, strict: bool):
        self.source, self.prefix, self.strict = source, prefix, strict
        if not isinstance(data, dict):
            self.fail(prefix.rstrip("."), data, "an object")
        self.data = data

    def fail(self, name: str, value: object, want: str) -> None:
        shown = "" if isinstance(value, dict | list) else f" ({value!r})"  # "1" would print as 1
        raise InputError(f"broken index manifest: '{name}' is a JSON {type(value).__name__}{shown}, not {want}; "
                         f"rebuild it", path=self.source, field=name)

    def get(self, key: str, hint: Any, want: str, default: Any = REQUIRED) -> Any:
        """The value of `key`, of the declared type `hint` (options.json_type_ok)."""
        name = self.prefix + key
        if self.data.get(key) is None:  # absent, or null: a part or a fact the build did not make
            if default is REQUIRED and self.strict:
                raise InputError(f"broken index manifest: '{name}' is missing; rebuild it", path=self.source,
                                 field=name)
            return None if default is REQUIRED else default
        value = self.data[key]
        if not json_type_ok(value, hint):  # True is an int to Python, not to a manifest
            self.fail(name, value, want)
        return value

    def rest(self, cls) -> dict:
        """The keys `cls` does not declare, kept as read (a newer build's facts)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return {k: v for k, v in self.data.items() if k not in names}


class _Part:
    """A part of the manifest, read field by field as each field declares (options.declared): its JSON type is
    its annotation, `want` how an error names it (else the type's word), `required` whether a current
    manifest must hold it."""

    @classmethod
    def from_json(cls, f: _Fields):
        hints = typing.get_type_hints(cls)
        out = {}
        for x in dataclasses.fields(cls):  # type: ignore[arg-type]
            s = spec(x)
            out[x.name] = f.get(x.name, hints[x.name], s.want or TYPE_WORDS[base_type(hints[x.name])],
                                default=REQUIRED if s.required else None)
        return cls(**out)


@dataclass(frozen=True)
class Passages(_Part):
    """The passages: a memory-mapped text store (index/textstore.py: `file` passages.arrow, `ids`, `rows`,
    `format` "arrow-ipc") or, in indexes built before it, one Parquet `file` read whole (no `format`)."""

    count: int | None = declared(None, required=True)
    file: str | None = declared(None, want="a file name", required=True)
    ids: str | None = declared(None, want="a file name")
    rows: str | None = declared(None, want="a file name")
    format: str | None = declared(None)
    sha256: str | None = declared(None, want="a sha256")
    skipped: dict[str, int] | None = declared(None, help="bad corpus rows skipped (`--skip-bad`), by reason")


@dataclass(frozen=True)
class Bm25Part(_Part):
    """The Lucene index (`dir`, Pyserini's layout) and what Anserini reported building it."""

    dir: str | None = declared(None, want="a folder name", required=True)
    documents: int | None = declared(None, required=True)
    stats: dict | None = declared(None)
    indexer: str | None = declared(None)
    contents: str | None = declared(None)
    analyzer: str | None = declared(None)
    files: dict[str, int] | None = declared(None, help="each file's bytes")


@dataclass(frozen=True)
class DensePart(_Part):
    """The FAISS index (`dir`: index + docid in Pyserini's layout, embeddings.npy) and its encoder: `encoder`
    is "default" (the packaged one) or a folder inside the index (`encoders/NAME`; an older build named
    the user's folder outside it, which open refuses and a build replaces)."""

    dir: str | None = declared(None, want="a folder name", required=True)
    encoder: str | None = declared(None, want="an encoder name", required=True)
    encoder_name: str | None = declared(None)
    encoder_path: str | None = declared(None)
    dim: int | None = declared(None, required=True)
    normalized: bool | None = declared(None, want="true or false")
    metric: str | None = declared(None)
    faiss: str | None = declared(None, required=True, help="the build option (flat | ivf | hnsw | a factory)")
    factory: str | None = declared(None)
    faiss_class: str | None = declared(None)
    vectors: int | None = declared(None, required=True)
    train_rows: int | None = declared(None)
    faiss_params: dict | None = declared(None, help="search parameters stored in the index file")
    passage_text: str | None = declared(None)
    embeddings: dict | None = declared(None, help="encoded here or shipped (index/shipped.py), and how")
    sha256: dict[str, str] | None = declared(None, help="index, docid, embeddings.npy")


@dataclass(frozen=True)
class CorpusEntry(JsonObject):
    """One corpus file of `corpus` (index/corpus.py `corpus_entries` makes it): its keys kept in their order, as
    the index's identity hashes them (batch/run/resources.py `index_identity`)."""

    path: str | None = None
    name: str | None = None
    bytes: int | None = None
    mtime_ns: int | None = None
    sha256: str | None = None  # absent from a cheap entry (`corpus_entries(checksum=False)`)


@dataclass(frozen=True)
class BuildSettings(JsonObject):
    """`build`: the settings the index was built with (index/build.py BuildOptions.identity()), compared key by
    key on the next build (`differences`); a setting an older build did not record is absent."""

    layout: int | None = None
    bm25: bool | None = None
    dense: bool | None = None
    encoder: str | None = None
    faiss: str | None = None
    nlist: int | None = None
    nprobe: int | None = None
    hnsw_m: int | None = None
    ef_search: int | None = None
    train_size: int | None = None
    skip_bad: bool | None = None


def _part_json(part) -> dict:
    """A part's JSON object: its fields in order, those it does not hold (None) left out, as a build writes
    them; so a manifest read and written again keeps the same keys (the index's identity,
    batch/run/resources.py `index_identity`, hashes the passages part)."""
    return {k: v for k, v in dataclasses.asdict(part).items() if v is not None}


@dataclass(frozen=True)
class IndexManifest:
    """manifest.json: what the index was built from (`corpus`: each file's name, size, mtime, sha256,
    index/corpus.py `corpus_entries`), with which settings (`build`: BuildOptions.identity(), compared key by
    key on the next build), and each part it holds (bm25 / dense: None when not built)."""

    corpus: tuple[CorpusEntry, ...]
    passages: Passages
    build: BuildSettings
    bm25: Bm25Part | None = None
    dense: DensePart | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds of each build phase
    created: str | None = None
    path_built: str | None = None  # where it was built (it may have been moved since)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this clarify does not declare, kept as read
    format: str = FORMAT
    version: int = VERSION
    schema_version: int = SCHEMA

    def __post_init__(self):  # a caller's JSON objects (a build's, a test's) read into their records
        object.__setattr__(self, "corpus", tuple(c if isinstance(c, CorpusEntry) else CorpusEntry.of(c)
                                                 for c in self.corpus))
        if not isinstance(self.build, BuildSettings):
            object.__setattr__(self, "build", BuildSettings.of(self.build))

    def identity(self) -> dict:
        """What identifies the index's content: its corpus, build settings and passages."""
        return {"corpus": [c.to_json() for c in self.corpus], "build": self.build.to_json(),
                "passages": _part_json(self.passages)}

    def to_json(self) -> dict:
        out = {"format": self.format, "version": self.version, "schema_version": SCHEMA, "created": self.created,
               "corpus": [c.to_json() for c in self.corpus], "passages": _part_json(self.passages),
               "build": self.build.to_json(),
               "bm25": _part_json(self.bm25) if self.bm25 else None,
               "dense": _part_json(self.dense) if self.dense else None, "timings": self.timings}
        if self.path_built is not None:
            out["path_built"] = self.path_built
        return {**out, **self.extra}

    def write(self, path: Path) -> None:
        """The writer: `path` is the manifest file."""
        write_json(self.to_json(), path, sort_keys=False)

    @classmethod
    def read(cls, path: Path) -> IndexManifest:
        """The manifest file at `path`, checked: InputError naming the file (and field) when it is not one."""
        source = str(path)
        try:
            data = read_json(path)
        except InputError as exc:
            raise InputError(f"broken index manifest: {exc.reason}", path=source, line=exc.line) from None
        return cls.from_json(data, source)

    @classmethod
    def from_json(cls, data: object, source: str) -> IndexManifest:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError(f"not a clarify index manifest (format is not '{FORMAT}')", path=source)
        top = _Fields(data, source, "", strict=True)
        version = top.get("version", int, "an integer")
        if version != VERSION:
            raise InputError(f"index format version {version} is not supported (want {VERSION}); rebuild it",
                             path=source)
        schema = top.get("schema_version", int, "an integer", default=1)
        if schema < 1 or schema > SCHEMA:
            raise InputError(f"manifest schema_version {schema} is not one this clarify reads (1 to {SCHEMA}): "
                             f"written by a newer clarify; use that one, or rebuild the index with --force",
                             path=source, field="schema_version")
        if schema == 1:
            return _layout_1(data, source)
        return _parse(data, source, strict=True, schema=schema)


def _parse(data: dict, source: str, *, strict: bool, schema: int) -> IndexManifest:
    top = _Fields(data, source, "", strict)

    def part(key: str, cls, required: bool = True):
        value = top.get(key, dict, "an object", default=REQUIRED if required else None)
        return None if value is None else cls.from_json(_Fields(value, source, f"{key}.", strict))

    corpus = top.get("corpus", list, "a list", default=REQUIRED if strict else [])
    for i, entry in enumerate(corpus):
        f = _Fields(entry, source, f"corpus.{i}.", strict)
        f.get("name", str, "a file name"), f.get("sha256", str, "a sha256")
    passages = part("passages", Passages) or Passages(None, None)
    created = top.get("created", str, "a date", default=None)
    return IndexManifest(tuple(corpus), passages, top.get("build", dict, "an object", default=REQUIRED if strict else {}),
                         part("bm25", Bm25Part, required=False), part("dense", DensePart, required=False),
                         top.get("timings", dict, "an object", default=REQUIRED if strict else {}), created,
                         top.get("path_built", str, "a path", default=None), top.rest(IndexManifest),
                         schema_version=schema)


def _layout_1(data: dict, source: str) -> IndexManifest:
    """A manifest written before `schema_version` (layout 1): the same keys, but older builds left some out
    (no text store, no timings, the dense part's facts), so a missing field is taken as absent instead of
    refused. Said once per index, in the session's notes and the log."""
    sentence = (f"the index manifest {source} was written by an older clarify (no schema_version): read in its "
                f"old layout; the next `clarify index build` into that folder writes it in the current one")
    console.note(f"index-manifest-layout:{source}", sentence)
    logging.getLogger("clarify.index").info(sentence)
    return _parse(data, source, strict=False, schema=1)


def read_manifest(path: Path) -> IndexManifest | None:
    """The manifest of the index folder `path`, or None when it holds none."""
    mf = Path(path) / MANIFEST
    return IndexManifest.read(mf) if mf.is_file() else None
