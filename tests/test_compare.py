"""`clarify compare`: shared retrieval between runs, and a real two-model comparison end to end."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from clarify.batch.run.search_cache import CachingSearcher
from tests.toc_fakes import FakeIndex

IDENTITY = {"searcher": "rerank", "candidates": 100, "cross_encoder": "", "index": "a" * 64}


def test_caching_searcher_searches_each_query_once(tmp_path):
    inner = FakeIndex().searcher()
    queries = pl.DataFrame({"qid": ["a", "b", "c"], "query": ["world cup winner", "harry potter actor", "world cup winner"]})
    first = CachingSearcher(inner, tmp_path / "sc", IDENTITY).search(queries, k=5)
    assert inner.calls == 1
    # another process (a new wrapper over the same folder) re-uses every result
    again = CachingSearcher(inner, tmp_path / "sc", IDENTITY)
    second = again.search(queries, k=5)
    assert inner.calls == 1 and again.searched == 0 and again.reused == 3
    assert first.equals(second)
    assert first.filter(pl.col("qid") == "a").drop("qid").equals(first.filter(pl.col("qid") == "c").drop("qid"))
    # a new query is searched alone; a different k is a different result
    mixed = again.search(pl.DataFrame({"qid": ["d", "e"], "query": ["world cup winner", "capital of georgia"]}), k=5)
    assert again.searched == 1 and mixed["qid"].unique().sort().to_list() == ["d", "e"]
    again.search(queries.head(1), k=3)
    assert again.searched == 2
    # another index (manifest checksum) or another searcher never gets these passages: searched anew
    for other in ({**IDENTITY, "index": "b" * 64}, {**IDENTITY, "searcher": "bm25"},
                  {**IDENTITY, "cross_encoder": "/models/ce"}):
        fresh = CachingSearcher(inner, tmp_path / "sc", other)
        fresh.search(queries, k=5)
        assert fresh.searched == 2 and fresh.reused == 1  # the two distinct queries; the repeat from them
    assert len(list((tmp_path / "sc").glob("*/identity.json"))) == 4


@pytest.mark.integration
def test_compare_two_models_real_runs(tmp_path, llm_model_dir, default_index):
    """Two model directories (the embedded SmolLM2 and a second folder of the same weights, so the test
    needs no second download) over the same 2 questions, run at the same time (`--parallel`), each on
    its own CPU core: one run directory each, a comparison table with parameter counts, a plot, and
    retrieval for identical queries shared."""
    from clarify.batch import config
    from clarify.batch.compare.compare import compare
    from clarify.batch.toc.tree import ROOT

    twin = tmp_path / "twin-model"
    twin.mkdir()
    for f in llm_model_dir.iterdir():
        os.symlink(f, twin / f.name)
    toml = tmp_path / "small.toml"
    toml.write_text("[toc]\nmax_expansions = 2\nclarify_max_tokens = 64\nanswer_max_tokens = 64\nn_demos = 2\n")
    cfg = config.load(toml, {"dataset": "asqa", "limit": 2, "index": str(default_index), "answer_style": "quoted"})
    out = tmp_path / "cmp"
    table = compare([str(llm_model_dir), str(twin)], cfg, out, parallel=True)
    assert table.height == 2 and table["params"].to_list() == [134515008, 134515008]
    # at the same time, on disjoint cores (each engine holds its own cores' locks: CoreLock)
    (s0, s1), (f0, f1) = table["started"].to_list(), table["finished"].to_list()
    assert max(s0, s1) < min(f0, f1)
    assert table["devices"].to_list() == ["VLLM_CPU_OMP_THREADS_BIND=0", "VLLM_CPU_OMP_THREADS_BIND=1"]
    assert all((out / f"{Path(r).name}.log").exists() for r in table["run_dir"])
    for col in ("rouge_l", "str_em", "llm_calls_per_question", "prompt_tokens", "wall_s", "quote_n_spans"):
        assert col in table.columns
    assert (out / "comparison.png").stat().st_size > 0 and (out / "comparison.md").exists()
    runs = [Path(p) for p in table["run_dir"]]
    for run_dir in runs:
        assert json.loads((run_dir / "summary.json").read_text())["n_questions"] == 2
    # the root questions are searched by both runs, but stored (searched) once
    cached = pl.concat([pl.read_parquet(f) for f in (out / "search_cache").glob("*/*.parquet")])
    # two runs at once may both search a root query before either has stored it: the results they store
    # are the same passages, rank for rank
    per_rank = cached.group_by("query", "k", "rank").agg(pl.col("passage_id").n_unique())
    assert (per_rank["passage_id"] == 1).all()
    # only the root question goes through the searcher (retrieval.node_passages = "pool": every node
    # reranks its tree's pool, batch/toc/program.py node_passages); which children get expanded, and so
    # which other queries appear in hits, depends on what this CPU's bf16 kernels made the model write
    roots = [set(pl.read_parquet(r / "hits.parquet").filter(pl.col("node_id") == ROOT)["query"]) for r in runs]
    assert len(roots[0]) == 2 and roots[0] == roots[1] == set(cached["query"])


def test_parallel_runs_get_disjoint_devices(monkeypatch):
    """`compare --parallel`: the visible GPUs split between the models, else this process's CPU cores;
    fewer devices than models is refused before anything starts."""
    from clarify.batch.compare.compare import device_groups
    from clarify.errors import InputError

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4")
    assert device_groups(2) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU: the cores
    cores = sorted(os.sched_getaffinity(0))
    groups = device_groups(len(cores))
    assert [g["VLLM_CPU_OMP_THREADS_BIND"] for g in groups] == [str(c) for c in cores]
    with pytest.raises(InputError, match=f"{len(cores) + 1} models at once need at least"):
        device_groups(len(cores) + 1)


def test_every_model_runs_on_one_resolved_config(tmp_path, monkeypatch):
    """compare resolves the TOML and the flags once and hands every model's run its own config file
    (<out>/models/<name>.json): a setting given only in the TOML (here the dataset) reaches each run,
    with that model's [model] settings (a models file's entry) in place of the TOML's."""
    from types import SimpleNamespace

    from clarify.batch import config
    from clarify.batch.compare import compare as cmp
    from clarify.batch.compare.models_file import Entry

    toml = tmp_path / "qs.toml"
    toml.write_text('dataset = "quotesum"\nlimit = 3\n[toc]\nmax_depth = 2\n[model]\nmax_model_len = 4096\n')
    cfg = config.load(toml, {"seed": 7})
    cmds = []
    monkeypatch.setattr(cmp, "_start", lambda cmd, **kw: cmds.append(cmd) or SimpleNamespace(returncode=0, poll=lambda: 0))
    entries = [Entry("a", {"model": "/models/a"}), Entry("b", {"model": "/models/b", "dtype": "float32",
                                                                "max_model_len": 2048, "chat_template": "off"})]
    cmp._launch({e.name: e.config(cfg) for e in entries}, tmp_path / "out", parallel=False, verbose=False)
    files = [tmp_path / "out" / "models" / f"{n}.json" for n in ("a", "b")]
    assert [c[c.index("--config") + 1] for c in cmds] == [str(f) for f in files]
    assert [c[c.index("--out") + 1] for c in cmds] == [str(tmp_path / "out" / n) for n in ("a", "b")]
    a, b = (config.load(f) for f in files)
    for got in (a, b):
        assert (got.dataset, got.limit, got.seed, got.toc.max_depth) == ("quotesum", 3, 7, 2)
    assert (a.model.model, a.model.dtype, a.model.max_model_len, a.model.chat_template) == ("/models/a", "auto", 4096, "auto")
    assert (b.model.model, b.model.dtype, b.model.max_model_len, b.model.chat_template) == ("/models/b", "float32", 2048, "off")


