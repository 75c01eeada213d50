"""One place that opens a run's inputs and resources.

`prepare(cfg)` resolves everything a run reads, once, into a `PreparedRun`: the demo pool (made concrete:
config.json records it, never `auto`), the dataset adapter (eval/datasets/), the questions it answers and
their gold, the index (opened lazily, its paths and dimensions checked) and `inputs`, what pins each input
in inputs.json (the questions file's sha256, the demo pool's, the index's fingerprint, the model's — one
resolution and one fingerprint of the model folder, or the server's address and the model it reports,
local_llm/backends.py). The pipeline (batch/run/pipeline.py), the demo (batch/cli/commands.py) and the Ray workers
(batch/run/cluster.py, `for_worker`: the driver's pins, not a second resolution) all start from one;
`open_resources` then opens the heavy parts a tree needs (encoder, demo pools, the cached engine, the
searcher) only when there is work left.

`prepare` and `for_worker` read the whole run config; what they hand on is its parts, each to the stage that
reads it (`PreparedRun`): the tree program its `TreeSettings`, the searcher its `[retrieval]` table, the engine
its `[model]` table. The whole config stays with the pipeline, which freezes it in config.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from clarify import schemas
from clarify.batch.config import AnswerStyle, ModelConfig, RetrievalConfig, RunConfig
from clarify.batch.run.records import ATTACHED, MODEL, Pin, RunInputs
from clarify.batch.run.rundir import PART_TABLES
from clarify.batch.toc.constraints import requested
from clarify.batch.toc.demos import Pool, resolve_pool
from clarify.batch.toc.program import Resources, TreeRows
from clarify.batch.toc.settings import TreeSettings
from clarify.errors import InputError
from clarify.eval import datasets
from clarify.files import sha256 as file_sha256
from clarify.schemas import Passage

EngineFactory = Callable[[ModelConfig], Any]  # the `[model]` table → an engine


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedRun:
    """A run's inputs, resolved once (`prepare`), and the parts of its config the stages after it read."""

    dataset: datasets.Dataset
    pool: Pool
    questions: pl.DataFrame  # the questions this run answers (offset/limit, not the demo pool's)
    gold: pl.DataFrame | None
    index: Any  # the opened (lazy) index
    inputs: dict[str, Pin]  # inputs.json: what pins each input
    tree: TreeSettings  # what each tree reads (the drivers, batch/run/scheduler.py; the quoted demos)
    retrieval: RetrievalConfig  # the searcher's table ([retrieval])
    model: ModelConfig  # the engine's table ([model])
    # how the engine is opened: `engine_for` on the pinned model unless a caller (a test, a worker) gives one
    engine_factory: EngineFactory | None = None

    @property
    def model_path(self) -> str | None:
        """The model folder the run pinned (None for a server or a caller's engine)."""
        pin = self.inputs.get(MODEL)
        return pin.path if pin else None

    def open_engine(self):
        if self.engine_factory is not None:
            return self.engine_factory(self.model)
        return engine_for(self.model, self.tree, pin=self.inputs.get(MODEL))


