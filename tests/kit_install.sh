#!/usr/bin/env bash
# The kit installed the way a vendor installs it, timed step by step:
#   1. a fresh virtual environment with nothing but torch==2.13.0;
#   2. one `pip install <this repository>`: the kit alone (no OpenReg, no CMake);
#   3. from an unrelated folder, `privateuse1-conformance run` (the whole suite,
#      the default workers) and `pytest --backend` (the core level, one worker)
#      against a backend that is not part of the kit (the first use compiles
#      the kit's C++ probe into a fresh cache).
# usage: tests/kit_install.sh WORKDIR BACKEND BACKEND_PYTHONPATH MANIFEST
# Writes WORKDIR/times.tsv (step, seconds) and WORKDIR/{cli,pytest}-report/.
# tests/test_kit_install.py runs it; docs/vendor-guide.md quotes its times.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$1 backend=$2 backend_path=$3 manifest=$4
python=${PYTHON:-python3}
mkdir -p "$work/unrelated"
times="$work/times.tsv"
: >"$times"
step() {  # step NAME COMMAND...: run it, record its wall time
  local name=$1 start end
  shift
  start=$EPOCHREALTIME
  "$@"
  end=$EPOCHREALTIME
  awk -v n="$name" -v s="$start" -v e="$end" 'BEGIN { printf "%s\t%.1f\n", n, e - s }' >>"$times"
}

step venv "$python" -m venv "$work/venv"
step torch "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check torch==2.13.0
step kit "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$repo"

cd "$work/unrelated"
export PYTHONPATH="$backend_path" PU1C_PROBE_CACHE="$work/probe-cache"
step probe "$work/venv/bin/python" -m privateuse1_conformance.conformance._probe
step cli-run "$work/venv/bin/privateuse1-conformance" run --backend "$backend" --manifest "$manifest" \
  --report-dir "$work/cli-report"
step pytest-run "$work/venv/bin/python" -m pytest -p no:cacheprovider -q --backend="$backend" \
  --manifest="$manifest" --level=core --report-dir="$work/pytest-report"
cat "$times"
