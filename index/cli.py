"""`clarify index build | search | coverage` (registered by clarify.batch.cli).

Only argparse at import; heavy libraries load inside the handlers. These commands never run vLLM,
so they set OMP_WAIT_POLICY=PASSIVE before torch loads: MiniLM encoding on shared cores collapses 3-10x
without it (docs/architecture.md#omp_wait_policypassive-outside-vllm).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from clarify.console import home_logs
from clarify.errors import InputError, need_file
from clarify.files import write_atomic, write_parquet
from clarify.index.build import BuildOptions
from clarify.index.search import CANDIDATES, SEARCH_K, SEARCH_SEARCHER, SEARCHER_KINDS
from clarify.options import add_flag, flag_value


def _passive_omp() -> None:
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _ks(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--k wants comma-separated integers, got '{text}'") from exc
    if not ks or min(ks) < 1:
        raise argparse.ArgumentTypeError("--k values must be positive")
    return ks


BUILD_EPILOG = """\
examples:
  clarify index build --default                          the embedded index (what `make demo` builds)
  clarify index build --corpus passages.jsonl --out indexes/mine
  clarify index build --corpus a.jsonl b.parquet --out indexes/big --faiss ivf --skip-bad
  clarify index build --corpus wiki.jsonl --out indexes/wiki --faiss 'IVF{nlist},SQ8' --nprobe 64
  clarify index build --corpus psgs_w100.tsv --out indexes/wiki --device cuda     one worker per GPU
  clarify index build --corpus psgs_w100.tsv --out indexes/wiki --shard 0/4       on node 0 of 4, then
  clarify index merge-shards --out indexes/wiki SHARD_FOLDERS...                  and build without --shard

writes into --out: manifest.json (corpus checksums, settings, timings), passages.arrow with
passage_ids.npy and passage_rows.npy (the text, memory-mapped), lucene/ (BM25) and dense/ (FAISS index,
docid, embeddings.npy). --default builds into
$CLARIFY_HOME/index/wiki-default. Building again with the same files and settings does nothing (files
whose size and mtime are unchanged are not read again; --verify-corpus checksums them anyway); a
changed corpus or setting is refused unless --force. Logs: $CLARIFY_HOME/logs.
"""

MERGE_EPILOG = """\
example (each node built one share with --shard i/n and the same corpus and settings):
  clarify index merge-shards --out /data/wiki node0/.wiki.encoding node1/.wiki.encoding
  clarify index build --corpus psgs_w100.tsv --out /data/wiki --faiss 'IVF{nlist},SQ8'   assembles, encodes nothing

a share made from another corpus, encoder, batch size or device kind is refused (its job.json).
"""

SEARCH_EPILOG = """\
examples:
  clarify index search --query "who won the 2018 world cup" --k 5
  clarify index search --queries queries.jsonl --retriever bm25 --k 100 --out hits.parquet
  clarify index search --index /data/lucene-wiki --faiss-index /data/faiss-wiki --encoder /models/enc --query "..."

prints the hits with passage titles, or writes them (.parquet: qid, passage_id, score, rank, retriever) to --out.
"""

COVERAGE_EPILOG = """\
Answer coverage AC@k: the share of ASQA short answers found in the top-k passages, per retriever
(ToC appendix B.1).

example:
  clarify index coverage --k 5,10,20,100 --retrievers bm25,dense --out coverage.csv