def _three_bad_entries(tmp_path, text: str) -> tuple:
    """A models file of `text`, refused in one message: (its path, the message's lines: a head, one per bad entry)."""
    from clarify.batch.compare import models_file
    from clarify.errors import InputError

    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(InputError) as got:
        models_file.load(bad)
    lines = str(got.value).splitlines()
    assert lines[0] == f"{bad}: 3 bad model entries:" and len(lines) == 4
    return bad, lines


def test_models_file_entries_and_one_line_per_bad_entry(tmp_path):
    from clarify.batch.compare import models_file
    from clarify.errors import InputError

    good = tmp_path / "models.toml"
    good.write_text('[[model]]\nmodel = "smollm2-135m-instruct"\n\n[[model]]\nname = "gemma-fp32"\n'
                    'model = "gemma3-270m"\ndtype = "float32"\ntensor_parallel_size = 1\n')
    a, b = models_file.load(good)
    assert (a.name, a.settings) == ("smollm2-135m-instruct", {"model": "smollm2-135m-instruct"})
    assert (b.name, b.settings) == ("gemma-fp32", {"model": "gemma3-270m", "dtype": "float32", "tensor_parallel_size": 1})
    bad, lines = _three_bad_entries(tmp_path, '[[model]]\nmodel = "a"\ndtype = "int3"\n\n[[model]]\nmodel = "b"\n\n'
                                               '[[model]]\nmodel = "c"\nquantisation = "awq"\n\n[[model]]\nmax_model_len = 0\n')
    assert lines[1].startswith(f"  {bad} (field 'model[1].dtype'): entry 'a': unknown value 'int3'")
    assert lines[2].startswith(f"  {bad} (field 'model[3]'): entry 'c': unknown key(s) ['quantisation']")
    assert lines[3] == (f"  {bad} (field 'model[4]'): max_model_len: must be >= 1, got 0; model: missing: the "
                        f"embedded model's name or a model folder")
    twice = tmp_path / "twice.toml"
    twice.write_text('[[model]]\nmodel = "/m/x"\n\n[[model]]\nmodel = "/n/x"\n')
    with pytest.raises(InputError, match=r"field 'model\[2\].name'.*share the run directory 'x'"):
        models_file.load(twice)