def prepare(cfg: RunConfig, *, index=None, engine_factory: EngineFactory | None = None) -> PreparedRun:
    """Resolve a run's inputs once, before anything is frozen or loaded: the questions (offset past the end
    refused), the demo pool (an empty one refused), the index and the model. An index or engine factory given
    by a caller (tests) is taken as given; an embedded model then is not prepared."""
    ds, pool, questions, gold = _questions(cfg)
    inputs = {"questions": Pin.of({"path": str(cfg.questions_file()), "sha256": file_sha256(cfg.questions_file())})}
    # the ASQA file the clarification demos come from, pinned like the questions (batch/toc/demos.py)
    demo_pool = inputs["demo_pool"] = Pin.of(pool.identity())
    if not demo_pool.demos:
        raise InputError(f"the demo pool {pool.spec} holds no demos", path=demo_pool.path, field="demo_pool")
    if index is None:
        index = open_run_index(cfg.index, cfg.retrieval)
    inputs["index"] = Pin.of(index_identity(index))
    from clarify.index.fingerprint import index_pins
    from clarify.local_llm import backends
    from clarify.local_llm.models import EMBEDDED, check_model_dir, model_fingerprint

    # a FAISS folder and encoder attached from elsewhere: pinned like the model
    inputs |= {k: Pin.of(v) for k, v in index_pins(index).items()}
    if cfg.retrieval.cross_encoder:  # a reranker changes every ranking: its files are pinned like the model's
        inputs["cross_encoder"] = Pin.of({"path": cfg.retrieval.cross_encoder,
                                          "fingerprint": model_fingerprint(check_model_dir(cfg.retrieval.cross_encoder))})
    tree = TreeSettings.of(cfg)
    if engine_factory is not None and cfg.model.model in EMBEDDED:
        inputs[MODEL] = Pin.of({"name": cfg.model.model})
    else:  # a model folder's fingerprint, or a server's address and the model it reports (local_llm/backends.py)
        inputs[MODEL] = Pin.of(backends.get(cfg.model.backend).identity(cfg.model, constrained=requested(tree)))
    return PreparedRun(ds, pool, questions, gold, index, inputs, tree, cfg.retrieval, cfg.model, engine_factory)


def for_worker(cfg: RunConfig, questions: pl.DataFrame, pins: dict[str, Pin],
               engine_factory: EngineFactory | None = None) -> PreparedRun:
    """A Ray worker's run (batch/run/cluster.py): the driver's whole frozen config (its pool already concrete; a
    worker re-opens the run from it: dataset, questions file and pool, `[retrieval]`, `[model]`, the tree's
    settings), the questions it was handed and the driver's pins (inputs.json) — exactly the index, FAISS
    folder, encoder and model folder the driver resolved, refused when this node's copies differ
    (`open_run_index`)."""
    index = open_run_index(cfg.index, cfg.retrieval, pins)
    return PreparedRun(datasets.get(cfg.dataset), pool_of(cfg), questions, None, index, pins, TreeSettings.of(cfg),
                       cfg.retrieval, cfg.model, engine_factory)


def load_questions(cfg: RunConfig) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """(questions, gold-or-None) for the configured dataset (eval/datasets/): the questions the run answers
    (offset:offset+limit, limit 0 all; ASQA: none of its demo pool, `Dataset.select`)."""
    _, _, questions, gold = _questions(cfg)
    return questions, gold


def pool_of(cfg: RunConfig) -> Pool:
    """A run config's concrete clarification demo pool (batch/toc/demos.py `resolve_pool`: its `demo_pool`, read
    with its dataset and questions file)."""
    return resolve_pool(cfg.demo_pool, dataset=cfg.dataset, questions_file=cfg.questions_file())


def _questions(cfg: RunConfig) -> tuple[datasets.Dataset, Pool, pl.DataFrame, pl.DataFrame | None]:
    """The dataset, the demo pool, and the questions the run answers with their gold (`load_questions`)."""
    pool, ds, path = pool_of(cfg), datasets.get(cfg.dataset), cfg.questions_file()
    questions, gold = ds.load(path)
    if cfg.offset >= questions.height:
        raise InputError(f"offset {cfg.offset} is past the end: {path} has {questions.height} question(s)",
                         field="offset")
    return ds, pool, ds.select(questions, pool, offset=cfg.offset, limit=cfg.limit), gold


def searcher_identity(r: RetrievalConfig, index) -> dict:
    """What a searcher's hits depend on (the shared search cache's key, batch/run/search_cache.py): its kind,
    candidates and reranker (the frozen config's `[retrieval]`, `r`), and the index's manifest checksum."""
    from clarify.index.fingerprint import index_pins

    ident = {"searcher": r.searcher, "candidates": r.candidates, "cross_encoder": r.cross_encoder,
             "index": Pin.of(index_identity(index)).fingerprint}
    # attached index parts and FAISS search knobs join the key only when set: caches made before they existed stay valid
    ident |= {k: Pin.of(v).fingerprint for k, v in index_pins(index).items()}
    ident |= {k: v for k, v in (("nprobe", r.nprobe), ("ef_search", r.ef_search)) if v}
    return ident


