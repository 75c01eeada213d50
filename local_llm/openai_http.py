"""Talking to an OpenAI-compatible server over HTTP: how (`ClientOptions`), one bounded exchange
(`exchange`), and the start-up check of what it serves (`resolve_served_model`: `GET /v1/models`).

Time: every exchange has a TOTAL deadline — connecting, waiting and the whole reply — not httpx's
per-read timeout, under which a server that sends one byte every few seconds is never timed out:
`request_timeout_s` for a completion, `check_timeout_s` for the start-up `GET /v1/models` and a token
count (`ClientOptions`, a run's [model] table). A body larger than the request allows is refused as soon
as it is seen to be, before it is read to the end.

Constraints are sent only to a vLLM server: one whose `GET /v1/models` lists the model as owned by "vllm"
(`ServedModel`); a run that asks for grammars from another server is refused here, in one line, before any
request (`check_constrainable`; local_llm/openai_engine.py, "Constraints").
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from clarify.errors import InputError, printable
from clarify.local_llm.openai_auth import Server, split_credentials
from clarify.local_llm.openai_reply import BadReply, json_body
from clarify.options import setting

SMALL_REPLY_BYTES = 4 << 20  # a model list or a token count (vLLM's /tokenize lists the token ids)


class Endpoint(StrEnum):
    """Where a prompt goes: "chat" sends it as one user message (/v1/chat/completions: the server applies the
    chat template), "completions" as raw text (/v1/completions: base models)."""

    CHAT = "chat"
    COMPLETIONS = "completions"


@dataclass(frozen=True)
class ClientOptions:
    """How the openai backend talks to its server, each option declared here once with its default (a run's
    `[model]` table, batch/config/schema.py ModelConfig, is made of these and local_llm/settings.py EngineOptions).
    None of them changes a completion the client accepts (declared `result_free`), but the address."""

    base_url: str = setting("", help="openai: the server's address, e.g. http://127.0.0.1:8000/v1")
    api_key_env: str = setting("", help="openai: the NAME of an environment variable holding the server's API "
                                        "key (never the key)")
    endpoint: Endpoint = setting(Endpoint.CHAT, help="openai: \"chat\" (the server applies the chat template) or "
                                                     "\"completions\" (raw text)")
    max_concurrency: int = setting(64, help="openai: requests in flight at once", lo=1, result_free=True)
    request_timeout_s: float = setting(600.0, help="openai: one request's TOTAL time limit in seconds: "
                                                   "connecting, waiting and the whole reply (a server that trickles "
                                                   "its reply a byte at a time is cut off); then it is retried "
                                                   "like a 5xx", lo=0, lo_open=True, unit="s", result_free=True)
    max_retries: int = setting(6, help="openai: retries of a request on 429/5xx/timeouts (backoff 1, 2, 4 ... s)",
                               lo=0, result_free=True)
    check_timeout_s: float = setting(10.0, help="openai: the total time limit in seconds of the start-up check "
                                                "(GET /v1/models) and of a token count (POST /tokenize)", lo=0,
                                       lo_open=True, unit="s", result_free=True)
    # Generous: the longest tokens of common vocabularies (runs of spaces or dashes) are far shorter than 128 bytes.
    reply_bytes_per_token: int = setting(128, help="openai: the longest reply accepted, in UTF-8 bytes of text per "
                                                   "requested token (max_tokens); a longer one is refused before "
                                                   "it is read to the end, and never cached", lo=1, unit="bytes",
                                           result_free=True)


def client_kwargs(options: ClientOptions) -> dict[str, Any]:
    """The client's options of an options object (a run's `[model]` table, a backend's Options) as the engine's
    keywords (local_llm/openai_engine.py OpenAIEngine), every one carried whole but the address, which the
    backend checks first (local_llm/backends.py `_base_url`): an option declared here reaches the engine with
    no edit there, as local_llm/settings.py `ask_of` carries the engine's options."""
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(ClientOptions) if f.name != "base_url"}


async def exchange(client, method: str, path: str, *, deadline_s: float, max_bytes: int,
                    body: dict | None = None) -> tuple[int, Any, bytes]:
    """(status, headers, body bytes) of one exchange, all of it within `deadline_s` seconds
    (TimeoutError otherwise); a body over `max_bytes` is refused (BadReply) as soon as it is seen to be,
    so a huge reply costs neither the time to read it nor the memory to hold it."""
    async with asyncio.timeout(deadline_s):
        async with client.stream(method, path, json=body) as r:
            declared = r.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise BadReply(f"a reply of {int(declared):,} bytes, over the {max_bytes:,} this request allows")
            chunks, size = [], 0
            async for chunk in r.aiter_bytes():  # decoded: a compressed bomb is capped as it inflates
                size += len(chunk)
                if size > max_bytes:
                    raise BadReply(f"a reply over the {max_bytes:,} bytes this request allows (cut off there)")
                chunks.append(chunk)
            return r.status_code, r.headers, b"".join(chunks)


