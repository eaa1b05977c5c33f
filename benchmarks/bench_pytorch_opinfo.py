"""How long PyTorch's own device-generic OpInfo tests take for the operators
the kit's operators area checks, next to the kit's own time for them.

What it measures. PyTorch tests operators with its OpInfo database in
``test/test_ops.py`` (class ``TestCommon``), instantiated for every device
type present, a PrivateUse1 backend included (``PrivateUse1TestBase`` in
``torch/testing/_internal/common_device_type.py``). This script runs the
``TestCommon`` tests that correspond to the kit's checks, restricted to the
OpInfo entries of one ``--operators`` selection (the kit's own selection
function, so both sides check the same entries), on the backend's device,
in one pytest process, and measures its wall time and its outcomes. With
``--kit`` it also times the kit's run of the same entries
(``privateuse1-conformance run --contract OP-INFO-001..004 --operators
SELECTION``) in the same benchmark run, so that the two times are one ratio
from one machine and one moment.

Where test_ops.py comes from. It is not in the torch wheel. A vendor takes it
from a PyTorch source checkout of the torch version they run
(``git checkout v<version>``; the file is ``test/test_ops.py``) and passes
its folder as ``--pytorch-tests``. A test_ops.py from another version may
import helpers the installed ``torch.testing._internal`` lacks, or name
OpInfo attributes it no longer has: such a file fails at collection (the
script reports it) or fails every test, and says nothing about the backend.

How PyTorch's tests are selected and run. The device type comes from
``PYTORCH_TESTING_DEVICE_ONLY_FOR`` (the backend's device name; the backend
must be imported by ``import torch``, which a backend with a
``torch.backends`` entry point is). The script collects test_ops.py once
(``pytest --collect-only``), keeps the node ids of the chosen tests whose
OpInfo part is the formatted name of a selected entry (``@ops`` names a test
``<test>_<op.formatted_name>_<device>[_<dtype>]``), and passes them to
pytest in a file (``@ARGSFILE``). pytest runs with an empty ini file, without
conftest.py files and without third-party plugins, so a checkout's own
pytest configuration does not change what runs. The outcomes come from
pytest's JUnit XML; the verbose log (unbuffered) says how far the run got
when the process dies, since a crash (a segfault, an abort) ends a PyTorch
test run: every later test is lost, and the script records the test that was
running and how many had finished. The whole run has a time limit
(``--timeout``); on expiry the process group is killed and the run is
reported as timed out.

Which PyTorch test corresponds to which of the kit's checks:

==============================  =============================================
PyTorch test (TestCommon)       the kit's check
==============================  =============================================
test_compare_cpu                forward (OP-INFO-001.1): device against CPU.
                                Decorated ``@onlyOn(["cuda", "xpu"])``: on a
                                PrivateUse1 device every one is skipped.
test_numpy_ref                  forward values (OP-INFO-001.1), against NumPy
                                in float64/int64/complex128, for the entries
                                with a NumPy reference that are not unary or
                                binary ufuncs, reductions or spectral
                                functions: the forward-value check PyTorch
                                does run on a PrivateUse1 device.
test_noncontiguous_samples      noncontiguous (OP-INFO-001.2), with gradients
test_out                        out (OP-INFO-002.1), one dtype per entry, plus
                                out= on the wrong device and of an unsafe dtype
test_variant_consistency_eager  inplace (OP-INFO-002.2): method and in-place
                                variants and aliases against the function,
                                forward and backward (float32, complex64)
test_errors                     errors (OP-INFO-004.1)
==============================  =============================================

The kit's backward check (OP-INFO-003.1: gradients on the device against the
CPU's) has no counterpart in test_ops.py; PyTorch checks gradients with
gradcheck in test_ops_gradients.py, which this script does not run.

Where the comparison is fair, and where not:

* Same machine, same torch, same backend, same OpInfo entries, same sample
  generator (``op.sample_inputs``), each side's whole command timed from
  start to exit (interpreter start, imports and collection included; the
  collection this script does beforehand to choose node ids is timed
  separately and not counted).
* Not the same work: PyTorch's tests run a few dtypes per test (one for
  test_out, float32/int64/complex64 for non-contiguity, float32/complex64
  for variants) and compare the device with itself (variants, layouts) or
  with NumPy; the kit compares every dtype the CPU supports with the CPU,
  check by check. The JSON gives each side's counts (tests, entries, dtypes,
  checks) so that the times can be read per unit of work.
* Not the same isolation: PyTorch's tests share one process (one crash ends
  the run); the kit forks a process per entry (a crash costs that entry).
* The machine may be shared: the load average before and after each run is
  recorded; repeat the run before trusting a small difference.

    python benchmarks/bench_pytorch_opinfo.py --pytorch-tests ~/pytorch/test \\
        [--operators default|all|a,b,c] [--tests test_out,test_errors] \\
        [--device openreg] [--timeout 3600] [--kit] [--output FILE.json]

Standard library and torch only (plus the kit itself, for its operator
selection); importing this module does nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

TEST_FILE = "test_ops.py"
DEFAULT_TESTS = (
    "test_compare_cpu",
    "test_numpy_ref",
    "test_noncontiguous_samples",
    "test_out",
    "test_variant_consistency_eager",
    "test_errors",
)
# PyTorch test -> the kit's check it corresponds to (the docstring's table).
KIT_CHECK = {
    "test_compare_cpu": "forward (OP-INFO-001.1); @onlyOn(['cuda', 'xpu']): skipped on PrivateUse1",
    "test_numpy_ref": "forward values (OP-INFO-001.1), against NumPy references",
    "test_noncontiguous_samples": "noncontiguous (OP-INFO-001.2)",
    "test_out": "out (OP-INFO-002.1)",
    "test_variant_consistency_eager": "inplace (OP-INFO-002.2)",
    "test_errors": "errors (OP-INFO-004.1)",
}
KIT_CONTRACTS = ("OP-INFO-001", "OP-INFO-002", "OP-INFO-003", "OP-INFO-004")
OUTCOMES = ("passed", "failed", "errors", "skipped", "xfailed", "xpassed")
VERBOSE_WORD = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped",
                "XFAIL": "xfailed", "XPASS": "xpassed"}
MESSAGE_LIMIT = 400        # characters of a failure message kept in the JSON
KILL_GRACE_S = 15.0        # between SIGTERM and SIGKILL of a timed-out run
COLLECT_LIMIT_S = 900.0    # collection alone (it imports PyTorch's whole OpInfo database)


# ---------------------------------------------------------------- processes

def run_bounded(cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path, timeout: float) -> dict:
    """Runs `cmd` with its output in `log`, in a session of its own, killed
    (the whole process group) after `timeout` seconds. Never hangs."""
    with open(log, "wb") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except BaseException:  # (KeyboardInterrupt: leave nothing running)
            _kill_group(proc)
            raise
        wall = time.perf_counter() - start
    rc = proc.returncode
    return {"command": cmd, "exit_code": rc, "wall_s": round(wall, 2), "timed_out": timed_out,
            "signal": signal.Signals(-rc).name if rc is not None and rc < 0 and not timed_out else None,
            "log": str(log)}


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        return None


# ------------------------------------------------------------ the selection

def selected_entries(selection: str) -> list[dict]:
    """The OpInfo entries the kit's --operators SELECTION checks: key, name,
    formatted name (the part of PyTorch's test names that names the entry)."""
    from torch.testing._internal.common_methods_invocations import op_db

    from privateuse1_conformance.conformance._opinfo import op_key
    from privateuse1_conformance.harness.operators import select

    by_key = {op_key(op): op for op in op_db}
    keys = select([(key, op.name) for key, op in by_key.items()], selection)
    return [{"key": key, "name": by_key[key].name, "formatted_name": by_key[key].formatted_name}
            for key in keys]


def pytest_command(tests_dir: Path, ini: Path, extra: list[str]) -> list[str]:
    # An empty ini file, no conftest.py, no third-party plugins (the
    # environment sets PYTEST_DISABLE_PLUGIN_AUTOLOAD): only test_ops.py decides.
    return [sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(tests_dir),
            "--noconftest", "-p", "no:cacheprovider", *extra]


def pytest_env(device: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"PYTORCH_TESTING_DEVICE_ONLY_FOR": device, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                "PYTHONUNBUFFERED": "1"})
    return env


