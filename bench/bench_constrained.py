"""Constrained decoding (batch/toc/constraints.py) measured on the embedded models: constraints off,
the DQ/DA format only, format + quotes; on ASQA dev (quoted style, the first N questions) and on QuoteSum
dev (its own sources, answers only). Every arm is its own process (`clarify run` through `pipeline.run`,
a fresh run directory and completion cache) on the same questions.

    .venv/bin/python bench/bench_constrained.py --asqa 50 --quotesum 91          # the issue's sizes
    .venv/bin/python bench/bench_constrained.py --asqa 0 --quotesum 10           # what 2 shared cores ran:
    .venv/bin/python bench/bench_constrained.py --append --asqa 10 --quotesum 0 --models smollm2-135m-instruct
    .venv/bin/python bench/bench_constrained.py --append --asqa 5 --quotesum 0 --models gemma3-270m

Per arm: parse-error rate of the clarifications (and how many were cut at max_tokens), valid nodes and
LLM calls per question, the dataset's metrics (ASQA: ROUGE-L, STR-EM, Answer-F1; QuoteSum: ROUGE-L,
Sem-F1, Sem-Rec, SEMQA; QuoteSum builds no tree, so its "format" arm would be its "off" arm and is not run), spans per answer, the share of spans verbatim as generated, the share of answers
with at least one span, engine tokens/s, and for the quote arms the grammar's compile time per prompt
(xgrammar, the model's tokenizer, no cache: what vLLM's backend pays for each answer prompt).

At the end, each constrained arm against the "off" arm of its model and dataset, question by question: the
mean difference of every per-question metric with its 95 % paired-bootstrap interval (`paired`; `--paired
WORK` computes it for a work folder kept from an earlier bench).

Writes bench/results/constrained.json after every arm (and prints the tables). The default sizes ran in one
sitting on an otherwise idle 2-core AMD EPYC (80 min); the earlier 10-question arms, run on shared cores
with the grammar versions they replaced, are kept in bench/results/constrained_10q.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from provenance import cpu_model  # bench/ is on sys.path when a script here runs

from clarify.options import JsonObject


@dataclass(frozen=True)
class Arm(JsonObject):
    """One arm of bench/results/constrained.json (`arm` writes it; `table`, bench/reproduce_doc.py and
    docs/results.md read it back): a model on a dataset with one constraint setting, and what its run measured.
    An arm that failed holds `error` (its last line) and no measures."""

    model: str = ""
    dataset: str = ""
    setting: str = ""  # a key of SETTINGS: off, format, format+quotes
    questions: int = 0
    engine_model_id: str | None = None
    wall_s: float | None = None
    engine_tokens_per_s: float | None = None
    clarify_calls: int | None = None
    parse_error_rate: float | None = None  # share of clarify calls with a parse error
    clarify_cut_at_max_tokens: int | None = None
    valid_nodes_per_question: float | None = None
    llm_calls_per_question: float | None = None
    metrics: dict[str, float] | None = None  # summary.json `metrics` (eval/summary.py)
    spans_per_answer: float | None = None
    share_verbatim: float | None = None
    share_answers_with_span: float | None = None
    quote_fidelity: dict | None = None  # summary.json `quote_fidelity`
    grammar_compile: dict | None = None  # format+quotes arms: `compile_cost`
    error: list[str] | None = None

    def metric(self, name: str) -> float | None:
        """A metric of the run's summary by its name (eval/summary.py: rouge_l, str_em, answer_f1, sem_f1, ...)."""
        return (self.metrics or {}).get(name)


def arms_of(doc: dict) -> list[Arm]:
    """The arms of a constrained.json body, as records."""
    return [Arm.of(a) for a in doc["arms"]]

SETTINGS = {
    "off": {},
    "format": {"toc.constrain_format": True},
    "format+quotes": {"toc.constrain_format": True, "answer.constrain_quotes": True},
}
MODELS = ("smollm2-135m-instruct", "gemma3-270m")


def arm(model: str, dataset: str, setting: str, limit: int, out: Path) -> dict:
    """One arm in this process: a run, then its measures."""
    import polars as pl

    from clarify.batch import config
    from clarify.batch.run.pipeline import run
    from clarify.batch.run.records import QuoteFidelity

    cfg = config.load(None, {"dataset": dataset, "limit": limit, "answer_style": "quoted", "model.model": model,
                             **SETTINGS[setting]})
    t0 = time.perf_counter()
    summary = run(cfg, out, progress=False)
    wall = time.perf_counter() - t0
    calls = pl.read_parquet(out / "llm_calls.parquet")
    clar = calls.filter(pl.col("step") == "clarify")
    n_q = summary.n_questions
    fid = summary.quote_fidelity or QuoteFidelity()
    n_ans = fid.n_answers or n_q
    got = Arm(
        model=model, engine_model_id=summary.engine_model_id, dataset=dataset, setting=setting,
        questions=n_q, wall_s=round(wall, 1), engine_tokens_per_s=summary.engine_tokens_per_s,
        clarify_calls=clar.height,
        parse_error_rate=round(clar["parse_error"].is_not_null().mean(), 4) if clar.height else None,
        clarify_cut_at_max_tokens=int((clar["finish_reason"] == "length").sum()) if clar.height else 0,
        valid_nodes_per_question=summary.valid_nodes_per_question,
        llm_calls_per_question=summary.llm_calls_per_question,
        metrics=summary.metrics,
        spans_per_answer=round((fid.n_spans or 0) / n_ans, 3) if n_ans else None,
        share_verbatim=fid.share_verbatim,
        share_answers_with_span=(None if fid.share_answers_without_spans is None
                                 else round(1 - fid.share_answers_without_spans, 4)),
        quote_fidelity=fid.to_json(),
        grammar_compile=compile_cost(cfg, out) if setting == "format+quotes" else None)
    return {k: v for k, v in got.to_json().items() if v is not None or k not in ("grammar_compile", "error")}


