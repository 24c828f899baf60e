# One-command entry points. `make setup && make test` is what CI runs (.ci/run).

PYTHON ?= python3
VENV   ?= .venv
PY     ?= $(VENV)/bin/python
JOBS   ?= 2
PYTEST  = $(PY) -m pytest -n $(JOBS)

# Debian packages: g++/make/perl for Verilator builds, lz4/zlib headers for FST traces, Icarus as the second
# simulator, ccache so new Verilator build folders reuse the compiled runtime. Never Debian's `verilator` (5.006 breaks cocotb 2.x); the PyPI wheel in the venv is the one used.
APT_PACKAGES = build-essential perl liblz4-dev zlib1g-dev iverilog ccache

DEFAULT_MARKERS = not slow and not rtl_slow and not synth and not random_configs and not paper and not notebooks
INSTALLED = $(VENV)/.xnortrain-installed

# Run pytest on one marker tier; exit code 5 (nothing selected yet) is not a failure for an optional tier.
define pytest_tier
	$(PYTEST) -m "$(1)"; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests marked '$(1)' yet"; rc=0; fi; exit $$rc
endef

.DEFAULT_GOAL := test
.PHONY: setup system-packages test test-paper test-notebooks test-slow test-rtl-slow test-synth test-random test-all lint clean distclean

setup: system-packages $(INSTALLED)

system-packages:
	@missing=""; \
	for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then echo "setup: please install:$$missing"; exit 0; fi; \
	if [ "$$(id -u)" -eq 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo"; \
	else echo "setup: not root and no sudo; please install:$$missing"; exit 0; fi; \
	echo "setup: apt-get install$$missing"; \
	$$sudo apt-get update -qq && \
	DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing

$(PY):
	$(PYTHON) -m venv $(VENV)

$(INSTALLED): pyproject.toml | $(PY)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $@

test: $(INSTALLED)
	$(PYTEST) -m "$(DEFAULT_MARKERS)"

# The paper's MLP (784-256-256-256-256-10, B = 100): 3 training steps in Verilator, compared with the bit-exact
# model after every step. One test, so no workers; -s prints its cycles and times into the log.
test-paper: $(INSTALLED)
	$(PY) -m pytest -m paper -s

# The board notebooks (notebooks/*.py) executed against the simulated board; board-only cells left out.
test-notebooks: $(INSTALLED)
	$(PY) -m pytest -m notebooks tests/notebooks -s

test-slow: $(INSTALLED)
	$(call pytest_tier,slow)

test-rtl-slow: $(INSTALLED)
	$(call pytest_tier,rtl_slow)

test-synth: $(INSTALLED)
	$(call pytest_tier,synth)

test-random: $(INSTALLED)
	$(call pytest_tier,random_configs)

test-all: $(INSTALLED)
	$(PYTEST)

lint: $(INSTALLED)
	$(PY) -m ruff check .

clean:
	rm -rf build results sim_build .pytest_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