# (a test name is not always an identifier: nn_functional_interpolate_nearest-exact)
NODE = re.compile(rf"^({re.escape(TEST_FILE)}::([^\s:]+)::([^\s:]+))")


def match_node(name: str, tests: tuple[str, ...], by_formatted: dict[str, str], device: str):
    """(test, entry key, rest) for a test named <test>_<formatted>_<device>[_<rest>], else None."""
    for test in tests:
        if not name.startswith(test + "_"):
            continue
        tail = name[len(test) + 1:]
        marker = f"_{device}"
        at = tail.find(marker)
        while at != -1:
            formatted, after = tail[:at], tail[at + len(marker):]
            if formatted in by_formatted and (after == "" or after.startswith("_")):
                return test, by_formatted[formatted], after[1:]
            at = tail.find(marker, at + 1)
    return None


# ----------------------------------------------------------------- outcomes

def outcomes_from_junit(path: Path, meta: dict[tuple[str, str], dict]) -> dict:
    """Outcome counts, per-test counts and times, and failures, from JUnit XML."""
    root = ET.parse(path).getroot()
    totals, per_test, failures, skip_reasons = Counter(), defaultdict(Counter), [], Counter()
    seconds = defaultdict(float)
    for case in root.iter("testcase"):
        cls = case.get("classname", "").rsplit(".", 1)[-1]
        name = case.get("name", "")
        info = meta.get((cls, name), {"test": "?", "entry": "?", "rest": ""})
        outcome, message = "passed", ""
        for child in case:
            if child.tag == "failure":
                outcome, message = "failed", child.get("message", "")
            elif child.tag == "error":
                outcome, message = "errors", child.get("message", "")
            elif child.tag == "skipped":
                xfail = child.get("type") == "pytest.xfail"
                outcome, message = ("xfailed" if xfail else "skipped"), child.get("message", "")
        totals[outcome] += 1
        per_test[info["test"]][outcome] += 1
        seconds[info["test"]] += float(case.get("time", 0) or 0)
        if outcome == "skipped":
            skip_reasons[f"{info['test']}: {message.splitlines()[0] if message else ''}"[:200]] += 1
        if outcome in ("failed", "errors"):
            failures.append({"nodeid": f"{TEST_FILE}::{cls}::{name}", "test": info["test"],
                             "entry": info["entry"], "dtype": info["rest"], "outcome": outcome,
                             "message": message[:MESSAGE_LIMIT]})
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return {"source": "junit", "outcomes": {k: totals.get(k, 0) for k in OUTCOMES},
            "per_test": {t: {"outcomes": dict(c), "time_s": round(seconds[t], 2)}
                         for t, c in sorted(per_test.items())},
            "junit_time_s": float(suite.get("time", 0)) if suite is not None else None,
            "skip_reasons": dict(skip_reasons.most_common()), "failures": failures}


