"""A run directory written by hand for tests of its readers: the frozen config of `config.load` and
tables in the run's schemas (batch/rundir.py TABLE_SCHEMAS), the columns a test leaves out as nulls."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from clarify import schemas
from clarify.batch import config
from clarify.batch.rundir import TABLE_SCHEMAS, RunDir


def full_table(df: pl.DataFrame, name: str) -> pl.DataFrame:
    """`df` with every column of the run table `name`: the missing ones null, all cast and ordered."""
    schema = schemas.SCHEMAS[TABLE_SCHEMAS[name]]
    df = df.with_columns([pl.lit(None, dtype).alias(c) for c, dtype in schema.items() if c not in df.columns])
    return schemas.conform(df.with_columns([pl.col(c).cast(t) for c, t in schema.items()]), TABLE_SCHEMAS[name])


def write_run(path: Path, settings: dict | None = None, summary: dict | None = None,
              **tables: pl.DataFrame) -> Path:
    """config.json from `settings` (dotted overrides of the defaults), the given tables, summary.json."""
    rd = RunDir(path)
    rd.path.mkdir(parents=True, exist_ok=True)
    rd.freeze(config.load(None, settings or {}).to_dict(), {})
    for name, df in tables.items():
        rd.write_table(name, full_table(df, name))
    if summary is not None:
        from clarify.files import write_json

        write_json(summary, rd.path / "summary.json")
    return rd.path