"""


def register(sub) -> None:
    p = sub.add_parser("index", help="build / search the local passage index, measure answer coverage",
                       description="The local passage index: BM25 (Pyserini/Lucene) + dense (MiniLM, FAISS).")
    isub = p.add_subparsers(dest="index_command", required=True, metavar="COMMAND")
    logs = {"log_dir": home_logs}

    b = isub.add_parser("build", help="build an index (BM25 + dense) from passage files", epilog=BUILD_EPILOG)
    b.add_argument("--corpus", nargs="+", type=Path, help="JSONL {id,title,text} or {id,contents}, Parquet, TSV")
    b.add_argument("--out", type=Path, help="index directory to create")
    b.add_argument("--default", action="store_true", help="build the embedded default index into $CLARIFY_HOME")
    for f in dataclasses.fields(BuildOptions):  # what to build: the options' declared flags and defaults
        add_flag(b, f, default=f.default)
    b.add_argument("--shard", default=None, metavar="I/N",
                   help="encode only shard I of N (0-based) into the encoding folder beside --out and stop; "
                        "then `clarify index merge-shards` and build without --shard")
    b.add_argument("--force", action="store_true", help="rebuild when the corpus or settings changed")
    b.add_argument("--verify-corpus", action="store_true",
                   help="checksum every corpus file even when its size and mtime are those the index recorded "
                        "(by default an unchanged size and mtime is trusted: a re-run costs a stat)")
    b.set_defaults(func=cmd_build, **logs)

    m = isub.add_parser("merge-shards", help="copy the encoded chunks of --shard builds into one index's "
                                             "encoding folder (then build without --shard)", epilog=MERGE_EPILOG)
    m.add_argument("--out", type=Path, required=True, help="the index directory the full build will create")
    m.add_argument("shards", nargs="+", type=Path, help="the shard builds' encoding folders (.NAME.encoding)")
    m.set_defaults(func=cmd_merge_shards, **logs)

    s = isub.add_parser("search", help="search an index with a file of queries (or one --query)",
                        epilog=SEARCH_EPILOG)
    s.add_argument("--index", type=Path, default=None, help="index dir (default: the embedded default index)")
    s.add_argument("--faiss-index", type=Path, default=None, help="Pyserini FAISS dir to pair with a Lucene --index")
    s.add_argument("--encoder", default=None, help="query encoder dir (for --faiss-index)")
    s.add_argument("--queries", type=Path, help="JSONL/Parquet/TSV with qid and query (or id / question) columns")
    s.add_argument("--query", help="a single query")
    s.add_argument("--k", type=int, default=SEARCH_K, help="hits per query")
    s.add_argument("--retriever", choices=SEARCHER_KINDS, default=SEARCH_SEARCHER.value,
                   help="bm25 (Lucene), dense (FAISS), hybrid (their top --candidates fused by reciprocal rank) "
                        "or rerank (that union rescored by --cross-encoder, else the dense encoder's cosine); "
                        "docs/retrieval.md#searchers-and-the-reranker")
    s.add_argument("--candidates", type=int, default=CANDIDATES, help="per-retriever candidates for hybrid/rerank")
    s.add_argument("--cross-encoder", default=None, help="local CrossEncoder dir for rerank")
    s.add_argument("--out", type=Path, help="write hits here (.parquet); else print them")
    s.set_defaults(func=cmd_search, **logs)

    c = isub.add_parser("coverage", help="AC@k of each retriever on ASQA (ToC appendix B.1)",
                        epilog=COVERAGE_EPILOG)
    c.add_argument("--dataset", choices=["asqa"], default="asqa",
                   help="the question set whose short answers are looked for (ASQA only)")
    c.add_argument("--data", type=Path, default=None, help="ASQA json (default: data/asqa/dev.json)")
    c.add_argument("--first", type=int, default=500, help="first N questions (default 500)")
    c.add_argument("--k", type=_ks, default=[5, 10, 20, 100], metavar="K,...",
                   help="comma-separated cut-offs: AC@k is measured in the top k passages for each")
    c.add_argument("--index", type=Path, default=None, help="index dir (default: the embedded default index)")
    c.add_argument("--retrievers", default="bm25,dense,hybrid,rerank",
                   help=f"comma-separated searchers to measure, each one of {', '.join(SEARCHER_KINDS)} "
                        "(as `clarify index search --retriever`)")
    c.add_argument("--candidates", type=int, default=CANDIDATES, help="per-retriever candidates for hybrid/rerank")
    c.add_argument("--cross-encoder", default=None, help="local CrossEncoder dir for rerank")
    c.add_argument("--out", type=Path, help="also write the table (.parquet, .csv or .json)")
    c.set_defaults(func=cmd_coverage, **logs)


def build_options(args: argparse.Namespace) -> dict:
    """BuildOptions' values from the parsed flags, the declared default where a switch is off."""
    return {f.name: f.default if (value := flag_value(args, f)) is None else value
            for f in dataclasses.fields(BuildOptions)}