def progress_from_log(path: Path) -> dict:
    """How far a run got, from pytest's verbose log: the outcome of every
    test that finished, and the test that was running when the log ends (a
    line with a node id and no outcome: the process died in it)."""
    finished: dict[str, str] = {}
    last_started = None
    for line in path.read_text(errors="replace").splitlines():
        m = NODE.match(line)
        if not m:
            continue
        nodeid = m.group(1)
        words = line[len(nodeid):].split()
        word = words[0] if words else ""
        if word in VERBOSE_WORD:
            # (a teardown error is a second line for the same test: it wins)
            if finished.get(nodeid) != "errors":
                finished[nodeid] = VERBOSE_WORD[word]
            last_started = None
        else:
            last_started = nodeid
    counts = Counter(finished.values())
    return {"finished": len(finished), "outcomes": {k: counts.get(k, 0) for k in OUTCOMES},
            "running_at_end": last_started}


def signature(message: str) -> str:
    """A failure message reduced to what groups failures of one cause."""
    first = message.strip().splitlines()[0] if message.strip() else ""
    first = re.sub(r"0x[0-9a-f]+", "0x…", first)
    first = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", first)
    return first[:160]


# ---------------------------------------------------------------- the kit

def kit_summary(report: Path) -> dict:
    data = json.loads(report.read_text())
    cells = checks = 0
    dtypes, check_verdicts, failing = set(), Counter(), []
    for row in data.get("operators") or []:
        for cell in row.get("cells", []):
            if cell["dtype"] != "any":
                cells += 1
                dtypes.add(cell["dtype"])
            for check, verdict in cell.get("checks", {}).items():
                checks += 1
                check_verdicts[verdict] += 1
                if verdict in ("fail", "error", "crash", "hang"):
                    failing.append({"entry": row["name"], "dtype": cell["dtype"], "check": check,
                                    "verdict": verdict,
                                    "message": cell.get("messages", {}).get(check, "")[:MESSAGE_LIMIT]})
    summary = data.get("summary", {})
    return {"entries": (summary.get("operators") or {}).get("operators"),
            "entry_verdicts": (summary.get("operators") or {}).get("verdicts"),
            "dtype_cells": cells, "dtypes": sorted(dtypes), "checks": checks,
            "check_verdicts": dict(check_verdicts), "test_verdicts": summary.get("test_verdicts"),
            "failing_checks": failing}


