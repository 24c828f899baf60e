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
	and not pynq and not timing and not finn
INSTALLED = $(VENV)/.xnortrain-installed

# The pynq tier runs what a board runs in two venvs of their own (pynq pins numpy<2, so it never enters $(VENV)), both
# with the board images' Python 3.10 when this machine has one (on PATH or under pyenv), else with $(PYTHON):
# - $(PYNQ_VENV): pynq 4.0.0 with the numpy it pins (1.26), the package editable (`pip install -e '.[board]'`);
# - $(PYNQ301_VENV): the PYNQ-Z1/Z2 image v3.0.1 as a user meets it - its compiled packages ($(IMAGE_PACKAGES)) first,
#   then xnortrain installed offline from `make board-wheels` (`pip install --no-index --find-links`), which must
#   leave numpy and pynq as they were. numpy 1.21.2 is the oldest numpy with a wheel for Python 3.10 (the image has
#   1.21.5 from apt); pycparser 2.21, matplotlib 3.5.1, MarkupSafe 2.0.1 and pandas 1.3.5 are Ubuntu 22.04's (pynq
#   3.0.1 imports pycparser.plyparser, gone in pycparser 3; pynq.DataRecorder needs pandas).
# The tier prints which versions each venv has.
PYNQ_VENV ?= .venv-pynq
PYNQ_PY = $(PYNQ_VENV)/bin/python
PYNQ_PYTHON ?= $(shell for p in python3.10 $$(pyenv root 2>/dev/null)/versions/3.10*/bin/python3.10; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null && { echo "$$p"; exit; }; done; \
	echo $(PYTHON))
PYNQ301_VENV ?= .venv-pynq301
PYNQ301_INSTALLED = $(PYNQ301_VENV)/.xnortrain-pynq301-installed
IMAGE_NUMPY = numpy==1.21.2
IMAGE_PACKAGES = $(IMAGE_NUMPY) pynq==3.0.1 pycparser==2.21 matplotlib==3.5.1 MarkupSafe==2.0.1 pandas==1.3.5
# `make board-wheels`: the xnortrain wheel and its pure-Python dependencies, no numpy or pynq (boards/wheelhouse.py)
BOARD_WHEELS ?= build/board-wheels
PYNQ_INSTALLED = $(PYNQ_VENV)/.xnortrain-pynq-installed
# What a board runs (Python 3.10): linted for 3.10 syntax by the pynq tier (and by `make lint`, pyproject's
# [tool.ruff.per-file-target-version], which must list the same paths).
BOARD_SOURCES = host sim rtl_gen/contract.py rtl_gen/regmap.py notebooks tests/pynq_tier tests/host/mock_accelerator.py
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
.PHONY: setup system-packages test test-paper test-timing test-notebooks test-finn test-pynq board-wheels test-slow test-rtl-slow \
	test-synth test-random \
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
	$(PYTEST) -m "$(DEFAULT_MARKERS)" --durations=30

# The paper's MLP (784-256-256-256-256-10, B = 100): 3 training steps in Verilator, compared with the bit-exact
# model after every step, and the same network on the simulated board; the two run side by side (-n 2), and -rA
# prints their cycles and times into the log.
test-paper: $(INSTALLED)
	$(PYTEST) -m paper -rA

# FINN's front end on the QONNX export (tests/finn_tier): finn-plus pins numpy, onnx, protobuf and torch, so it lives
# in a venv of its own and never enters $(VENV); the test exports in $(VENV) and runs FINN there. 1.6.1 is the release
# checked (docs/results/deploy.md).
FINN_VENV ?= .venv-finn
test-finn: $(INSTALLED)
	@test -x $(FINN_VENV)/bin/python || $(PYTHON) -m venv $(FINN_VENV)
	$(FINN_VENV)/bin/python -m pip install -q 'finn-plus==1.6.1'
	$(PY) -m pytest -m finn tests/finn_tier -s

# The board notebooks (notebooks/*.py) executed against the simulated board; board-only cells left out.
test-notebooks: $(INSTALLED)
	$(PYTEST) -m notebooks tests/notebooks

