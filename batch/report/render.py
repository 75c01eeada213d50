"""The report's rendering: the Jinja2 environment over batch/report/templates/ (autoescaped: model output
is untrusted), PNGs as `data:` URIs, and the packing of folded text (deflated, base64) that report.js
inflates when it opens."""

from __future__ import annotations

import base64
import json
import zlib
from functools import lru_cache
from pathlib import Path

import jinja2
from markupsafe import Markup

from clarify.batch.report.comparison import fmt

TEMPLATES = Path(__file__).parent / "templates"  # package data (pyproject `[tool.setuptools.package-data]`)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The report's Jinja2 environment: templates from TEMPLATES, autoescape on (model output is untrusted),
    None rendered as nothing, `fmt` (comparison.fmt) as a filter and `inline(name)` for a template folder
    file's text as it is (report.css, report.js: ours, not from a run)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=lambda value: "" if value is None else value,
    )
    env.filters["fmt"] = fmt
    env.globals["inline"] = lambda name: Markup(env.loader.get_source(env, name)[0])
    return env


def data_uri(png: bytes | None) -> str | None:
    return None if png is None else "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def pack(text: str) -> Markup:
    """`text` deflated (raw DEFLATE, RFC 1951) and base64-encoded, for a `<script type="application/
    octet-stream">` that report.js inflates with the browser's DecompressionStream("deflate-raw"). Base64
    has no `<` or `&`, so nothing packed can close the script element; what is packed was escaped when it
    was rendered (autoescape) or is put in as text (the passage store)."""
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)  # wbits -15: no zlib header, as "deflate-raw" wants
    return Markup(base64.b64encode(deflate.compress(text.encode("utf-8")) + deflate.flush()).decode("ascii"))


def text_store(texts: dict[str, str]) -> Markup:
    """The run's folded passage texts, a JSON object packed (`pack`): report.js fills a passage's text from
    it when its <details> opens, as textContent, never markup."""
    return pack(json.dumps(texts, ensure_ascii=False, sort_keys=True))
