"""Passage text without a RAM copy: an Arrow IPC file read through a memory map, and an id -> row map
made of two numpy arrays (also memory-mapped).

    passages.arrow      Arrow IPC file [passage_id, title, text], uncompressed, corpus order
    passage_ids.npy     the passage ids sorted, fixed-width UTF-8 bytes (numpy S<width>)
    passage_rows.npy    int64: row in passages.arrow of each sorted id

Opening maps the files and reads nothing else (pyarrow.memory_map + ipc.open_file: the record batches
point into the map, https://arrow.apache.org/docs/python/ipc.html#efficiently-writing-and-reading-arrow-data);
a lookup is np.searchsorted over the sorted ids and a `take` of those rows. Every process on a node
that opens the same store shares one copy of it through the OS page cache; a process touches only the
pages of the passages it reads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from clarify.errors import InputError
from clarify.schemas import PASSAGES

TEXT_FILE, IDS_FILE, ROWS_FILE = "passages.arrow", "passage_ids.npy", "passage_rows.npy"


def id_array(column) -> np.ndarray:
    """A string column (pyarrow Array or ChunkedArray) as a numpy fixed-width bytes array (UTF-8), gathered
    from Arrow's offsets and data buffers without a Python object per id. InputError for an id with NUL."""
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = []
    for arr in chunks:
        arr = arr.cast(pa.large_string())
        n = len(arr)
        if n == 0:
            continue
        if arr.null_count:
            raise InputError("a passage id is missing", field="id")
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, dtype=np.uint8)
        if (data[offsets[0] : offsets[-1]] == 0).any():
            raise InputError("a passage id contains a NUL character", field="id")
        starts, lens = offsets[:-1], np.diff(offsets)
        width = max(1, int(lens.max()))
        out = np.zeros((n, width), dtype=np.uint8)
        cols = np.arange(width)
        for a in range(0, n, 1 << 18):  # vectorised gather of each id into a fixed-width row
            s, ln = starts[a : a + (1 << 18), None], lens[a : a + (1 << 18), None]
            mask = cols < ln
            out[a : a + (1 << 18)][mask] = data[(s + cols)[mask]]
        parts.append(out.view(f"S{width}").reshape(-1))
    if not parts:
        return np.zeros(0, dtype="S1")
    width = max(p.dtype.itemsize for p in parts)
    return np.concatenate([p.astype(f"S{width}") for p in parts])


