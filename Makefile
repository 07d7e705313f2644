# swa-repro: the two commands are `make repro` and `make test`.
# Both bootstrap .venv from nothing; the only prerequisites are Python >= 3.11 and make.
# The install is stamped with pyproject.toml's hash, so a second run installs nothing.

SHELL   := /bin/bash
# The first of these that is >= 3.11 (override: make test PYTHON=/path/to/python3.12).
ifndef PYTHON
PYTHON := $(or $(shell for p in python3 python3.13 python3.12 python3.11; do \
            $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && { echo $$p; break; }; done),python3)
endif
VENV    ?= .venv
BIN     := $(VENV)/bin
EXTRAS  ?= baseline,notebooks,dev
OUTPUT  ?= artifacts
MODE    ?= auto
RUN_ARGS ?=
# Three pytest-xdist workers on 2 cores, one test file each at a time (module fixtures stay once per
# file), handed out in collection order: tests/conftest.py puts the heaviest files first (HEAVY_FIRST);
# benchmarks/REPORT.md has the suite's time with and without. Three, not two: the suite also waits
# (the GPU scripts' stand-ins sleep, the lab's server starts, overlays download), and a third worker
# fills those waits: from nothing on 2 cores (2026-12-05) the suite took 258 s with 2 workers, 247 s
# with 3.
PYTEST_ARGS ?= -q -n 3 --dist loadfile --no-loadscope-reorder
PIP_ARGS    ?= --progress-bar off
# uv installs the pinned stack ~7x faster than pip (benchmarks/REPORT.md); itself pinned, from PyPI.
UV_VERSION  ?= 0.13.9
# make lab: JupyterLab on scratch/ (LAB_ROOT), a git-ignored copy of notebooks/ (LAB_FROM), with the
# venv's kernel: a save or autosave writes the copy, never a tracked notebook. Before the lab starts,
# swa_repro/notebook/scratch.py copies what is new and refreshes every copy without edits whose
# notebook changed; an edited copy is kept, and a line says when its notebook changed too.
# LAB_ROOT=notebooks opens the tracked notebooks themselves (a save then writes them).
# The shipped defaults (a .py opens as a notebook: jupyter/labconfig/) come in through
# JUPYTER_CONFIG_PATH; Jupyter's, IPython's and matplotlib's per-user state (settings, workspaces,
# runtime files) goes to LAB_STATE, not $HOME.
# The shipped config also allows root (containers): jupyter/jupyter_server_config.json.
LAB_PORT    ?= 8888
LAB_ARGS    ?=
LAB_ROOT    ?= scratch
LAB_FROM    ?= notebooks
LAB_STATE   ?= $(VENV)/lab-state
LAB_ENV      = JUPYTER_CONFIG_PATH='$(CURDIR)/jupyter' JUPYTER_CONFIG_DIR='$(abspath $(LAB_STATE))/config' \
  JUPYTER_DATA_DIR='$(abspath $(LAB_STATE))/data' IPYTHONDIR='$(abspath $(LAB_STATE))/ipython' \
  MPLCONFIGDIR='$(abspath $(LAB_STATE))/matplotlib' \
  $(if $(SWA_REPRO_CACHE),SWA_REPRO_CACHE='$(abspath $(SWA_REPRO_CACHE))')
# Compiled bytecode goes to one folder inside the venv, also where PYTHONDONTWRITEBYTECODE is set
# (as on this project's CI image): without it every notebook kernel and test process compiled
# torch, transformers and sglang from source again (cProfile: 20.9 s of notebook 04's 52 s was compile()).
export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache
unexport PYTHONDONTWRITEBYTECODE
HASH    := $(shell (sha256sum pyproject.toml 2>/dev/null || shasum -a 256 pyproject.toml) | cut -c1-16)
STAMP   := $(VENV)/.swa-repro-installed-$(HASH)

.PHONY: repro test test-matrix venv doctor lab lab-url clean help
.DEFAULT_GOAL := help

help:
	@echo "make repro   run every notebook (papermill) -> $(OUTPUT)/ (.ipynb, .html, PNGs, summary.json)"
	@echo "make test    run the test suite (all but the release matrix)"
	@echo "make test-matrix  the release matrix: the fixes and audits on every other sglang release"
	@echo "make venv    only create/refresh $(VENV) (stamped on pyproject.toml's hash)"
	@echo "make doctor  what is installed and which mode auto picks (DOCTOR_ARGS=\"--model gemma2\": is that family affected here)"
	@echo "make lab     JupyterLab on $(LAB_ROOT)/, your git-ignored copy of $(LAB_FROM)/; a .py opens as a notebook (LAB_PORT=$(LAB_PORT), LAB_ARGS=...)"
	@echo "make lab-url the running lab's URL with its token"

repro: $(STAMP)
	$(BIN)/swa-repro run --mode $(MODE) --output $(OUTPUT) $(RUN_ARGS)

# pytest's own exit status is written to $$SWA_PYTEST_RC when set (.ci/run uses it: make itself
# can only exit 2 on a failed recipe, which would hide pytest's 5 = "no tests collected").
# `make test` is every test but the release matrix (tests marked `matrix`: the fixes and audits on
# every other sglang release), which `make test-matrix` runs; .ci/run runs both.
test: $(STAMP)
	@rc=0; $(BIN)/python -m pytest $(PYTEST_ARGS) -m 'not matrix' || rc=$$?; \
	  if [ -n "$$SWA_PYTEST_RC" ]; then echo $$rc > "$$SWA_PYTEST_RC"; fi; exit $$rc

test-matrix: $(STAMP)
	@rc=0; $(BIN)/python -m pytest $(PYTEST_ARGS) -m matrix || rc=$$?; \
	  if [ -n "$$SWA_PYTEST_RC" ]; then echo $$rc > "$$SWA_PYTEST_RC"; fi; exit $$rc

doctor: $(STAMP)
	$(BIN)/swa-repro doctor $(DOCTOR_ARGS)

venv: $(STAMP)

lab: $(STAMP)
	@$(BIN)/python -m swa_repro.notebook.scratch '$(LAB_FROM)' '$(LAB_ROOT)'
	$(LAB_ENV) $(BIN)/jupyter lab --ServerApp.root_dir='$(LAB_ROOT)' --ServerApp.port=$(LAB_PORT) $(LAB_ARGS)

# The running lab's URL with its token: its runtime files are under LAB_STATE, where a bare
# `jupyter server list` does not look. Installs nothing (a lab is running from this venv).
lab-url:
	@test -x $(BIN)/jupyter || { echo "no $(BIN)/jupyter: start the lab with make lab first" >&2; exit 2; }
	@$(LAB_ENV) $(BIN)/jupyter server list

$(STAMP):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "swa-repro needs Python >= 3.11, but $(PYTHON) is " + sys.version.split()[0] + ": run make PYTHON=python3.11 (or newer)")' \
	  || { [ $$? -eq 127 ] && echo "'$(PYTHON)' not found: install Python >= 3.11 or run make PYTHON=/path/to/python3.11" >&2; exit 1; }
	@if [ ! -x $(BIN)/python ]; then echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); fi
	@$(BIN)/python -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "$(VENV) has Python " + sys.version.split()[0] + ": remove $(VENV) and run make again with Python >= 3.11")'
	$(BIN)/python -m pip install $(PIP_ARGS) --disable-pip-version-check -q 'uv==$(UV_VERSION)'
	$(BIN)/uv pip install --python $(BIN)/python -e '.[$(EXTRAS)]'
	@rm -f $(VENV)/.swa-repro-installed-*
	@touch $@

clean:
	rm -rf $(OUTPUT)
