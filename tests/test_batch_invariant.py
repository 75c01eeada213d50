"""`[model] batch_invariant = true` (docs/engines.md#batch-invariance): the same questions give identical tables computed FRESH —
no completion cache shared, the prefix cache dropped between runs — under the three schedulers in one
process and on 2 Ray workers. On CPU the mode runs float32, whose texts do not depend on the batch
(tests/test_llm_engine.py); on CUDA it sets vLLM's batch-invariant kernels (local_llm/settings.py), which
bench/gpu_check.py checks the same way where a GPU is lent.

Every run is a child process (Ray's signal handlers stay out of this pytest process, as in
tests/test_cluster.py); the three schedulers share one engine there, as they would in one `clarify` process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import polars as pl
import pytest

from tests.run_fixtures import SMALL, same_tables

pytestmark = pytest.mark.integration

# Two questions, small trees: fresh runs are paid in full, four times.
SETTINGS = {"answer_style": "free", **SMALL, "toc.max_expansions": 2, "toc.n_demos": 2, "limit": 2,
            "model.batch_invariant": True}

SCHEDULERS = """
import json, sys
from pathlib import Path
from clarify.batch import config
from clarify.batch.run.pipeline import run
from clarify.batch.run.resources import engine_for
from clarify.batch.toc.settings import TreeSettings
settings, out = json.loads(sys.argv[1]), Path(sys.argv[2])
engines = []
def fresh(model):  # one engine for the three runs, its prefix cache dropped before each: computed afresh
    engine = engine_for(model, TreeSettings.of(cfg))
    engine.reset_prefix_cache()
    engines.append(engine)
    return engine
got = {}
for scheduler in ("continuous", "waves", "sequential"):
    cfg = config.load(None, {**settings, "scheduler": scheduler})
    got[scheduler] = run(cfg, out / scheduler, engine_factory=fresh, progress=False).to_json()
assert len({id(e) for e in engines}) == 1
print(json.dumps(got))
"""


def _child(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_batch_invariant_runs_are_identical_fresh_under_every_scheduler_and_two_workers(tmp_path, default_index):
    settings = {**SETTINGS, "index": str(default_index)}
    runs = _child(SCHEDULERS, json.dumps(settings), str(tmp_path))
    ray_out = tmp_path / "ray"
    runs["ray"] = _child("import json, sys\nfrom clarify.batch import config\nfrom clarify.batch.run.pipeline import run\n"
                         "cfg = config.load(None, json.loads(sys.argv[1]))\n"
                         "print(json.dumps(run(cfg, sys.argv[2], progress=False).to_json()))",
                         json.dumps({**settings, "cluster.workers": 2, "cluster.chunk_questions": 1}), str(ray_out))
    for name, summary in runs.items():
        assert summary["n_questions"] == 2, name
        # computed here: each run starts with an empty completion cache; the cached calls are repeats of a
        # byte-identical request inside the run (the seed is a function of the prompt, docs/fidelity.md)
        assert summary["llm_calls"] > summary["cached_calls"], name
        engine = summary["engine"]
        assert engine["dtype"] == "float32" and engine["batch_invariant"] is True, name
        assert ":batch-invariant:" in engine["model_id"] and engine["vllm"] and engine["torch"], name
    assert runs["ray"]["cluster"]["workers"] == 2 and runs["ray"]["cluster"]["chunks"] == 2
    frozen = json.loads((tmp_path / "continuous" / "config.json").read_text())
    assert frozen["model"]["batch_invariant"] is True
    texts = pl.read_parquet(tmp_path / "continuous" / "llm_calls.parquet")["completion"].to_list()
    assert len(texts) >= 4 and any(t.strip() for t in texts)
    for other in ("waves", "sequential"):
        same_tables(tmp_path / "continuous", tmp_path / other)
    same_tables(tmp_path / "continuous", ray_out)
