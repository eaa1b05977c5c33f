"""How fast the conformance suite runs against the reference backend.

Measures, on this machine:
  * the whole suite's wall time against OpenReg (target: under 60 s), for
    1, 2, 4 and 8 devices (target: growing no faster than linearly);
  * the per-test cost of process isolation: N trivial tests run with
    --isolation=fork versus --isolation=none (target: under 20 ms per test).

Prints a table and writes benchmarks/results-suite.json. Numbers, not
assertions: these machines are noisy.

    python benchmarks/bench_suite.py [--devices 1 2 4 8] [--trivial 200] [--jobs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The plugin, by its pytest11 entry point's name (loaded even with
# PYTEST_DISABLE_PLUGIN_AUTOLOAD set).
PLUGIN = "privateuse1_conformance"

TRIVIAL = '''
import pytest

@pytest.mark.contract("DM-NAME-001")
@pytest.mark.parametrize("i", range({count}))
def test_trivial(i):
    assert i >= 0
'''


def _pytest(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, int, str]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-q", *args],
        cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    return time.perf_counter() - start, proc.returncode, proc.stdout.strip().splitlines()[-1:]


def suite_time(devices: int, jobs: int, workdir: Path) -> dict:
    args = ["--backend=openreg", "--pyargs", "privateuse1_conformance.conformance"]
    if jobs > 1:
        args += ["-n", str(jobs)]
    wall, code, tail = _pytest(args, workdir, {"OPENREG_DEVICE_COUNT": str(devices)})
    return {"devices": devices, "jobs": jobs, "wall_s": round(wall, 2), "exit": code,
            "summary": tail[0] if tail else ""}


def isolation_overhead(count: int, workdir: Path) -> dict:
    (workdir / "test_trivial.py").write_text(TRIVIAL.format(count=count))
    timings = {}
    for mode in ("none", "fork"):
        best = min(_pytest(["--backend=openreg", f"--isolation={mode}", "test_trivial.py"], workdir)[0]
                   for _ in range(3))
        timings[mode] = best
    per_test_ms = (timings["fork"] - timings["none"]) / count * 1000
    return {"tests": count, "in_process_s": round(timings["none"], 3),
            "forked_s": round(timings["fork"], 3), "overhead_per_test_ms": round(per_test_ms, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--trivial", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--output", type=Path, default=HERE / "results-suite.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        isolation = isolation_overhead(args.trivial, work)
        print(f"isolation: {isolation['tests']} trivial tests, in-process {isolation['in_process_s']} s, "
              f"forked {isolation['forked_s']} s -> {isolation['overhead_per_test_ms']} ms per test "
              f"(target < 20 ms, ratio {isolation['overhead_per_test_ms'] / 20:.2f} of target)")
        suites = []
        for devices in args.devices:
            result = suite_time(devices, args.jobs, work)
            suites.append(result)
            print(f"suite: {devices} device(s), {args.jobs} job(s): {result['wall_s']} s "
                  f"(target < 60 s, ratio {result['wall_s'] / 60:.2f}) [{result['summary']}]")
    base = next((s for s in suites if s["devices"] == 1), suites[0])
    for s in suites:
        s["growth_vs_1_device"] = round(s["wall_s"] / base["wall_s"], 2)
        s["linear_bound"] = s["devices"] / base["devices"]
    print("growth with the device count (wall time relative to 1 device, linear would be the device count):")
    for s in suites:
        print(f"  {s['devices']:>2} devices: x{s['growth_vs_1_device']}")
    args.output.write_text(json.dumps({"isolation": isolation, "suite": suites}, indent=2) + "\n")
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
