"""Compile time of the quotes grammar (batch/toc/constraints.py `quotes_grammar`) against the size of the
source set, with the cap on quotable words (GRAMMAR_MAX_UNITS) and without it (the construction before the
cap: every word of every source).

Sources are the shipped Wikipedia passages (data/wiki/passages_dpr_random1000.jsonl, DPR's 100-word
passages) in file order, concatenated into source sets of N words, twice: as many passages of that file
(the shape of a prompt with many retrieved passages) and as one source holding all N words (a long
document). Each grammar is compiled by xgrammar with SmolLM2's tokenizer and no cache, one thread, as
vLLM's xgrammar backend compiles a request's grammar (bench/bench_constrained.py `compile_cost`). The time
is the process CPU time of the compile.

    .venv/bin/python bench/bench_grammar.py                   # 5,000 and 20,000 words, capped and uncapped
    .venv/bin/python bench/bench_grammar.py --words 2000 5000 --no-uncapped

Writes bench/results/grammar.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sources(words: int, *, one: bool):
    """Passages of the shipped DPR file, cut to `words` words in all (quote_words); `one`: as one source."""
    from clarify.batch.toc.constraints import quote_words
    from clarify.jsonl import iter_jsonl
    from clarify.schemas import Passage

    out, n = [], 0
    while n < words:
        for _, row in iter_jsonl(ROOT / "data" / "wiki" / "passages_dpr_random1000.jsonl"):
            w = quote_words(row["text"])[: words - n]
            if not w:
                break
            out.append(Passage(row["id"], "", "".join(a + b for a, b in w)))
            n += len(w)
    if one:
        return [Passage("all", "", " ".join(p.text for p in out))]
    return out


def compile_s(compiler, grammar: str) -> float:
    t0 = time.process_time()
    compiler.compile_grammar(grammar)
    return time.process_time() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--words", type=int, nargs="+", default=[5000, 20000])
    ap.add_argument("--no-uncapped", action="store_true", help="skip the uncapped grammars (20,000 words: ~1 min)")
    args = ap.parse_args(argv)
    import xgrammar as xgr
    from transformers import AutoTokenizer

    from clarify.batch.toc import constraints
    from clarify.local_llm.models import resolve_model

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from provenance import cpu_model, provenance

    model = "smollm2-135m-instruct"
    tok = AutoTokenizer.from_pretrained(resolve_model(model))
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok), max_threads=1, cache_enabled=False)
    cap = constraints.GRAMMAR_MAX_UNITS
    rows = []
    for words in args.words:
        for one in (False, True):
            srcs = sources(words, one=one)
            for capped in (True, False) if not args.no_uncapped else (True,):
                constraints.GRAMMAR_MAX_UNITS = cap if capped else 10**12
                t0 = time.process_time()
                g = constraints.quotes_grammar(srcs)
                build = time.process_time() - t0
                row = {"words": words, "sources": len(srcs), "capped": capped, "grammar_kb": round(len(g.encode()) / 1024, 1),
                       "rules": g.count("::="), "build_s": round(build, 3), "compile_s": round(compile_s(compiler, g), 3)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    constraints.GRAMMAR_MAX_UNITS = cap
    result = {"provenance": provenance(), "cpu": cpu_model(), "tokenizer": model, "xgrammar_threads": 1, "max_units": cap,
              "unit_bytes": constraints.GRAMMAR_UNIT_BYTES, "rows": rows}
    out = ROOT / "bench" / "results" / "grammar.json"
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"CPU: {result['cpu']}; wrote {out}")
    return result


if __name__ == "__main__":
    main()
