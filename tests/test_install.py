"""Installing clarify.

- The Makefile's install of the CPU lock's torch (`torch==2.13.0+cpu`, which PyPI does not host) on a
  machine with only pip and the public indexes: from PyTorch's CPU index, hash-checked; a wrong wheel fails
  in one line. The Makefile's own pip call (`make torch-cpu`, the first step of `make setup`'s install),
  against a PEP 503 index served from 127.0.0.1.
- The stack a venv was installed with (cpu or gpu) is what later make targets use without `STACK=`.
- A regular (non-editable) `pip install .` works on its own: the package finds its shipped data and
  report templates inside site-packages and `clarify run` answers on the embedded defaults.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
TORCH_PIN = re.search(r"^torch==(\S+)", (ROOT / "requirements" / "cpu.txt").read_text(), re.M).group(1)
WHEEL_NAME = f"torch-{TORCH_PIN}-cp311-cp311-manylinux_2_28_x86_64.whl"


def _pip_env(tmp_path: Path) -> dict[str, str]:
    """This process' environment less every pip setting that names a source (find-links, indexes, config
    files: PIP_CONFIG_FILE=os.devnull loads none, https://pip.pypa.io/en/stable/topics/configuration/), and
    without pip's cache (the wheel must come from the index, not from an earlier run) or PYTHONPATH (the
    new venv's pip must see that venv's packages only). pip's log goes to tmp_path/pip.log."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PYTHONPATH",
                        "STACK", "PIP_SOURCE", "MAKEFLAGS", "MAKELEVEL")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1", PIP_LOG=str(tmp_path / "pip.log"))
    return env


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def torch_index(tmp_path):
    """A PEP 503 "simple" index on 127.0.0.1 over tmp_path/srv (simple/torch/index.html links the wheel put
    beside it); yields (folder of the torch files, index URL)."""
    files = tmp_path / "srv" / "simple" / "torch"
    files.mkdir(parents=True)
    (files / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{WHEEL_NAME.replace("+", "%2B")}">{WHEEL_NAME}</a></body></html>\n')
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(tmp_path / "srv")))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield files, f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def _make_torch_cpu(tmp_path: Path, index_url: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "torch-cpu", f"VENV={tmp_path / 'venv'}",
                           f"PYTHON={sys.executable}", f"TORCH_CPU_INDEX={index_url}"],
                          capture_output=True, text=True, env=_pip_env(tmp_path), timeout=600)


def _installed_torch(venv: Path) -> list[str]:
    return [p.name for p in venv.glob("lib/python*/site-packages/torch-*.dist-info")]


def _local_torch_wheel() -> Path | None:
    for folder in os.environ.get("PIP_FIND_LINKS", "").split():
        if (Path(folder) / WHEEL_NAME).is_file():
            return Path(folder) / WHEEL_NAME
    return None


@needs_make
def test_make_installs_the_cpu_torch_from_pytorchs_index_when_no_find_links_holds_it(tmp_path, torch_index):
    """A fresh machine: no PIP_FIND_LINKS, no pip config, TORCH_CPU_INDEX at an index on 127.0.0.1 holding
    the pinned wheel. `make torch-cpu` runs the Makefile's own pip call for the CPU lock's torch (the command
    `make setup` runs before the rest of requirements/cpu.txt, whose install then finds torch installed at
    its pin and looks nothing up for it), into a throwaway venv that make creates: torch alone, because the
    other ~200 packages of the lock come from PyPI unchanged and would only add minutes; the real wheel,
    because the lock's sha256 is the real one (hard-linked, not copied, where the file system allows). It
    must install, and pip's log must show torch fetched from 127.0.0.1 and PyPI never asked."""
    wheel = _local_torch_wheel()
    if wheel is None:
        pytest.skip(f"no {WHEEL_NAME} in PIP_FIND_LINKS to serve")
    files, url = torch_index
    try:
        os.link(wheel, files / WHEEL_NAME)
    except OSError:
        shutil.copyfile(wheel, files / WHEEL_NAME)
    proc = _make_torch_cpu(tmp_path, url)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"install --index-url {url} --no-deps --require-hashes -r" in proc.stdout
    assert _installed_torch(tmp_path / "venv") == [f"torch-{TORCH_PIN}.dist-info"]
    log = (tmp_path / "pip.log").read_text()
    assert f"Downloading {url}/torch/{WHEEL_NAME.replace('+', '%2B')}" in log
    assert "pypi.org" not in log and "pythonhosted.org" not in log


