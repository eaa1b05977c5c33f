"""The harness on its own: verdicts (including crash and hang), expectations,
manifests, the registry loader and the level computation. Scratch suites
are run in subprocesses against OpenReg so that the real plugin is used."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kit_support import DECIDE_ALL, run_pytest
from privateuse1_conformance.harness import backend as backend_mod
from privateuse1_conformance.harness import expectations as expectations_mod
from privateuse1_conformance.harness import registry as registry_mod
from privateuse1_conformance.reports import model
from privateuse1_conformance.reports.model import Verdict

SCRATCH = '''
import os, signal, time
import pytest

@pytest.mark.contract("DM-NAME-001")
def test_crash():
    print("last words before the crash", flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)

@pytest.mark.contract("DM-NAME-002")
def test_hang():
    time.sleep(60)

@pytest.mark.contract("DM-MOD-001")
def test_fail():
    assert 1 == 2, "one is not two"

@pytest.mark.contract("DM-ACC-001")
def test_error():
    raise KeyError("boom")

@pytest.mark.contract("DM-COUNT-001")
def test_pass():
    decide_all("DM-COUNT-001")

@pytest.mark.contract("DM-COUNT-002")
def test_abort():
    os.abort()

@pytest.mark.contract("DM-COUNT-003")
def test_exit():
    os._exit(3)

@pytest.mark.contract("DM-GET-001")
def test_skip():
    pytest.skip("not here")

@pytest.mark.contract("DM-SET-001")
def test_expected_failure():
    assert False, "known"

@pytest.mark.contract("DM-SET-002")
def test_stale_expectation():
    decide_all("DM-SET-002")

@pytest.mark.contract("EV-REC-001")
def test_feature_not_claimed():
    raise AssertionError("must not run: the manifest says events are absent")

@pytest.mark.contract("DM-SET-003")
def test_expectation_never_hides_a_crash():
    os.kill(os.getpid(), signal.SIGSEGV)
'''

EXPECTATIONS = '''
[[expect]]
contract = "DM-SET-001"
reason = "known failure"

[[expect]]
contract = "DM-SET-002"
reason = "believed broken"

[[expect]]
contract = "DM-SET-003"
reason = "crashes are never excused"
'''


@pytest.fixture(scope="module")
def scratch_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scratch")
    (folder / "test_scratch.py").write_text(SCRATCH + DECIDE_ALL)
    (folder / "expect.toml").write_text(EXPECTATIONS)
    (folder / "manifest.toml").write_text('[backend]\nunclaimed = ["events"]\n')
    return run_pytest(["--backend=openreg", "--contract-timeout=3", "--expectations=expect.toml",
                       "--manifest=manifest.toml", "test_scratch.py"], folder)


def test_every_verdict_is_assigned(scratch_run):
    verdicts = scratch_run.verdicts()
    expected = {
        "DM-NAME-001": "crash", "DM-NAME-002": "hang", "DM-MOD-001": "fail", "DM-ACC-001": "error",
        "DM-COUNT-001": "pass", "DM-COUNT-002": "crash", "DM-COUNT-003": "crash", "DM-GET-001": "skip",
        "DM-SET-001": "xfail", "DM-SET-002": "xpass", "EV-REC-001": "not-claimed",
        "DM-SET-003": "crash",
    }
    assert {k: verdicts[k] for k in expected} == expected
    assert scratch_run.returncode == 1, scratch_run.stdout[-2000:]
    assert scratch_run.report["complete"] is True


def test_crash_and_hang_messages_carry_diagnostics(scratch_run):
    crash = scratch_run.contract("DM-NAME-001")["tests"][0]
    assert "SIGSEGV" in crash["message"]
    assert "last words before the crash" in crash["details"]
    assert "test_crash" in crash["details"], "the crash report should include the Python traceback"
    hang = scratch_run.contract("DM-NAME-002")["tests"][0]
    assert "did not finish within 3 s" in hang["message"]
    assert "test_hang" in hang["details"], "the hang report should say where the test was stuck"
    assert "SIGABRT" in scratch_run.contract("DM-COUNT-002")["tests"][0]["message"]
    assert "status 3" in scratch_run.contract("DM-COUNT-003")["tests"][0]["message"]


def test_results_after_a_crash_are_kept(scratch_run):
    # test_crash runs first; everything after it still has its own verdict.
    verdicts = scratch_run.verdicts()
    assert verdicts["DM-COUNT-001"] == "pass" and verdicts["DM-MOD-001"] == "fail"


def test_stale_expectations_are_reported(scratch_run):
    assert scratch_run.report["summary"]["stale_expectations"] == ["DM-SET-002"]
    assert "Stale expectations" in scratch_run.stdout


def test_rerun_command_reruns_one_test(scratch_run, tmp_path):
    rerun = scratch_run.contract("DM-MOD-001")["tests"][0]["rerun"]
    assert "--backend=openreg" in rerun and rerun.endswith("test_scratch.py::test_fail")
    # A test outside the suite is named relative to the run's working
    # directory (a published report carries no path of the machine).
    assert rerun.split()[-1] == "./test_scratch.py::test_fail", rerun
    assert "--manifest=./manifest.toml" in rerun and "--expectations=./expect.toml" in rerun, rerun


def test_unknown_contract_id_fails_collection(tmp_path):
    (tmp_path / "test_bad.py").write_text(textwrap.dedent('''
        import pytest
        @pytest.mark.contract("DM-NOPE-999")
        def test_x():
            pass
        def test_without_contract():
            pass
    '''))
    run = run_pytest(["--backend=openreg", "test_bad.py"], tmp_path)
    assert run.returncode == 4, run.stdout + run.stderr
    assert "unknown contract ID 'DM-NOPE-999'" in run.stderr
    assert "test_without_contract: declares no contract" in run.stderr


def test_backend_that_does_not_exist_is_a_clear_usage_error(tmp_path):
    run = run_pytest(["--backend=no_such_backend_module", "--pyargs", "privateuse1_conformance.conformance"],
                     tmp_path)
    assert run.returncode == 4
    assert "no_such_backend_module" in run.stderr and "ModuleNotFoundError" in run.stderr


def test_backend_that_crashes_on_import_is_reported(tmp_path):
    (tmp_path / "crash_on_import.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    run = run_pytest(["--backend=crash_on_import", "--pyargs", "privateuse1_conformance.conformance"],
                     tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert run.returncode == 4
    assert "crash_on_import" in run.stderr and "killed by signal 11" in run.stderr


def test_backend_whose_device_count_hangs_is_reported_not_waited_on(tmp_path):
    """The kit asks the backend for its device count before any test, in a
    probe process with a time limit: a backend that never answers ends the
    run with one clear cause and a report, not a hung kit."""
    (tmp_path / "hanging_count.py").write_text(
        "import threading\nimport openreg\n"
        "openreg.device_count = lambda: threading.Event().wait()  # never answers\n")
    run = run_pytest(["--backend=hanging_count", "--contract-timeout=2", "--pyargs",
                      "privateuse1_conformance.conformance", "--contract=DM-COUNT-001,DM-GET-001"],
                     tmp_path, env={"PYTHONPATH": str(tmp_path)}, timeout=600)
    assert run.report is not None, run.stdout[-3000:] + run.stderr[-3000:]
    # Each test is an error on its primary contract (the first it declares).
    tests = [t for c in run.report["contracts"] for t in c["tests"] if t["contracts"][0] == c["id"]]
    assert tests and {t["verdict"] for t in tests} == {"error"}, {t["nodeid"]: t["verdict"] for t in tests}
    assert all("device_count()" in t["message"] and "no test was run" in t["message"] for t in tests)
    causes = run.report["summary"]["root_causes"]
    assert len(causes) == 1 and len(causes[0]["tests"]) == len({t["nodeid"] for t in tests}), causes
    assert run.returncode == 1


# ----------------------------------------------------------- pure units

def test_registry_rejects_malformed_entries(tmp_path):
    good = registry_mod.load(registry_mod.default_path())
    base = registry_mod.default_path().read_text()
    cases = {
        "duplicate": base + '\n[[contract]]\nid = "DM-SET-001"\narea = "device-management"\nlevel = "core"\nstatement = "x"\nsource = "y"\n',
        "bad level": base + '\n[[contract]]\nid = "DM-NEW-001"\narea = "device-management"\nlevel = "expert"\nstatement = "x"\nsource = "y"\n',
        "bad area": base + '\n[[contract]]\nid = "DM-NEW-001"\narea = "nowhere"\nlevel = "core"\nstatement = "x"\nsource = "y"\n',
        "bad id": base + '\n[[contract]]\nid = "dm-new-1"\narea = "device-management"\nlevel = "core"\nstatement = "x"\nsource = "y"\n',
        "bad feature": base + '\n[[contract]]\nid = "DM-NEW-001"\narea = "device-management"\nlevel = "core"\nstatement = "x"\nsource = "y"\nfeatures = ["teleport"]\n',
    }
    assert len(good.active()) > 70
    for name, text in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.toml"
        path.write_text(text)
        with pytest.raises(registry_mod.RegistryError):
            registry_mod.load(path)


def test_expectations_and_manifest_validation(tmp_path):
    registry = registry_mod.load(registry_mod.default_path())
    bad = tmp_path / "bad.toml"
    for text in ('[[expect]]\ncontract = "XX-NOPE-001"\nreason = "r"\n',
                 '[[expect]]\ncontract = "DM-SET-001"\n',
                 '[[expect]]\ncontract = "DM-SET-001"\nreason = "a"\n[[expect]]\ncontract = "DM-SET-001"\nreason = "b"\n'):
        bad.write_text(text)
        with pytest.raises(expectations_mod.ExpectationsError):
            expectations_mod.load(bad, registry)
    for text in ('[backend]\nclaims = "expert"\n', '[backend]\nunclaimed = ["teleport"]\n',
                 '[backend]\nunknown_key = 1\n', '[backend]\nbackend_metadata = ["a"]\n',
                 '[backend]\nbackend_metadata = { a = 1 }\n', '[backend]\nbackend_metadata = { conj = true }\n'):
        bad.write_text(text)
        with pytest.raises(backend_mod.BackendError):
            backend_mod.Manifest.load(bad, registry)
    good = tmp_path / "good.toml"
    good.write_text('[backend]\nbackend_metadata = { "xyz.format" = true, other = false }\n')
    assert backend_mod.Manifest.load(good, registry).backend_metadata == {"xyz.format": True, "other": False}


def _result(contract_id: str, level: str, verdicts: list[Verdict], unclaimed=()) -> model.ContractResult:
    info = model.ContractInfo(contract_id, "a", level, "s", "src", list(unclaimed))
    tests = [model.TestResult(f"t{i}", [contract_id], v) for i, v in enumerate(verdicts)]
    return model.ContractResult(info, tests, list(unclaimed))


def test_contract_verdict_is_its_worst_test():
    assert _result("A", "core", [Verdict.PASS, Verdict.SKIP]).verdict is Verdict.SKIP
    assert _result("A", "core", [Verdict.XFAIL, Verdict.CRASH, Verdict.FAIL]).verdict is Verdict.CRASH
    assert _result("A", "core", [Verdict.PASS, Verdict.XPASS]).verdict is Verdict.XPASS
    assert _result("A", "core", []).verdict is None


def test_level_reached():
    optional = {"amp"}
    core_ok = _result("C", "core", [Verdict.PASS])
    std_ok = _result("S", "standard", [Verdict.PASS])
    full_optional_absent = _result("F", "full", [Verdict.NOT_CLAIMED], unclaimed=["amp"])
    assert model.level_reached([core_ok, std_ok, full_optional_absent], optional) == "full"
    full_mandatory_absent = _result("F", "full", [Verdict.NOT_CLAIMED], unclaimed=["fork"])
    assert model.level_reached([core_ok, std_ok, full_mandatory_absent], optional) == "standard"
    std_xfail = _result("S", "standard", [Verdict.XFAIL])
    assert model.level_reached([core_ok, std_xfail], optional) == "core"
    untested = _result("C2", "core", [])
    assert model.level_reached([core_ok, untested, std_ok], optional) is None
    assert [r.contract.id for r in model.blocking_contracts([core_ok, untested], optional, "core")] == ["C2"]


def test_crash_output_tail_keeps_the_traceback_not_the_extension_list(tmp_path):
    """faulthandler ends its dump with every loaded extension module; in a
    rich environment that line alone can fill the kept tail."""
    from privateuse1_conformance.harness import isolation

    modules = ", ".join(f"package{i}._speedups" for i in range(2000))
    output = tmp_path / "child.out"
    output.write_text("Fatal Python error: Segmentation fault\n\nCurrent thread:\n"
                      '  File "conformance/test_hooks.py", line 12 in test_crash\n\n'
                      f"Extension modules: {modules} (total: 2000)\n")
    tail = isolation._tail(str(output))
    assert tail.startswith("Fatal Python error") and "test_crash" in tail
    assert "Extension modules: [list omitted] (total: 2000)" in tail


def test_crash_output_tail_keeps_the_fatal_error_line_of_a_long_dump(tmp_path):
    """With many threads the dump is longer than the kept tail; its first line
    (which signal) stays, with a note of what was left out."""
    from privateuse1_conformance.harness import isolation

    threads = "".join(f"Thread 0x{i:012x} (most recent call first):\n"
                      + "".join(f'  File "worker.py", line {k} in step\n' for k in range(40)) + "\n"
                      for i in range(30))
    output = tmp_path / "child.out"
    output.write_text("Fatal Python error: Segmentation fault\n\n" + threads +
                      'Current thread 0x00007f0000000001 (most recent call first):\n'
                      '  File "conformance/test_hooks.py", line 12 in test_crash\n')
    tail = isolation._tail(str(output))
    assert tail.startswith("Fatal Python error: Segmentation fault\n[... ")
    assert "characters of the crash dump omitted ...]" in tail and tail.rstrip().endswith("in test_crash")
    assert len(tail) < isolation.OUTPUT_TAIL + 200


def test_crash_dump_folds_the_machinery_frames():
    """A crash dump keeps the test's and the backend's frames; the runs of
    pytest's, pluggy's and the kit harness's frames become one line each."""
    import _pytest
    import pluggy

    from privateuse1_conformance.harness import isolation

    pytest_dir, pluggy_dir = os.path.dirname(_pytest.__file__), os.path.dirname(pluggy.__file__)
    harness_dir = os.path.dirname(isolation.__file__)
    dump = ("Current thread 0x00007f0000000001 (most recent call first):\n"
            '  File "/opt/backend/xpu/__init__.py", line 7 in set_device\n'
            '  File "/kit/conformance/test_device_management.py", line 12 in test_set\n'
            f'  File "{pytest_dir}/python.py", line 187 in pytest_pyfunc_call\n'
            f'  File "{pluggy_dir}/_callers.py", line 103 in _multicall\n'
            f'  File "{harness_dir}/isolation.py", line 65 in _run_child\n'
            '  File "<frozen runpy>", line 88 in _run_code\n\n'
            "Extension modules: [list omitted]\n")
    quiet = isolation.quiet_frames(dump)
    assert "set_device" in quiet and "test_set" in quiet
    assert "pytest_pyfunc_call" not in quiet and "_run_child" not in quiet and "_run_code" not in quiet
    assert quiet.count("[4 frames of pytest and the kit's harness]") == 1
    assert quiet.endswith("Extension modules: [list omitted]\n")


