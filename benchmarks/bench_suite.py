"""How fast the conformance suite runs against the reference backend, and
where a run's time goes beyond its tests.

Measures, on this machine, through the CLI as a vendor runs it:
  * the default run (`privateuse1-conformance run`) with one worker and with
    the default (one per core): wall time, speedup, and whether every
    verdict is the same (it must be);
  * the time per area (the sum of its tests' own durations);
  * a core-level run with one worker: the overhead ratio, the run's duration
    over the sum of its tests' own durations (target: at most 1.3), and the
    command's wall time;
  * a one-contract rerun: how long from the command to its test's start;
  * the per-test cost of process isolation: N trivial tests run with
    --isolation=fork versus --isolation=none (target: under 20 ms per test);
  * with --devices, the core run's growth with the device count.

Prints a table and writes benchmarks/results-suite.json. Numbers, not
assertions: these machines are noisy.

    python benchmarks/bench_suite.py [--quick] [--devices 1 2 4 8] [--trivial 200]

--quick leaves out the two default runs (minutes each).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# The plugin, by its pytest11 entry point's name (loaded even with
# PYTEST_DISABLE_PLUGIN_AUTOLOAD set).
PLUGIN = "privateuse1_conformance"
CLI = Path(sys.executable).parent / "privateuse1-conformance"
OVERHEAD_TARGET = 1.3
SPEEDUP_TARGET = 1.8

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


def _cli_run(args: list[str], report_dir: Path, env: dict[str, str] | None = None) -> tuple[float, dict]:
    """(the command's wall time, its report) of `privateuse1-conformance run --backend openreg ARGS`."""
    start = time.perf_counter()
    proc = subprocess.run([str(CLI), "run", "--backend", "openreg", "--report-dir", str(report_dir), *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    report_file = report_dir / "report.json"
    if not report_file.exists():
        raise SystemExit(f"no report from {args}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, json.loads(report_file.read_text())


def _tests(report: dict) -> dict[str, dict]:
    """nodeid -> test (each once, whatever contracts it checked), with its area."""
    tests = {}
    for contract in report["contracts"]:
        for test in contract["tests"]:
            tests.setdefault(test["nodeid"], {**test, "area": contract["area"]})
    return tests


def _run_facts(wall: float, report: dict) -> dict:
    tests = _tests(report)
    test_time = sum(t["duration_ms"] for t in tests.values()) / 1000
    duration = report["provenance"]["duration_ms"] / 1000
    return {"wall_s": round(wall, 1), "run_s": round(duration, 1), "tests": len(tests),
            "test_time_s": round(test_time, 1), "workers": report["provenance"].get("workers", 1),
            "level": report["summary"]["level_reached"],
            "overhead_ratio": round(duration / test_time, 2) if test_time else None}


def _verdicts(report: dict) -> dict[str, str]:
    return {**{c["id"]: c["verdict"] for c in report["contracts"]},
            **{nodeid: t["verdict"] for nodeid, t in _tests(report).items()}}


def default_runs(work: Path) -> dict:
    serial_wall, serial = _cli_run(["-j", "1"], work / "serial")
    parallel_wall, parallel = _cli_run([], work / "parallel")
    one, default = _verdicts(serial), _verdicts(parallel)
    differ = sorted(k for k in one.keys() | default.keys() if one.get(k) != default.get(k))
    areas: dict[str, float] = defaultdict(float)
    for test in _tests(serial).values():
        areas[test["area"]] += test["duration_ms"] / 1000
    return {"serial": _run_facts(serial_wall, serial), "default": _run_facts(parallel_wall, parallel),
            "speedup": round(serial_wall / parallel_wall, 2), "target_speedup": SPEEDUP_TARGET,
            "verdicts_compared": len(one), "verdicts_differing": differ,
            "areas_s": {a: round(s, 1) for a, s in sorted(areas.items(), key=lambda kv: -kv[1])}}


def core_run(work: Path, devices: int | None = None) -> dict:
    env = {"OPENREG_DEVICE_COUNT": str(devices)} if devices else None
    wall, report = _cli_run(["-j", "1", "--level", "core"], work / f"core-{devices}", env)
    return {**_run_facts(wall, report), "devices": devices or report["provenance"]["device_count"],
            "target_overhead_ratio": OVERHEAD_TARGET}


def rerun(work: Path) -> dict:
    """A one-contract rerun: the command's wall time, its test's own time, and the rest."""
    wall, report = _cli_run(["-j", "1", "--contract", "DM-COUNT-001"], work / "rerun")
    facts = _run_facts(wall, report)
    return {**facts, "before_and_after_tests_s": round(wall - facts["test_time_s"], 1)}


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
    parser.add_argument("--quick", action="store_true", help="leave out the two default runs")
    parser.add_argument("--devices", type=int, nargs="*", default=[],
                        help="also time the core run with these device counts")
    parser.add_argument("--trivial", type=int, default=200)
    parser.add_argument("--output", type=Path, default=HERE / "results-suite.json")
    args = parser.parse_args()

    results: dict = {"cores": len(os.sched_getaffinity(0))}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        iso = results["isolation"] = isolation_overhead(args.trivial, work)
        print(f"isolation: {iso['tests']} trivial tests, in-process {iso['in_process_s']} s, forked "
              f"{iso['forked_s']} s -> {iso['overhead_per_test_ms']} ms per test (target < 20 ms)")
        core = results["core"] = core_run(work)
        print(f"core run, 1 worker: {core['tests']} tests, {core['test_time_s']} s of tests in a "
              f"{core['run_s']} s run ({core['wall_s']} s command): overhead ratio {core['overhead_ratio']} "
              f"(target <= {OVERHEAD_TARGET}); level {core['level']}")
        again = results["rerun"] = rerun(work)
        print(f"one-contract rerun: {again['wall_s']} s command, {again['test_time_s']} s of tests")
        if args.devices:
            results["core_by_devices"] = [core_run(work, n) for n in args.devices]
            base = results["core_by_devices"][0]
            for row in results["core_by_devices"]:
                row["growth"] = round(row["run_s"] / base["run_s"], 2)
                print(f"  core run with {row['devices']} device(s): {row['run_s']} s (x{row['growth']})")
        if not args.quick:
            runs = results["default_run"] = default_runs(work)
            for name in ("serial", "default"):
                r = runs[name]
                print(f"default run, {r['workers']} worker(s): {r['wall_s']} s command, {r['run_s']} s run, "
                      f"{r['tests']} tests, {r['test_time_s']} s of tests; level {r['level']}")
            print(f"speedup of the default over one worker: {runs['speedup']}x (target >= {SPEEDUP_TARGET}); "
                  f"{len(runs['verdicts_differing'])} of {runs['verdicts_compared']} verdicts differ "
                  f"{runs['verdicts_differing'][:5]}")
            print("time per area (one worker): " + ", ".join(f"{a} {s} s" for a, s in runs["areas_s"].items()))
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
