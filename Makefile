# The two commands of the README, and what they need. Every target is
# idempotent: on a fresh machine it installs what is missing, afterwards it
# only rebuilds what changed.
SHELL := /bin/bash
# The torch to build and test against. The project's own environment is
# 2.13.0's CPU wheel (the fastest to install here); any other supported
# release (TORCH=2.14.1, TORCH=2.15.0: a CUDA build from PyPI, about 5 GB,
# that runs on the CPU) gets an environment and build folders of its own,
# so every target works on it: `make conformance TORCH=2.15.0`.
TORCH ?= 2.13.0
DEFAULT_TORCH := 2.13.0
ifeq ($(TORCH),$(DEFAULT_TORCH))
VENV ?= .venv
BUILD_ROOT := build
REPORT_DIR ?= conformance-report
else
VENV ?= .venv-torch-$(TORCH)
BUILD_ROOT := build/torch-$(TORCH)
REPORT_DIR ?= conformance-report-torch-$(TORCH)
endif
PYTHON := $(VENV)/bin/python
# OpenReg's CMake build (with the runtime's GoogleTest suite) and the
# development build (test fixtures, C++ benchmarks; the top-level CMakeLists.txt).
OPENREG_BUILD_DIR := $(BUILD_ROOT)/openreg
DEV_BUILD_DIR := $(BUILD_ROOT)/dev
# Pinned tools of the environment (torch must stay pinned: an unpinned torch
# pulls a multi-GB CUDA build).
PIP_PACKAGES := torch==$(TORCH) "scikit-build-core>=0.11" ninja
# Compiled Python (and pytest's assertion-rewritten test modules) is cached in
# build/pycache, outside the sources, even where the environment asks Python
# not to write bytecode: `make test` starts the suite hundreds of times, and
# each start would otherwise compile the kit again (seconds each).
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX := $(abspath build/pycache)
# ccache (a system package below) keys compiled objects by paths relative to
# the checkout, so a fresh clone anywhere reuses what an earlier one compiled.
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: conformance test test-process test-clean-build test-newest-torch fixture-build fixture-build-locked fixture-conformance torch-matrix mutants benchmarks build build-locked docs setup system-packages sanitizers fuzz fuzz-smoke stress

## Main job: the conformance suite against the reference backend; the
## compliance report lands in $(REPORT_DIR)/ (JSON, JUnit, Markdown, HTML, badge).
conformance: build
	$(PYTHON) -m openreg
	$(VENV)/bin/privateuse1-conformance run --backend openreg --report-dir $(REPORT_DIR)

## OpenReg in process mode (each device an executor process:
## docs/reference-backend/executor.md): its backend tests and the whole
## conformance suite; part of `make test`.
PROCESS_MODE_TESTS := $(addprefix tests/test_,allocator.py amp.py async_operators.py autoload.py device_loss.py \
  device_management.py guard.py hooks.py inductor.py inline_kernels.py isolation.py memory.py processes.py rng.py \
  openreg_stress.py process_group.py streams_events.py tensors.py)
test-process: build
	OPENREG_EXECUTOR=process $(PYTHON) -m pytest $(PROCESS_MODE_TESTS) -n 2 --dist loadfile -q -rs -m "not mutation"
	OPENREG_EXECUTOR=process $(VENV)/bin/privateuse1-conformance run --backend openreg \
	  --report-dir build/conformance-report-process

## All of the project's tests: the runtime's GoogleTest suite (plain, under
## ASan+UBSan and under TSan), a short fuzzing run of the runtime, pytest
## (with a sample of the mutation run: one mutant per contract area),
## OpenReg's backend tests and the conformance suite in process mode, and
## the kit on the newest supported torch.
test: build
	ctest --test-dir $(OPENREG_BUILD_DIR) --output-on-failure
	$(MAKE) --no-print-directory sanitizers fuzz-smoke
	$(PYTHON) -m pytest tests -n 2 --dist loadfile --no-loadscope-reorder -q -rs -m "not mutation"
	$(MAKE) --no-print-directory test-process
	$(MAKE) --no-print-directory test-clean-build
	$(MAKE) --no-print-directory test-newest-torch

## OpenReg as a vendor copying it gets it: built from its clean sources
## without the mutant weaver (docs/mutation-testing.md), installed (not
## editable) with the kit into an environment of its own that borrows the
## project environment's packages (torch, pytest) but none of its start-up
## hooks (no mutant weaving, no editable OpenReg). The runtime's GoogleTest
## suite and a sample of OpenReg's backend tests run on it: the woven build
## the other targets test is the clean one when no mutant is selected.
CLEAN_DIR := $(BUILD_ROOT)/openreg-clean
CLEAN_PYTHON := $(CLEAN_DIR)/venv/bin/python
CLEAN_BUILD_TESTS := $(addprefix tests/test_,allocator.py async_operators.py device_management.py guard.py hooks.py \
  inductor.py memory.py rng.py streams_events.py tensors.py)