def index_identity(index) -> dict:
    """An index's fingerprint: its manifest's corpus checksums and build settings (index/fingerprint.py), or
    the names and sizes of a prebuilt index's files; {} for a stand-in without a path."""
    path = getattr(index, "path", None)
    if path is None:
        return {}
    manifest = getattr(index, "manifest", None)  # an IndexManifest (index/manifest.py); None: a prebuilt index
    if manifest is not None:
        ident = json.dumps(manifest.identity(), sort_keys=True, default=str)
    else:  # a prebuilt index: its files' names, sizes, mtimes and sampled blocks (index/fingerprint.py `fingerprint`)
        from clarify.index.fingerprint import fingerprint

        ident = fingerprint(path)
    return {"path": str(path), "fingerprint": hashlib.sha256(ident.encode("utf-8")).hexdigest()}


def dense_options(r: RetrievalConfig):
    """How this process opens the FAISS part, from `[retrieval]` (index/local.py DenseOptions) and, for the
    device, the CPU/CUDA settings table (local_llm/settings.py: the GPU where faiss-gpu sees one)."""
    from clarify.index.local import DenseOptions
    from clarify.local_llm.settings import faiss_device
    from clarify.local_llm.vllm_engine import device_facts

    return DenseOptions(nprobe=r.nprobe, ef_search=r.ef_search, device=faiss_device(device_facts()))


def open_run_index(index: str, r: RetrievalConfig, pins: dict[str, Pin] | None = None):
    """The index a run uses: the config's `index` (else the embedded default, built once), with `[retrieval]`
    (`r`) `faiss_index` and `encoder` attached, opened lazily after every path and the encoder/index dimensions
    are checked. `pins`: the driver's inputs.json — a Ray worker opens exactly those paths and refuses
    them when their fingerprints differ from the driver's (another copy on another node)."""
    from clarify.index import ensure_default_index, open_index
    from clarify.index.fingerprint import index_pins

    pinned = RunInputs(pins or {}).pins  # a caller's JSON objects read as Pins; absent ones are empty Pins
    pin = {what: pinned.get(what) or Pin() for what in ATTACHED}
    if pins is not None:
        path = pin["index"].path
        faiss_dir = pin["faiss_index"].path or r.faiss_index or None
        encoder = pin["encoder"].path or r.encoder or None
    else:
        path, faiss_dir, encoder = index or ensure_default_index(), r.faiss_index or None, r.encoder or None
    index = open_index(path, faiss_dir=faiss_dir, encoder=encoder, dense_options=dense_options(r))
    if faiss_dir:  # its docids among the index's passages: refused before the run directory is made
        index.check_attached()
    if pins is not None and pin["index"].fingerprint:
        mine = RunInputs({"index": index_identity(index)} | index_pins(index)).pins
        for what in ATTACHED:
            want, have = pin[what], mine.get(what) or Pin()
            if want.fingerprint != have.fingerprint:
                raise InputError(f"this worker's {what.replace('_', ' ')} differs from the one the driver pinned "
                                 f"(fingerprint {str(have.fingerprint)[:12]} here, {str(want.fingerprint)[:12]} in "
                                 f"inputs.json): every node needs the same files at the same path",
                                 path=str(have.path or want.path))
    return index


