#!/usr/bin/env bash
# Builds the OpenReg runtime fuzzer (fuzz_runtime.cpp + the runtime's sources,
# libFuzzer + ASan + UBSan) and runs it on the committed seed corpus.
#
#   reference_backend/runtime/fuzz/run_fuzz.sh [SECONDS] [extra libFuzzer args...]
#
# SECONDS (default 60; 0: no limit) bounds the run (-max_total_time). New
# inputs go to a scratch folder under build/fuzz/ that is removed afterwards
# (the committed corpus/ is only read); crash inputs are kept in
# build/fuzz/artifacts/. Exits non-zero on any crash, sanitizer report, leak,
# timeout or oracle failure. Works from any directory. The binary is rebuilt
# when a source is newer than it.
#
# Environment:
#   OPENREG_FUZZ_RUNTIME  a directory with include/ and src/ to build against
#                         instead of reference_backend/runtime (e.g. a copy of
#                         an older runtime); its binary gets its own name.
#                         Runtimes before 1c90f4f never freed destroyed
#                         streams (on purpose): run those with
#                         ASAN_OPTIONS=detect_leaks=0 and -detect_leaks=0.
#   CXX                   the compiler (default clang++-14, else clang++).
#   OPENREG_FUZZ_TRACE=1: see fuzz_runtime.cpp.
#
# To replay one input:   build/fuzz/fuzz_runtime FILE
# With a trace of every op:  OPENREG_FUZZ_TRACE=1 build/fuzz/fuzz_runtime FILE
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
seconds="${1:-60}"
if [[ $# -gt 0 ]]; then shift; fi
if ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 [SECONDS] [extra libFuzzer args...]" >&2
  exit 2
fi

runtime="${OPENREG_FUZZ_RUNTIME:-$repo/reference_backend/runtime}"
runtime="$(cd "$runtime" && pwd)"
out="$repo/build/fuzz"
name=fuzz_runtime
if [[ "$runtime" != "$repo/reference_backend/runtime" ]]; then
  name="fuzz_runtime-$(printf '%s' "$runtime" | cksum | cut -d' ' -f1)"
fi
bin="$out/$name"
mkdir -p "$out"

# ---------------------------------------------------------------- compiler
find_cxx() {
  if [[ -n "${CXX:-}" ]] && command -v "$CXX" >/dev/null 2>&1; then
    command -v "$CXX"; return
  fi
  for c in clang++-14 clang++; do
    if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return; fi
  done
}
cxx="$(find_cxx || true)"
if [[ -z "$cxx" ]]; then
  echo "run_fuzz.sh: clang++ not found; installing clang-14" >&2
  sudo=""
  if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
  $sudo apt-get update
  $sudo apt-get install -y clang-14 libclang-rt-14-dev
  cxx="$(find_cxx)"
fi

# ------------------------------------------------------------------- build
sources=("$here/fuzz_runtime.cpp" "$runtime/src/device.cpp" "$runtime/src/executor.cpp"
         "$runtime/src/memory.cpp" "$runtime/src/module.cpp" "$runtime/src/staging.cpp"
         "$runtime/src/stream.cpp")
deps=("${sources[@]}" "$runtime/src/internal.h" "$runtime/src/executor_protocol.h"
      "$runtime/include/openreg/runtime.h"
      "$here/run_fuzz.sh")
stale=0
if [[ ! -x "$bin" ]]; then
  stale=1
else
  for f in "${deps[@]}"; do
    if [[ "$f" -nt "$bin" ]]; then stale=1; break; fi
  done
fi
if [[ $stale == 1 ]]; then
  echo "run_fuzz.sh: building $bin with $cxx (runtime: $runtime)" >&2
  tmp="$bin.tmp.$$"
  "$cxx" -fsanitize=fuzzer,address,undefined -g -O1 -std=c++20 \
    -Wall -Wextra -I "$runtime/include" -I "$runtime/src" -pthread \
    "${sources[@]}" -o "$tmp"
  mv -f "$tmp" "$bin"
fi

# --------------------------------------------------------------------- run
artifacts="$out/artifacts"
mkdir -p "$artifacts"
new_corpus="$(mktemp -d "$out/scratch-corpus.XXXXXX")"
trap 'rm -rf "$new_corpus"' EXIT
export ASAN_OPTIONS="detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
echo "run_fuzz.sh: fuzzing for ${seconds}s: $bin" >&2
set +e
"$bin" -max_total_time="$seconds" -timeout=60 -max_len=4097 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" \
  "$new_corpus" "$here/corpus"
rc=$?
set -e
if [[ $rc != 0 ]]; then
  echo "run_fuzz.sh: FAILED (exit $rc); the input is in $artifacts/" >&2
  exit "$rc"
fi
echo "run_fuzz.sh: no failure in ${seconds}s" >&2
