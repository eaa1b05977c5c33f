# The two commands of the README, and what they need. Every target is
# idempotent: on a fresh machine it installs what is missing, afterwards it
# only rebuilds what changed.
SHELL := /bin/bash
VENV ?= .venv
PYTHON := $(VENV)/bin/python
BUILD_DIR := build/cmake
REPORT_DIR ?= conformance-report
# Pinned tools of the project's own environment (torch must stay pinned: an
# unpinned torch pulls a multi-GB CUDA build).
PIP_PACKAGES := torch==2.13.0 "scikit-build-core>=0.11" ninja

.PHONY: conformance test benchmarks build setup system-packages

## Main job: the conformance suite against the reference backend; the
## compliance report lands in $(REPORT_DIR)/ (JSON, JUnit, Markdown, HTML, badge).
conformance: build
	$(PYTHON) -m openreg
	$(VENV)/bin/privateuse1-conformance run --backend openreg --report-dir $(REPORT_DIR)

## All of the project's tests: the runtime's GoogleTest suite and pytest.
test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure
	$(PYTHON) -m pytest tests -n 2 --dist loadfile -q

## All benchmarks: a table of ratios against the targets, and benchmarks/results.json.
benchmarks: build
	$(PYTHON) benchmarks/run_all.py

## Build and install (editable) into the virtual environment.
build: setup
	mkdir -p build
	flock build/.lock $(PYTHON) -m pip install --quiet --no-build-isolation --editable ".[test]"

setup: system-packages $(VENV)/.pip-stamp

$(VENV)/.pip-stamp: pyproject.toml Makefile
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet $(PIP_PACKAGES)
	touch $@

# GoogleTest and CMake build the C++ parts (Google Benchmark the C++
# benchmarks); chromium checks the HTML report in a real (headless) browser.
SYSTEM_PACKAGES := libgtest-dev libbenchmark-dev cmake g++ chromium

system-packages:
	@if ! dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $(SYSTEM_PACKAGES); \
	fi