test-clean-build: build
	test -x $(CLEAN_PYTHON) || $(PYTHON) -m venv --without-pip $(CLEAN_DIR)/venv
	$(PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
	  "$$($(CLEAN_PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/project-packages.pth"
	$(CLEAN_PYTHON) -m pip install --quiet --no-deps --no-build-isolation .
	$(CLEAN_PYTHON) -m pip install --quiet --no-deps --no-build-isolation ./reference_backend \
	  --config-settings=build-dir=$(abspath $(CLEAN_DIR))/cmake \
	  --config-settings=cmake.define.OPENREG_BUILD_TESTS=ON
	ctest --test-dir $(CLEAN_DIR)/cmake --output-on-failure
	cd $(CLEAN_DIR) && $(abspath $(CLEAN_PYTHON)) -c "import openreg, sys; \
	  sys.exit(0 if openreg.__file__.startswith('$(abspath $(CLEAN_DIR))') else 'not the clean build: ' + openreg.__file__)"
	$(CLEAN_PYTHON) -m pytest $(CLEAN_BUILD_TESTS) -n 2 --dist loadfile -q -rs -m "not mutation and not woven"

## The suite against the independent conforming fixture pu1_sync, built
## against $(TORCH) (the kit and the fixture only: no OpenReg), at
## FIXTURE_LEVEL (default: the level its manifest claims); the report lands
## in $(BUILD_ROOT)/pu1_sync-report. It must reach that level.
FIXTURE_LEVEL ?=
FIXTURE_REPORT_DIR := $(BUILD_ROOT)/pu1_sync-report
FIXTURE_SITE := $(BUILD_ROOT)/pu1_sync-site
fixture-conformance: fixture-build
	@# pu1_sync as an installed, versioned distribution, as a vendor's backend
	@# is: the report of a backend without a version does not verify.
	mkdir -p $(FIXTURE_SITE)/pu1_sync-0.1.0.dist-info
	printf 'Metadata-Version: 2.1\nName: pu1-sync\nVersion: 0.1.0\n' > $(FIXTURE_SITE)/pu1_sync-0.1.0.dist-info/METADATA
	echo pu1_sync > $(FIXTURE_SITE)/pu1_sync-0.1.0.dist-info/top_level.txt
	PYTHONPATH=$(abspath $(DEV_BUILD_DIR))/fixtures:$(abspath $(FIXTURE_SITE)) \
	  $(VENV)/bin/privateuse1-conformance run --backend pu1_sync \
	  --manifest tests/fixtures/pu1_sync/manifest.toml $(if $(FIXTURE_LEVEL),--level $(FIXTURE_LEVEL)) \
	  --report-dir $(FIXTURE_REPORT_DIR)

## The kit on the newest torch it supports: pu1_sync at core level, so that a
## torch release that breaks the kit fails `make test` (the environment, a
## CUDA build of torch from PyPI, is made once: about 5 GB).
NEWEST_TORCH := 2.15.0
test-newest-torch:
	$(MAKE) --no-print-directory fixture-conformance TORCH=$(NEWEST_TORCH) FIXTURE_LEVEL=core

## Every supported torch: OpenReg (the main job) and pu1_sync, each at the
## level it claims, in an environment per torch; the table of their reports
## goes to docs/torch-matrix.md.
TORCH_MATRIX := 2.13.0 2.14.1 2.15.0
torch-matrix:
	@set -e; for t in $(TORCH_MATRIX); do \
	  $(MAKE) --no-print-directory conformance fixture-conformance TORCH=$$t; done
	$(PYTHON) benchmarks/torch_matrix.py $(foreach t,$(TORCH_MATRIX),\
	  $(t)=openreg=$(if $(filter $(t),$(DEFAULT_TORCH)),conformance-report,conformance-report-torch-$(t)) \
	  $(t)=pu1_sync=$(if $(filter $(t),$(DEFAULT_TORCH)),build,build/torch-$(t))/pu1_sync-report) > docs/torch-matrix.md

## The whole mutation run, recorded: every mutant in both configurations (with
## OpenReg's instrumentation and without; those of contracts that need a newer
## torch on $(NEWEST_TORCH)), written to the kill matrix the
## project's tests bind to this tree, and the docs' table regenerated; then
## every ordering mutant killed in 20 of 20 runs on a busy machine.
KILL_MATRIX := docs/mutation-kill-matrix.json
mutants: build
	@# The mutants of contracts that need a newer torch (min_torch) run there:
	@# OpenReg and the kit built in the newest supported torch's environment.
	$(MAKE) --no-print-directory build TORCH=$(NEWEST_TORCH)
	$(PYTHON) mutation/run.py --jobs 2 --newer-python .venv-torch-$(NEWEST_TORCH)/bin/python \
	  --output $(KILL_MATRIX)
	$(PYTHON) mutation/run.py --markdown $(KILL_MATRIX) --docs docs/mutation-testing.md
	$(PYTHON) -m pytest tests/test_mutants.py -q -m mutation

# Sanitizer builds of the runtime (plain C++, no torch): each a standalone
# CMake build of reference_backend/runtime and its GoogleTest suite.
SANITIZER_BUILDS := asan=address,undefined tsan=thread
CCACHE := $(shell command -v ccache 2>/dev/null)

## The runtime's GoogleTest suite under ASan+UBSan and under TSan.
sanitizers: setup
	@set -e; for spec in $(SANITIZER_BUILDS); do \
	  dir=build/sanitize-$${spec%%=*}; \
	  echo "== runtime tests under -fsanitize=$${spec#*=} ($$dir)"; \
	  cmake -S reference_backend/runtime -B $$dir -G Ninja -Wno-dev \
	    -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	    -DOPENREG_SANITIZE=$${spec#*=} $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE)) >/dev/null; \
	  cmake --build $$dir; \
	  ctest --test-dir $$dir --output-on-failure; \
	done

## Fuzzing the runtime's C API (libFuzzer, ASan+UBSan): a short run on the
## committed corpus in `make test`, a long one here (FUZZ_SECONDS).
FUZZ_SECONDS ?= 600
fuzz: system-packages
	reference_backend/runtime/fuzz/run_fuzz.sh $(FUZZ_SECONDS)

fuzz-smoke: system-packages
	reference_backend/runtime/fuzz/run_fuzz.sh 30

## A long multi-threaded stress run of OpenReg through PyTorch, every result checked.
STRESS_SECONDS ?= 120
stress: build
	$(PYTHON) benchmarks/stress.py --seconds $(STRESS_SECONDS)

## All benchmarks: a table of ratios against the targets, and benchmarks/results.json.
benchmarks: build
	$(PYTHON) benchmarks/run_all.py

## Build and install (editable) into the virtual environment: the kit
## (nothing to compile; its C++ probe is compiled here ahead of its first
## use), OpenReg (CMake, with the runtime's tests; woven with the mutants of
## conformance/mutants.toml, which the project's tests and `make mutants`
## select with OPENREG_MUTANT: docs/mutation-testing.md), then the fixtures
## and C++ benchmarks (the top-level CMakeLists.txt).
build: setup
	mkdir -p build
	flock build/.lock $(MAKE) --no-print-directory build-locked

build-locked:
	$(PYTHON) -m pip install --quiet --no-build-isolation --editable ".[test,docs]"
	$(PYTHON) -m pip install --quiet --no-build-isolation --editable ./reference_backend \
	  --config-settings=build-dir=$(abspath $(OPENREG_BUILD_DIR)) \
	  --config-settings=cmake.define.OPENREG_BUILD_TESTS=ON \
	  --config-settings=cmake.define.OPENREG_WEAVE=$(abspath mutation/Weave.cmake)
	$(PYTHON) mutation/pyhook.py --install
	cmake -S . -B $(DEV_BUILD_DIR) -G Ninja -Wno-dev -DPython_EXECUTABLE=$(abspath $(PYTHON)) \
	  -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja >/dev/null
	cmake --build $(DEV_BUILD_DIR)
	$(PYTHON) -m privateuse1_conformance.conformance._probe >/dev/null

# The kit and the pu1_sync fixture alone (no OpenReg): what a run of the kit
# on another torch needs.
fixture-build: setup
	mkdir -p build
	flock build/.lock $(MAKE) --no-print-directory fixture-build-locked

fixture-build-locked:
	$(PYTHON) -m pip install --quiet --no-build-isolation --editable .
	cmake -S . -B $(DEV_BUILD_DIR) -G Ninja -Wno-dev -DPython_EXECUTABLE=$(abspath $(PYTHON)) \
	  -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV))/bin/ninja >/dev/null
	cmake --build $(DEV_BUILD_DIR) --target pu1_sync_C
	$(PYTHON) -m privateuse1_conformance.conformance._probe >/dev/null

