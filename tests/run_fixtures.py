"""A run directory written by hand for tests of its readers: the frozen config of `config.load` and
tables in the run's schemas (batch/run/rundir.py TABLE_SCHEMAS), the columns a test leaves out as nulls.
Also what the real-engine runs (test_toc_real, test_cluster) share: their small settings, as overrides
and as a --config TOML, and the comparison of two run directories' tables."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from clarify import schemas
from clarify.batch import config
from clarify.batch.run.rundir import TABLE_SCHEMAS, RunDir

# Small trees and short outputs: the real engine on CPU stays quick.
SMALL = {"toc.max_expansions": 3, "toc.clarify_max_tokens": 96, "toc.answer_max_tokens": 96,
         "toc.n_demos": 3}
# The tables two runs over the same completions write alike (llm_calls too, but for `cached`).
TABLES = ("nodes", "hits", "answers", "spans", "passages", "scores")


def small_toml(path: Path, head: str = "", toc: str = "") -> Path:
    """SMALL as a --config file at `path`: `head` (top-level settings, TOML lines) before its [toc]
    table, `toc` (more [toc] lines) after SMALL's."""
    path.write_text(head + "[toc]\n" + "".join(f"{k.split('.')[1]} = {v}\n" for k, v in SMALL.items()) + toc)
    return path


def same_tables(a: Path, b: Path) -> None:
    """The run directories `a` and `b` hold equal TABLES, and equal llm_calls but for `cached`.

    One column is compared to its precision instead: `hits.score`, rounded to 5 decimals where it is
    computed (batch/toc/program.py rank_by_scores). The encoder embeds a node's question in a batch with
    whatever other questions are pending, and the batch's shape moves the float32 result by ~1e-7, so a
    score that lies that close to a rounding boundary is recorded one unit apart (seen: 1 of 120 hits
    between two Ray workers and one process). Passages, ranks and everything downstream stay equal."""
    for name in TABLES:
        ta, tb = (pl.read_parquet(d / f"{name}.parquet") for d in (a, b))
        if name == "hits":
            assert ta.drop("score").equals(tb.drop("score")), name
            assert ((ta["score"] - tb["score"]).abs() <= 1.5e-5).all(), name
            continue
        assert ta.equals(tb), name
    ca, cb = (pl.read_parquet(d / "llm_calls.parquet").drop("cached") for d in (a, b))
    assert ca.equals(cb)


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