def cmd_build(args) -> int:
    _passive_omp()
    from clarify.index.build import BuildOptions, build_index
    from clarify.index.default import ensure_default_index
    from clarify.index.local import open_index

    if args.default:
        out = ensure_default_index()
    else:
        if not args.corpus or not args.out:
            raise InputError("index build needs --corpus FILE... and --out DIR (or --default)")
        opts = BuildOptions(**build_options(args))
        from clarify.index.encode import parse_shard

        shard = parse_shard(args.shard)
        out = build_index(args.corpus, args.out, options=opts, force=args.force, verify=args.verify_corpus,
                          shard=shard)
        if shard is not None:
            print(f"shard {args.shard}: encoded chunks in {out}")
            return 0
    m = open_index(out).manifest
    skipped = m.passages.skipped or {}
    print(f"index {out}: {m.passages.count} passages"
          + (f", skipped {sum(skipped.values())} bad rows {skipped}" if skipped else "")
          + (f", bm25 {m.bm25.documents} docs" if m.bm25 else "")
          + (f", dense {m.dense.vectors}x{m.dense.dim} {m.dense.faiss}" if m.dense else "")
          + f", timings {m.timings}")
    return 0


def cmd_merge_shards(args) -> int:
    from clarify.index.encode import encoding_dir, merge_shards

    target = encoding_dir(args.out)
    print(f"{merge_shards(target, args.shards)} encoded chunks in {target}")
    return 0


QID_COLUMNS = ("qid", "id", "sample_id")
QUERY_COLUMNS = ("query", "question", "ambiguous_question")


def read_queries(path: Path):
    """Queries file -> [qid, query]. JSONL / Parquet / TSV; columns qid|id and query|question. A file that
    cannot be read (a broken Parquet file, a TSV line with another number of fields than its header, a
    JSONL line that is no object) is one InputError naming the file, and the line where there is one."""
    import polars as pl

    path = Path(path)
    need_file(path, "queries file")
    name = path.name.lower()
    if name.endswith(".parquet"):
        try:
            df = pl.read_parquet(path)
        except Exception as exc:  # polars and pyarrow raise several types for a damaged or foreign file
            raise InputError(f"cannot read Parquet: {str(exc).splitlines()[0][:200]}", path=str(path)) from None
    elif name.endswith(".tsv"):
        df = _read_tsv_queries(path)
    elif name.endswith((".jsonl", ".json")):
        return _read_jsonl_queries(path)
    else:
        raise InputError("unknown queries format (use .jsonl, .parquet or .tsv)", path=str(path))
    qid = next((c for c in QID_COLUMNS if c in df.columns), None)
    query = next((c for c in QUERY_COLUMNS if c in df.columns), None)
    if qid is None or query is None:
        raise InputError(f"queries need a qid (or id) and a query (or question) column; got {df.columns}", path=str(path))
    return df.select(pl.col(qid).cast(pl.String).alias("qid"), pl.col(query).cast(pl.String).alias("query"))


def _read_tsv_queries(path: Path):
    """A TSV of queries, every field a string; a line with another field count than the header names it."""
    import polars as pl

    try:
        return pl.read_csv(path, separator="\t", infer_schema=False, quote_char=None)
    except (pl.exceptions.PolarsError, UnicodeDecodeError) as exc:
        with open(path, "rb") as fh:
            width = None
            for line_no, raw in enumerate(fh, start=1):
                try:
                    fields = raw.decode("utf-8").rstrip("\r\n").split("\t")
                except UnicodeDecodeError as bad:
                    raise InputError(f"not UTF-8 ({bad.reason} at byte {bad.start} of the line)", path=str(path),
                                     line=line_no) from None
                if width is None:
                    width = len(fields)
                    if len(set(fields)) < width:
                        raise InputError("the header names a column more than once", path=str(path),
                                         line=1) from None
                elif len(fields) != width and raw.strip():
                    raise InputError(f"expected {width} tab-separated fields (as the header), got {len(fields)}",
                                     path=str(path), line=line_no) from None
        raise InputError(f"cannot read TSV: {str(exc).splitlines()[0][:200]}", path=str(path)) from None


