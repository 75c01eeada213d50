"""A server's reply, checked: `parse_reply` turns a 200 body into a `Completion` or refuses it with
`BadReply` saying what is wrong (cut-off or non-JSON bodies, missing or malformed choices, another model, an
unknown finish reason, a reply far larger than `max_tokens` allows, text that is not Unicode). Nothing it
refuses reaches the completion cache (local_llm/openai_engine.py, "Failures").

Text: a reply's text must be valid Unicode without NUL (a lone surrogate such as `\\ud800`, invalid UTF-8
or a NUL refuses the whole reply: no working detokenizer produces them, so they mean a broken server).
The other control characters (C0 but tab, newline and carriage return; DEL; C1) are replaced by U+FFFD,
as vLLM's detokenizer writes a byte it cannot decode: a model may emit them as byte tokens, and they
must not reach a terminal or a later prompt as escape sequences.
"""

from __future__ import annotations

import json
import re
from typing import Any

from clarify.local_llm.engine import Completion, GenParams

# What a completion may finish with: the OpenAI API's and vLLM's reasons for a text that ended on a stop
# (string, token or the end of a choice) or on max_tokens (vllm/entrypoints/openai/protocol.py). Any
# other ("abort", "content_filter", "tool_calls", null) is not a plain completion and is refused.
FINISH_REASONS = ("stop", "length")
ENVELOPE_BYTES = 64 << 10  # a reply's JSON around its texts (ids, usage, logprob-free choices): generous
# C0 controls but tab, newline and carriage return; DEL; C1 (module docstring, "Text")
_CONTROL = re.compile("[\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class BadReply(Exception):
    """A reply that is not what was asked for; the message says what is wrong, in words."""


def json_body(raw: bytes) -> Any:
    """The JSON of a body; BadReply saying what it is instead (empty, not UTF-8, an HTML page, cut off)."""
    if not raw.strip():
        raise BadReply("an empty body")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadReply(f"a body that is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError
        what = "an HTML page" if text.lstrip()[:1] == "<" else "not JSON (cut off, or not an API reply)"
        pos = getattr(exc, "pos", None)
        raise BadReply(f"{what} ({getattr(exc, 'msg', exc)}, character {pos}), beginning {text[:60]!r}") from None




def reply_cap(params: GenParams, bytes_per_token: int) -> int:
    """The largest reply body accepted for `params`: each of its `n` texts at `bytes_per_token` bytes per
    requested token, JSON-escaped at worst (6 bytes for one: `\\u001b`), plus the envelope."""
    return ENVELOPE_BYTES + 6 * params.n * params.max_tokens * bytes_per_token


def count(value: Any, name: str) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadReply(f"{name} is {value!r}, not a count of tokens")
    return value


def _text(value: Any, where: str, cap: int) -> str:
    """A choice's text, checked and cleaned (module docstring, "Text")."""
    if not isinstance(value, str):
        raise BadReply(f"{where} is {'missing' if value is _MISSING else repr(value)[:40]}, not a string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise BadReply(f"{where} holds a lone surrogate ({value[exc.start]!r}) at character {exc.start}: "
                       f"not Unicode") from None
    if "\x00" in value:
        raise BadReply(f"{where} holds a NUL character at character {value.index(chr(0))}")
    if size > cap:
        raise BadReply(f"{where} is {size:,} bytes, over the {cap:,} its max_tokens allows")
    return _CONTROL.sub("\ufffd", value)


_MISSING = object()


def parse_reply(raw: bytes, params: GenParams, *, chat: bool, served: str, bytes_per_token: int) -> Completion:
    """The Completion in a 200 reply's body, or BadReply saying what is wrong with it: every check that
    keeps a reply that is not a completion of this request out of the cache (module docstring)."""
    data = json_body(raw)
    if not isinstance(data, dict):
        raise BadReply(f"a JSON {type(data).__name__}, not an object")
    if data.get("model") != served:
        raise BadReply(f"it names the model {data.get('model')!r:.80}, not {served!r} (the one /v1/models served)")
    choices = data.get("choices", _MISSING)
    if choices is _MISSING:
        raise BadReply("no 'choices'")
    if not isinstance(choices, list) or not choices:
        raise BadReply(f"'choices' is {choices!r:.40}, not a list of choices")
    if len(choices) != params.n:
        raise BadReply(f"{len(choices)} choices for n = {params.n}")
    by_index: dict[int, dict] = {}
    for pos, c in enumerate(choices):
        if not isinstance(c, dict):
            raise BadReply(f"choice {pos} is {c!r:.40}, not an object")
        i = c.get("index", pos)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < params.n or i in by_index:
            raise BadReply(f"choice {pos} has index {i!r:.20}; want each of 0..{params.n - 1} once")
        by_index[i] = c
    cap = params.max_tokens * bytes_per_token
    texts, reasons = [], []
    for i in range(params.n):
        c = by_index[i]
        if chat:
            message = c.get("message")
            if not isinstance(message, dict):
                raise BadReply(f"choice {i} has no message")
            texts.append(_text(message.get("content", _MISSING), f"choice {i}'s message.content", cap))
        else:
            texts.append(_text(c.get("text", _MISSING), f"choice {i}'s text", cap))
        reason = c.get("finish_reason")
        if reason not in FINISH_REASONS:
            raise BadReply(f"choice {i} finished with {reason!r:.40}, not one of {FINISH_REASONS}")
        reasons.append(reason)
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if not isinstance(usage, dict) or not isinstance(details or {}, dict):
        raise BadReply(f"'usage' is {usage!r:.60}, not an object of counts")
    extra: dict[str, Any] = {"cached_tokens": count((details or {}).get("cached_tokens"),
                                                     "usage.prompt_tokens_details.cached_tokens")}
    if params.n > 1:
        extra["finish_reasons"] = reasons
    fingerprint = data.get("system_fingerprint")
    if isinstance(fingerprint, str):
        extra["system_fingerprint"] = fingerprint[:200]
    return Completion(texts=tuple(texts), finish_reason=reasons[0],
                      prompt_tokens=count(usage.get("prompt_tokens"), "usage.prompt_tokens"),
                      output_tokens=count(usage.get("completion_tokens"), "usage.completion_tokens"), extra=extra)
