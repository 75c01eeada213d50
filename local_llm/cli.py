"""CLI: `clarify generate` (batch generation for users) and `clarify models prepare|info`.

`clarify generate --model MODEL --prompts FILE.jsonl --out FILE.parquet`
    Input: JSONL, one object per line: {"id": optional str/int (default: the line number), "prompt": str}.
    Blank lines are skipped. Every line is checked before the model is loaded; a bad line raises
    InputError naming file and line, and nothing is written.
    Output: Parquet with columns id (str), prompt (str), completion (str), finish_reason (str),
    prompt_tokens (int64), output_tokens (int64), cached (bool); written to a temp file and renamed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from clarify import schemas
from clarify.console import home_logs
from clarify.errors import InputError, need_file
from clarify.files import write_parquet
from clarify.jsonl import iter_jsonl
from clarify.local_llm import backends
from clarify.local_llm.backends import Options
from clarify.local_llm.engine import GenParams
from clarify.local_llm.models import (
    EMBEDDED,
    embedded_name_of,
    model_info,
    prepare_model,
    resolve_model,
)
from clarify.options import add_flag, spec

OPTION = {f.name: f for f in dataclasses.fields(Options)}  # the declared settings `generate` has flags for
# `generate --batch-size`: prompts handed to the engine per call (its checkpoint into the cache), and a
# server's requests in flight; vLLM schedules within a call by its own budget (max_num_seqs)
BATCH_SIZE = 256


def read_prompts(path: str | os.PathLike) -> list[tuple[str, str]]:
    """JSONL file -> [(id, prompt)]. Raises InputError(path, line) on the first bad line."""
    return [(rid, prompt) for _, rid, prompt in read_prompt_lines(path)]


def read_prompt_lines(path: str | os.PathLike) -> list[tuple[int, str, str]]:
    """JSONL file -> [(line, id, prompt)]. Raises InputError(path, line) on the first bad line."""
    p = Path(path)
    need_file(p, "prompts file")
    rows: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for lineno, obj in iter_jsonl(p, wording={"non_utf8": "not valid UTF-8"}):
        prompt = obj.get("prompt")
        if prompt is None:
            raise InputError("missing prompt", path=str(p), line=lineno, field="prompt")
        if not isinstance(prompt, str):
            raise InputError(f"prompt must be a string, got {type(prompt).__name__}", path=str(p), line=lineno, field="prompt")
        if not prompt.strip():
            raise InputError("empty prompt", path=str(p), line=lineno, field="prompt")
        rid = obj.get("id", lineno)
        if isinstance(rid, bool) or not isinstance(rid, str | int) or (isinstance(rid, str) and not rid.strip()):
            raise InputError(f"id must be a non-empty string or an integer, got {rid!r}", path=str(p), line=lineno, field="id")
        rid = str(rid)
        if rid in seen:
            raise InputError(f"duplicate id {rid!r} (first on line {seen[rid]})", path=str(p), line=lineno, field="id")
        seen[rid] = lineno
        rows.append((lineno, rid, prompt))
    if not rows:
        raise InputError("no prompts in file", path=str(p))
    return rows


def _check_context(model_dir: Path, path, lines: list[tuple[int, str, str]]) -> None:
    """Every prompt must fit the engine's context: counted with the model's tokenizer, before vLLM loads;
    the first one too long is named by its line and id (not its position in a batch)."""
    from clarify.local_llm.vllm_engine import prompts_over_context

    over = prompts_over_context(model_dir, [p for _, _, p in lines], Options.max_model_len)
    if over:
        (i, n), more = over[0], len(over) - 1
        line, rid, _ = lines[i]
        raise InputError(f"prompt '{rid}' has {n} tokens, but the engine's context (max_model_len) is "
                         f"{Options.max_model_len}; shorten it" + (f" ({more} more prompt(s) too long)" if more else ""),
                         path=str(path), line=line, field="prompt")


def cmd_generate(args: argparse.Namespace) -> int:
    import polars as pl

    from clarify.console import progress

    lines = read_prompt_lines(args.prompts)  # all input checked before the model is loaded
    rows = [(rid, prompt) for _, rid, prompt in lines]
    if args.batch_size < 1:
        raise InputError("must be >= 1", field="--batch-size")
    out = Path(args.out)
    if args.base_url:  # a served model: the server checks its own context
        name = None
    else:
        model_dir = resolve_model(args.model)
        _check_context(model_dir, args.prompts, lines)
        name = embedded_name_of(model_dir)
    stop = tuple(args.stop) if args.stop else (EMBEDDED[name].default_stop if name else ())
    try:
        params = GenParams(
            temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, stop=stop, seed=args.seed
        )
    except ValueError as exc:
        raise InputError(str(exc), field="sampling options") from exc

    # [model]'s engine and client options at their declared defaults (local_llm/settings.py EngineOptions,
    # local_llm/openai_http.py ClientOptions), then the command's flags
    if args.base_url:  # deadlines, retries and the reply cap as declared; the server checks its own context
        served = Options(base_url=args.base_url, model="" if args.model == Options.model else args.model,
                         api_key_env=args.api_key_env, max_concurrency=args.batch_size)
        engine = backends.get("openai").open(served)
    else:
        engine = backends.get("vllm").open(Options(model=str(model_dir)))
    runner = engine
    if args.cache:
        from clarify.local_llm.cache import CachedEngine

        runner = CachedEngine(engine, args.cache)

    completions = []
    t0 = time.perf_counter()
    batches = [rows[i : i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
    bar = progress(total=len(rows), desc="generate", unit="prompt", disable=None)
    engine.on_progress = lambda finished, _tokens: bar.update(finished)  # moves as requests finish
    try:
        for batch in batches:
            before = bar.n
            completions.extend(runner.generate([r[1] for r in batch], [params] * len(batch)))
            bar.update(before + len(batch) - bar.n)  # cached prompts never reach the engine
    finally:
        engine.on_progress = None
        bar.close()
    elapsed = time.perf_counter() - t0

    df = pl.DataFrame(
        {
            "id": [r[0] for r in rows],
            "prompt": [r[1] for r in rows],
            "completion": [c.text for c in completions],
            "finish_reason": [c.finish_reason for c in completions],
            "prompt_tokens": [c.prompt_tokens for c in completions],
            "output_tokens": [c.output_tokens for c in completions],
            "cached": [c.cached for c in completions],
        },
        schema=schemas.GENERATIONS,
    )
    write_parquet(df, out)
    new = [c for c in completions if not c.cached]
    new_tokens = sum(c.output_tokens for c in new)
    rate = new_tokens / elapsed if elapsed > 0 else 0.0
    print(
        f"model {engine.model_id}: {len(rows)} prompts ({len(rows) - len(new)} from cache), "
        f"{new_tokens} new tokens in {elapsed:.1f} s = {rate:.1f} tokens/s -> {out}"
    )
    return 0


def cmd_models_prepare(args: argparse.Namespace) -> int:
    for name in args.names or [Options.model]:
        t0 = time.perf_counter()
        path = prepare_model(name)
        print(f"{name}: ready at {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


def cmd_models_info(args: argparse.Namespace) -> int:
    info = model_info(resolve_model(args.model))
    json.dump(info, sys.stdout, indent=2)
    print()
    return 0


GENERATE_EPILOG = """\
examples:
  clarify generate --prompts data/examples/prompts.jsonl --out runs/completions.parquet
  clarify generate --model gemma3-270m --prompts p.jsonl --out c.parquet --temperature 0.7 --seed 1
  clarify generate --prompts p.jsonl --out c.parquet --cache runs/gen-cache      re-runs cost nothing