def test_compare_checks_every_model_on_this_machine_and_plans_before_starting(tmp_path, monkeypatch, capsys):
    """A quantization on a CPU machine is refused in one line naming the model, before any run; on faked
    GPUs `--plan-only` prints the plan (model folders' own config.json sizes) and starts nothing."""
    import json as _json
    import struct

    from clarify.batch import config
    from clarify.batch.compare import compare as cmp
    from clarify.batch.compare.models_file import Entry
    from clarify.errors import InputError
    from clarify.local_llm.preflight import Gpu

    monkeypatch.setattr(cmp, "_start", lambda *a, **k: pytest.fail("nothing may start"))
    cfg = config.load(None, {"limit": 2})
    entries = [Entry("smol", {"model": "/m/smol"}), Entry("awq", {"model": "/m/awq", "quantization": "awq"})]
    with pytest.raises(InputError) as got:
        cmp.compare(entries, cfg, tmp_path / "out", gpus=[], source="models.toml")
    assert str(got.value) == ("models.toml: model 'awq': field 'model.quantization': quantization 'awq' needs a "
                              "CUDA GPU; a CPU engine runs the weights unquantized (leave quantization empty)")
    assert not (tmp_path / "out").exists()
    for name, (gib, layers) in {"small": (3, 16), "big": (100, 80)}.items():  # folders as the planner reads them
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(_json.dumps({"model_type": "llama", "torch_dtype": "bfloat16", "num_hidden_layers": layers,
                                                    "num_attention_heads": 64, "num_key_value_heads": 8,
                                                    "hidden_size": 8192}))
        with open(d / "model.safetensors", "wb") as fh:  # a header, then sparse: its size is what the planner reads
            fh.write(struct.pack("<Q", 2) + b"{}")
            fh.truncate(gib << 30)
    h100 = Gpu("H100", (9, 0), 80 << 30, 80 << 30)
    entries = [Entry("small", {"model": str(tmp_path / "small")}), Entry("big", {"model": str(tmp_path / "big")})]
    assert cmp.compare(entries, cfg, tmp_path / "out", plan_only=True, gpus=[(str(i), h100) for i in range(4)]) is None
    plan = capsys.readouterr().out
    assert "1. big    GPUs 0,1" in plan and "2. small  GPU 2" in plan and "idle at the start: GPU 3" in plan
    assert not (tmp_path / "out").exists()
    # on a Ray cluster the same needs are each run's resource request (batch/run/cluster.py), Ray queues them
    ray = config.load(None, {"limit": 2, "cluster.ray_address": "auto"})
    cmp.compare(entries, ray, tmp_path / "out", plan_only=True, gpus=[(str(i), h100) for i in range(4)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  small: num_gpus 1 (tensor_parallel_size 1")
    assert lines[2].startswith("  big: a placement group of 2 x {GPU: 1, CPU: 1} (tensor_parallel_size 2")


def test_a_stopped_compare_passes_the_signal_once_to_each_run(tmp_path):
    """`compare` runs each model in a session of its own (a terminal's Ctrl-C reaches compare only) and
    passes a stop on once: each run then stops as a run does (stops.py) — a second signal would stop it
    at once. Compare waits for them and says how each ended."""
    import signal
    import threading

    from clarify import stops
    from clarify.batch.compare import compare as cmp

    child = ("import signal, sys, time\nseen = []\nsignal.signal(signal.SIGINT, lambda s, f: seen.append(s))\n"
             "print('ready', flush=True)\nwhile not seen: time.sleep(0.05)\ntime.sleep(0.5)\n"
             "sys.exit(100 + len(seen))\n")
    procs = {m: cmp._start([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True) for m in ("a", "b")}
    for p in procs.values():
        assert p.stdout.readline().strip() == "ready"
        assert os.getpgid(p.pid) != os.getpgid(0)  # not in our process group: a terminal's signal skips it
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    with stops.handled(), pytest.raises(stops.Stopped) as got:
        cmp._wait(procs)
    assert [p.returncode for p in procs.values()] == [101, 101]  # one SIGINT each
    assert got.value.done == "a: stopped (exit 101); b: stopped (exit 101)"


def test_a_planned_run_sees_only_its_own_gpus(tmp_path, monkeypatch):
    """Each model's run gets CUDA_VISIBLE_DEVICES = the machine ids of its planned GPUs (here the visible
    GPUs are 4..7), the tensor_parallel_size the planner chose in its frozen config, its output in its log."""
    from types import SimpleNamespace

    from clarify.batch import config
    from clarify.batch.compare import compare as cmp
    from clarify.batch.compare import gpu_plan
    from clarify.local_llm.preflight import Gpu, ModelShape
    from clarify.local_llm.settings import Ask

    h100 = Gpu("H100", (9, 0), 80 << 30, 80 << 30)
    shapes = {"big": ModelShape(141 << 30, "bfloat16", 80, 8, 128), "small": ModelShape(3 << 30, "bfloat16", 16, 8, 64)}
    plan = gpu_plan.plan([gpu_plan.Model(n, s, Ask(model=n, model_dtype="bfloat16", tensor_parallel_size=0))
                          for n, s in shapes.items()], [h100] * 4)
    seen = {}
    monkeypatch.setattr(cmp, "_start", lambda cmd, **kw: seen.setdefault(
        cmd[cmd.index("--out") + 1], kw["env"]["CUDA_VISIBLE_DEVICES"]) and SimpleNamespace(returncode=0, poll=lambda: 0))
    configs = {p.name: config.load(None, {"limit": 1, "model.model": p.name, "model.tensor_parallel_size": p.tp})
               for p in plan.placements}
    (tmp_path / "out").mkdir()
    times = cmp._launch(configs, tmp_path / "out", False, False, plan, ["4", "5", "6", "7"])
    # the 70B-sized model needs all 4 GPUs; the small one waits for them and starts on the first
    assert seen == {str(tmp_path / "out" / "big"): "4,5,6,7", str(tmp_path / "out" / "small"): "4"}
    assert times["big"]["devices"] == "CUDA_VISIBLE_DEVICES=4,5,6,7"
    assert config.load(tmp_path / "out" / "models" / "big.json").model.tensor_parallel_size == 4
    assert (tmp_path / "out" / "small.log").exists()


def test_gpus_read_from_nvidia_smi_lines():
    """nvidia-smi's CSV (GPU_QUERY: index, name, MiB total, MiB free, compute capability), filtered and
    ordered by CUDA_VISIBLE_DEVICES; a line it cannot read is left out."""
    from clarify.batch.compare.compare import parse_gpus

    text = ("0, NVIDIA H100 80GB HBM3, 81559, 81080, 9.0\n1, NVIDIA H100 80GB HBM3, 81559, 1024, 9.0\n"
            "2, NVIDIA H100 80GB HBM3, [N/A], [N/A], 9.0\n")
    got = parse_gpus(text, None)
    assert [i for i, _ in got] == ["0", "1"]
    assert got[0][1].capability == (9, 0) and got[0][1].total_bytes == 81559 << 20 and got[1][1].free_bytes == 1024 << 20
    assert [i for i, _ in parse_gpus(text, "1,0")] == ["1", "0"] and parse_gpus(text, "") == []


# --- --out, model names and parameter counts. The runs' launch is replaced (`_finished_runs`): each model's
# run directory is a copy of a finished run of tests/fixtures_report.py, so no engine starts.

def _finished_runs(monkeypatch, report_runs, params=(135_000_000, 268_000_000)):
    """compare's `_launch` made to write each model's config (as it does) and, for a model not yet run, copy
    a finished run into `<out>/<name>` whose summary.json `params` is the given one (None: a served model's
    run, which reads no weights). Returns the names launched, call after call."""
    from clarify.batch.compare import compare as cmp
    from clarify.files import write_json
    from tests.fixtures_report import copy_run

    launched = []

    def launch(configs, out, parallel, verbose, plan=None, gpu_ids=None):
        for (name, cfg), src, n in zip(configs.items(), report_runs, params):
            write_json(cfg.recorded(), out / "models" / f"{name}.json")
            if not (out / name).exists():
                copy_run(src, out / name)
                summary = json.loads((out / name / "summary.json").read_text())
                (out / name / "summary.json").write_text(json.dumps({**summary, "params": n}))
            launched.append(name)
        return {n: {"started": 0.0, "finished": 1.0, "devices": None} for n in configs}

    monkeypatch.setattr(cmp, "_launch", launch)
    monkeypatch.setattr(cmp, "_start", lambda *a, **k: pytest.fail("no engine may start"))
    return launched


def test_compare_out_onto_a_run_directory_is_refused_and_its_config_untouched(tmp_path, report_runs, monkeypatch,
                                                                               capsys):
    """compare writes its own config.json and tables at the top of --out: onto a run directory they would
    replace the run's frozen config (and a stopped compare would leave a run claiming another model and
    limit). Refused in one line by the command line, before anything is written there."""
    from clarify.batch import cli
    from clarify.batch.compare import compare as cmp
    from tests.fixtures_report import copy_run

    run = copy_run(report_runs[0], tmp_path / "run")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    monkeypatch.setattr(cmp, "gpu_facts", lambda: [])
    monkeypatch.setattr(cmp, "_launch", lambda *a, **k: pytest.fail("no run may start"))
    assert cli.main(["compare", "--models", "smollm2-135m-instruct,gemma3-270m", "--limit", "1",
                     "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"clarify compare: error: {run}: is a run directory (it holds ")
    assert "give it a new --out" in err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # config.json byte-identical
    assert not (run / "models").exists() and not (run / "smollm2-135m-instruct").exists()


def test_compare_out_holding_foreign_files_is_refused_and_its_own_out_resumes(tmp_path, report_runs, monkeypatch):
    """--out is new, empty, or compare's own: a folder with files compare did not write is refused before
    anything is written; the --out of an earlier compare (its config.json, logs/, models/, run directories,
    a temp file of a killed write) is accepted, its finished runs resumed, not redone."""
    from clarify.batch import config
    from clarify.batch.compare import compare as cmp
    from clarify.batch.compare.models_file import Entry
    from clarify.errors import InputError

    launched = _finished_runs(monkeypatch, report_runs)
    cfg = config.load(None, {"limit": 3})
    entries = [Entry("smol", {"model": "smollm2-135m-instruct"}), Entry("gemma", {"model": "gemma3-270m"})]
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"holds files clarify compare did not write \(notes.txt\): give compare "
                                         r"a new or empty --out"):
        cmp.compare(entries, cfg, out, gpus=[])
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and launched == []

    out = tmp_path / "cmp"
    (out / "logs").mkdir(parents=True)  # as the command line's session makes it before compare runs
    first = cmp.compare(entries, cfg, out, gpus=[])
    assert launched == ["smol", "gemma"]
    (out / "comparison.parquet").unlink()  # stopped before its tables
    (out / ".paired.parquet.tmp1x2y").write_text("")  # a write killed midway
    (out / "report.html").write_text("")  # `clarify report` of its runs writes beside them by default
    again = cmp.compare(entries, cfg, out, gpus=[])
    assert launched == ["smol", "gemma"] * 2 and again.drop("run_dir").equals(first.drop("run_dir"))
    # an earlier compare of another model set into the same folder: its models are in models/
    third = cmp.compare([entries[0], Entry("other", {"model": "gemma3-270m"})], cfg, out, gpus=[])
    assert third["model"].to_list() == ["smol", "other"]
    cmp.compare(entries, cfg, out, gpus=[])  # "other" (models/other.json, other/) is compare's own


def test_model_names_that_collide_with_compare_files_are_refused_before_any_run(tmp_path, monkeypatch):
    """A model's run directory named like one of compare's own files (`models`, `config.json`,
    `comparison.parquet`, another model's `<name>.log`) would end in a clash after every run had finished:
    refused up front, in one line naming the entry."""
    from clarify.batch import config
    from clarify.batch.compare import compare as cmp
    from clarify.batch.compare import models_file
    from clarify.errors import InputError

    monkeypatch.setattr(cmp, "_launch", lambda *a, **k: pytest.fail("no run may start"))
    cfg = config.load(None, {"limit": 1})
    for models, clash in ((["/m/models", "smollm2-135m-instruct"], "'models' would take the place of the "
                                                                    "comparison's own models"),
                          (["smollm2-135m-instruct", "/m/Comparison.parquet"], "'Comparison.parquet' would take the "
                                                                              "place of the comparison's own comparison.parquet"),
                          (["/m/a", "/n/a.log"], "'a.log' would take the place of model 'a''s log")):
        with pytest.raises(InputError) as got:
            cmp.compare(models, cfg, tmp_path / "out", gpus=[])
        msg = str(got.value)
        assert "\n" not in msg and msg.startswith("field '--models': model ") and clash in msg, msg
        assert "give the model another name (a models file's `name`)" in msg
        assert not (tmp_path / "out").exists()
    toml = tmp_path / "models.toml"
    toml.write_text('[[model]]\nmodel = "smollm2-135m-instruct"\n\n[[model]]\nname = "config.json"\nmodel = "gemma3-270m"\n')
    with pytest.raises(InputError) as got:
        models_file.load(toml)
    assert str(got.value).startswith(f"{toml} (field 'model[2].name'): entry 'gemma3-270m': the run directory "
                                     f"'config.json' would take the place of the comparison's own config.json")
    toml.write_text('[[model]]\nmodel = "/m/x"\n\n[[model]]\nname = "x.log"\nmodel = "/m/y"\n')
    with pytest.raises(InputError, match=r"field 'model\[2\].name'.*'x.log' would take the place of model 'x''s log"):
        models_file.load(toml)


def test_models_file_params_parsed_and_bad_ones_refused_by_entry(tmp_path):
    from clarify.batch.compare import models_file

    good = tmp_path / "models.toml"
    good.write_text('[[model]]\nmodel = "a"\nparams = "8B"\n\n[[model]]\nmodel = "b"\nparams = 135000000\n\n'
                    '[[model]]\nmodel = "c"\nparams = "1.5b"\n\n[[model]]\nmodel = "d"\nparams = " 270 M "\n\n'
                    '[[model]]\nmodel = "e"\n')
    entries = models_file.load(good)
    assert [e.params for e in entries] == [8e9, 1.35e8, 1.5e9, 2.7e8, None]
    assert all("params" not in e.settings for e in entries)  # the comparison's, not a [model] setting
    bad, lines = _three_bad_entries(tmp_path, '[[model]]\nmodel = "a"\nparams = 0\n\n[[model]]\nmodel = "b"\nparams = "lots"\n\n'
                                               '[[model]]\nmodel = "c"\nparams = true\n\n[[model]]\nmodel = "d"\nparams = "8B"\n')
    for line, (i, name, value) in zip(lines[1:], [(1, "a", "0"), (2, "b", "'lots'"), (3, "c", "True")]):
        assert line.startswith(f"  {bad} (field 'model[{i}].params'): entry '{name}': must be a positive parameter "
                               f"count (a number, or one with K, M, B or T: \"135M\", \"8B\"), got {value}"), line


def test_compare_of_models_without_a_parameter_count_plots_against_cost(tmp_path, report_runs, monkeypatch):
    """Served models (an `openai` backend) have no parameter count: the comparison still writes its table
    and a plot, against cost per question (the axis says so); a models file's `params` supplies the count
    for the table and the plot."""
    from clarify.batch import config
    from clarify.batch.compare import compare as cmp
    from clarify.batch.compare.models_file import Entry
    from clarify.batch.report import plots

    _finished_runs(monkeypatch, report_runs, params=(None, None))
    cfg = config.load(None, {"limit": 3})
    served = [Entry("small", {"model": "small-served", "backend": "openai", "base_url": "http://h:8000/v1"}),
              Entry("large", {"model": "large-served", "backend": "openai", "base_url": "http://h:8000/v1"})]
    table = cmp.compare(served, cfg, tmp_path / "out", gpus=[])
    assert table["params"].to_list() == [None, None] and table.height == 2
    assert (tmp_path / "out" / "comparison.png").read_bytes()[:4] == b"\x89PNG"
    assert "| params | — | — |" in (tmp_path / "out" / "comparison.md").read_text()
    col, xs, label, log = plots.compare_x(table)
    assert col in plots.SIZE_FALLBACKS and log and xs == table[col].to_list()
    assert label.startswith(col.replace("_s_per_", "-seconds per ").replace("_", " ") + " (log scale; no parameter "
                            "count for small and large)")
    fig = plots.compare_figure(table, ["wall_s_per_question"])
    assert fig.axes[0].get_xlabel() == label and fig.axes[0].get_xscale() == "log"

    given = [dataclasses.replace(served[0], params=8e9), dataclasses.replace(served[1], params=7e10)]
    table = cmp.compare(given, cfg, tmp_path / "given", gpus=[])
    assert table["params"].to_list() == [8e9, 7e10]
    assert plots.compare_x(table)[0] == "params"


def test_plot_against_run_order_when_no_size_nor_cost_is_known():
    import polars as pl

    from clarify.batch.report import plots

    table = pl.DataFrame({"model": ["b", "a", "c"], "params": [None, 1e8, None], "sem_f1": [3.0, 1.0, 2.0],
                          "wall_s_per_question": [1.0, None, 2.0]})
    fig = plots.compare_figure(table, ["sem_f1"])
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and ax.get_xlabel() == "run order (no parameter count for b and c)"
    xs, ys = ax.lines[0].get_data()
    assert list(xs) == [1.0, 2.0, 3.0] and list(ys) == [3.0, 1.0, 2.0]  # every model, in the table's order
