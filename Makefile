# The template's own entry points. Both set themselves up on a fresh machine
# (python3 3.11+, Java 17, network to PyPI and Maven Central).
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
DEMO_DIR := build/demo

.PHONY: install test test-fast demo clean

install: $(VENV)/.installed

$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# Hook unit tests, every bake combination, and the slow tier: one baked project
# installs itself and runs its own `make test-all` (real Kafka, Spark, Delta, S3).
# Two workers: the slow test starts first on one, the other runs the rest (and
# takes back what was queued behind it) while the bake downloads its packages.
test: install
	$(PY) -m pytest -n 2 --dist worksteal tests

test-fast: install
	$(PY) -m pytest tests -m "not slow"

# Bake the default project and run its demo.
demo: install
	rm -rf $(DEMO_DIR)
	$(VENV)/bin/cookiecutter --no-input --output-dir $(DEMO_DIR) .
	$(MAKE) -C $(DEMO_DIR)/clickstream-lakehouse demo

clean:
	rm -rf $(VENV) build .pytest_cache