class StoreWriter:
    """Writes a text store chunk by chunk (an index build, index/corpus.py): `write` appends passages
    [passage_id, title, text] to the Arrow file; `close`; `sorted_ids` reads the id column back from the
    memory map as one sorted numpy array (duplicates are equal neighbours); `finish` writes the id -> row
    map, first dropping the rows `keep` marks False (the one case where the text is written twice)."""

    def __init__(self, out: Path, *, batch_rows: int = 65536):
        import pyarrow as pa

        self.out, self.batch_rows, self.count = Path(out), batch_rows, 0
        self.sink = pa.OSFile(str(self.out / TEXT_FILE), "wb")
        self.writer = None

    def write(self, passages: pl.DataFrame) -> None:
        import pyarrow as pa

        table = passages.select(list(PASSAGES)).cast(PASSAGES).to_arrow()
        if self.writer is None:
            self.writer = pa.ipc.new_file(self.sink, table.schema)
        self.writer.write_table(table, max_chunksize=self.batch_rows)
        self.count += table.num_rows

    def close(self) -> None:
        if self.writer is None and not self.sink.closed:
            self.write(pl.DataFrame(schema=PASSAGES))
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if not self.sink.closed:
            self.sink.close()

    def _reader(self):
        import pyarrow as pa

        return pa.ipc.open_file(pa.memory_map(str(self.out / TEXT_FILE), "r"))

    def sorted_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids sorted, the rows that sort them): np.argsort, stable, so among equal ids the first row comes
        first."""
        reader = self._reader()
        ids = id_array(reader.read_all().column("passage_id")) if reader.num_record_batches else np.zeros(0, "S1")
        order = np.argsort(ids, kind="stable")
        return ids[order], order

    def finish(self, ids_sorted: np.ndarray, order: np.ndarray, keep: np.ndarray | None = None) -> dict:
        """Write the id -> row map; with `keep`, first rewrite the Arrow file without the dropped rows."""
        import pyarrow as pa

        if keep is not None and not keep.all():
            reader, tmp = self._reader(), self.out / (TEXT_FILE + ".tmp")
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, reader.schema) as writer:
                start = 0
                for i in range(reader.num_record_batches):
                    batch = reader.get_batch(i)
                    mask = keep[start : start + batch.num_rows]
                    writer.write_batch(batch.filter(pa.array(mask)))
                    start += batch.num_rows
            del reader
            tmp.replace(self.out / TEXT_FILE)
            new_row = np.cumsum(keep) - 1
            kept = keep[order]
            ids_sorted, order = ids_sorted[kept], new_row[order[kept]]
        np.save(self.out / IDS_FILE, ids_sorted)
        np.save(self.out / ROWS_FILE, order.astype(np.int64))
        return {"file": TEXT_FILE, "ids": IDS_FILE, "rows": ROWS_FILE, "format": "arrow-ipc"}


def write_store(passages: pl.DataFrame, out: Path, *, batch_rows: int = 65536) -> dict:
    """Write passages [passage_id, title, text] (ids unique) as a text store into folder `out`; return its
    manifest part."""
    writer = StoreWriter(Path(out), batch_rows=batch_rows)
    try:
        writer.write(passages)
    finally:
        writer.close()
    return writer.finish(*writer.sorted_ids())


class PassageStore:
    """An opened text store (see the module docstring). `lookup(ids)` -> passages in the given order."""

    def __init__(self, folder: Path, files: dict | None = None):
        import pyarrow as pa

        files = files or {"file": TEXT_FILE, "ids": IDS_FILE, "rows": ROWS_FILE}
        self.folder = Path(folder)
        paths = [self.folder / files[k] for k in ("file", "ids", "rows")]
        for p in paths:
            if not p.is_file():
                raise InputError(f"the passage store is incomplete: '{p.name}' is missing", path=str(self.folder))
        try:  # record batches point into the map (zero-copy); a lookup reads only the batches it needs
            self.reader = pa.ipc.open_file(pa.memory_map(str(paths[0]), "r"))
        except pa.ArrowInvalid as exc:
            raise InputError(f"not an Arrow IPC passage file: {exc}", path=str(paths[0])) from None
        sizes = [self.reader.get_batch(i).num_rows for i in range(self.reader.num_record_batches)]
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.ids = np.load(paths[1], mmap_mode="r")
        self.rows = np.load(paths[2], mmap_mode="r")
        if not (len(self.ids) == len(self.rows) == int(self.starts[-1])):
            raise InputError("the passage store's files disagree on the passage count", path=str(self.folder))

    def __len__(self) -> int:
        return int(self.starts[-1])

    def row_of(self, passage_ids: list[str]) -> np.ndarray:
        """Rows of these ids in the Arrow file; InputError naming unknown ids."""
        if not passage_ids:
            return np.zeros(0, dtype=np.int64)
        if not len(self.ids):
            raise InputError(f"{len(passage_ids)} unknown passage id(s), e.g. {passage_ids[:3]}", path=str(self.folder))
        width = self.ids.dtype.itemsize
        keys = np.array([p.encode("utf-8") for p in passage_ids], dtype=object)
        too_long = np.array([len(k) > width for k in keys], dtype=bool)
        keys = keys.astype(f"S{width}")
        pos = np.minimum(np.searchsorted(self.ids, keys), len(self.ids) - 1)
        bad = too_long | (self.ids[pos] != keys)
        if bad.any():
            missing = [p for p, b in zip(passage_ids, bad) if b]
            raise InputError(f"{len(missing)} unknown passage id(s), e.g. {missing[:3]}", path=str(self.folder))
        return np.asarray(self.rows[pos], dtype=np.int64)

    def lookup(self, passage_ids) -> pl.DataFrame:
        """passage ids -> passages [passage_id, title, text], one row per id in the given order."""
        return self.take(self.row_of([str(p) for p in passage_ids]))

    def take(self, rows) -> pl.DataFrame:
        """Rows of the Arrow file -> passages [passage_id, title, text], in the given order."""
        import pyarrow as pa

        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return pl.DataFrame(schema=PASSAGES)
        # per record batch: Table.take over the whole file would first combine every chunk (a full copy)
        batch = np.searchsorted(self.starts, rows, side="right") - 1
        pieces, where = [], []
        for b in np.unique(batch):
            sel = np.flatnonzero(batch == b)
            pieces.append(self.reader.get_batch(int(b)).take(pa.array(rows[sel] - self.starts[b])))
            where.append(sel)
        got = pl.from_arrow(pa.Table.from_batches(pieces)).cast(PASSAGES)
        return got[np.argsort(np.concatenate(where), kind="stable")]

    def all(self) -> pl.DataFrame:
        """Every passage as a DataFrame (a copy in RAM: for small indexes and tools, not for runs)."""
        return pl.from_arrow(self.reader.read_all()).cast(PASSAGES)
