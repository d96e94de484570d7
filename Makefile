# hetcluster — the two commands that matter: `make demo` and `make test`.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
TEST_WORKERS ?= 2

.PHONY: setup lint test test-fast demo protos check-protos bench clean

## pip byte-compiles on one core (129 s of install on a 2-core host); compileall on every core (52 s of
## install, then 36 s). A module that does not compile is skipped, as pip would skip it.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[dev]'
	$(PY) -m compileall -qq -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
		|| echo "compileall: some modules did not compile; they compile when imported"
	touch $(STAMP)

setup: $(STAMP)

## The tests in two phases: first those marked serial, alone (they read the host's CPU time or measure
## a CPU share or a rate), then the rest in TEST_WORKERS pytest-xdist workers (an end-to-end test leaves
## a core idle while a throttled device imports TensorFlow; a third worker slows the elastic tests'
## launches past what a switch is worth); tests marked xdist_group(NAME) share one worker (--dist
## loadgroup), e.g. to share the TF servers a module fixture started. $(1): a marker expression both
## phases also need. Exit status 5 (nothing selected, e.g. a PYTEST_ARGS path without serial tests) is
## not a failure.
define pytest_in_two_phases
	$(PY) -m pytest -m 'serial$(if $(1), and $(1))' $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(PY) -m pytest -m 'not serial$(if $(1), and $(1))' -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS) || [ $$? -eq 5 ]
endef

## Style by tools: ruff (pyproject.toml), and the rules it cannot see (scripts/check_prose.py).
lint: setup
	$(PY) -m ruff check .
	$(PY) scripts/check_prose.py

## Runs the whole test suite (slow end-to-end tests included), after the lint and the stub drift check.
test: setup lint
	PYTHON=$(PY) scripts/check_protos.sh
	$(call pytest_in_two_phases)

## The quick loop while developing: everything but the slow end-to-end tests.
test-fast: setup
	$(call pytest_in_two_phases,not slow)

## Sets up and runs the main job on the embedded default (an emulated fleet on this machine).
demo: setup
	PATH=$(abspath $(VENV))/bin:$$PATH scripts/demo.sh

protos: setup
	PYTHON=$(PY) scripts/gen_protos.sh

check-protos: setup
	PYTHON=$(PY) scripts/check_protos.sh

bench: setup
	for b in benchmarks/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache demo-out
