"""docs/results.md from bench/results/*.json: every measured number in the docs comes from its file.

    python bench/results_doc.py --write      # writes docs/results.md
    python bench/results_doc.py              # prints it

Each results file carries a `provenance` object (date, cpu, command, commit; `superseded_by` when a later
file replaces it): its table states them. Superseded measurements stay in their JSON and are rendered
under "Superseded". tests/test_results_doc.py regenerates the page and fails when it differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

from clarify.files import page_main

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
PAGE = REPO / "docs" / "results.md"
sys.path.insert(0, str(REPO / "bench"))
from provenance import Results, read_results  # noqa: E402

# file -> (title, what it measures); the order of the page
TITLES = {
    "make": ("`make test` and `make demo` wall times", "the two set-up commands on the machines this project ran on"),
    "engine": ("Engine: batched vs one prompt at a time", "32 prompts x 64 tokens, one `generate` (bench/bench_engine.py)"),
    "engine_threads": ("Engine thread settings", "tokens/s of one `generate` under OpenMP and core-binding settings"),
    "sched12": ("Schedulers, 12 ASQA questions", "the three schedulers and the one-`generate` ceiling, each arm computing everything"),
    "sched48": ("Schedulers, 48 ASQA questions", "the continuous scheduler against the ceiling"),
    "ray": ("Ray workers vs one engine in process", "12 ASQA questions, every arm computing everything"),
    "backends": ("The `openai` backend vs in-process vLLM", "ToC on the same questions through a running vLLM server"),
    "constrained": ("Constrained decoding", "ASQA dev 0-49 and all 91 QuoteSum dev questions, both embedded models, three arms"),
    "index": ("Retrieval on the embedded index", "AC@k of each retriever (first 500 ASQA dev questions) and search speed"),
    "encode": ("Encoding the embedded corpus", "batching by token count vs corpus order (1,000 passages)"),
    "avx2_emulation": ("The suite as an AVX2-only CPU runs it", "bench/emulate_avx2 on a faster CPU, calibrated against a real AVX2 EPYC (estimates marked)"),
    "shipped_embeddings_avx2": ("Shipped corpus vectors on an AVX2 CPU", "the shipped vectors re-encoded with AVX2 kernels"),
    "eval": ("Scoring speed and reproduced reference scores", "ASQA and QuoteSum scorers (bench/bench_eval.py)"),
    "scale": ("Index growth from 125k to 2M passages", "synthetic corpora; FAISS types; log-log fits to 21M (estimates)"),
    "build": ("Index builds from 125k to 1M passages", "corpus read, Lucene, encoding with a kill and resume"),
    "constrained_10q": ("Constrained decoding, 10 questions", "the first, smaller measurement"),
    "toc": ("Waves vs the per-question loop, 4 questions", "the wave scheduler before the continuous one"),
    "toc12": ("Waves vs the per-question loop, 12 questions", "the wave scheduler before the continuous one"),
    "paired": ("Paired bootstrap speed", "95 % paired-bootstrap intervals, 10,000 resamples, vectorised vs a plain loop (bench/bench_paired.py)"),
    "estimate": ("The demo's time estimate against the ToC time", "the probe's estimate, the re-estimate after the first tree and the actual ToC time (bench/bench_estimate.py); earlier rows: earlier probes"),
    "host": ("clarify's own work per LLM call", "a finished run replayed with no engine (bench/bench_host.py): ms per call by component, before and after the host cuts"),
    "host_avx2": ("clarify's own work per LLM call, as an AVX2-only CPU runs it", "bench/bench_host.py under bench/emulate_avx2 (this machine held to AVX2; the emulation ran ~1.8x faster than the real AVX2 EPYC: see the AVX2 section)"),
    "demo": ("The recorded `make demo`", "one run of `clarify demo`, its terminal output kept whole (the README's transcript is generated from it by bench/reproduce_doc.py)"),
    "simulate": ("GPU-speed engine simulator, 960 questions (ESTIMATE)", "a model, not a measurement: the replayed trees against a simulated H100 running Llama-3.1-8B (bench/bench_simulate.py); engine busy share and projected wall time"),
    "atsize": ("The largest runs the shipped data allows", "whole runs as a user runs them, in sessions stopped and resumed, watched from outside (bench/bench_atsize.py): what must hold at size"),
    "engine_ab": ("The real CPU engine through clarify, before and after the host cuts", "tokens/s of `clarify run` on 6 ASQA questions, constrained, the clarify of an earlier commit against a later one in alternating arms (bench/bench_engine_ab.py)"),
    "report_size": ("Report at full size", "a finished run's tables copied to 504 questions (bench/bench_report.py): `clarify report` seconds and MB, the first screen in headless chromium, `clarify show`, before and after closed questions were packed"),
    "grammar": ("Quote grammar compile time", "xgrammar compile of the `[k span]` grammar for 5,000 and 20,000 source words, capped and uncapped (bench/bench_grammar.py)"),
}


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
        return ", ".join(_fmt(x) for x in v)
    return " ".join(str(v).split()).replace("|", "\\|")


def _flat(d: dict, prefix: str = "") -> dict:
    """Nested dicts as dotted keys; lists of scalars stay one cell."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
            continue
        else:
            out[f"{prefix}{k}"] = v
    return out