@needs_make
def test_a_wrong_torch_wheel_fails_the_install_in_one_line(tmp_path, torch_index):
    """The same install with the index serving another file under the pinned wheel's name: pip's hash check
    (--require-hashes, the lock's sha256) refuses it, nothing is installed, and make says so in one line
    (pip's own message is in the venv's torch-cpu.log)."""
    files, url = torch_index
    (files / WHEEL_NAME).write_bytes(b"not the torch wheel" * 256)
    proc = _make_torch_cpu(tmp_path, url)
    assert proc.returncode != 0
    said = [line for line in proc.stderr.splitlines() if line and not line.startswith("make:")]
    assert len(said) == 1, proc.stderr
    assert said[0].startswith(f"error: the torch wheel from --index-url {url} has sha256 ")
    assert f"requirements/cpu.txt pins for torch=={TORCH_PIN}" in said[0]
    assert "DO NOT MATCH THE HASHES" in (tmp_path / "venv" / "torch-cpu.log").read_text()
    assert _installed_torch(tmp_path / "venv") == []


def _plan(venv: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """What `make -n` would run in this checkout with the venv at `venv` (nothing is run)."""
    proc = subprocess.run(["make", "--no-print-directory", "-n", "-C", str(ROOT), f"VENV={venv}", *args],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@needs_make
def test_where_the_cpu_torch_comes_from(tmp_path):
    """PIP_SOURCE (`make install-offline`'s wheelhouse) first; else a find-links folder holding the pinned
    wheel, with --no-index; else PyTorch's CPU index alone."""
    env = _pip_env(tmp_path)
    index = "--index-url https://download.pytorch.org/whl/cpu "
    assert index in _plan(tmp_path / "v", "torch-cpu", env=env)
    empty, holds = tmp_path / "empty", tmp_path / "holds"
    empty.mkdir()
    holds.mkdir()
    (holds / WHEEL_NAME).write_bytes(b"")
    assert index in _plan(tmp_path / "v", "torch-cpu", env={**env, "PIP_FIND_LINKS": str(empty)})
    plan = _plan(tmp_path / "v", "torch-cpu", env={**env, "PIP_FIND_LINKS": f"{empty} {holds}"})
    assert f"install --no-index --find-links {holds} --no-deps" in plan
    plan = _plan(tmp_path / "v", "torch-cpu", "PIP_SOURCE=--no-index --find-links /w", env=env)
    assert "install --no-index --find-links /w --no-deps" in plan


def _fake_venv(tmp_path: Path, stack: str) -> tuple[Path, dict[str, str]]:
    """A venv that `make setup STACK=stack` finished (its python, its stamp) and a $CLARIFY_HOME whose
    embedded model is prepared: what `make demo` finds after `make install-offline STACK=stack`."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    env = {**_pip_env(tmp_path), "CLARIFY_HOME": str(tmp_path / "home")}
    stamp = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(ROOT), f"VENV={venv}", f"STACK={stack}",
                            "--eval=print-stamp: ; @echo $(DEPS_STAMP)", "print-stamp"],
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    assert Path(stamp).parent == venv and Path(stamp).name.startswith(f".deps-{stack}-")
    Path(stamp).touch()
    ready = tmp_path / "home" / ".model-ready"
    ready.parent.mkdir()
    ready.touch()
    later = Path(stamp).stat().st_mtime + 10
    os.utime(ready, (later, later))
    return venv, env


@needs_make
@pytest.mark.parametrize("stack", ["gpu", "cpu"])
def test_later_make_targets_use_the_installed_stack(tmp_path, stack):
    """After `make install-offline STACK=gpu` (or `make setup`), `make demo` and `make test` without STACK=
    install nothing (the stack is read from the venv's stamp): they run offline, and a CUDA torch is not
    swapped for the CPU one."""
    venv, env = _fake_venv(tmp_path, stack)
    for target in ("demo", "test"):
        plan = _plan(venv, target, env=env)
        assert "pip" not in plan and "requirements/" not in plan, plan
        assert f"{venv}/bin/clarify index build --default" in plan
    assert f"{venv}/bin/clarify demo" in _plan(venv, "demo", env=env)


@needs_make
def test_an_explicit_stack_still_wins(tmp_path):
    """STACK= on the command line switches the venv, and says so."""
    venv, env = _fake_venv(tmp_path, "gpu")
    plan = _plan(venv, "setup", "STACK=cpu", env=env)
    assert re.search(r"pip .*install +--no-deps --require-hashes -r requirements/cpu.txt", plan), plan
    assert f"{venv} holds the gpu stack: the cpu stack is installed over it" in plan
    assert "requirements/gpu.txt" not in plan
    # a venv without a stamp (none yet, or made before stamps named their stack): cpu
    plan = _plan(tmp_path / "none", "setup", env=env)
    assert "-r requirements/cpu.txt" in plan and "holds the" not in plan


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
    # (made absolute: the runs below start in tmp_path, where the README's relative `bench/emulate_avx2` is not)
    keep = [str(Path(e).resolve()) for e in os.environ.get("PYTHONPATH", "").split(os.pathsep)
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