$(PYNQ_INSTALLED): pyproject.toml
	@test -x $(PYNQ_PY) || { echo "test-pynq: creating $(PYNQ_VENV) with $(PYNQ_PYTHON)"; $(PYNQ_PYTHON) -m venv $(PYNQ_VENV); }
	$(PYNQ_PY) -m pip install -q --disable-pip-version-check -e '.[board]' 'pynq==4.0.0' 'pandas<3' 'pytest>=8' \
	  'ruff>=0.6'
	@touch $@

board-wheels: $(INSTALLED)
	$(PY) -m boards.wheelhouse $(BOARD_WHEELS)

# The image first (online), then the offline install from the wheelhouse; numpy and pynq must not move.
$(PYNQ301_INSTALLED): pyproject.toml boards/wheelhouse.py
	rm -rf $(PYNQ301_VENV)
	@echo "test-pynq: creating $(PYNQ301_VENV) with $(PYNQ_PYTHON): the image's $(IMAGE_PACKAGES)"
	$(PYNQ_PYTHON) -m venv $(PYNQ301_VENV)
	echo "$(IMAGE_NUMPY)" > $(PYNQ301_VENV)/image-constraints.txt
	$(PYNQ301_VENV)/bin/pip install -q --disable-pip-version-check -c $(PYNQ301_VENV)/image-constraints.txt \
	  $(IMAGE_PACKAGES)
	$(MAKE) --no-print-directory board-wheels
	@pin() { $(PYNQ301_VENV)/bin/pip freeze --disable-pip-version-check | grep -iE '^(numpy|pynq)=='; }; \
	before="$$(pin)"; set -e; \
	$(PYNQ301_VENV)/bin/pip install -q --disable-pip-version-check --no-index --find-links $(BOARD_WHEELS) \
	  'xnortrain[board]'; \
	after="$$(pin)"; if [ "$$before" != "$$after" ]; then \
	  echo "test-pynq: the offline install changed the image's packages: $$before -> $$after"; exit 1; fi; \
	echo "test-pynq: offline install from $(BOARD_WHEELS) kept" $$after
	cd /tmp && $(CURDIR)/$(PYNQ301_VENV)/bin/xnortrain config --model mlp > /dev/null
	$(PYNQ301_VENV)/bin/pip install -q --disable-pip-version-check -c $(PYNQ301_VENV)/image-constraints.txt 'pytest>=8'
	@touch $@

# In each pynq venv: the driver through pynq's own MMIO, DMA and allocate on mock devices (marker pynq,
# tests/pynq_tier), then the bit-exact model's and the driver's tests on numpy 1.x; then the 3.10 syntax lint of
# what a board runs.
test-pynq: $(PYNQ_INSTALLED) $(PYNQ301_INSTALLED)
	@for py in $(PYNQ_PY) $(PYNQ301_VENV)/bin/python; do \
	  $$py -c 'import sys, numpy, pynq; print("test-pynq:", sys.argv[1], "Python", sys.version.split()[0], "numpy", numpy.__version__, "pynq", pynq.__version__)' $$py && \
	  $$py -m pytest -q --confcutdir=tests/pynq_tier -m pynq tests/pynq_tier && \
	  $$py -m pytest -q --noconftest -m "$(DEFAULT_MARKERS)" $(PYNQ_NUMPY1_TESTS) \
	    --deselect tests/host/test_driver.py::test_pynq_is_never_imported || exit 1; \
	done
	$(PYNQ_VENV)/bin/ruff check --select E9 --target-version py310 $(BOARD_SOURCES)

# The timing guard: Yosys synth_ecp5 of the SMALL whole design (configs/timing_small.toml) and its deepest
# register-to-register path in LUT levels against the calibrated limit (tests/rtl_gen/test_timing.py), and a
# path planted across two units that must exceed it. About 5 min on 2 cores with an empty cache.
test-timing: $(INSTALLED)
	$(PYTEST) -m timing tests/rtl_gen/test_timing.py tests/rtl_gen/test_bn_unit.py tests/rtl_gen/test_bn_param.py \
		tests/rtl_gen/test_weight_memory.py

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

# ruff: Python 3.11 rules, and 3.10 syntax for what a board runs (pyproject: [tool.ruff.per-file-target-version]);
# lint-imports: the layers (pyproject: [tool.importlinter]; docs/architecture.md, "Layers").
lint: $(INSTALLED)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf build results sim_build .pytest_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(PYNQ_VENV) $(PYNQ301_VENV) *.egg-info
