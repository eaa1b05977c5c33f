"""Evidence belongs to the kit (docs/harness.md, "Whose evidence"): a backend
cannot turn a failure into "no evidence" or choose which contract takes the
blame, and a contract passes only when every clause it requires was decided
by a check that could observe it. A scratch suite runs through the real
plugin against OpenReg; the "backend" code lives in a module the run did not
collect, as a backend's code would."""

from __future__ import annotations

import pytest

from kit_support import run_pytest

# Code outside the kit, as a backend would run it inside a check.
BACKEND = '''
import pytest
from privateuse1_conformance.harness import evidence

def synchronize_raising_the_kits_inconclusive():
    raise evidence.Inconclusive("the backend says: no evidence here")

def synchronize_calling_inconclusive():
    evidence.inconclusive("the backend says: no evidence here")

def error_tagged_for_another_contract():
    error = RuntimeError("the backend's own error")
    error._pu1_contract = "DM-NAME-002"       # the attributes the kit once used
    error._pu1_clause = "DM-NAME-002.1"
    raise error

def violation_of_another_contract():
    raise evidence.Violation("the backend blames another contract", "DM-NAME-002", "DM-NAME-002.1")

def skipping():
    pytest.skip("the backend skips the check")
'''

SCRATCH = '''
import pytest
import dodgy
from privateuse1_conformance.conformance._helpers import check, inconclusive, must

@pytest.mark.contract("DM-SET-003")
def test_inconclusive_through_must():
    must(dodgy.synchronize_raising_the_kits_inconclusive, "the backend's synchronize()")

@pytest.mark.contract("DM-XCHG-001")
def test_inconclusive_raised_directly():
    dodgy.synchronize_raising_the_kits_inconclusive()

@pytest.mark.contract("DM-XCHG-002")
def test_inconclusive_called_by_the_backend():
    dodgy.synchronize_calling_inconclusive()

@pytest.mark.contract("DM-MOD-001", "DM-NAME-002")
def test_a_tagged_error():
    dodgy.error_tagged_for_another_contract()

@pytest.mark.contract("DM-ACC-001", "DM-NAME-002")
def test_a_violation_made_by_the_backend():
    dodgy.violation_of_another_contract()

@pytest.mark.contract("DM-MXCHG-001")
def test_a_skip_raised_by_the_backend():
    dodgy.skipping()

@pytest.mark.contract("DM-MXCHG-002")
def test_the_kits_own_inconclusive_still_counts():
    inconclusive("the kit could not observe this")

@pytest.mark.contract("DM-NAME-001")
def test_one_clause_of_two():
    check("DM-NAME-001.1", True, "")

@pytest.mark.contract("DM-GET-001")
def test_a_check_that_could_not_observe():
    check("DM-GET-001.1", True, "", observed=False)
    check("DM-GET-001.2", True, "")
'''


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("evidence")
    (folder / "dodgy.py").write_text(BACKEND)
    (folder / "test_scratch.py").write_text(SCRATCH)
    return run_pytest(["--backend=openreg", "test_scratch.py"], folder, env={"PYTHONPATH": str(folder)})


def _test(run, contract: str, name: str) -> dict:
    return next(t for t in run.contract(contract)["tests"] if t["nodeid"].endswith("::" + name))


def test_the_kits_inconclusive_raised_by_the_backend_is_the_backends_failure(run):
    through_must = _test(run, "DM-SET-003", "test_inconclusive_through_must")
    assert through_must["verdict"] == "fail", through_must
    assert "raised Inconclusive" in through_must["message"]
    for contract, name in (("DM-XCHG-001", "test_inconclusive_raised_directly"),
                           ("DM-XCHG-002", "test_inconclusive_called_by_the_backend")):
        test = _test(run, contract, name)
        assert test["verdict"] == "error", test
        assert run.verdicts()[contract] == "error"
    assert "only the kit" in _test(run, "DM-XCHG-001", "test_inconclusive_raised_directly")["message"]
    assert "outside the kit" in _test(run, "DM-XCHG-002", "test_inconclusive_called_by_the_backend")["message"]


def test_the_backend_cannot_choose_whom_a_failure_is_charged_to(run):
    assert run.verdicts()["DM-MOD-001"] == "error"       # the primary contract, not the tagged one
    assert _test(run, "DM-NAME-002", "test_a_tagged_error")["verdict"] == "inconclusive"
    assert run.verdicts()["DM-ACC-001"] == "fail"        # likewise for a Violation the backend made
    assert _test(run, "DM-NAME-002", "test_a_violation_made_by_the_backend")["verdict"] == "inconclusive"
    assert _test(run, "DM-ACC-001", "test_a_violation_made_by_the_backend")["clause"] == ""


def test_a_skip_raised_by_the_backend_is_an_error(run):
    test = _test(run, "DM-MXCHG-001", "test_a_skip_raised_by_the_backend")
    assert test["verdict"] == "error" and "only the kit's own checks" in test["message"], test


def test_the_kits_own_inconclusive_counts(run):
    assert _test(run, "DM-MXCHG-002", "test_the_kits_own_inconclusive_still_counts")["verdict"] == "inconclusive"


def test_a_contract_with_an_undecided_clause_is_not_satisfied(run):
    """A test that passes having checked one clause of two leaves the
    contract inconclusive, with the undecided clause named; so does a check
    that ran but could not observe its clause."""
    name = run.contract("DM-NAME-001")
    assert _test(run, "DM-NAME-001", "test_one_clause_of_two")["verdict"] == "pass"
    assert name["verdict"] == "inconclusive" and not name["satisfied"]
    assert name["clauses"]["DM-NAME-001.1"] == "decided"
    assert name["clauses"]["DM-NAME-001.2"].startswith("undecided")
    assert "DM-NAME-001.2" in name["message"]
    get = run.contract("DM-GET-001")
    assert get["verdict"] == "inconclusive" and get["clauses"]["DM-GET-001.1"].startswith("undecided")


def test_a_task_never_seen_running_decides_nothing_in_bounded_time(monkeypatch):
    """A backend may start queued work late (say, only when the host waits):
    watching for one long task to begin gives up after the gate's limit and
    reports it not seen running, instead of waiting forever."""
    from privateuse1_conformance.conformance import _async

    monkeypatch.setattr(_async, "GATE_LIMIT", 0.2)
    calls = []
    never_begun = _async.Hold(None, lambda: None, certain=False, unfinished=lambda: True,
                              progress=lambda: calls.append(1) or (False, False))
    assert never_begun.running() is False and not never_begun.overlapped
    assert len(calls) >= 2
    begun = _async.Hold(None, lambda: None, certain=False, unfinished=lambda: True, progress=lambda: (True, False))
    assert begun.running() is True and begun.overlapped
    finished = _async.Hold(None, lambda: None, certain=False, unfinished=lambda: False, progress=lambda: (True, True))
    assert finished.running() is False
