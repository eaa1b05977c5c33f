"""The whole suite against backends other than OpenReg: the deliberately
minimal fixture backend and the faulty one (segfault in getDeviceFromPtr,
hang in isPinnedPtr). Each must get a complete run and a complete report."""

from __future__ import annotations

import pytest

from kit_support import FEW_OPERATORS, FIXTURE_DIR, PU1_SYNC_MANIFEST, pu1_minimal_run, run_suite
from privateuse1_conformance.harness import registry as registry_mod

FAILURE_VERDICTS = {"fail", "error"}
OPERATORS = FEW_OPERATORS

pytestmark = pytest.mark.skipif(
    not any(FIXTURE_DIR.glob("pu1_minimal*.so")), reason="fixture backends are not built (make build)")


@pytest.fixture(scope="module")
def registry():
    """The registry as this torch's runs see it (contracts of newer releases retired)."""
    import torch

    contracts = registry_mod.load(registry_mod.default_path())
    contracts.leave_out_for_torch(torch.__version__)
    return contracts


@pytest.fixture(scope="module")
def minimal_run(tmp_path_factory):
    return pu1_minimal_run(tmp_path_factory)[1]  # (shared with test_reports_run.py)


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    return run_suite("pu1_faulty", tmp_path_factory.mktemp("faulty"), "--contract-timeout=5", OPERATORS)


def test_minimal_backend_gets_a_complete_run(minimal_run, registry):
    assert minimal_run.returncode == 1, minimal_run.stdout[-3000:] + minimal_run.stderr[-3000:]
    report = minimal_run.report
    assert report["complete"] is True
    assert report["provenance"]["device_type"] == "minimal"
    verdicts = minimal_run.verdicts()
    assert set(verdicts) == {c.id for c in registry.active()}, "every contract must appear in the report"
    assert "no-test" not in verdicts.values(), "every contract must have been checked"
    assert report["summary"]["level_reached"] is None


def test_minimal_backend_failures_say_what_to_implement(minimal_run):
    verdicts = minimal_run.verdicts()
    assert not {c for c, v in verdicts.items() if v in ("crash", "hang")}, \
        "a merely incomplete backend must not produce crash or hang verdicts"
    # No hooks registered: the hooks contracts fail and name what to register.
    for contract_id in ("HK-CTX-001", "HK-GEN-001", "HK-AVAIL-001"):
        assert verdicts[contract_id] == "fail", (contract_id, verdicts[contract_id])
        messages = " ".join(t["message"] for t in minimal_run.contract(contract_id)["tests"])
        assert "RegisterPrivateUse1HooksInterface" in messages, (contract_id, messages[:500])
    # No allocator registered: a failure that says so, not a crash in PyTorch.
    resize = minimal_run.contract("HK-RESIZE-001")
    assert resize["verdict"] == "fail"
    assert any("no allocator is registered" in t["message"] for t in resize["tests"]), resize["tests"]
    # No streams: the guard's default says so.
    streams = " ".join(t["message"] for t in minimal_run.contract("ST-NEW-001")["tests"])
    assert verdicts["ST-NEW-001"] == "fail" and "doesn't support create a new Stream" in streams
    # No kernel for an operator: the error names the operator and the backend.
    ptr = " ".join(t["message"] for t in minimal_run.contract("HK-PTR-001")["tests"])
    assert "Could not run 'aten::" in ptr and "'minimal' backend" in ptr
    for result in minimal_run.report["contracts"]:
        for test in result["tests"]:
            if test["verdict"] in FAILURE_VERDICTS:
                assert test["message"].strip(), f"{test['nodeid']} failed without a message"
    # What the minimal backend does implement passes.
    for contract_id in ("DM-NAME-001", "DM-MOD-001", "DM-PARSE-001", "GD-DEV-001", "GD-CNT-001"):
        assert verdicts[contract_id] == "pass", (contract_id, verdicts[contract_id])


# The contracts whose checks call the faulty hooks: getDeviceFromPtr (crash)
# only in HK-PTR-001; isPinnedPtr (hang) in the pinned-memory contracts.
CALLS_GET_DEVICE_FROM_PTR = {"HK-PTR-001"}
CALLS_IS_PINNED_PTR = {"HK-PIN-001", "HK-PIN-002", "MM-PIN-001", "MM-COPY-001"}


