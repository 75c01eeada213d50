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


def id_bytes(ids, width: int | None = None) -> np.ndarray:
    """Passage ids as a numpy fixed-width bytes array (UTF-8)."""
    encoded = [str(p).encode("utf-8") for p in ids]
    if any(b"\0" in b for b in encoded):
        raise InputError("a passage id contains a NUL character", field="id")
    return np.array(encoded, dtype=f"S{width or max([len(b) for b in encoded] + [1])}")


def write_store(passages: pl.DataFrame, out: Path, *, batch_rows: int = 65536) -> dict:
    """Write passages [passage_id, title, text] as a text store into folder `out`; return its manifest part."""
    import pyarrow as pa

    out = Path(out)
    table = passages.select(list(PASSAGES)).to_arrow()
    with pa.OSFile(str(out / TEXT_FILE), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=batch_rows)
    ids = id_bytes(passages["passage_id"].to_list())
    order = np.argsort(ids, kind="stable")
    np.save(out / IDS_FILE, ids[order])
    np.save(out / ROWS_FILE, order.astype(np.int64))
    return {"file": TEXT_FILE, "ids": IDS_FILE, "rows": ROWS_FILE, "format": "arrow-ipc"}


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
        import pyarrow as pa

        ids = [str(p) for p in passage_ids]
        rows = self.row_of(ids)
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