def kit_command() -> str:
    beside = Path(sys.executable).with_name("privateuse1-conformance")
    found = str(beside) if beside.exists() else shutil.which("privateuse1-conformance")
    if not found:
        raise SystemExit("--kit: privateuse1-conformance is not installed beside this Python")
    return found


# ------------------------------------------------------------------- main

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pytorch-tests", type=Path, required=True,
                        help="folder with PyTorch's test_ops.py (test/ of a PyTorch source checkout "
                             "of the installed torch's version)")
    parser.add_argument("--operators", default="default",
                        help="the kit's --operators selection: default, all, or names/patterns a,b,c")
    parser.add_argument("--tests", default=",".join(DEFAULT_TESTS),
                        help=f"TestCommon tests to run (default: {','.join(DEFAULT_TESTS)})")
    parser.add_argument("--device", default="openreg", help="the backend's device type (default openreg)")
    parser.add_argument("--backend", default=None, help="the kit's --backend (default: --device)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds each run (PyTorch's, the kit's) may take before it is killed")
    parser.add_argument("--kit", action="store_true", help="also time the kit's run of the same entries")
    parser.add_argument("--output", type=Path, default=Path("bench_pytorch_opinfo.json"))
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="logs, JUnit XML, node ids, the kit's reports (default: OUTPUT's name + '.d')")
    args = parser.parse_args(argv)

    tests_dir = args.pytorch_tests.resolve()
    test_file = tests_dir / TEST_FILE
    if not test_file.is_file():
        parser.error(f"--pytorch-tests: no {TEST_FILE} in {tests_dir}")
    tests = tuple(t.strip() for t in args.tests.split(",") if t.strip())
    work = (args.work_dir or args.output.with_name(args.output.name + ".d")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    ini = work / "pytest.ini"
    ini.write_text("[pytest]\n")
    env = pytest_env(args.device)

    import torch

    result: dict = {
        "benchmark": "pytorch-opinfo-vs-kit",
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__, "torch_git": torch.version.git_version},
        "operators": args.operators, "device": args.device, "timeout_s": args.timeout,
    }

    # 1. The entries, as the kit selects them.
    start = time.perf_counter()
    entries = selected_entries(args.operators)
    by_formatted = {e["formatted_name"]: e["key"] for e in entries}
    result["entries"] = {"count": len(entries), "select_s": round(time.perf_counter() - start, 2)}

    # 2. PyTorch's node ids for those entries and tests.
    collect = run_bounded(pytest_command(tests_dir, ini, ["--collect-only", "-q", TEST_FILE]),
                          cwd=tests_dir, env=env, log=work / "collect.log",
                          timeout=min(args.timeout, COLLECT_LIMIT_S))
    nodeids, meta, per_entry = [], {}, Counter()
    collected = 0
    for line in (work / "collect.log").read_text(errors="replace").splitlines():
        m = NODE.match(line)
        if not m:
            continue
        collected += 1
        found = match_node(m.group(3), tests, by_formatted, args.device)
        if found:
            test, key, rest = found
            nodeids.append(m.group(1))
            meta[(m.group(2), m.group(3))] = {"test": test, "entry": key, "rest": rest}
            per_entry[key] += 1
    tests_found = Counter(info["test"] for info in meta.values())
    result["pytorch"] = {
        "test_file": str(test_file), "test_file_sha256": sha256(test_file),
        "tests": {t: {"kit_check": KIT_CHECK.get(t, ""), "instantiated": tests_found.get(t, 0),
                      "entries": len({i["entry"] for i in meta.values() if i["test"] == t}),
                      "dtypes": sorted({i["rest"] for i in meta.values() if i["test"] == t and i["rest"]})}
                  for t in tests},
        "collect": {**collect, "collected": collected},
        "selected_tests": len(nodeids),
        "entries_with_tests": len(per_entry),
        "entries_without_tests": [e["key"] for e in entries if e["key"] not in per_entry],
        "dtypes": sorted({info["rest"] for info in meta.values() if info["rest"]}),
    }
    missing = [t for t in tests if not tests_found.get(t)]
    if missing:
        result["pytorch"]["warning"] = (f"no instantiated test for {missing} on device "
                                        f"{args.device!r} among the selected entries")
    if collect["exit_code"] != 0 or not nodeids:
        result["pytorch"]["error"] = ("collection failed (see the log: a test_ops.py from another "
                                      "PyTorch version?)" if collect["exit_code"] != 0
                                      else "no test matches the selection")
        return finish(result, args.output)

    # 3. PyTorch's run.
    ids_file = work / "nodeids.txt"
    ids_file.write_text("\n".join(nodeids) + "\n")
    junit = work / "pytorch.junit.xml"
    junit.unlink(missing_ok=True)
    load_before = load()
    run = run_bounded(pytest_command(tests_dir, ini, ["-v", "--junitxml", str(junit), f"@{ids_file}"]),
                      cwd=tests_dir, env=env, log=work / "pytorch.log", timeout=args.timeout)
    run.update({"load_before": load_before, "load_after": load()})
    progress = progress_from_log(work / "pytorch.log")
    ended_early = run["timed_out"] or run["signal"] is not None or run["exit_code"] not in (0, 1) \
        or progress["finished"] < len(nodeids)
    run["ended_early"] = ended_early
    run["progress"] = progress
    if ended_early:
        run["ended_early_at"] = {"tests_finished": progress["finished"], "of": len(nodeids),
                                 "running": progress["running_at_end"]}
    if junit.exists() and not ended_early:
        run.update(outcomes_from_junit(junit, meta))
    else:
        run.update({"source": "log", "outcomes": progress["outcomes"]})
    if run.get("failures"):
        groups = Counter((f["test"], signature(f["message"])) for f in run["failures"])
        run["failure_signatures"] = [{"test": t, "signature": s, "count": n}
                                     for (t, s), n in groups.most_common()]
    result["pytorch"]["run"] = run

    # 4. The kit's run of the same entries.
    if args.kit:
        report_dir = work / "kit-report"
        shutil.rmtree(report_dir, ignore_errors=True)
        cmd = [kit_command(), "run", "--backend", args.backend or args.device,
               *[a for c in KIT_CONTRACTS for a in ("--contract", c)],
               "--operators", args.operators, "--report-dir", str(report_dir)]
        load_before = load()
        kit = run_bounded(cmd, cwd=work, env=dict(os.environ), log=work / "kit.log", timeout=args.timeout)
        kit.update({"load_before": load_before, "load_after": load()})
        report = report_dir / "report.json"
        if report.exists():
            kit.update(kit_summary(report))
        result["kit"] = kit
        if kit["wall_s"] and not kit["timed_out"] and not run["timed_out"]:
            result["ratio_pytorch_to_kit"] = round(run["wall_s"] / kit["wall_s"], 2)
    return finish(result, args.output)


