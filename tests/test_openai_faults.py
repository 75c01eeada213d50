"""The `openai` backend (local_llm/openai_engine.py) against a misbehaving server: a scripted stdlib HTTP server on
127.0.0.1 that trickles its reply, answers with what is not a completion, sends a huge body, or echoes the
credentials it was sent. Each case checks the real outcome: the time it took, the one line printed, what the
completion cache holds (never the bad reply), and that no credential reaches the terminal or a file."""

from __future__ import annotations

import base64
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import polars as pl
import pytest

from clarify import stops
from clarify.errors import EngineUnavailable, InputError
from clarify.local_llm.engine import GenParams, Request
from clarify.local_llm.openai_engine import OpenAIEngine
from clarify.local_llm.openai_http import served_models

KEY = "sk-UNIQUE41a-0c6f2d9e"  # grepped for in everything written and printed
USER, PASSWORD = "USER41a-name", "PASS41a-7b3e1f"
SECRETS = (KEY, USER, PASSWORD, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())


def completion(body: dict, text: str, **over) -> dict:
    """A good chat completion of `body`, as vLLM's server sends it; `over` replaces top-level fields."""
    return {"id": "cmpl-1", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": len(text.split())}} | over


def send(h, status: int, data: bytes, headers: dict | None = None) -> None:
    h.send_response(status)
    for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}.items():
        h.send_header(k, v)
    h.end_headers()
    h.wfile.write(data)


def trickle(h, seconds: float, every: float = 0.3) -> None:
    """Headers, then one byte of a promised 10,000 every `every` s for `seconds` (then the server gives up)."""
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", "10000")
    h.end_headers()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(every)
    except OSError:  # the client went away
        h.server.fake.hung_up.set()