def open_resources(run: PreparedRun, cache_dir: Path, *, search_cache: Path | None = None,
                   cache_name: str | None = None) -> Resources:
    """Encoder, demo pools, the cached engine and the searcher of a prepared run. The engine's completion
    cache is `cache_dir/cache_name`, read together with the other caches there (a cluster run's workers')."""
    from clarify.batch.toc.demos import KnnPool
    from clarify.local_llm.cache import DEFAULT_FILE, CachedEngine, union_of

    index = run.index
    fixed = run.dataset.given_sources(run.questions)
    passages = passage_store(fixed, index)
    embed = index.encoder.encode_queries  # remembered per run (index/dense.py QueryMemo)
    enc_id = getattr(index.encoder, "name", "encoder")
    # the whole pool is embedded once and cached by its questions' checksum (KnnPool): 4,353 train questions
    # cost seconds once, nothing on later runs
    demos = KnnPool(run.pool.demos(), embed, name="asqa-demos", encoder_id=enc_id)
    quoted = None
    if run.tree.answer_style == AnswerStyle.QUOTED or run.dataset.quoted_gold:
        quoted = KnnPool(datasets.get("quotesum").demos(), embed, name="quotesum-demos", encoder_id=enc_id)

    own = Path(cache_dir) / (cache_name or DEFAULT_FILE)
    engine = CachedEngine(run.open_engine(), own, also=union_of(cache_dir, own))
    searcher, rerank = None, None
    if run.dataset.builds_trees:
        r = run.retrieval
        cross = r.cross_encoder or None
        searcher = index.searcher(r.searcher, candidates=r.candidates, cross_encoder=cross)
        # the reranker every node's pool, the evidence and the answer passages are scored with: the
        # rerank searcher's own scorer, else the index's (run_toc.py:164 dsp's cross-encoder)
        rerank = (getattr(searcher, "scorer", None) or index.scorer(cross)).score
    if searcher is not None and search_cache is not None:
        from clarify.batch.run.search_cache import CachingSearcher

        searcher = CachingSearcher(searcher, search_cache, searcher_identity(run.retrieval, index))
    return Resources(engine=engine, searcher=searcher, passages=passages, embed=embed, demos=demos,
                     quoted_demos=quoted, fixed_passages=fixed, rerank=rerank)


def passages_only(run: PreparedRun) -> Resources:
    """What finishing a run whose trees are all written needs: the passages, no model."""
    fixed = run.dataset.given_sources(run.questions)
    return Resources(engine=None, searcher=None, passages=passage_store(fixed, run.index), embed=None,
                     demos=None, fixed_passages=fixed)


def passage_store(fixed: dict[str, list[Passage]], index) -> Callable[[list[str]], dict[str, Passage]]:
    """Passage ids → passages: a question's own sources (`Dataset.given_sources`), else the index's stored text."""
    given = {p.passage_id: p for ps in fixed.values() for p in ps}

    def passages(ids: list[str]) -> dict[str, Passage]:
        out = {i: given[i] for i in ids if i in given}
        rest = [i for i in ids if i not in out]
        if rest:
            for row in index.passage_lookup(rest).iter_rows(named=True):
                out[row["passage_id"]] = Passage(row["passage_id"], row["title"] or "", row["text"])
        return out

    return passages


def engine_for(model: ModelConfig, tree: TreeSettings, *, pin: dict | None = None, **placement):
    """The engine of a `[model]` table, from its backend (local_llm/backends.py): vLLM's process-wide engine
    (built once, then shared), or a client of a running server; `tree`: which of its steps decode under a
    grammar (batch/toc/constraints.py requested). `pin`: the run's pin of the model (inputs.json: the folder
    resolved and fingerprinted once). `placement`: where a cluster worker's engine runs its shards
    (batch/run/cluster.py), no result changes."""
    from clarify.local_llm import backends

    return backends.get(model.backend).open(model, pin=pin, constrained=requested(tree), **placement)


def tables(rows: list[TreeRows]) -> dict[str, pl.DataFrame]:
    """Finished trees' rows as one part's tables (batch/run/rundir.py `write_part`)."""
    return {name: schemas.frame((r for t in rows for r in getattr(t, name)), record)
            for name, record in PART_TABLES.items()}
