"""local_llm: the Engine contract, the vLLM engine, the completion cache, model preparation.

Pure imports only here; `clarify.local_llm.vllm_engine` (vllm, torch) is imported by whoever
builds a real engine."""

from clarify.local_llm.cache import CachedEngine
from clarify.local_llm.engine import Completion, Engine, GenParams, request_key
from clarify.local_llm.models import DEFAULT_MODEL, EMBEDDED, model_info, prepare_model, resolve_model
from clarify.local_llm.scripted import ScriptedEngine

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED",
    "CachedEngine",
    "Completion",
    "Engine",
    "GenParams",
    "ScriptedEngine",
    "model_info",
    "prepare_model",
    "request_key",
    "resolve_model",
]
