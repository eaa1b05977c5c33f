#!/usr/bin/env bash
# The kit installed and used the way a vendor does, timed step by step:
#   1. a fresh virtual environment with nothing but torch==2.13.0;
#   2. one `pip install <this repository>`: the kit alone (no OpenReg, no CMake);
#   3. from an unrelated folder, the CI recipe (docs/ci/conformance.sh) with the
#      kit already installed: `privateuse1-conformance run` (the whole suite,
#      the default workers), the job summary, `verify` as the gate; then
#      `pytest --backend` (the core level, one worker). The recipe's run, the
#      kit's first use, compiles its C++ probe into a fresh cache (and says so).
# usage: tests/kit_install.sh WORKDIR BACKEND BACKEND_PYTHONPATH MANIFEST
# BASE_PYTHON: the interpreter that makes the environment (default python3);
# the CI recipe's settings (GITHUB_STEP_SUMMARY, ...) come from the environment.
# Writes WORKDIR/times.tsv (step, seconds), the recipe's report in
# WORKDIR/unrelated/conformance-report/, pytest's in WORKDIR/pytest-report/.
# tests/kit_support.py runs it once per test session (for test_kit_install.py,
# test_ci_recipe.py, test_kit_fairness.py); docs/vendor-guide.md quotes its times.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$1 backend=$2 backend_path=$3 manifest=$4
base_python=${BASE_PYTHON:-python3}
mkdir -p "$work/unrelated"
times="$work/times.tsv"
: >"$times"
step() {  # step NAME COMMAND...: run it, record its wall time, return its status
  local name=$1 start end status=0
  shift
  start=$EPOCHREALTIME
  "$@" || status=$?
  end=$EPOCHREALTIME
  awk -v n="$name" -v s="$start" -v e="$end" 'BEGIN { printf "%s\t%.1f\n", n, e - s }' >>"$times"
  return "$status"
}

step venv "$base_python" -m venv "$work/venv"
step torch "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check torch==2.13.0
step kit "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$repo"

cd "$work/unrelated"
export PYTHONPATH="$backend_path" PU1C_PROBE_CACHE="$work/probe-cache"
# Both runs run whatever the first's status: the script exits with the first failure's.
status=0
step ci-recipe env BACKEND="$backend" MANIFEST="$manifest" KIT= BACKEND_PACKAGE= PYTHON="$work/venv/bin/python" \
  "$repo/docs/ci/conformance.sh" || status=$?
step pytest-run "$work/venv/bin/python" -m pytest -p no:cacheprovider -q --backend="$backend" \
  --manifest="$manifest" --level=core --report-dir="$work/pytest-report" || { rc=$?; [[ $status -ne 0 ]] || status=$rc; }
cat "$times"
exit "$status"
