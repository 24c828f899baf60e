# One-command entry points. `make setup && make test` is what CI runs (.ci/run).

PYTHON ?= python3
VENV   ?= .venv
PY     ?= $(VENV)/bin/python
JOBS   ?= 2
PYTEST  = $(PY) -m pytest -n $(JOBS)

# Debian packages: g++/make/perl for Verilator builds, lz4/zlib headers for FST traces, Icarus as the second
# simulator, ccache so new Verilator build folders reuse the compiled runtime. Never Debian's `verilator` (5.006 breaks cocotb 2.x); the PyPI wheel in the venv is the one used.
APT_PACKAGES = build-essential perl liblz4-dev zlib1g-dev iverilog ccache

DEFAULT_MARKERS = not slow and not rtl_slow and not synth and not random_configs and not paper and not notebooks \
	and not pynq and not timing
INSTALLED = $(VENV)/.xnortrain-installed

# The pynq tier: its own venv (pynq 4.0.0 pins numpy<2, so it never enters $(VENV)) with the package's board extra
# (`pip install xnortrain[board]`, as on a board). Built with the board images' Python 3.10 when this machine has
# one (on PATH or under pyenv), else with $(PYTHON); the tier prints which.
PYNQ_VENV ?= .venv-pynq
PYNQ_PY = $(PYNQ_VENV)/bin/python
PYNQ_PYTHON ?= $(shell for p in python3.10 $$(pyenv root 2>/dev/null)/versions/3.10*/bin/python3.10; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null && { echo "$$p"; exit; }; done; \
	echo $(PYTHON))
PYNQ_INSTALLED = $(PYNQ_VENV)/.xnortrain-pynq-installed
# What a board runs (Python 3.10): linted for 3.10 syntax by the pynq tier (and by `make lint`, pyproject's
# [tool.ruff.per-file-target-version], which must list the same paths).
BOARD_SOURCES = host sim rtl_gen/regmap.py notebooks tests/pynq_tier tests/host/mock_accelerator.py
# What the pynq venv also runs with numpy 1.x: the bit-exact model, the configuration, the driver's own tests.
# --noconftest: the root conftest sets up Verilator, which that venv does not have.
PYNQ_NUMPY1_TESTS = tests/sim/hw tests/sim/test_config.py tests/host/test_driver.py tests/host/test_pynq_transport.py \
	tests/host/test_energy.py

# Run pytest on one marker tier; exit code 5 (nothing selected yet) is not a failure for an optional tier.
define pytest_tier
	$(PYTEST) -m "$(1)"; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests marked '$(1)' yet"; rc=0; fi; exit $$rc
endef

.DEFAULT_GOAL := test
.PHONY: setup system-packages test test-paper test-timing test-notebooks test-pynq test-slow test-rtl-slow test-synth test-random \
	test-all lint clean distclean

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

$(PYNQ_INSTALLED): pyproject.toml
	@test -x $(PYNQ_PY) || { echo "test-pynq: creating $(PYNQ_VENV) with $(PYNQ_PYTHON)"; $(PYNQ_PYTHON) -m venv $(PYNQ_VENV); }
	$(PYNQ_PY) -m pip install -q --disable-pip-version-check -e '.[board]' 'pytest>=8' 'ruff>=0.6'
	@touch $@

# The driver through pynq's own MMIO, DMA and allocate on mock devices (marker pynq, tests/pynq_tier), then the
# bit-exact model's and the driver's tests on numpy 1.x, then the 3.10 syntax lint of what a board runs.
test-pynq: $(PYNQ_INSTALLED)
	@$(PYNQ_PY) -c 'import sys, numpy, pynq; print("test-pynq: Python", sys.version.split()[0], "numpy", numpy.__version__, "pynq", pynq.__version__)'
	$(PYNQ_PY) -m pytest --confcutdir=tests/pynq_tier -m pynq tests/pynq_tier
	$(PYNQ_PY) -m pytest --noconftest -m "$(DEFAULT_MARKERS)" $(PYNQ_NUMPY1_TESTS) \
	  --deselect tests/host/test_driver.py::test_pynq_is_never_imported
	$(PYNQ_VENV)/bin/ruff check --select E9 --target-version py310 $(BOARD_SOURCES)

# The timing guard: Yosys synth_ecp5 of the SMALL whole design (configs/timing_small.toml) and its deepest
# register-to-register path in LUT levels against the calibrated limit (tests/rtl_gen/test_timing.py), and a
# path planted across two units that must exceed it. About 5 min on 2 cores with an empty cache.
test-timing: $(INSTALLED)
	$(PYTEST) -m timing tests/rtl_gen/test_timing.py

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

# ruff: Python 3.11 rules, and 3.10 syntax for what a board runs (pyproject: [tool.ruff.per-file-target-version]).
lint: $(INSTALLED)
	$(PY) -m ruff check .

clean:
	rm -rf build results sim_build .pytest_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(PYNQ_VENV) *.egg-info