def compile_cost(cfg, out: Path) -> dict:
    """xgrammar compile time of each answer prompt's quotes grammar (and of the format grammar), with the
    model's tokenizer and no cache, as vLLM's xgrammar backend compiles them (backend_xgrammar.py)."""
    import polars as pl
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from clarify.batch.toc.constraints import quotes_grammar
    from clarify.batch.toc.format import format_grammar
    from clarify.local_llm.models import resolve_model
    from clarify.schemas import Passage

    tok = AutoTokenizer.from_pretrained(resolve_model(cfg.model.model))
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok), max_threads=8, cache_enabled=False)
    t0 = time.perf_counter()
    compiler.compile_grammar(format_grammar())
    format_ms = (time.perf_counter() - t0) * 1000
    passages = {r["passage_id"]: r for r in pl.read_parquet(out / "passages.parquet").iter_rows(named=True)}
    times, sizes = [], []
    for ids in pl.read_parquet(out / "answers.parquet")["passage_ids"]:
        g = quotes_grammar([Passage(p, passages[p]["title"] or "", passages[p]["text"]) for p in ids])
        t0 = time.perf_counter()
        compiler.compile_grammar(g)
        times.append((time.perf_counter() - t0) * 1000)
        sizes.append(len(g.encode()))
    times.sort()
    return {"format_ms": round(format_ms, 1), "quotes_prompts": len(times),
            "quotes_ms_mean": round(sum(times) / len(times), 1) if times else None,
            "quotes_ms_p50": round(times[len(times) // 2], 1) if times else None,
            "quotes_ms_max": round(times[-1], 1) if times else None,
            "quotes_grammar_kb_mean": round(sum(sizes) / len(sizes) / 1024, 1) if sizes else None}


def paired(work: Path, resamples: int = 10_000, seed: int = 0) -> list[dict]:
    """Each constrained arm against the "off" arm of its model and dataset, question by question: the mean
    difference of every metric (eval/ scores.parquet, the per-question values the summary averages) and
    its 95 % paired-bootstrap interval (eval/paired.py: the same resampled questions for both arms; percentile method).
    An interval that holds 0 says the arms differ by less than these questions can show. ROUGE-L here is
    the plain mean of the per-question values; the summary's is the official bootstrap mid (eval/summary.py),
    which differs from it by a few tenths."""
    import polars as pl

    from clarify.eval.paired import interval  # the product's paired bootstrap (eval/paired.py)

    arms = {}
    for d in sorted(p for p in work.iterdir() if (p / "scores.parquet").exists()):
        c = json.loads((d / "config.json").read_text())
        setting = ("format+quotes" if c["answer"]["constrain_quotes"] else "format") if c["toc"]["constrain_format"] \
            else ("quotes" if c["answer"]["constrain_quotes"] else "off")
        arms[(c["model"]["model"], c["dataset"], setting)] = pl.read_parquet(d / "scores.parquet")
    out = []
    for (model, dataset, setting), scores in arms.items():
        base = arms.get((model, dataset, "off"))
        if setting == "off" or base is None:
            continue
        for metric in METRIC_COLUMNS[dataset]:
            a = base.filter(pl.col("metric") == metric).select("qid", off=pl.col("value"))
            b = scores.filter(pl.col("metric") == metric).select("qid", on=pl.col("value"))
            both = a.join(b, on="qid").drop_nulls()
            if both.height == 0:
                continue
            mean, lo, hi = interval(both["off"].to_numpy(), both["on"].to_numpy(), resamples=resamples, seed=seed)
            out.append({"model": model, "dataset": dataset, "setting": setting, "metric": metric,
                        "questions": int(both.height), "off": round(float(both["off"].mean()), 2),
                        "on": round(float(both["on"].mean()), 2), "diff": round(mean, 2),
                        "ci95": [round(float(lo), 2), round(float(hi), 2)]})
    return out


def paired_table(rows: list[dict]) -> str:
    """The README's table of paired differences, one row per constrained arm and metric."""
    lines = ["| model | data | constraints | metric | q | off | on | on − off | 95 % CI |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model'].split('-')[0]} | {r['dataset']} | {r['setting']} | {r['metric']} | {r['questions']} | "
                     f"{r['off']:.1f} | {r['on']:.1f} | {r['diff']:+.1f} | {r['ci95'][0]:+.1f} … {r['ci95'][1]:+.1f} |")
    return "\n".join(lines)


def save_paired(result: dict, rows: list[dict], out: Path) -> None:
    """`rows` replace the paired rows of the same arm and metric in `result`, which is written to `out`
    and its paired table printed."""
    done = {(r["model"], r["dataset"], r["setting"], r["metric"]) for r in rows}
    result["paired"] = [r for r in result.get("paired", [])
                        if (r["model"], r["dataset"], r["setting"], r["metric"]) not in done] + rows
    out.write_text(json.dumps(result, indent=2))
    print(paired_table(result["paired"]), flush=True)


METRIC_COLUMNS = {"asqa": ("rouge_l", "str_em", "answer_f1"), "quotesum": ("rouge_l", "sem_f1", "sem_rec", "semqa")}


def table(results: list[dict]) -> str:
    """The README's Markdown table, one row per arm."""
    head = ("| model | data | constraints | q | parse err | cut | valid nodes/q | calls/q | ROUGE-L | STR-EM | "
            "Answer-F1 | Sem-F1 | Sem-Rec | SEMQA | spans/ans | verbatim | ans w/ span | tok/s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def f(v, nd=3):
        return "–" if v is None else (f"{v:.{nd}g}" if isinstance(v, float) else str(v))

    for r in map(Arm.of, results):
        cells = [r.model.split("-")[0], r.dataset, r.setting, r.questions,
                 f(r.parse_error_rate), r.clarify_cut_at_max_tokens,
                 f(r.valid_nodes_per_question), f(r.llm_calls_per_question),
                 f(r.metric("rouge_l")), f(r.metric("str_em")),
                 f(r.metric("answer_f1")), f(r.metric("sem_f1")), f(r.metric("sem_rec")), f(r.metric("semqa")),
                 f(r.spans_per_answer), f(r.share_verbatim), f(r.share_answers_with_span),
                 f(r.engine_tokens_per_s, 4)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--asqa", type=int, default=50, help="first N ASQA dev questions (default 50: dev 0-49)")
    ap.add_argument("--quotesum", type=int, default=91, help="first N QuoteSum dev questions (default: all 91)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "constrained.json"))
    ap.add_argument("--append", action="store_true",
                    help="add these arms to the arms already in --out (e.g. another model at another size)")
    ap.add_argument("--arm", nargs=4, metavar=("MODEL", "DATASET", "SETTING", "LIMIT"), help=argparse.SUPPRESS)
    ap.add_argument("--arm-out", help=argparse.SUPPRESS)
    ap.add_argument("--paired", metavar="WORK",
                    help="only add the paired differences of the runs kept in WORK (a finished bench's work folder) "
                         "to --out's \"paired\" list")
    args = ap.parse_args()

    if args.paired:
        rows = paired(Path(args.paired))
        result = json.loads(Path(args.out).read_text())
        save_paired(result, rows, Path(args.out))
        return
    if args.arm:  # a child: one arm, its result as the last stdout line
        model, dataset, setting, limit = args.arm
        print(json.dumps(arm(model, dataset, setting, int(limit), Path(args.arm_out))), flush=True)
        return

    cpu = cpu_model()
    print(f"cpu: {cpu}", flush=True)
    result = {"cpu": cpu, "sizes": {"asqa": args.asqa, "quotesum": args.quotesum},
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "arms": []}
    if args.append and Path(args.out).exists():
        before = json.loads(Path(args.out).read_text())
        result["arms"] = before["arms"]
        result["command"] = before["command"] + " ; " + result["command"]
        result["sizes"] = {"earlier": before["sizes"], "now": result["sizes"]}
    work = Path(tempfile.mkdtemp(prefix="bench-constrained-"))
    for model in args.models.split(","):
        for dataset, limit in (("asqa", args.asqa), ("quotesum", args.quotesum)):
            if not limit:
                continue
            for setting in args.settings.split(","):
                if dataset == "quotesum" and setting == "format":  # no tree, no clarification: the same as off
                    continue
                run_dir = work / f"{model}-{dataset}-{setting}"
                print(f"== {model} {dataset} {limit} {setting} ...", flush=True)
                proc = subprocess.run([sys.executable, __file__, "--arm", model, dataset, setting, str(limit),
                                       "--arm-out", str(run_dir)], capture_output=True, text=True)
                if proc.returncode != 0:
                    print(proc.stderr[-3000:], flush=True)
                    result["arms"].append({"model": model, "dataset": dataset, "setting": setting,
                                           "error": proc.stderr.strip().splitlines()[-1:]})
                    continue
                got = json.loads(proc.stdout.strip().splitlines()[-1])
                print(json.dumps(got), flush=True)
                result["arms"].append(got)
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(result, indent=2))
    print(table([a for a in result["arms"] if "error" not in a]), flush=True)
    rows = paired(work)  # the constrained arms against "off", question by question
    save_paired(result, rows, Path(args.out))


if __name__ == "__main__":
    main()