def test_a_long_report_cut_to_fit_keeps_the_backends_frames_and_errors():
    """Details over the limit keep their first lines, the backend's frames
    (with their source lines), the error lines and the end, and say what was cut."""
    from privateuse1_conformance.harness import results

    lines = ["first line: what failed"] + [f'  File "<site-packages>/torch/x.py", line {i} in f' for i in range(600)]
    lines[300] = "<xpu>/xpu/__init__.py:55: in set_device"
    lines[301] = "    _C._set_device(index)"
    lines[400] = "E   RuntimeError: invalid device ordinal"
    cut = results._trim("\n".join(lines))
    assert len(cut) <= results.MESSAGE_LIMIT
    assert cut.startswith("first line: what failed\n")
    kept = cut.splitlines()
    for line in (lines[300], lines[301], lines[400], lines[-1]):
        assert line in kept
    assert any(line.startswith("[... ") and line.endswith(" lines cut ...]") for line in kept)


def test_guard_contracts_with_more_devices_than_the_cases_loop_over(tmp_path):
    """The C++ guard cases loop over at most 4 devices but single the last
    one out: with 6 devices they must still track it (a suite bug once
    indexed past the streams it had recorded)."""
    from kit_support import run_suite

    registry = registry_mod.load(registry_mod.default_path())
    guard = sorted(c.id for c in registry.active() if c.area == "guard")
    run = run_suite("openreg", tmp_path, f"--contract={','.join(guard)}", env={"OPENREG_DEVICE_COUNT": "6"})
    verdicts = {c: v for c, v in run.verdicts().items() if c in guard}
    assert set(verdicts.values()) == {"pass"}, {c: v for c, v in verdicts.items() if v != "pass"}


def test_a_skip_that_is_not_an_allowed_environment_limit_fails_the_project_tests(tmp_path):
    """make test must not pass while a proof skipped (a missing fixture build,
    say): tests/skip_gate.py turns such a skip into a failed run."""
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n"
        "def test_proof():\n    pytest.skip('fixture backends are not built (make build)')\n"
        "def test_environment():\n    pytest.skip('actionlint is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "skip_gate", "-p", "no:cacheprovider", "-rs",
                           "test_skips.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "skips that prove nothing" in proc.stdout
    assert "test_proof: fixture backends are not built" in proc.stdout
    assert "test_environment" not in proc.stdout.split("skips that prove nothing")[1]