input: JSONL, one {"id": optional string or integer, "prompt": string} per line; every line is checked
before the model loads, and a bad line is reported with its number.
writes --out: Parquet with id, prompt, completion, finish_reason, prompt_tokens, output_tokens, cached.
Logs: $CLARIFY_HOME/logs.
"""

MODELS_EPILOG = """\
examples:
  clarify models prepare                    convert the default embedded model (once)
  clarify models prepare gemma3-270m        after `make gemma`
  clarify models info smollm2-135m-instruct

Converted models live in $CLARIFY_HOME/models/<name>/ (safetensors); any local Hugging Face model
directory works as --model without preparing.
"""


def register(sub) -> None:
    g = sub.add_parser("generate", help="batch generation over a JSONL file of prompts -> Parquet",
                       description="Batch generation with vLLM: one JSONL file of prompts in, one Parquet "
                                   "file of completions out.", epilog=GENERATE_EPILOG)
    add_flag(g, OPTION["model"], default=Options.model)
    g.add_argument("--prompts", required=True, help='JSONL, one {"id": ..., "prompt": ...} per line')
    g.add_argument("--out", required=True, help="output Parquet file")
    for f in dataclasses.fields(GenParams):  # sampling: the request's declared settings, at their defaults
        if spec(f).flag:
            add_flag(g, f, default=f.default)
    g.add_argument("--stop", action="append", help="stop string (repeatable); base models default to a blank line")
    g.add_argument("--cache", default=None, help="completion cache (SQLite file or directory); re-runs make no model calls")
    g.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="prompts per engine call")
    # a served model instead of vLLM in this process (backend openai, local_llm/backends.py)
    add_flag(g, OPTION["base_url"], flag="--base-url", default=Options.base_url)
    add_flag(g, OPTION["api_key_env"], flag="--api-key-env", default=Options.api_key_env)
    g.set_defaults(func=cmd_generate, log_dir=home_logs)

    m = sub.add_parser("models", help="embedded models: prepare (convert once) and inspect", epilog=MODELS_EPILOG)
    msub = m.add_subparsers(dest="models_command", required=True, metavar="COMMAND")
    p = msub.add_parser("prepare", help="convert embedded models into $CLARIFY_HOME/models (idempotent)",
                        epilog=MODELS_EPILOG)
    p.add_argument("names", nargs="*", help=f"embedded model names ({', '.join(EMBEDDED)}); default: {Options.model}")
    p.set_defaults(func=cmd_models_prepare, log_dir=home_logs)
    i = msub.add_parser("info", help="architecture, parameter count, chat template of a model",
                        epilog=MODELS_EPILOG)
    i.add_argument("model", help="embedded model name or local HF model directory")
    i.set_defaults(func=cmd_models_info)
