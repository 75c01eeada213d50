"""Datasets as adapters: everything that differs between question sets lives in one module each.

`clarify run`, `clarify eval`, `clarify compare` and the config ask the registry (`get(name)`) and call a
`Dataset`; none of them tests a dataset's name. Shipped: `asqa` (ASQA, Stelmakh et al. 2022), `quotesum`
(QuoteSum/SEMQA, Schuster et al. 2023), `jsonl` (a user's JSONL of {qid, question}, no gold).

What an adapter answers (`Dataset`, the defaults below fit a searched dataset without gold):
- `default_file`: its shipped questions/gold file under `clarify.files.data_dir()` (None: the user gives one);
- `load(path, split=)`: (questions [schemas.QUESTIONS + own columns], gold or None);
- `select(cfg, questions, pool)`: the questions a run answers, offset/limit applied (ASQA: not the demo pool's);
- `demo_file(path)`: the official-layout ASQA file its clarification demos come from (ASQA: its own file;
  others: None, the shipped ASQA dev set; batch/toc/demos.py `resolve_pool`);
- `splits(path)`: the splits a file holds (ASQA: its top-level keys; one file per split: ("dev",));
- `demos(split, path=, start=, stop=)`: its few-shot demos (fewshot.py records), read by the reader of `load`
  (ASQA: clarification demos, `Demo`; QuoteSum: SEMQA demos, `QuotedDemo`); batch/toc/demos.py picks them;
- `given_sources(questions)`: qid → the question's own numbered passages (QuoteSum), else {};
- `builds_trees`: False when a run answers from the given sources, with no index search and no tree;
- `quoted_gold`: its gold answers are SEMQA quoted answers (a run then loads the SEMQA demos);
- `answer_column`: which column of a run's answers.parquet is scored (ASQA: `answer_plain`);
- `canonical_markers(predictions)`: `clarify eval --canonical-markers` (QuoteSum's `[ k span ]`);
- `score(predictions, gold, nodes=, reader=)`: the per-question table; `summarize(per_q, gold)`: the summary.

Adding a dataset (e.g. AmbigQA), one new module and nothing else:
1. write `clarify/eval/datasets/ambigqa.py` with a `Dataset` subclass: `name`, `default_file` (ship the file
   under `data/` with a SOURCE.md), `load`, `score`/`summarize` if it has gold, `demos` if its file gives few-shot
   demos (read with `load`'s reader; override what else differs);
2. end the module with `register(AmbigQA())`;
3. add its module name to `BUILTIN` below so it is imported with the registry (a dataset outside the
   package registers itself the same way once its module is imported).
`clarify run --dataset`, `clarify eval --dataset` (datasets with gold) and the config's `dataset` check then
list it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clarify.errors import InputError

if TYPE_CHECKING:
    import polars as pl

    from clarify.fewshot import Demo, QuotedDemo
    from clarify.schemas import Passage

DEV = "dev"  # the split of a file with one split, and the split `load` and `clarify eval --split` read by default


class Dataset:
    """One question set. Subclasses set the class attributes and override what differs."""

    name: str = ""
    default_file: tuple[str, ...] | None = None  # under files.data_dir(); None: the user gives the file
    has_gold: bool = False
    builds_trees: bool = True  # searches the index and builds a tree per question
    quoted_gold: bool = False  # gold answers are SEMQA quoted answers
    answer_column: str = "answer"  # the column of a run's answers that is scored

    def default_path(self) -> Path | None:
        """The shipped file (`$CLARIFY_DATA` honoured), or None when the user must give one."""
        from clarify.files import data_dir

        return data_dir().joinpath(*self.default_file) if self.default_file else None

    def load(self, path: str | Path, *, split: str = DEV) -> tuple[pl.DataFrame, pl.DataFrame | None]:
        """(questions, gold or None) from `path`, in file order."""
        raise NotImplementedError

    def select(self, questions: pl.DataFrame, pool: Any, *, offset: int, limit: int) -> pl.DataFrame:
        """The questions a run answers (`pool`: its resolved clarification demo pool, batch/toc/demos.py `Pool`;
        `offset`, `limit`: the run's settings): offset..offset+limit-1, limit 0 every one from offset on; an
        InputError for a slice this dataset cannot answer."""
        return questions.slice(offset, limit or None)

    def demo_file(self, path: Path | None) -> Path | None:
        """The official-layout ASQA file the clarification demo pool reads when `demo_pool` names none, given
        the run's questions file `path`; None: the shipped ASQA dev set."""
        return None

    def splits(self, path: str | Path) -> tuple[str, ...]:
        """The splits `path` holds, as `load` and `demos` name them; one file per split: ("dev",)."""
        return (DEV,)

    def demos(self, split: str = DEV, *, path: str | Path | None = None, start: int = 0,
              stop: int | None = None) -> list[Demo] | list[QuotedDemo]:
        """Few-shot demos from instances start..stop-1 of `split` of `path` (default: the shipped file), in file
        order, read by the same reader as `load`; a slice counts every instance, demo or not."""
        raise InputError(f"dataset '{self.name}' has no few-shot demos", field="demo_pool")

    def given_sources(self, questions: pl.DataFrame) -> dict[str, list[Passage]]:
        """qid → the question's own passages, for datasets that come with them; {} for searched ones."""
        return {}

    def predictions(self, answers: pl.DataFrame) -> pl.DataFrame:
        """A run's answers table as the predictions [qid, answer] this dataset scores: `answer_column`
        (ASQA: `answer_plain`, markers removed), the answer itself where that is null."""
        import polars as pl

        return answers.select("qid", pl.coalesce(pl.col(self.answer_column), pl.col("answer")).alias("answer"))

    def canonical_markers(self, predictions: pl.DataFrame) -> pl.DataFrame:
        """Predictions [qid, answer] with quote markers rewritten into the official form (none: as given)."""
        return predictions

    def score(self, predictions: pl.DataFrame, gold: pl.DataFrame, *, nodes: pl.DataFrame | None = None,
              reader: Any = None) -> pl.DataFrame:
        """Per-question scores of predictions [qid, answer] (+ `missing`): one row per qid, one column per
        metric. nodes: the run's tree nodes (schemas.NODES) when there are any; reader: a QA reader."""
        raise InputError(f"dataset '{self.name}' has no gold answers to score against", field="dataset")

    def summarize(self, per_question: pl.DataFrame, gold: pl.DataFrame) -> pl.DataFrame:
        """One row per metric (schemas.METRICS)."""
        from clarify.eval.summary import summarize

        return summarize(per_question)


_REGISTRY: dict[str, Dataset] = {}
BUILTIN = ("asqa", "quotesum", "jsonl")  # modules of this package, imported with it


def register(dataset: Dataset) -> Dataset:
    """Make `dataset` known by its name (a later registration under the same name replaces it)."""
    if not dataset.name:
        raise ValueError(f"{type(dataset).__name__} has no name")
    _REGISTRY[dataset.name] = dataset
    return dataset


def unregister(name: str) -> None:
    """Forget a dataset (tests that register their own)."""
    _REGISTRY.pop(name, None)


def get(name: str) -> Dataset:
    """The dataset registered as `name`; InputError naming the known ones otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise InputError(f"unknown dataset {name!r}; known: {', '.join(names())}", field="dataset") from None


def names(*, with_gold: bool = False) -> tuple[str, ...]:
    """Registered dataset names, in registration order (`with_gold`: only those that can be scored)."""
    return tuple(n for n, d in _REGISTRY.items() if d.has_gold or not with_gold)


for _module in BUILTIN:
    importlib.import_module(f"{__name__}.{_module}")
