"""The report's words: statuses, span checks, metrics, summary.json's and config.json's keys as a reader
reads them, and the folded summary and config grouped under titles (batch/report/html.py's page)."""

from __future__ import annotations

from clarify.batch.report.comparison import flatten, split_summary
from clarify.batch.run.records import RunSummary
from clarify.batch.toc.tree import Status
from clarify.eval import metrics

STATUS_LABELS = {s: s.value.upper() for s in Status}  # the nodes table's statuses (batch/toc/tree.py)
SPAN_LABELS = {
    "verbatim": "verbatim",
    "repaired": "not verbatim: repaired",
    "unmarked": "not verbatim: unmarked",
    "bad_source": "not verbatim: no such source",
    "empty": "empty marker, no quote",
    "unverified": "not verbatim",
}
METRIC_WORDS = metrics.WORDS  # the headline's metrics in words, in its order; others keep their key
READER_NOTE = ("needs a reader: a SQuAD 2.0 extractive QA model, given to `clarify eval --reader DIR` "
               "(eval/reader.py)")
# summary.json grouped for the folded run summary: (group title, its keys' prefixes); the rest go last.
SUMMARY_GROUPS = (
    ("Run", ("name", "dataset", "model", "engine_model_id", "params", "answer_style", "n_questions", "constraints",
             "scheduler", "parts")),
    ("Work per question", ("llm_calls", "cached_calls", "tokens", "parse_errors", "prompts_too_long",
                           "valid_nodes_per_question", "max_depth", "node_status")),
    ("Quotes", ("quote_fidelity",)),
    ("Time", ("wall_s_last_session", "wall_s_total", "toc_s_last_session", "seconds_last_session",
              "engine_tokens_per_s")),
    ("Engine", ("engine", "engine_usage_last_session", "cache_recomputed", "cluster")),
)
SUMMARY_WORDS = {
    "n_questions": "questions", "engine_model_id": "engine model id", "params": "model parameters",
    "llm_calls": "LLM calls", "llm_calls_per_question": "LLM calls per question",
    "llm_calls_per_question_max": "LLM calls, most for one question", "cached_calls": "calls from the cache",
    "tokens.prompt": "prompt tokens", "tokens.output": "output tokens", "parse_errors": "completions not parsed",
    "prompts_too_long": "prompts over the context", "valid_nodes_per_question": "valid nodes per question",
    "max_depth": "deepest node", "wall_s_last_session": "wall seconds, last session",
    "wall_s_total": "wall seconds, all sessions", "toc_s_last_session": "ToC seconds, last session",
    "engine_tokens_per_s": "engine tokens/s (prompt + output)", "parts": "checkpoint parts",
}
# config.json's sections in words (batch/config/schema.py); top-level settings are the run's own.
CONFIG_SECTIONS = {"": "Run", "model": "Model and engine", "retrieval": "Retrieval", "toc": "Tree of clarifications",
                   "answer": "Answer", "cluster": "Cluster"}


def _words(key: str) -> str:
    """A flattened summary key in words: SUMMARY_WORDS, else its parts with spaces (`quote_fidelity.n_spans`
    -> `quote fidelity: n spans`)."""
    return SUMMARY_WORDS.get(key) or ": ".join(part.replace("_", " ") for part in key.split("."))


def summary_groups(summary: RunSummary | None) -> list[tuple[str, list[tuple[str, object]]]]:
    """summary.json but its metrics (shown first), flattened, in SUMMARY_GROUPS, keys in words."""
    _, rest = split_summary(summary)
    groups, taken = [], set()
    for title, prefixes in SUMMARY_GROUPS:
        keys = [k for k in rest if k not in taken and any(k == p or k.startswith(p + ".") or k.startswith(p + "_")
                                                          for p in prefixes)]
        taken.update(keys)
        if keys:
            groups.append((title, [(_words(k), rest[k]) for k in keys]))
    other = [k for k in rest if k not in taken]
    if other:
        groups.append(("Other", [(_words(k), rest[k]) for k in other]))
    return groups


def config_groups(settings: dict) -> list[tuple[str, list[tuple[str, object]]]]:
    """config.json by section (CONFIG_SECTIONS), each setting by its name in the section."""
    top = [(k, v) for k, v in settings.items() if not isinstance(v, dict)]
    groups = [(CONFIG_SECTIONS[""], top)] if top else []
    for section, values in settings.items():
        if isinstance(values, dict):
            groups.append((CONFIG_SECTIONS.get(section, section), list(flatten(values).items())))
    return groups
