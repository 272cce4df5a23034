# The two commands of the README:
#   make lab    set up what a learner needs, then open the course in JupyterLab
#   make test   set up what the tests need too, then run the whole test suite (what CI runs)
# Set-up is scripts/setup.sh: system packages (graphviz's dot; chromium for the tests) where it may
# install them, a virtual environment in .venv with PyTorch and dpteach (+ its lab, or lab/test/e2e, extras).
# More:
#   make lab LAB_ARGS="--no-browser --port=8899"   extra options for `jupyter lab`
#   make book         the book (Sphinx + myst-nb, docs/book/) of every chapter with its outputs, in
#                     artifacts/book/; BOOK_ARGS=--allow-missing-alt builds despite figures without alt
#   make colab-stack  the library tests and the chapters in a Colab-like environment (ipywidgets 7.7.1)
#   make dist         the sdist and wheel in dist/, checked with twine
#   make wheel-check  build the wheel from a clean copy and install it into a fresh venv with torch
#   make memory       peak memory of chapters 08, 09 and 10, the heaviest on Binder's 2 GB
#   make sync         rewrite what is derived from dpteach/_course.py (badges, set-up cells)

PYTHON ?= python3
VENV   := .venv
LAB_STAMP  := $(VENV)/.dpteach-lab
TEST_STAMP := $(VENV)/.dpteach-test
# How the lab is served (root folder, --allow-root only as root, .venv/bin on terminals' PATH, no
# news toast): scripts/lab/jupyter_lab_config.py. LAB_ARGS adds options, e.g. --no-browser --port=N.
LAB_ARGS ?=

.PHONY: lab test setup book colab-stack dist wheel-check memory sync gpu-check bench clean

lab: $(LAB_STAMP)
	$(VENV)/bin/jupyter lab --config=scripts/lab/jupyter_lab_config.py $(LAB_ARGS) notebooks/00_start_here.ipynb

# Test files run in parallel, one pytest-xdist worker per core (at most 4), each file on one worker.
PYTEST_WORKERS ?= -n auto --maxprocesses=4 --dist loadgroup

test: $(TEST_STAMP)
	$(VENV)/bin/python -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS)

setup: $(LAB_STAMP)

$(LAB_STAMP): pyproject.toml scripts/setup.sh
	PYTHON=$(PYTHON) scripts/setup.sh lab
	touch $@

$(TEST_STAMP): pyproject.toml scripts/setup.sh
	PYTHON=$(PYTHON) scripts/setup.sh test
	touch $@ $(LAB_STAMP)

book: $(TEST_STAMP)
	$(VENV)/bin/python scripts/build_book.py $(BOOK_ARGS)

colab-stack:
	scripts/colab_stack.sh

dist: $(TEST_STAMP)
	rm -rf dist
	$(VENV)/bin/python -m pip install -q build twine
	$(VENV)/bin/python -m build --outdir dist .
	$(VENV)/bin/python -m twine check --strict dist/*

wheel-check: $(TEST_STAMP)
	$(VENV)/bin/python -m pip install -q build twine
	scripts/check_wheel.sh

memory: $(TEST_STAMP)
	$(VENV)/bin/python scripts/peak_memory.py notebooks/08_real_gpus.ipynb notebooks/09_beyond_one_process.ipynb notebooks/10_the_cpp_original.ipynb

sync: $(LAB_STAMP)
	$(VENV)/bin/python scripts/sync_course.py

gpu-check: $(TEST_STAMP)
	scripts/gpu_check.sh

bench: $(LAB_STAMP)
	$(VENV)/bin/python -m dpteach.measure.bench

clean:
	rm -rf $(VENV) .venv-colab artifacts dist .pytest_cache .hypothesis
