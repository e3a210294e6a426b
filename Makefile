# Set-up and checks in two commands: `make main` (the main job) and `make test` (every check CI
# runs). Both create .venv on first use (or reuse it) with the tested CPU torch: `make main`
# installs the project with what the main job needs (the examples extra), `make test` adds the
# test, integrations and docs extras. TORCH_PIP_ARGS passes extra pip arguments for torch alone,
# e.g. an --index-url of CPU wheels where pip's default index serves CUDA builds.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
TORCH_PIP_ARGS ?=
SOURCES := dash_fn tests benchmarks examples

.PHONY: main test lint ruff format-check typecheck pytest accelerator compat docs wheel venv venv-main

# one stamp per set of extras, rebuilt when the pins change (pyproject.toml or this file)
$(VENV)/.installed-%: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_PIP_ARGS) $(TORCH)
	$(BIN)/python -m pip install -q -e ".[$(subst +,$(comma),$*)]"
	$(BIN)/python -c "import torch, tensordict, dash_fn; print('torch', torch.__version__, '| tensordict', tensordict.__version__, '| dash_fn', dash_fn.__version__)"
	touch $@

comma := ,
venv-main: $(VENV)/.installed-examples
venv: $(VENV)/.installed-examples+test+integrations+docs

main: venv-main
	$(BIN)/python examples/train_lm.py

test: lint pytest accelerator docs wheel compat

lint: ruff format-check typecheck

ruff: venv
	$(BIN)/ruff check $(SOURCES)

format-check: venv
	$(BIN)/ruff format --check $(SOURCES)

typecheck: venv
	$(BIN)/mypy

# The tests run one torch thread each (tests/conftest.py), so one pytest worker a core keeps
# every core busy; --dist loadfile keeps a file's tests, and its module fixtures (the
# multi-process DDP and FSDP2 runs), on one worker.
PYTEST := $(BIN)/python -m pytest -q --durations=15 -n auto --dist loadfile

pytest: venv
	$(PYTEST)

# the tests of what an accelerator executes, with the accelerator strategy simulated on the CPU
accelerator: venv
	DASH_FN_SIMULATE_ACCELERATOR=1 $(PYTEST) -m "accelerator and not inductor and not sets_accelerator"

# the tests where torch releases can differ, on the oldest and newest supported torch, each in a
# venv of its own kept between runs (.ci/compat says how); COMPAT_TORCH="" skips it
COMPAT_TORCH ?= 2.11.0 2.15.0

compat:
	$(if $(strip $(COMPAT_TORCH)),bash .ci/compat $(COMPAT_TORCH),@echo "compat: skipped (COMPAT_TORCH is empty)")

# the docs site (docs/ and the API reference from the docstrings) into site/; --strict: a
# broken link or reference, or a docstring that names a missing argument, fails the build
# (NO_MKDOCS_2_WARNING silences the theme's banner about its successor, which is no warning)
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# the sdist and wheel built, the wheel installed into a fresh venv beside the pinned torch, and
# the README's quick start run from outside the checkout (.ci/wheel says how)
wheel: venv
	PYTHON=$(BIN)/python TORCH="$(TORCH)" TORCH_PIP_ARGS="$(TORCH_PIP_ARGS)" bash .ci/wheel
