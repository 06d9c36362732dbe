# Two commands: `make run` (the CIFAR-10 recipe, 2 processes, synthetic data) and `make test`.
# Both create .venv when it is missing or older than pyproject.toml.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test docs test-gpu lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,plot]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m fleetlite.cli run --nproc_per_node 2 cifar10 data=synthetic

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(MAKE) --no-print-directory docs
	$(PY) -m pytest -q -n 2 --dist loadfile

# The docs site (docs/, mkdocs.yml) into site/; --strict: a broken link, anchor, nav entry or API reference fails.
# The API pages read this checkout's sources (no import). NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The GPU suite (tests/gpu/, marker `gpu`): skipped without CUDA, one command on a GPU machine.
test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu tests/gpu

bench: $(STAMP)
	$(PY) benchmarks/dp_vs_ddp.py
	$(PY) benchmarks/input_pipeline.py
	$(PY) benchmarks/trainer_overhead.py

clean:
	rm -rf $(VENV) outputs .pytest_cache site
