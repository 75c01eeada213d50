"""Shared pytest set-up. Fixtures live in plugin modules, one per subpackage, listed here."""

import os

# Never reach a network from tests (models and data are local); keep vLLM in-process.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OPENAI_API_KEY", "unused")  # pyserini builds an OpenAI client at import

pytest_plugins = [
    "tests.fixtures_llm",
    "tests.fixtures_index",
    "tests.fixtures_eval",
]
