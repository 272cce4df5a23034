# The two commands of the README:
#   make lab    set everything up, then open the course in JupyterLab
#   make test   set everything up, then run the whole test suite (what CI runs)
# Set-up is scripts/setup.sh: system packages (graphviz's dot, chromium) where it may install them,
# a virtual environment in .venv with PyTorch and dpteach, and a Colab-like one for ipywidgets 7.

PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.dpteach-installed

.PHONY: lab test setup gpu-check bench clean

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

test: $(STAMP)
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	PYTHON=$(PYTHON) scripts/setup.sh
	touch $@

gpu-check: $(STAMP)
	scripts/gpu_check.sh

bench: $(STAMP)
	$(VENV)/bin/python -m dpteach.bench

clean:
	rm -rf $(VENV) .venv-colab artifacts .pytest_cache .hypothesis
