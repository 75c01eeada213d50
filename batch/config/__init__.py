"""The run configuration: its schema (schema.py: the tables' dataclasses, each setting declared once in its
field, checked on construction), its reading (load.py: TOML or a run's config.json, CLI overrides) and what
a question costs under it (costs.py). `config.X` names the three modules' names as one, as before they were
split; the modules import what they need from the one that declares it."""

from clarify.batch.config.costs import (  # noqa: F401
    CALLS_PER_QUESTION,
    CONSTRAINED_CALLS_PER_QUESTION,
    CONSTRAINED_TOKENS_PER_QUESTION,
    TOKENS_PER_QUESTION,
    calls_per_question,
    tokens_per_question,
)
from clarify.batch.config.load import from_dict, load  # noqa: F401
from clarify.batch.config.schema import *  # noqa: F401,F403
from clarify.batch.config.schema import _SECTIONS, _as_declared, _check_values  # noqa: F401
