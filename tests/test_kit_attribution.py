"""Where a verdict lands: a failure, crash or hang of a test that checks
several contracts is charged to the contract whose evidence it is (the
check's contract, the open scope, else the primary contract), inconclusive
tests count for nothing, failures sharing one underlying error show as one
root cause, and --test-id selects tests by their canonical ID. A scratch
suite runs through the real plugin against OpenReg."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit_support import DECIDE_ALL, run_pytest

SCRATCH = '''
import ctypes, os, signal, threading, time
import pytest
from privateuse1_conformance.conformance._helpers import check, inconclusive, must, scope

@pytest.mark.contract("DM-NAME-001", "DM-NAME-002")
def test_check_names_its_contract():
    check("DM-NAME-002.1", False, "the second contract is broken")

@pytest.mark.contract("DM-MOD-001", "DM-ACC-001")
def test_untagged_failure_goes_to_the_primary_contract():
    raise KeyError("boom")

@pytest.mark.contract("DM-COUNT-001", "DM-COUNT-002")
def test_crash_inside_a_scope():
    with scope("DM-COUNT-002", "the crashing step"):
        os.kill(os.getpid(), signal.SIGSEGV)

@pytest.mark.contract("DM-COUNT-003", "DM-GET-001")
def test_crash_in_another_threads_scope():
    def worker():
        with scope("DM-GET-001", "worker"):
            ctypes.string_at(0)  # a real SIGSEGV, raised in this thread
    with scope("DM-COUNT-003", "main thread waiting"):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()

@pytest.mark.contract("HK-DEV-001", "GD-DEV-001")
def test_crash_in_work_handed_to_a_new_thread():
    from privateuse1_conformance.conformance._helpers import in_thread
    with scope("GD-DEV-001", "handed to a new thread"):
        in_thread(lambda: ctypes.string_at(0))  # the scope opened here follows the call

@pytest.mark.contract("ST-NEW-001", "ST-CUR-001")
def test_crash_in_work_handed_to_a_waiting_worker():
    import queue
    from privateuse1_conformance.harness.evidence import carry
    calls = queue.Queue()
    worker = threading.Thread(target=lambda: calls.get()())  # started outside any scope
    worker.start()
    with scope("ST-CUR-001", "handed to a worker"):
        calls.put(carry(lambda: ctypes.string_at(0)))
        worker.join()

@pytest.mark.contract("DM-SET-001", "DM-SET-002")
def test_hang_inside_a_scope():
    with scope("DM-SET-002", "waiting forever"):
        time.sleep(600)

@pytest.mark.contract("DM-SET-003")
def test_only_inconclusive():
    inconclusive("needs something this backend does not have")

@pytest.mark.contract("DM-XCHG-001")
def test_passes():
    decide_all("DM-XCHG-001")

@pytest.mark.contract("DM-XCHG-001")
def test_inconclusive_beside_a_pass():
    inconclusive("no evidence here")

def _missing_kernel(address):
    raise NotImplementedError(f"no kernel for aten::foo (object at {address})")

@pytest.mark.contract("DM-XCHG-002")
def test_cause_one():
    must(lambda: _missing_kernel("0x7f0012345678"), "the first call")

@pytest.mark.contract("DM-MXCHG-001")
def test_cause_two():
    must(lambda: _missing_kernel("0x7f00abcdef00"), "another call")

@pytest.mark.contract("DM-MXCHG-002")
def test_check_of_an_undeclared_contract():
    check("EV-REC-001.1", False, "not this test's contract")

@pytest.mark.contract("TP-NEGCONJ-001")
def test_known_symptom():
    with scope("TP-NEGCONJ-001", "materializing a conjugate view with .cpu()"):
        os.kill(os.getpid(), signal.SIGSEGV)

@pytest.mark.contract("OP-SDPA-002")
def test_known_clause():
    check("OP-SDPA-002.1", False, "the device's choice is not OVERRIDEABLE")

@pytest.mark.contract("TP-SHALLOW-001")
def test_unknown_symptom():
    check("TP-SHALLOW-001.2", False, "the storage is not shared")
'''


@pytest.fixture(scope="module")
def attribution_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("attribution")
    (folder / "test_scratch.py").write_text(SCRATCH + DECIDE_ALL)
    return run_pytest(["--backend=openreg", "--contract-timeout=2", "test_scratch.py"], folder)


def _test(run, contract: str, name: str) -> dict:
    return next(t for t in run.contract(contract)["tests"] if t["nodeid"].endswith("::" + name))


def test_a_check_is_charged_to_its_own_contract(attribution_run):
    run = attribution_run
    broken = _test(run, "DM-NAME-002", "test_check_names_its_contract")
    assert broken["verdict"] == "fail" and broken["clause"] == "DM-NAME-002.1"
    assert "the second contract is broken" in broken["message"]
    # The other contract learnt nothing: the test stopped before its checks.
    assert _test(run, "DM-NAME-001", "test_check_names_its_contract")["verdict"] == "inconclusive"
    assert run.verdicts()["DM-NAME-002"] == "fail"
    assert run.verdicts()["DM-NAME-001"] == "inconclusive"


def test_an_untagged_failure_is_charged_to_the_primary_contract(attribution_run):
    assert attribution_run.verdicts()["DM-MOD-001"] == "error"
    assert attribution_run.verdicts()["DM-ACC-001"] == "inconclusive"


def test_a_crash_is_charged_to_the_scope_that_was_open(attribution_run):
    run = attribution_run
    crashed = _test(run, "DM-COUNT-002", "test_crash_inside_a_scope")
    assert crashed["verdict"] == "crash" and crashed["step"] == "the crashing step"
    assert run.verdicts()["DM-COUNT-001"] == "inconclusive"


def test_a_crash_is_charged_to_the_crashing_threads_scope(attribution_run):
    run = attribution_run
    assert run.verdicts()["DM-GET-001"] == "crash", run.contract("DM-GET-001")
    assert _test(run, "DM-GET-001", "test_crash_in_another_threads_scope")["step"] == "worker"
    assert run.verdicts()["DM-COUNT-003"] == "inconclusive"


@pytest.mark.parametrize("contract,primary,test,step", [
    ("GD-DEV-001", "HK-DEV-001", "test_crash_in_work_handed_to_a_new_thread", "handed to a new thread"),
    ("ST-CUR-001", "ST-NEW-001", "test_crash_in_work_handed_to_a_waiting_worker", "handed to a worker"),
])
def test_a_crash_in_work_handed_to_another_thread_is_charged_to_the_scope_that_handed_it(
        attribution_run, contract, primary, test, step):
    """The kit's own thread helpers carry the open scope with the work: the
    crashing thread is the worker, the scope the test's."""
    run = attribution_run
    crashed = _test(run, contract, test)
    assert crashed["verdict"] == "crash" and crashed["step"] == step, crashed
    assert run.verdicts()[primary] == "inconclusive"


