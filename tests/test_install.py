"""A regular (non-editable) `pip install .` works on its own: the package finds its shipped data and
report templates inside site-packages and `clarify run` answers on the embedded defaults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
@pytest.mark.slow
def test_regular_install_runs_clarify_on_the_embedded_defaults(tmp_path, llm_model_dir, default_index):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # The pinned dependencies come from this environment's site-packages through a .pth line; a .pth file
    # inside a directory named that way is not run, so this environment's editable clarify stays out.
    (site / "clarify-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # `pip install .` is build a wheel, then install it: built with this environment's setuptools (the new
    # venv's bundled one predates PEP 517 wheels), installed by the new venv's pip
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(tmp_path / "wheel"), str(ROOT)], check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "wheel").glob("clarify-*.whl")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", str(wheel)],
                   check=True, cwd=tmp_path)
    # No other clarify on the path; the rest of PYTHONPATH stays (bench/emulate_avx2's sitecustomize: a
    # process without it under ATEN_CPU_CAPABILITY=avx2 mixes AVX2 torch with AVX-512 vLLM kernels, SIGABRT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CLARIFY_DATA")}
    keep = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if e and not (Path(e) / "clarify" / "__init__.py").exists()]
    if keep:
        env["PYTHONPATH"] = os.pathsep.join(keep)
    where = subprocess.run([str(py), "-c", "import clarify, clarify.files as f; print(clarify.__file__); "
                            "print(f.data_dir())"], check=True, capture_output=True, text=True, cwd=tmp_path,
                           env=env).stdout.split()
    assert where[0].startswith(str(site)) and where[1] == str(site / "clarify" / "data")
    assert (site / "clarify" / "data" / "wiki" / "all-MiniLM-L6-v2.embeddings.npy").is_file()
    assert (site / "clarify" / "batch" / "report" / "templates" / "report.css").is_file()

    small = tmp_path / "small.toml"
    small.write_text("[toc]\nmax_expansions = 1\nclarify_max_tokens = 48\nanswer_max_tokens = 48\nn_demos = 2\n")
    run_dir = tmp_path / "run"
    clarify = str(venv / "bin" / "clarify")
    proc = subprocess.run([clarify, "run", "--config", str(small), "--dataset", "asqa", "--limit", "1",
                           "--out", str(run_dir), "--no-progress"], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["n_questions"] == 1 and summary["llm_calls"] >= 2 and "str_em" in summary["metrics"]
    assert json.loads((run_dir / "inputs.json").read_text())["questions"]["path"].startswith(str(site))
    report = subprocess.run([clarify, "report", str(run_dir)], capture_output=True, text=True, cwd=tmp_path,
                            env=env)
    assert report.returncode == 0, report.stderr[-2000:]
    html = (run_dir / "report.html").read_text()
    assert ".qspan.nonverbatim{" in html and 'data-qid="' in html