def redirect(status: int, headers) -> str:
    return (f"HTTP {status}, a redirect to {headers.get('location', '(no location)')}: clarify does not follow "
            f"redirects; set [model] base_url to the address that answers")



# vLLM's server lists each model with owned_by "vllm" (vllm/entrypoints/serve/engine/protocol.py:109 ModelCard,
# vLLM 0.32; SGLang, TGI and llama.cpp's server write their own names there).
VLLM_OWNER = "vllm"


@dataclass(frozen=True)
class ServedModel:
    """A model as `GET /v1/models` lists it: its id, and who the server says owns it."""

    id: str
    owned_by: str | None = None

    @property
    def constrains(self) -> bool:
        """Whether clarify can send this server constraints: vLLM's server, which reads `structured_outputs`."""
        return self.owned_by == VLLM_OWNER


def check_constrainable(served: ServedModel, where: str, constrained: Sequence[str]) -> None:
    """The start-up check of constraints: InputError, in one line, when `constrained` (the settings that ask
    for grammars, e.g. "toc.constrain_format") is not empty and the server is not one that reads them."""
    if constrained and not served.constrains:
        owner = f"owned_by {printable(repr(served.owned_by))}" if served.owned_by is not None else "no owned_by"
        raise InputError(f"this server cannot constrain decoding ({where} lists {printable(repr(served.id))} with "
                         f"{owner}, not {VLLM_OWNER!r}: clarify sends grammars only in vLLM's structured_outputs); "
                         "set " + " and ".join(f"{name} = false" for name in constrained), field="model.base_url")


def served_models(base_url: str, api_key_env: str = ClientOptions.api_key_env,
                  timeout_s: float = ClientOptions.check_timeout_s) -> list[str]:
    """The model ids the server at `base_url` serves."""
    return [m.id for m in _model_list(base_url, api_key_env, timeout_s)]


def _model_list(base_url: str, api_key_env: str, timeout_s: float) -> list[ServedModel]:
    """The models the server at `base_url` serves (`GET /v1/models`, all of it within `timeout_s`);
    InputError, in one line, when it does not answer or is not an OpenAI-compatible server."""
    import httpx

    server = Server(base_url, api_key_env)
    url = server.url + "/models"

    async def get() -> tuple[int, Any, bytes]:
        async with server.client(timeout_s) as client:
            return await exchange(client, "GET", "/models", deadline_s=timeout_s, max_bytes=SMALL_REPLY_BYTES)

    fix = "start it (vllm serve MODEL --port ...) or fix [model] base_url"
    try:
        status, headers, raw = asyncio.run(get())
    except TimeoutError:
        raise InputError(f"the server at {server.url} did not answer GET {url} within {timeout_s:g} s "
                         f"(model.check_timeout_s); {fix}", field="model.base_url") from None
    except (httpx.HTTPError, BadReply, OSError) as exc:
        raise InputError(f"no OpenAI-compatible server answers at {server.url} "
                         f"({server.say(f'{type(exc).__name__}: {exc}')}); {fix}", field="model.base_url") from None
    if 300 <= status < 400:
        raise InputError(f"GET {url}: {server.say(redirect(status, headers))}", field="model.base_url")
    if status != 200:
        raise InputError(f"the server answered {status} to GET {url}"
                         + (" (check [model] api_key_env, or the credentials in base_url)" if status in (401, 403)
                            else ""), field="model.base_url")
    try:
        data = json_body(raw)
        ids = data["data"] if isinstance(data, dict) else None
        if not isinstance(ids, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in ids):
            raise BadReply("no list of models with ids in its 'data'")
        return [ServedModel(m["id"], m["owned_by"] if isinstance(m.get("owned_by"), str) else None) for m in ids]
    except BadReply as exc:
        raise InputError(f"the server at {server.url} is not OpenAI-compatible: GET {url} gave {server.say(exc)}; "
                         f"{fix}", field="model.base_url") from None


def resolve_served_model(base_url: str, model: str, api_key_env: str = ClientOptions.api_key_env,
                         timeout_s: float = ClientOptions.check_timeout_s,
                         constrained: Sequence[str] = ()) -> ServedModel:
    """The server's listing of `model` (of the one it serves when `model` is empty); InputError when it
    serves another, or cannot constrain decoding and `constrained` settings ask for it (`check_constrainable`)."""
    models = _model_list(base_url, api_key_env, timeout_s)
    ids = [m.id for m in models]
    where = split_credentials(base_url)[0]
    if not model:
        if len(ids) != 1:
            raise InputError(f"the server at {where} serves {printable(ids)}: name one in [model] model",
                             field="model.model")
        model = ids[0]
    if model not in ids:
        raise InputError(f"the server at {where} serves {printable(ids)}, not {printable(repr(model))}",
                         field="model.model")
    served = models[ids.index(model)]
    check_constrainable(served, f"the server at {where}", constrained)
    return served