def test_crashes_by_one_signal_in_different_places_are_different_causes(attribution_run):
    """Root causes group crashes by where they happened (the open scope's
    contract, the innermost frame, an abort's message), not by signal alone."""
    causes = {t["nodeid"].split("::")[1]: t["cause"] for c in attribution_run.report["contracts"]
              for t in c["tests"] if t["verdict"] == "crash"}
    assert causes["test_crash_inside_a_scope"].startswith("crash: the test process was killed by SIGSEGV in "
                                                          "DM-COUNT-002, at test_crash_inside_a_scope"), causes
    assert causes["test_crash_in_work_handed_to_a_new_thread"] != causes[
        "test_crash_in_work_handed_to_a_waiting_worker"], causes
    assert len(set(causes.values())) == len(causes), causes


def test_a_hang_is_charged_to_the_scope_the_test_is_stuck_in(attribution_run):
    run = attribution_run
    hung = _test(run, "DM-SET-002", "test_hang_inside_a_scope")
    assert hung["verdict"] == "hang" and "blocked" in hung["message"], hung["message"]
    assert run.verdicts()["DM-SET-001"] == "inconclusive"


def test_inconclusive_tests_count_for_nothing(attribution_run):
    verdicts = attribution_run.verdicts()
    assert verdicts["DM-SET-003"] == "inconclusive"     # all its tests: not satisfied
    assert verdicts["DM-XCHG-001"] == "pass"            # beside a pass: ignored
    assert not attribution_run.contract("DM-SET-003")["satisfied"]


def test_failures_sharing_one_error_are_one_root_cause(attribution_run):
    causes = attribution_run.report["summary"]["root_causes"]
    shared = [c for c in causes if "no kernel for aten::foo" in c["cause"]]
    assert len(shared) == 1, causes
    assert shared[0]["cause"] == "NotImplementedError: no kernel for aten::foo (object at 0x…)"
    assert sorted(shared[0]["contracts"]) == ["DM-MXCHG-001", "DM-XCHG-002"]
    assert len(shared[0]["tests"]) == 2
    assert "shared root causes" in attribution_run.stdout


def test_a_check_of_an_undeclared_contract_is_a_kit_bug(attribution_run):
    test = _test(attribution_run, "DM-MXCHG-002", "test_check_of_an_undeclared_contract")
    assert test["verdict"] == "error" and "[kit bug]" in test["message"] + test["details"], test
    assert attribution_run.verdicts().get("EV-REC-001", "no-test") == "no-test"


def test_test_id_selects_suite_tests_by_canonical_id(tmp_path):
    """A suite test's ID is its file relative to the suite folder, wherever
    the suite is installed and whatever the working directory; --test-id
    selects by it, and the rerun command uses it (no absolute paths)."""
    wanted = ["test_device_management.py::test_maybe_exchange_minus_one_is_a_no_op",
              "test_device_management.py::test_device_counts_agree"]
    run = run_pytest(["--backend=openreg", "--pyargs", "privateuse1_conformance.conformance",
                      *(f"--test-id={t}" for t in wanted)], tmp_path)
    ran = sorted({t["nodeid"] for c in run.report["contracts"] for t in c["tests"]})
    assert ran == sorted(wanted), ran
    for contract in run.report["contracts"]:
        for test in contract["tests"]:
            assert f"--test={test['nodeid']}" in test["rerun"] and "/" not in test["rerun"].split("--test=")[1], test


def test_a_known_symptom_links_its_fix_in_every_report(attribution_run):
    """A failure whose symptom the registry knows carries the fix and the
    vendor guide's section, in report.json, report.md, report.html and JUnit;
    a failure of the same area whose symptom is unknown carries none."""
    run = attribution_run
    crash = _test(run, "TP-NEGCONJ-001", "test_known_symptom")
    assert crash["verdict"] == "crash" and "materializing a conjugate view" in crash["step"]
    assert "_copy_from" in crash["fix"] and "vendor-guide.md#registrations-" in crash["fix"], crash
    clause = _test(run, "OP-SDPA-002", "test_known_clause")
    assert "_fused_sdp_choice_stub" in clause["fix"], clause
    assert "fix" not in _test(run, "TP-SHALLOW-001", "test_unknown_symptom")
    folder = Path(run.report_dir)
    for name in ("report.md", "report.html", "report.junit.xml"):
        text = (folder / name).read_text().replace("\\_", "_")  # (Markdown escapes underscores)
        assert "Known fix: register _copy_from" in text, name
        assert text.count("Known fix:") == 2 if name != "report.html" else text.count("Known fix:") >= 2, name
