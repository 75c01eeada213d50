"""The `openai` backend (local_llm/openai_engine.py) against a scripted OpenAI-compatible server in
this process (stdlib http.server): the request body vLLM's server reads, retries with backoff on 429/5xx, a
completion returned once whatever the retries, a server that is down or serves another model refused in one
line, a server that is not vLLM's refused in one line when the run asks for constrained decoding, and a
server that dies mid-run stops the run resumably. The real server (`vllm serve` on CPU, the
embedded model) is tested in tests/test_openai_server.py."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clarify import console
from clarify.batch import config
from clarify.batch.toc.format import format_grammar
from clarify.errors import InputError
from clarify.local_llm import backends
from clarify.local_llm.engine import GenParams, Request
from clarify.local_llm.openai_engine import EngineUnavailable, OpenAIEngine


class Fake:
    """A scripted server: `fail` status codes answered first (one per request), then `reply(body)`. It lists
    its models as owned by `owned_by` ("vllm", as vLLM's server does; None: no such field)."""

    def __init__(self, models=("m",), fail=(), reply=None, owned_by="vllm"):
        self.models, self.fail, self.bodies, self.owned_by = list(models), list(fail), [], owned_by
        self.reply = reply or (lambda body: body["messages"][0]["content"][::-1])
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                owner = {} if fake.owned_by is None else {"owned_by": fake.owned_by}
                self._send(200, {"object": "list", "data": [{"id": m, "object": "model", **owner} for m in fake.models]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/tokenize"):  # vLLM's own endpoint: count the prompt's words
                    return self._send(200, {"count": len(json.dumps(body).split())})
                with fake.lock:
                    fake.bodies.append(body)
                    code = fake.fail.pop(0) if fake.fail else 200
                if code != 200:
                    return self._send(code, {"error": "busy"})
                text = fake.reply(body)
                self._send(200, {"model": body["model"], "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 7, "completion_tokens": len(text.split())},
                                 "system_fingerprint": "fake-1"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    servers = []

    def make(**kw):
        servers.append(Fake(**kw))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


def test_requests_carry_vllms_sampling_fields_and_come_back_in_order(fake):
    f = fake()
    eng = OpenAIEngine(f.url, "m", max_concurrency=4, backoff_s=0.01)
    params = [GenParams(temperature=0.7, max_tokens=9, stop=("\n",), seed=i) for i in range(10)]
    out = eng.generate([f"prompt {i}" for i in range(10)], params)
    assert [c.text for c in out] == [f"prompt {i}"[::-1] for i in range(10)]
    body = next(b for b in f.bodies if b["seed"] == 3)
    assert body["messages"] == [{"role": "user", "content": "prompt 3"}] and body["model"] == "m"
    assert (body["max_tokens"], body["stop"], body["temperature"], body["top_k"], body["repetition_penalty"]) == \
        (9, ["\n"], 0.7, 0, 1.0)
    verdict = eng.generate(["q"], [GenParams(choices=("True", "False"))])
    assert f.bodies[-1]["structured_outputs"] == {"choice": ["True", "False"]} and verdict[0].text == "q"
    eng.generate(["g"], [GenParams(grammar='root ::= "DQ 1: " [a-z]+')])
    assert f.bodies[-1]["structured_outputs"] == {"grammar": 'root ::= "DQ 1: " [a-z]+'}
    assert eng.model_id == f"openai:m@{f.url}" and eng.facts()["system_fingerprint"] == "fake-1"
    eng.close()


@pytest.mark.parametrize("owned_by", ["sglang", "llamacpp", None])
def test_a_server_that_is_not_vllms_is_refused_at_start_up_when_the_run_asks_for_constraints(fake, owned_by):
    f = fake(owned_by=owned_by)
    both = ("toc.constrain_format", "answer.constrain_quotes")
    m = config.load(None, {"model.backend": "openai", "model.base_url": f.url, "model.model": "m"}).model
    for start in (lambda: backends.get("openai").identity(m, constrained=both),
                  lambda: backends.get("openai").open(m, constrained=both)):
        with pytest.raises(InputError) as err:
            start()
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith("field 'model.base_url': this server cannot constrain decoding (")
        assert msg.endswith("; set toc.constrain_format = false and answer.constrain_quotes = false")
        assert (f"with owned_by {owned_by!r}, not 'vllm'" if owned_by else "with no owned_by, not 'vllm'") in msg
    with pytest.raises(InputError, match=r"; set answer.constrain_quotes = false$"):
        OpenAIEngine(f.url, "m", constrained=("answer.constrain_quotes",))
    assert f.bodies == []  # refused before any request

    # unconstrained runs use it: no vLLM-only field is sent, the verification's choice goes unconstrained
    eng = backends.get("openai").open(m)
    console._notes.clear()
    eng.generate(["q"], [GenParams(choices=("True", "False"))])
    assert "structured_outputs" not in f.bodies[-1] and "decoded freely" in console.notes()[0]
    with pytest.raises(InputError, match="cannot constrain decoding .* a request asks for a grammar"):
        eng.generate(["g"], [GenParams(grammar='root ::= "a"')])
    assert len(f.bodies) == 1
    eng.close()


def test_a_vllm_server_gets_the_constraints_in_its_dialect(fake):
    f = fake()
    m = config.load(None, {"model.backend": "openai", "model.base_url": f.url, "model.model": "m"}).model
    both = ("toc.constrain_format", "answer.constrain_quotes")
    assert backends.get("openai").identity(m, constrained=both)["served_model"] == "m"
    eng = backends.get("openai").open(m, constrained=both)
    grammar = format_grammar()
    eng.generate(["g", "v"], [GenParams(grammar=grammar), GenParams(choices=("True", "False"))])
    assert sorted(json.dumps(b["structured_outputs"]) for b in f.bodies) == sorted(
        [json.dumps({"grammar": grammar}), json.dumps({"choice": ["True", "False"]})])
    eng.close()


def test_busy_answers_are_retried_and_each_completion_returned_once(fake):
    f = fake(fail=[429, 503, 500])
    eng = OpenAIEngine(f.url, "m", max_concurrency=2, backoff_s=0.01, max_retries=5)
    eng.submit([Request(f"r{i}", f"p{i}", GenParams(seed=i)) for i in range(4)])
    got = []
    while eng.pending():
        got += eng.step()
    assert sorted(rid for rid, _ in got) == ["r0", "r1", "r2", "r3"]  # each exactly once
    assert eng.stats["retries"] == 3 and len(f.bodies) == 7
    eng.close()


def test_a_request_that_keeps_failing_stops_with_one_clear_error(fake):
    f = fake(fail=[503] * 10)
    eng = OpenAIEngine(f.url, "m", backoff_s=0.01, max_retries=2)
    with pytest.raises(EngineUnavailable, match=r"did not answer a request after 2 retries \(HTTP 503"):
        eng.generate(["p"], [GenParams()])
    f.fail = [400]
    with pytest.raises(EngineUnavailable, match="refused a request \\(HTTP 400"):
        eng.generate(["p"], [GenParams()])
    eng.close()


def test_a_server_down_or_serving_another_model_is_refused_before_anything(fake, tmp_path):
    f = fake(models=("llama",))
    m = config.load(None, {"model.backend": "openai", "model.base_url": f.url, "model.model": "smollm2"}).model
    with pytest.raises(InputError, match=r"serves \['llama'\], not 'smollm2'"):
        backends.get("openai").identity(m)
    down = config.load(None, {"model.backend": "openai", "model.base_url": "http://127.0.0.1:9/v1"}).model
    with pytest.raises(InputError, match="field 'model.base_url': no OpenAI-compatible server answers at"):
        backends.get("openai").identity(down)
    with pytest.raises(InputError, match="needs the server's address"):
        backends.get("openai").identity(config.load(None, {"model.backend": "openai"}).model)
    assert OpenAIEngine(f.url, "").served == "llama"  # no name given: the server's only model
    f.models.append("other")
    with pytest.raises(InputError, match=r"serves \['llama', 'other'\]: name one"):
        OpenAIEngine(f.url, "")


def test_the_api_key_comes_from_the_named_variable_and_is_never_written(fake, monkeypatch, tmp_path):
    f = fake()
    with pytest.raises(InputError, match="MY_KEY"):
        OpenAIEngine(f.url, "m", api_key_env="MY_KEY")
    monkeypatch.setenv("MY_KEY", "sk-secret-123")
    eng = OpenAIEngine(f.url, "m", api_key_env="MY_KEY")
    assert "sk-secret" not in json.dumps(eng.facts()) and "sk-secret" not in eng.model_id
    eng.close()


@pytest.mark.integration
def test_a_server_that_dies_mid_run_stops_it_in_one_line_and_the_run_resumes(fake, tmp_path, default_index, capsys):
    """ToC through the openai backend (scripted answers): the server answers 503 from its 6th request on; the
    run stops with one line naming the server and the resume command, keeps its completions; once the
    server answers again the same command finishes, and no completion was recorded twice."""
    import sqlite3

    from clarify.batch.cli import main

    f = fake(models=("smollm2",), reply=lambda body: "DQ 1: Which one?\nDA 1: This one")
    toml = tmp_path / "run.toml"
    toml.write_text(f'limit = 2\nanswer_style = "free"\nindex = "{default_index}"\n[model]\nbackend = "openai"\n'
                    f'base_url = "{f.url}"\nmodel = "smollm2"\nmax_retries = 1\nmax_concurrency = 2\n'
                    '[toc]\nmax_expansions = 2\nn_demos = 2\n')
    out = tmp_path / "run"
    argv = ["run", "--config", str(toml), "--out", str(out), "--no-progress"]
    served = {"n": 0}

    def reply(body):
        served["n"] += 1
        return "DQ 1: Which one?\nDA 1: This one" if "Disambiguations" in body["messages"][0]["content"] else "True"

    f.reply = reply
    f.fail = [200] * 5 + [503] * 1000
    assert main(argv) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("clarify")]  # not libraries' bars
    assert len(err) == 1 and "did not answer a request after 1 retries (HTTP 503" in err[0]
    assert f"resume with: clarify run --config {toml}" in err[0] and f.url in err[0]
    kept = sqlite3.connect(out / "cache" / "completions.sqlite").execute("SELECT count(*) FROM completions").fetchone()[0]
    assert kept == served["n"] == 5  # every answered request is in the cache
    f.fail = []
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_questions"] == 2 and summary["engine"]["backend"] == "openai"
    assert summary["cached_calls"] >= 5
    inputs = json.loads((out / "inputs.json").read_text())
    assert inputs["model"] == {"backend": "openai", "base_url": f.url, "served_model": "smollm2"}
    with sqlite3.connect(out / "cache" / "completions.sqlite") as db:
        rows, keys = db.execute("SELECT count(*), count(DISTINCT key) FROM completions").fetchone()
    assert rows == keys == summary["llm_calls"] - (summary["cached_calls"] - kept)


@pytest.mark.integration
def test_a_constrained_run_on_a_server_that_is_not_vllms_stops_in_one_line_before_anything(fake, tmp_path,
                                                                                          default_index, capsys):
    from clarify.batch.cli import main

    f = fake(models=("smollm2",), owned_by="sglang")
    toml = tmp_path / "run.toml"
    toml.write_text(f'limit = 1\nindex = "{default_index}"\n[model]\nbackend = "openai"\nbase_url = "{f.url}"\n'
                    'model = "smollm2"\n')
    out = tmp_path / "run"
    argv = ["run", "--config", str(toml), "--constrain-format", "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("clarify")]
    assert len(err) == 1 and "this server cannot constrain decoding (" in err[0]
    assert err[0].endswith("; set toc.constrain_format = false")
    assert f.bodies == [] and not (out / "config.json").exists()  # no request sent, nothing written