def test_faulty_backend_crash_and_hang_cost_only_their_contracts(faulty_run, registry):
    assert faulty_run.returncode == 1, faulty_run.stdout[-3000:] + faulty_run.stderr[-3000:]
    assert faulty_run.report["complete"] is True
    verdicts = faulty_run.verdicts()
    assert set(verdicts) == {c.id for c in registry.active()}
    crashed = {c for c, v in verdicts.items() if v == "crash"}
    hung = {c for c, v in verdicts.items() if v == "hang"}
    assert crashed == CALLS_GET_DEVICE_FROM_PTR, {
        c["id"]: c["message"][:2000] for c in faulty_run.report["contracts"] if c["id"] in crashed}
    assert {"HK-PIN-001", "HK-PIN-002"} <= hung <= CALLS_IS_PINNED_PTR, hung
    for test in faulty_run.contract("HK-PTR-001")["tests"]:
        if test["verdict"] == "crash":  # (HK-INIT-001's test reaches getDeviceFromPtr too: charged here)
            assert "SIGSEGV" in test["message"]
            assert "Fatal Python error" in test["details"] or "the thread that crashed" in test["details"]
    for test in faulty_run.contract("HK-PIN-002")["tests"]:
        if test["verdict"] == "hang":
            assert "did not finish within 5 s" in test["message"]
            assert "isPinnedPtr" in test["details"] or "is_pinned" in test["details"], \
                "the hang report should show where the test was stuck"
    # A hasPrimaryContext that answers True always: HK-CTX-001 fails; the new
    # interpreter's check of DM-COUNT-003 cannot tell it from an import that
    # created contexts, and says so instead of accusing the import.
    assert verdicts["HK-CTX-001"] == "fail", faulty_run.contract("HK-CTX-001")
    [fresh] = [t for t in faulty_run.contract("DM-COUNT-003")["tests"]
               if t["nodeid"].endswith("test_import_and_queries_create_no_context_in_a_new_interpreter")]
    assert fresh["verdict"] == "inconclusive" and "HK-CTX-001" in fresh["message"], fresh
    # ER-MSG-001 judges how a rejection is worded, not whether a function
    # exists: an entry that fails alike for device 0 (no statistics in the
    # allocator, no device synchronization) is n/a there; one that rejects the
    # bad index with its own error (torch.Stream: no streams for device 0, "out
    # of range" for 102) is judged, and its message lacks the range.
    bad_input = {t["nodeid"].split("[", 1)[1].rstrip("]"): t for t in faulty_run.contract("ER-MSG-001")["tests"]}
    for entry in ("torch.accelerator.get_memory_info", "torch.accelerator.synchronize"):
        assert bad_input[entry]["verdict"] == "inconclusive", bad_input[entry]
        assert bad_input[entry]["message"].startswith(f"{entry} raises for device 0 as it does for 2"), bad_input[entry]
    assert bad_input["torch.Stream(device=...)"]["verdict"] == "fail", bad_input["torch.Stream(device=...)"]
    # Every other contract still got a real verdict, and some pass.
    assert "no-test" not in verdicts.values()
    for contract_id in ("DM-NAME-001", "DM-COUNT-001", "HK-REG-001", "GD-DEV-001"):
        assert verdicts[contract_id] == "pass", (contract_id, verdicts[contract_id])


def test_a_missing_device_context_under_an_expectation_costs_no_other_contract(tmp_path):
    """pu1_sync without its module's device(): DM-CTX-001 fails and its
    expectation excuses it; the state machines that enter device() among
    other steps leave that step out, so the contracts of their other steps
    (DM-SET-001, DM-THREAD-001) keep their passes."""
    expectations = tmp_path / "expectations.toml"
    expectations.write_text('[[expect]]\ncontract = "DM-CTX-001"\nreason = "no device() context manager yet"\n')
    run = run_suite("pu1_sync", tmp_path, f"--manifest={PU1_SYNC_MANIFEST}", f"--expectations={expectations}",
                    "--contract=DM-CTX-001,DM-SET-001,DM-THREAD-001",
                    env={"PU1_SYNC_WITHOUT_DEVICE_CONTEXT": "1"})
    verdicts = run.verdicts()
    assert verdicts["DM-CTX-001"] == "xfail", run.contract("DM-CTX-001")
    for contract_id in ("DM-SET-001", "DM-THREAD-001"):
        assert verdicts[contract_id] == "pass", [
            (t["nodeid"], t["verdict"], t["message"][:500]) for t in run.contract(contract_id)["tests"]]
