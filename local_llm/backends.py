"""Engine backends behind one seam (docs/engines.md), shaped like the dataset registry (eval/datasets/).

`[model] backend` picks one: "vllm" (default) starts vLLM's offline engine in this process
(local_llm/vllm_engine.py); "openai" talks to a model that already runs as a server speaking the
OpenAI-compatible API (local_llm/openai_engine.py). Each backend answers three questions:
- `open(model_cfg, pin=, constrained=, **placement)`: the engine (`pin`: the run's `identity`, so a folder is
  resolved and fingerprinted once per run) (Engine + EngineInfo + StepEngine, local_llm/engine.py);
- `identity(model_cfg, constrained=)`: what a run pins in inputs.json, checked before anything is written (a
  model folder's fingerprint; a server's address and the model id it reports, refused in one line when down);
- `uses_gpus`: whether a Ray worker of this backend needs a GPU of its own (batch/run/cluster.py).
Constraints: the engine translates a request's `choices` and `grammar` (GenParams, an EBNF grammar in the
GBNF syntax) into its server's dialect: vLLM's structured outputs, in process (vllm_engine.py) or in a vLLM
server's `structured_outputs` (openai_engine.py). `constrained` names the settings that will send grammars
(e.g. "toc.constrain_format"); a backend whose server cannot honour them refuses in one line, in `identity`
and `open`, before any request: "this server cannot constrain decoding (...); set ... = false".
Adding SGLang's or TGI's native client is one more module and one more entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clarify.local_llm.openai_http import ClientOptions, client_kwargs
from clarify.local_llm.settings import EngineOptions


@dataclass(frozen=True)
class Options(ClientOptions, EngineOptions):
    """What a backend opens: the model, the engine's options and the server client's, each with its declared
    default (batch/config/schema.py ModelConfig adds the run's own; `clarify generate` opens one of these)."""


@dataclass(frozen=True)
class Backend:
    name: str
    open: Callable[..., Any]
    identity: Callable[[Any], dict]
    uses_gpus: bool
    description: str


def _vllm_open(m, pin: Any = None, constrained=(), **placement):  # vLLM constrains every request
    from clarify.local_llm.vllm_engine import get_engine

    # the run's pin (`identity`, inputs.json; batch/run/records.py Pin): the folder it resolved and fingerprinted once
    model, fingerprint = (pin.path, pin.fingerprint) if pin and pin.path else (m.model, None)
    return get_engine(model, m, fingerprint=fingerprint, **placement,
                      progress=False)  # the run shows its own progress (console.RunProgress), not vLLM's


def _vllm_identity(m, constrained=()) -> dict:
    from clarify.local_llm.models import model_fingerprint, resolve_model

    path = resolve_model(m.model)
    return {"path": str(path), "fingerprint": model_fingerprint(path)}


def _openai_open(m, pin: Any = None, constrained=(), **placement):
    from clarify.local_llm.openai_engine import OpenAIEngine

    return OpenAIEngine(_base_url(m), m.model, **client_kwargs(m), max_model_len=m.max_model_len,
                        constrained=constrained)


def _openai_identity(m, constrained=()) -> dict:
    from clarify.local_llm.openai_auth import split_credentials
    from clarify.local_llm.openai_http import resolve_served_model

    url = _base_url(m)
    served = resolve_served_model(url, m.model, m.api_key_env, m.check_timeout_s, constrained).id
    return {"backend": "openai", "base_url": split_credentials(url)[0], "served_model": served}  # no credentials


def _base_url(m) -> str:
    from clarify.errors import InputError
    from clarify.local_llm.openai_auth import split_credentials

    if not m.base_url:
        raise InputError("backend \"openai\" needs the server's address, e.g. http://127.0.0.1:8000/v1",
                         field="model.base_url")
    credentials = split_credentials(m.base_url)[1]
    if credentials and "***" in credentials:  # a run's config.json records the URL redacted (errors.redacted)
        raise InputError("a run's config.json records base_url without its credentials (***); give the URL "
                         "with them in your own config", field="model.base_url")
    return m.base_url.rstrip("/")


BACKENDS: dict[str, Backend] = {
    "vllm": Backend("vllm", _vllm_open, _vllm_identity, True,
                    "vLLM's offline engine in this process (a model folder or an embedded model)"),
    "openai": Backend("openai", _openai_open, _openai_identity, False,
                      "a running OpenAI-compatible server (vllm serve, SGLang, TGI, llama.cpp) at [model] base_url"),
}


def names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def get(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {names()}") from None