def _read_jsonl_queries(path: Path):
    """JSONL queries through the one JSONL reader (jsonl.py): each line an object with an id and a string query."""
    import polars as pl

    from clarify.jsonl import iter_jsonl, record_id

    qids, queries = [], []
    for line_no, obj in iter_jsonl(path, wording={"bad_json": "broken JSON line"}):
        key = next((c for c in QUERY_COLUMNS if c in obj), None)
        qid = record_id(obj, path, line_no, QID_COLUMNS)
        if qid is None or key is None:
            raise InputError(f"queries need a qid (or id) and a query (or question) field; got {sorted(obj)[:6]}",
                             path=str(path), line=line_no)
        if not isinstance(obj[key], str):
            raise InputError(f"a query must be a string, got {type(obj[key]).__name__}", path=str(path),
                             line=line_no, field=key)
        qids.append(qid)
        queries.append(obj[key])
    return pl.DataFrame({"qid": qids, "query": queries}, schema={"qid": pl.String, "query": pl.String})


def _open(args):
    from clarify.index.default import ensure_default_index
    from clarify.index.local import open_index

    path = args.index if args.index is not None else ensure_default_index()
    index = open_index(path, faiss_dir=getattr(args, "faiss_index", None), encoder=getattr(args, "encoder", None))
    if getattr(args, "faiss_index", None):
        index.check_attached()  # its docids are passages of this index (LocalIndex.check_attached)
    return index


def cmd_search(args) -> int:
    _passive_omp()
    import polars as pl

    if (args.queries is None) == (args.query is None):
        raise InputError("index search needs exactly one of --queries FILE or --query TEXT")
    queries = read_queries(args.queries) if args.queries else pl.DataFrame({"qid": ["q"], "query": [args.query]})
    idx = _open(args)
    searcher = idx.searcher(args.retriever, args.candidates, cross_encoder=args.cross_encoder)
    hits = searcher.search(queries, args.k)
    print(f"# {searcher.name}: {hits.height} hits for {queries.height} queries", file=sys.stderr)
    if args.out:
        write_parquet(hits, args.out)
        print(f"wrote {args.out}")
    else:
        from clarify.errors import printable

        shown = hits.join(idx.passage_lookup(hits["passage_id"].unique().to_list()), on="passage_id", how="left",
                          maintain_order="left").with_columns(pl.col("text").str.slice(0, 80))
        # titles and texts as the terminal may show them: control characters escaped (console.printable)
        shown = shown.with_columns(pl.col("title", "text").map_elements(printable, return_dtype=pl.String))
        with pl.Config(tbl_rows=min(shown.height, 200), fmt_str_lengths=80, tbl_width_chars=200):
            print(shown.select("qid", "rank", "score", "passage_id", "title", "text"))
    return 0


def cmd_coverage(args) -> int:
    _passive_omp()
    import polars as pl

    from clarify.asqa_file import load_asqa, shipped_path
    from clarify.index.coverage import answer_coverage, coverage_table, retrieval_inputs

    data = args.data or shipped_path()  # --dataset: asqa, the only set with short answers to look for
    queries, gold = retrieval_inputs(*load_asqa(data), first=args.first)
    idx = _open(args)
    per_q = []
    for kind in [r.strip() for r in args.retrievers.split(",") if r.strip()]:
        searcher = idx.searcher(kind, args.candidates, cross_encoder=args.cross_encoder)
        hits = searcher.search(queries, max(args.k))
        cov = answer_coverage(hits, idx.passage_lookup(hits["passage_id"].unique().to_list()), gold, args.k)
        per_q.append(cov.with_columns(pl.lit(kind).alias("retriever"), pl.lit(searcher.name).alias("searcher")))
    table = coverage_table(pl.concat(per_q))
    wide = table.pivot(on="k", index="retriever", values="ac", sort_columns=True)
    wide = wide.rename({c: f"AC@{c}" for c in wide.columns if c != "retriever"})
    print(f"AC@k (%), {args.dataset} first {queries.height} questions, {gold.height} qa_pairs; index {idx.path}")
    with pl.Config(tbl_rows=20, float_precision=1):
        print(wide)
    if args.out:
        suffix = args.out.suffix.lower()
        write = table.write_parquet if suffix == ".parquet" else table.write_csv if suffix == ".csv" else table.write_json
        write_atomic(args.out, write)
    return 0