class Server:
    """A scripted OpenAI-compatible server: GET /v1/models by `models(handler)` (default: serves "m"), POST
    /tokenize by `tokenize(handler, body)` (default: the prompt's words), every other POST by
    `answer(handler, body)` (default: the prompt reversed). Records those POSTs' bodies and headers."""

    def __init__(self, answer=None, models=None, tokenize=None):
        self.answer = answer or (lambda h, body: send(h, 200, json.dumps(completion(body, prompt(body)[::-1])).encode()))
        self.models = models or (lambda h: send(h, 200, json.dumps({"data": [{"id": "m"}]}).encode()))
        self.tokenize = tokenize or (lambda h, body: send(h, 200, json.dumps({"count": len(prompt(body).split())}).encode()))
        self.posts: list[tuple[dict, dict]] = []
        self.hung_up = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake.models(self)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/tokenize"):  # vLLM's own endpoint (the scheduler's context check)
                    return fake.tokenize(self, body)
                fake.posts.append((body, dict(self.headers)))
                fake.answer(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.fake = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def prompt(body: dict) -> str:
    return body["messages"][0]["content"] if "messages" in body else body["prompt"]


@pytest.fixture
def server():
    made = []

    def make(**kw):
        made.append(Server(**kw))
        return made[-1]

    yield make
    for s in made:
        s.stop()


# --- hangs: a total deadline, and a stop honoured while a request is in flight ----------------------------
def test_a_trickled_reply_is_cut_off_at_the_total_deadline(server):
    s = server(answer=lambda h, body: trickle(h, 8))
    eng = OpenAIEngine(s.url, "m", request_timeout_s=1, max_retries=0)
    t0 = time.monotonic()
    with pytest.raises(EngineUnavailable, match=r"no whole reply within 1 s \(model.request_timeout_s\)"):
        eng.generate(["p"], [GenParams()])
    assert time.monotonic() - t0 < 3  # httpx's per-read timeout alone waited for the whole 8 s trickle
    eng.close()


def test_the_start_up_check_has_a_total_deadline_too(server):
    s = server(models=lambda h: trickle(h, 8))
    t0 = time.monotonic()
    with pytest.raises(InputError, match=r"did not answer GET .*/models within 1 s \(model.check_timeout_s\)"):
        served_models(s.url, timeout_s=1)
    assert time.monotonic() - t0 < 3


def test_a_token_count_has_the_check_deadline(server):
    s = server(tokenize=lambda h, body: trickle(h, 8))
    eng = OpenAIEngine(s.url, "m", check_timeout_s=1)
    t0 = time.monotonic()
    assert eng.count_tokens("a long prompt") is None  # unknown: the server checks the context itself
    assert time.monotonic() - t0 < 3
    eng.close()


def test_a_stop_signal_ends_a_step_waiting_on_a_trickling_server_within_a_second(server):
    """The scheduler's step runs inside stops.deferred(): the step must notice the pending signal and return,
    and the in-flight request is then cancelled (the server sees the client hang up)."""
    s = server(answer=lambda h, body: trickle(h, 6))
    eng = OpenAIEngine(s.url, "m", request_timeout_s=60, max_retries=0)
    eng.submit([Request("r", "p", GenParams())])
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    with stops.handled(), pytest.raises(stops.Stopped):
        with stops.deferred():
            eng.step()
    assert time.monotonic() - t0 < 1.5
    eng.cancel()  # what a stopped run does (batch/run/scheduler.py _StepLoop.close)
    assert s.hung_up.wait(3) and eng.pending() == 0
    eng.close()


# --- malformed replies: one line, the good completions kept, nothing bad cached -------------------------
def _bad(data, status=200, headers=None):
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return lambda h, body: send(h, status, raw, headers)


def _huge(declared: bool):
    """A well-formed completion of 100 MiB of text (for max_tokens = 128), sent in 1 MiB writes."""
    head = b'{"model": "m", "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "'
    tail = b'"}}]}'

    def answer(h, body):
        h.send_response(200)
        if declared:
            h.send_header("Content-Length", str(len(head) + (100 << 20) + len(tail)))
        h.end_headers()
        try:
            h.wfile.write(head)
            for _ in range(100):
                h.wfile.write(b"x" * (1 << 20))
            h.wfile.write(tail)
        except OSError:
            h.server.fake.hung_up.set()
    return answer


CHOICE = {"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}
ENV = {"model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
CASES = {
    "cut-off JSON": (_bad(b'{"model": "m", "choices": [{"index": 0, "mess'), "not JSON (cut off, or not an API reply)"),
    "HTML page": (_bad(b"<html><body><h1>502 Bad Gateway</h1></body></html>", headers={"Content-Type": "text/html"}),
                  "an HTML page"),
    "empty body": (_bad(b""), "an empty body"),
    "307": (_bad(b"", 307, {"Location": "http://elsewhere:8000/v1/chat/completions"}),
            "HTTP 307, a redirect to http://elsewhere:8000/v1/chat/completions: clarify does not follow redirects"),
    "no choices": (_bad(ENV), "no 'choices'"),
    "choices []": (_bad(ENV | {"choices": []}), "'choices' is [], not a list of choices"),
    "choices null": (_bad(ENV | {"choices": None}), "'choices' is None, not a list of choices"),
    "choice without message": (_bad(ENV | {"choices": [{"index": 0, "finish_reason": "stop"}]}),
                               "choice 0 has no message"),
    "top-level list": (_bad([ENV | {"choices": [CHOICE]}]), "a JSON list, not an object"),
    "index a string": (_bad(ENV | {"choices": [CHOICE | {"index": "0"}]}), "choice 0 has index '0'"),
    "two choices for n = 1": (_bad(ENV | {"choices": [CHOICE, CHOICE | {"index": "1"}]}), "2 choices for n = 1"),
    "non-numeric usage": (_bad(ENV | {"choices": [CHOICE], "usage": {"prompt_tokens": "7"}}),
                          "usage.prompt_tokens is '7', not a count of tokens"),
    "usage a string": (_bad(ENV | {"choices": [CHOICE], "usage": "lots"}), "'usage' is 'lots', not an object"),
    "invalid UTF-8": (_bad(b'{"model": "m", "choices": [{"index": 0, "message": {"content": "\xff\xfe"}, '
                           b'"finish_reason": "stop"}]}'), "a body that is not valid UTF-8 (byte 64)"),
    "lone surrogate": (_bad(b'{"model": "m", "choices": [{"index": 0, "message": {"content": "a\\ud800"}, '
                            b'"finish_reason": "stop"}]}'), "holds a lone surrogate ('\\ud800') at character 1"),
    "content null": (_bad(ENV | {"choices": [CHOICE | {"message": {"role": "assistant", "content": None}}]}),
                     "choice 0's message.content is None, not a string"),
    "no content": (_bad(ENV | {"choices": [CHOICE | {"message": {"role": "assistant"}}]}),
                   "choice 0's message.content is missing, not a string"),
    "finish_reason abort": (_bad(ENV | {"choices": [CHOICE | {"finish_reason": "abort"}]}),
                            "choice 0 finished with 'abort', not one of ('stop', 'length')"),
    "finish_reason null": (_bad(ENV | {"choices": [CHOICE | {"finish_reason": None}]}), "finished with None"),
    "another model": (_bad(ENV | {"model": "other", "choices": [CHOICE]}),
                      "it names the model 'other', not 'm' (the one /v1/models served)"),
    "NUL in the text": (_bad(ENV | {"choices": [CHOICE | {"message": {"content": "a\x00b"}}]}),
                        "holds a NUL character at character 1"),
    "text over the cap": (_bad(ENV | {"choices": [CHOICE | {"message": {"content": "ab" * 9000}}]}),
                          "choice 0's message.content is 18,000 bytes, over the 16,384 its max_tokens allows"),
    "100 MB body, length declared": (_huge(True), "a reply of 104,857,694 bytes, over the 163,840 this request allows"),
    "100 MB body, no length": (_huge(False), "a reply over the 163,840 bytes this request allows"),
}


def _generate(tmp_path: Path, url: str, prompts: list[str], *more: str, env: dict | None = None, capsys=None):
    """`clarify generate --base-url URL` with the cache and $CLARIFY_HOME under tmp_path: in this process
    (`capsys` given), else in a process of its own (its argv, which the log records, is what a user typed):
    (exit status, stdout, stderr)."""
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n"
                                              for i, p in enumerate(prompts)))
    argv = ["generate", "--base-url", url, "--model", "m", "--prompts", str(tmp_path / "p.jsonl"), "--out",
            str(tmp_path / "out.parquet"), "--cache", str(tmp_path / "cache"), "--max-tokens", "128", *more]
    env = {**os.environ, "PYTHONPATH": ":".join(sys.path), "CLARIFY_HOME": str(tmp_path / "home"), **(env or {})}
    if capsys is not None:
        from clarify.batch.cli import main

        saved = dict(os.environ)
        os.environ.update(env)
        try:
            rc = main(argv)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        got = capsys.readouterr()
        return rc, got.out, got.err
    proc = subprocess.run([sys.executable, "-m", "clarify.batch.cli", *argv], env=env, capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def _cached(tmp_path: Path) -> list[tuple[str, list[str]]]:
    with sqlite3.connect(tmp_path / "cache" / "completions.sqlite") as db:
        rows = db.execute("SELECT prompt, payload FROM completions ORDER BY prompt").fetchall()
    return [(p, json.loads(payload)["texts"]) for p, payload in rows]


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_reply_is_one_line_and_never_cached(server, tmp_path, case, capsys):
    """Two good prompts answered first, the third answered with the case (a moment later): `clarify generate`
    exits 1 with one line naming the server, the request and what was wrong; the cache holds exactly the
    two good completions."""
    bad, said = CASES[case]
    good = threading.Semaphore(0)

    def answer(h, body):
        if prompt(body) == "the bad one":  # the good ones come back first
            assert good.acquire(timeout=10) and good.acquire(timeout=10)
            time.sleep(0.3)
            return bad(h, body)
        send(h, 200, json.dumps(completion(body, prompt(body).upper())).encode())
        good.release()

    s = server(answer=answer)
    t0 = time.monotonic()
    rc, out, err = _generate(tmp_path, s.url, ["good one", "good two", "the bad one"], capsys=capsys)
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, err[-3000:]
    assert lines[0].startswith(f"clarify generate: error: the server at {s.url} ")
    assert said in lines[0] and "(POST /chat/completions, the prompt ending 'the bad one'); nothing of it was " \
        "cached" in lines[0], lines[0]
    assert _cached(tmp_path) == [("good one", ["GOOD ONE"]), ("good two", ["GOOD TWO"])]
    assert time.monotonic() - t0 < 30  # the 100 MB bodies are refused early, not read (39 s before)


def test_mixed_index_types_among_n_choices_are_refused(server):
    two = [CHOICE, CHOICE | {"index": "1"}]
    s = server(answer=_bad(ENV | {"choices": two}))
    eng = OpenAIEngine(s.url, "m", max_retries=0)
    with pytest.raises(EngineUnavailable, match=r"choice 1 has index '1'; want each of 0\.\.1 once"):
        eng.generate(["p"], [GenParams(n=2, temperature=1.0)])
    eng.close()


def test_control_characters_are_replaced_and_tab_newline_kept(server, tmp_path, capsys):
    """A model may emit ESC or BEL as byte tokens: the text is kept, each such character replaced by U+FFFD
    (never written raw to a table, the cache or a later prompt); tab and newline stay."""
    text = "red \x1b[31m alert\x07\tnext\nline \x9b"
    s = server(answer=lambda h, body: send(h, 200, json.dumps(completion(body, text)).encode()))
    rc, _, err = _generate(tmp_path, s.url, ["p"], capsys=capsys)
    assert rc == 0, err
    want = "red \ufffd[31m alert\ufffd\tnext\nline \ufffd"
    assert _cached(tmp_path) == [("p", [want])]
    assert pl.read_parquet(tmp_path / "out.parquet")["completion"].to_list() == [want]


# --- secrets: the API key and URL credentials never reach the terminal or a file --------------------------
def _written(*roots: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for root in roots for p in Path(root).rglob("*") if p.is_file()}


def _leaks(texts: dict) -> list[str]:
    return [f"{where} holds {secret!r}" for where, text in texts.items() for secret in SECRETS
            if secret.encode() in (text if isinstance(text, bytes) else text.encode())]


def test_a_key_echoed_by_the_server_and_url_credentials_are_never_written_or_printed(server, tmp_path):
    """A run that works, then a server that refuses with a 401 echoing the Authorization header: the key, the
    password and the user (and their basic-auth form) are nowhere in the terminal output, the log under
    $CLARIFY_HOME/logs, the cache (its model_id column included) or the output."""
    state = {"refuse": False}

    def answer(h, body):
        if state["refuse"]:
            echo = f"invalid credentials: Authorization: {h.headers['Authorization']} for {h.path}"
            return send(h, 401, json.dumps({"error": echo}).encode())
        return send(h, 200, json.dumps(completion(body, "ok")).encode())

    s = server(answer=answer)
    url = s.url.replace("http://", f"http://{USER}:{PASSWORD}@")
    rc, out, err = _generate(tmp_path, url, ["p"], "--api-key-env", "MY_KEY", env={"MY_KEY": KEY})
    assert rc == 0, err
    assert s.posts[-1][1]["Authorization"] == f"Bearer {KEY}"  # the key is sent
    state["refuse"] = True
    rc2, out2, err2 = _generate(tmp_path, url, ["q"], "--api-key-env", "MY_KEY", env={"MY_KEY": KEY})
    assert rc2 == 1 and "refused a request (HTTP 401" in err2 and "Bearer ***" in err2, err2
    with sqlite3.connect(tmp_path / "cache" / "completions.sqlite") as db:
        assert db.execute("SELECT DISTINCT model_id FROM completions").fetchall() == [(f"openai:m@{s.url}",)]
    logs = list((tmp_path / "home" / "logs").glob("generate-*.log"))
    assert len(logs) == 2 and "HTTP 401" in logs[-1].read_text() + logs[0].read_text()
    assert _leaks({**_written(tmp_path), "stdout": out + out2, "stderr": err + err2}) == []
    # credentials in the URL alone are sent as basic auth
    state["refuse"] = False
    rc3, out3, err3 = _generate(tmp_path, url, ["r"])
    assert rc3 == 0 and s.posts[-1][1]["Authorization"] == "Basic " + SECRETS[3], err3
    assert _leaks({**_written(tmp_path), "stdout": out3, "stderr": err3}) == []


def test_ctrl_c_while_the_server_trickles_stops_generate_at_once_and_the_line_hides_the_password(server, tmp_path):
    """`clarify generate` is not in a deferred block: SIGINT ends it within a second, with the one line whose
    "run again" command shows the URL as http://***@..."""
    s = server(answer=lambda h, body: trickle(h, 20))
    url = s.url.replace("http://", f"http://{USER}:{PASSWORD}@")
    (tmp_path / "p.jsonl").write_text('{"prompt": "p"}\n')
    argv = ["generate", "--base-url", url, "--model", "m", "--prompts", str(tmp_path / "p.jsonl"), "--out",
            str(tmp_path / "out.parquet")]
    env = {**os.environ, "PYTHONPATH": ":".join(sys.path), "CLARIFY_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "clarify.batch.cli", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not s.posts and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
        assert time.monotonic() - t0 < 2
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130 and err.strip().splitlines() == [
        "clarify generate: stopped by SIGINT; nothing kept, run again: clarify "
        + " ".join(argv).replace(f"{USER}:{PASSWORD}@", "***@")], err
    assert s.hung_up.wait(3)  # the request was cancelled, not left running
    assert _leaks({**_written(tmp_path), "stdout": out, "stderr": err}) == []


def test_config_json_records_the_url_without_credentials_and_a_copy_of_it_is_refused_in_one_line(tmp_path):
    from clarify.batch import config
    from clarify.local_llm import backends

    cfg = config.load(None, {"model.backend": "openai", "model.base_url": f"http://{USER}:{PASSWORD}@127.0.0.1:9/v1"})
    recorded = cfg.to_json()
    assert json.loads(recorded)["model"]["base_url"] == "http://***@127.0.0.1:9/v1" and _leaks({"": recorded}) == []
    (tmp_path / "config.json").write_text(recorded)
    with pytest.raises(InputError, match=r"records base_url without its credentials \(\*\*\*\); give the URL"):
        backends.get("openai").identity(config.load(tmp_path / "config.json").model)


def test_an_api_key_given_as_the_variable_name_is_refused_without_echoing_it(server):
    s = server()
    with pytest.raises(InputError) as got:
        OpenAIEngine(s.url, "m", api_key_env=KEY)
    assert "NAME of an environment variable" in str(got.value) and KEY not in str(got.value)


# --- clarify run: a stop while the server trickles, a malformed reply, credentials -----------------------
TOC_REPLY = "DQ 1: Which one?\nDA 1: This one"


def _toc_answer(body) -> str:
    return TOC_REPLY if "Disambiguations" in prompt(body) else "True"


def _toml(tmp_path: Path, index, url: str, **model) -> Path:
    model = {"backend": "openai", "base_url": url, "model": "m", "max_concurrency": 2, **model}
    toml = tmp_path / "run.toml"
    toml.write_text(f'limit = 2\nanswer_style = "free"\nindex = "{index}"\n[model]\n'
                    + "".join(f"{k} = {json.dumps(v)}\n" for k, v in model.items()) +
                    '[toc]\nmax_expansions = 2\nn_demos = 2\n')
    return toml


@pytest.mark.integration
def test_a_sigterm_while_the_server_trickles_ends_the_run_in_seconds_and_it_resumes(server, tmp_path, default_index):
    """`clarify run` in a process of its own: the server answers three requests, then trickles every reply.
    A SIGTERM once a trickle has begun ends the run within 5 s with the usual one line (exit 143), the
    completions it had are in the cache; once the server answers again the same command finishes."""
    state = {"served": 0, "trickle": True}

    def answer(h, body):
        if state["trickle"] and state["served"] >= 3:
            return trickle(h, 60)
        state["served"] += 1
        send(h, 200, json.dumps(completion(body, _toc_answer(body))).encode())

    s = server(answer=answer)
    toml = _toml(tmp_path, default_index, s.url, request_timeout_s=600.0)
    out = tmp_path / "run"
    argv = ["run", "--config", str(toml), "--out", str(out), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": ":".join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "clarify.batch.cli", *argv], env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while len(s.posts) <= 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None and len(s.posts) > 3, proc.communicate()[1][-3000:]
        time.sleep(1)  # well inside the trickle
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert time.monotonic() - t0 < 5
    finally:
        proc.kill()  # a no-op once it has ended
        proc.wait()
    assert proc.returncode == 143, err[-3000:]
    lines = [line for line in err.strip().splitlines() if line.startswith("clarify")]
    assert len(lines) == 1 and lines[0].startswith("clarify run: stopped by SIGTERM") and \
        lines[0].endswith(f"resume with: clarify {' '.join(argv)}"), err[-3000:]
    with sqlite3.connect(out / "cache" / "completions.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM completions").fetchone()[0] == 3
    state["trickle"] = False
    proc = subprocess.run([sys.executable, "-m", "clarify.batch.cli", *argv], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_questions"] == 2 and summary["cached_calls"] >= 3


@pytest.mark.integration
def test_a_run_stops_on_a_null_content_in_one_line_caches_none_of_it_and_writes_no_credential(
        server, tmp_path, default_index, monkeypatch, capsys):
    """`clarify run` with the key and URL credentials: the server answers a `"content": null` to its 4th request;
    the run stops with one line naming the server and the resume command, the cache holds the three good
    completions and no empty one; the same command then finishes. Nothing the runs wrote, and nothing they
    printed, holds a credential (config.json keeps the URL as http://***@...)."""
    from clarify.batch.cli import main

    state = {"served": 0, "null": True}

    def answer(h, body):
        state["served"] += 1
        if state["null"] and state["served"] == 4:
            return send(h, 200, json.dumps(completion(body, "x") | {"choices": [
                CHOICE | {"message": {"role": "assistant", "content": None}}]}).encode())
        send(h, 200, json.dumps(completion(body, _toc_answer(body))).encode())

    s = server(answer=answer)
    monkeypatch.setenv("MY_KEY", KEY)
    url = s.url.replace("http://", f"http://{USER}:{PASSWORD}@")
    toml = _toml(tmp_path, default_index, url, api_key_env="MY_KEY", max_concurrency=1)
    out = tmp_path / "run"
    argv = ["run", "--config", str(toml), "--out", str(out), "--no-progress"]
    assert main(argv) == 1
    first = capsys.readouterr()
    err = [line for line in first.err.splitlines() if line.startswith("clarify")]
    assert len(err) == 1 and "choice 0's message.content is None, not a string" in err[0], first.err[-3000:]
    assert f"the server at {s.url}" in err[0] and f"resume with: clarify {' '.join(argv)}" in err[0]
    with sqlite3.connect(out / "cache" / "completions.sqlite") as db:
        texts = [json.loads(p)["texts"] for (p,) in db.execute("SELECT payload FROM completions")]
    assert len(texts) == 3 and all(t and t[0] for t in texts)
    state["null"] = False
    assert main(argv) == 0
    second = capsys.readouterr()
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["base_url"] == s.url.replace("http://", "http://***@")
    assert json.loads((out / "inputs.json").read_text())["model"]["base_url"] == s.url
    assert all(h["Authorization"] == f"Bearer {KEY}" for _, h in s.posts)
    assert _leaks({**_written(out), "stdout": first.out + second.out, "stderr": first.err + second.err}) == []


def test_a_run_stopped_by_a_deadline_resumes_with_a_longer_one_but_not_with_another_model(tmp_path):
    """How the client talks to the server (deadlines, retries, the reply cap, concurrency) never changes an
    accepted completion: a run may resume with other values (config.json records the latest); the model may
    not change."""
    from clarify.batch import config
    from clarify.batch.config import RESULT_FREE
    from clarify.batch.run.rundir import RunDir

    rd = RunDir(tmp_path / "run")
    base = {"model.backend": "openai", "model.base_url": "http://127.0.0.1:9/v1", "model.model": "m"}
    rd.path.mkdir()
    rd.freeze(json.loads(config.load(None, base).to_json()), {}, ignore=RESULT_FREE)
    (rd.parts_dir / "0001").mkdir(parents=True)  # a checkpoint: the config is binding from now on
    longer = {**base, "model.request_timeout_s": 1200.0, "model.max_retries": 2, "model.check_timeout_s": 30.0,
              "model.reply_bytes_per_token": 512, "model.max_concurrency": 8}
    rd.freeze(json.loads(config.load(None, longer).to_json()), {}, ignore=RESULT_FREE)
    assert json.loads(rd.config_file.read_text())["model"]["request_timeout_s"] == 1200.0
    with pytest.raises(InputError, match=r"made with another config.*model\.model: 'm' → 'other'"):
        rd.freeze(json.loads(config.load(None, {**longer, "model.model": "other"}).to_json()), {}, ignore=RESULT_FREE)