## The documentation site (docs/ with mkdocs) into build/docs-site; fails on a
## broken link or anchor. Needs neither torch nor the C++ build.
docs: $(VENV)/.pip-stamp
	$(PYTHON) -m pip install --quiet "mkdocs>=1.6,<2"
	$(PYTHON) -m mkdocs build --strict

setup: system-packages $(VENV)/.pip-stamp

$(VENV)/.pip-stamp: pyproject.toml Makefile
	test -x $(PYTHON) || python3 -m venv $(VENV)
ifneq ($(TORCH),$(DEFAULT_TORCH))
	@# Where the machine's pip configuration caps torch (a constraints file),
	@# this environment's own configuration lifts the cap for itself.
	printf '[global]\nconstraint =\n' > $(VENV)/pip.conf
endif
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet $(PIP_PACKAGES)
	touch $@

# GoogleTest and CMake build the C++ parts (Google Benchmark the C++
# benchmarks), ccache keeps what they compiled for the next build or clone;
# clang's libFuzzer fuzzes the runtime; chromium checks the HTML
# report in a real (headless) browser.
SYSTEM_PACKAGES := libgtest-dev libbenchmark-dev cmake ccache g++ clang-14 libclang-rt-14-dev chromium

system-packages:
	@if ! dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $(SYSTEM_PACKAGES); \
	fi
