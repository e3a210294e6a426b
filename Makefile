# Set-up and checks: `make main` (the main job), `make check` (a contributor's loop: lint, types
# and a representative selection of the tests, in minutes) and `make test` (every check CI
# runs). Each creates .venv on first use (or reuses it) with the tested torch: `make main`
# installs the project with what the main job needs (the examples extra), `make check` adds the
# test extra, `make test` the integrations, torchtitan and docs extras too, and `make docs` only the docs
# extra. TORCH_PIP_ARGS passes extra pip arguments for torch alone, e.g. an --index-url of CPU
# wheels where pip's default index serves CUDA builds (README, "Set-up").
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
TORCH_PIP_ARGS ?=
SOURCES := dash_fn tests benchmarks examples

.PHONY: main check test lint ruff format-check typecheck pytest accelerator compat docs wheel venv venv-main venv-dev

# one stamp per set of extras, rebuilt when the pins change (pyproject.toml or this file)
$(VENV)/.installed-%: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_PIP_ARGS) $(TORCH)
	$(BIN)/python -m pip install -q -e ".[$(subst +,$(comma),$*)]"
	$(BIN)/python -c "import torch, tensordict, dash_fn; print('torch', torch.__version__, '| tensordict', tensordict.__version__, '| dash_fn', dash_fn.__version__)"
	touch $@

comma := ,
venv-main: $(VENV)/.installed-examples
venv-dev: $(VENV)/.installed-examples+test
venv: $(VENV)/.installed-examples+test+integrations+torchtitan+docs

main: venv-main
	$(BIN)/python examples/train_lm.py

# every stage in turn, each one's seconds printed as it ends and all of them at the end (CI's
# figures in docs/CONTRIBUTING.md, "How long CI takes")
TEST_STAGES := venv lint pytest accelerator docs wheel compat

test:
	@times=""; total=$$(date +%s); \
	for stage in $(TEST_STAGES); do \
		start=$$(date +%s); \
		$(MAKE) --no-print-directory $$stage || { echo "make test: stage $$stage failed"; exit 1; }; \
		took=$$(( $$(date +%s) - start )); times="$$times $$stage $$took s,"; \
		echo "make test: stage $$stage took $$took s"; \
	done; \
	echo "make test: stage times:$${times%,}; total $$(( $$(date +%s) - total )) s"

lint: ruff format-check typecheck

ruff: venv-dev
	$(BIN)/ruff check $(SOURCES)

format-check: venv-dev
	$(BIN)/ruff format --check $(SOURCES)

typecheck: venv-dev
	$(BIN)/mypy

# The tests run one torch thread each (tests/conftest.py), so one pytest worker a core keeps
# every core busy; --dist loadfile keeps a file's tests, and its module fixtures (the
# multi-process DDP and FSDP2 runs), on one worker.
PYTEST := $(BIN)/python -m pytest -q --durations=15 -n auto --dist loadfile

pytest: venv
	$(PYTEST)

# The contributor's selection: every module's oracle tests (the float64 per-block reference,
# torch.optim.Adam, float64 eigh, SOAP's reference, the precisions against float64), the
# compiled step, checkpoints, the adapter, the guard, and one multi-process run bitwise equal
# to one process; no Inductor (gcc's compile time) and nothing beyond the test extra.
CHECK_TESTS := tests/test_reference_agreement.py tests/test_adam_oracle.py tests/test_solvers.py \
	tests/test_precision.py tests/test_eigenvalue_corrected.py tests/test_update_rules.py tests/test_thin.py \
	tests/test_grafting.py tests/test_storage.py tests/test_plan.py tests/test_schedule.py tests/test_config.py \
	tests/test_errors.py tests/test_api.py tests/test_compile_step.py tests/test_checkpoint.py \
	tests/test_nonfinite.py tests/test_optim.py \
	"tests/test_distributed.py::test_every_rank_equals_one_process_bitwise[3-eigh]" \
	tests/test_examples.py::test_progress_bars_print_plain_lines_off_a_terminal

check: venv-dev
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory lint && \
	$(PYTEST) -m "not inductor" $(CHECK_TESTS) && \
	echo "make check: lint, types and $(words $(CHECK_TESTS)) test files passed in $$(( $$(date +%s) - start )) s"

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
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# the sdist and wheel built, the wheel installed into a fresh venv beside the pinned torch, and
# the README's quick start run from outside the checkout (.ci/wheel says how)
wheel: venv
	PYTHON=$(BIN)/python TORCH="$(TORCH)" TORCH_PIP_ARGS="$(TORCH_PIP_ARGS)" bash .ci/wheel
