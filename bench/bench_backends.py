"""The two engine backends (local_llm/backends.py) on the same questions: ToC through a running vLLM
OpenAI-compatible server (`backend = "openai"`) vs vLLM in this process, both float32 so their texts
are comparable (docs/engines.md#a-running-server-the-openai-backend).

    .venv/bin/python bench/bench_backends.py [--questions 6] [--out bench/results/backends.json]

The server is `python -m vllm.entrypoints.openai.api_server` on a free local port, with the in-process
engine's CPU settings (local_llm/settings.py: eager, no chunked prefill, prefix caching, seed 0); it is
stopped before the in-process arm, so the two never share the cores. Per arm: engine tokens/s (prompt +
output over the time spent waiting on the engine), the run's wall time, and whether the tables equal the
other arm's (all but the model id and the call ids, which name the backend by design).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("nodes", "hits", "answers", "spans", "passages", "scores")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: Path, max_model_len: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    # the in-process engine's CPU environment (local_llm/settings.py): every core (vLLM's default leaves one
    # idle) and a KV cache of VLLM_CPU_KVCACHE_SPACE GiB (without it vLLM-CPU reserves gpu_memory_utilization
    # x the RAM)
    from clarify.local_llm.hardware import affinity, cpu_list

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": cpu_list(affinity())}
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                             "--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port),
                             "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len),
                             "--no-enable-chunked-prefill", "--enable-prefix-caching", "--seed", "0"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/models", timeout=5):
                return proc, url
        except OSError:
            time.sleep(2)
    proc.kill()
    raise SystemExit(f"the server did not start; its log: {log}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=6, help="first N ASQA dev questions")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "backends.json"))
    args = ap.parse_args(argv)

    from clarify.batch import config
    from clarify.batch.run.pipeline import run
    from clarify.index import ensure_default_index, open_index
    from clarify.local_llm.hardware import describe
    from clarify.local_llm.models import DEFAULT_MODEL, prepare_model

    print(describe(), flush=True)
    settings = {"limit": args.questions, "answer_style": "free", "toc.max_expansions": 2, "toc.n_demos": 2}
    index = open_index(ensure_default_index())
    work = Path(tempfile.mkdtemp(prefix="bench-backends-"))
    model_dir = prepare_model(DEFAULT_MODEL)
    max_len = config.load(None).model.max_model_len
    server, url = start_server(model_dir, max_len, work / "server.log")
    try:
        remote = run(config.load(None, {**settings, "model.backend": "openai", "model.base_url": url,
                                        "model.model": "bench"}), work / "server", index=index, progress=False)
    finally:
        server.terminate()
        server.wait(timeout=120)
    local = run(config.load(None, {**settings, "model.batch_invariant": True}), work / "in-process", index=index,
                progress=False)
    same = {t: pl.read_parquet(work / "server" / f"{t}.parquet").equals(pl.read_parquet(work / "in-process" / f"{t}.parquet"))
            for t in TABLES}
    calls = [pl.read_parquet(work / d / "llm_calls.parquet").drop("cached", "model", "call_id") for d in ("server", "in-process")]
    same["llm_calls"] = calls[0].equals(calls[1])
    arms = {name: {"engine_tokens_per_s": s.engine_tokens_per_s, "wall_s": s.wall_s_last_session,
                   "tokens": s.tokens.to_json(), "llm_calls": s.llm_calls, "engine": s.engine.model_id}
            for name, s in (("server", remote), ("in-process", local))}
    result = {"cpu": describe(), "questions": args.questions, "settings": settings, "arms": arms,
              "server_over_in_process_tokens_per_s": round(arms["server"]["engine_tokens_per_s"]
                                                            / arms["in-process"]["engine_tokens_per_s"], 2),
              "tables_equal": same, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "note": "in-process wall time includes loading its engine; the server was loaded before its arm"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