def finish(result: dict, output: Path) -> int:
    output.write_text(json.dumps(result, indent=2) + "\n")
    pt = result.get("pytorch", {})
    run = pt.get("run", {})
    print(f"entries: {result['entries']['count']} selected, {pt.get('entries_with_tests', 0)} with "
          f"PyTorch tests; PyTorch tests selected: {pt.get('selected_tests', 0)}")
    if "error" in pt:
        print(f"PyTorch: {pt['error']}")
    if run:
        state = "TIMED OUT" if run["timed_out"] else ("ENDED EARLY" if run["ended_early"] else "complete")
        print(f"PyTorch's tests: {run['wall_s']:.1f} s, {state}, "
              + ", ".join(f"{n} {k}" for k, n in run["outcomes"].items() if n))
        if run["ended_early"]:
            print(f"  ended at {run['ended_early_at']}")
    kit = result.get("kit")
    if kit:
        state = "TIMED OUT" if kit["timed_out"] else f"exit {kit['exit_code']}"
        print(f"kit: {kit['wall_s']:.1f} s ({state}), {kit.get('entries')} entries, "
              f"{kit.get('dtype_cells')} dtype cells, {kit.get('checks')} checks")
    if "ratio_pytorch_to_kit" in result:
        print(f"PyTorch / kit: {result['ratio_pytorch_to_kit']}")
    print(f"written: {output}")
    return 1 if "error" in pt else 0  # (failing tests are a measurement, not an error)


if __name__ == "__main__":
    sys.exit(main())