def _table(rows: dict[str, dict], first: str = "") -> list[str]:
    """One row per key of `rows`, one column per dotted field any row has."""
    flat = {name: _flat(r) for name, r in rows.items()}
    cols = list(dict.fromkeys(c for r in flat.values() for c in r))
    lines = [f"| {first} | " + " | ".join(cols) + " |", "|" + " --- |" * (len(cols) + 1)]
    lines += [f"| {name} | " + " | ".join(_fmt(r.get(c)) for c in cols) + " |" for name, r in flat.items()]
    return lines


def _key_values(d: dict) -> list[str]:
    return ["| what | value |", "| --- | --- |", *(f"| {k} | {_fmt(v)} |" for k, v in _flat(d).items())]


def generic(doc: dict) -> str:
    """Scalars as one key/value table; each dict of dicts (arms, runs, sizes) and list of dicts as a table."""
    scalars, parts = {}, []
    for k, v in doc.items():
        if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
            parts += ["", f"**{k}**", "", *_table(v, k)]
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            parts += ["", f"**{k}**", "", *_table({str(i + 1): x for i, x in enumerate(v)}, "#")]
        else:
            scalars[k] = v
    head = _key_values(scalars) if _flat(scalars) else []
    return "\n".join([*head, *parts]).strip("\n")


def constrained(doc: dict) -> str:
    import bench_constrained

    out = [bench_constrained.table(doc["arms"])]
    if doc.get("paired"):
        out += ["", "Each constrained arm against the free one, question by question (mean difference and its 95 % "
                    "paired-bootstrap interval, 10,000 resamples):", "", bench_constrained.paired_table(doc["paired"])]
    return "\n".join(out)


def scale(doc: dict) -> str:
    import bench_scale

    return bench_scale.markdown(doc)


def build(doc: dict) -> str:
    import bench_build

    return bench_build.markdown(doc)


def atsize(doc: dict) -> str:
    import bench_atsize

    return bench_atsize.markdown(doc)


def make(doc: dict) -> str:
    cols = ("what", "when", "date", "cpu", "wall", "tests", "questions", "decoding", "note", "commit")
    lines = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r in doc["runs"]:
        lines.append("| " + " | ".join(_fmt(r.get(c)) if c in r else "" for c in cols) + " |")
    return "\n".join(lines)


def demo(doc: dict) -> str:
    lines = [f"{doc['wall_s']:.0f} s in all. {doc.get('note', '')}".strip(), "", "```", *doc["stdout"], "```"]
    return "\n".join(lines)


RENDER = {"atsize": atsize, "demo": demo, "constrained": constrained, "constrained_10q": constrained, "scale": scale, "build": build, "make": make}


def section(name: str, doc: Results) -> str:
    prov = doc.provenance
    if prov is None or not prov.complete:
        raise SystemExit(f"bench/results/{name}.json: needs a provenance object with date, cpu, command and commit")
    title, what = TITLES.get(name, (name, ""))
    lines = [f"### {title}", "", f"{what}." if what else "", "",
             f"- file: [bench/results/{name}.json](../bench/results/{name}.json)",
             f"- date: {prov.date}; commit: {prov.commit}",
             f"- CPU: {prov.cpu}",
             f"- command: `{prov.command}`"]
    if prov.superseded_by:
        lines.append(f"- superseded by: {prov.superseded_by}")
    lines += ["", RENDER.get(name, generic)(doc.body), ""]
    return "\n".join(lines)


def render() -> str:
    docs = {p.stem: read_results(p.stem, RESULTS) for p in sorted(RESULTS.glob("*.json"))}
    order = [n for n in TITLES if n in docs] + sorted(set(docs) - set(TITLES))
    current = [n for n in order if not (docs[n].provenance and docs[n].provenance.superseded_by)]
    old = [n for n in order if n not in current]
    out = ["# Measured results", "",
           "<!-- Generated by `python bench/results_doc.py --write` from bench/results/*.json; "
           "tests/test_results_doc.py fails when this page and the files disagree. Do not edit by hand. -->", "",
           "Every number on this page is read from a file under bench/results/, written by the bench script "
           "named in its `command`. Each table states the date, the CPU, the command and the commit it was "
           "measured at. Most were measured on 2-core cloud CPUs shared with other jobs: read ratios within "
           "one table, not single cells, and re-run the command on your machine. Commentary on what the "
           "numbers mean is on the task pages ([engines](engines.md), [scale](scale.md), "
           "[retrieval](retrieval.md), [running ToC](running-toc.md)).", "",
           "## Current", ""]
    out += [section(n, docs[n]) for n in current]
    out += ["## Superseded", "", "Kept as data; later measurements (named in each) replace them.", ""]
    out += [section(n, docs[n]) for n in old]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    return page_main(argv, PAGE, render, "print (or --write) docs/results.md from bench/results/*.json")

if __name__ == "__main__":
    sys.exit(main())
