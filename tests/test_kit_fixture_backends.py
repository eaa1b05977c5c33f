"""The whole suite against backends other than OpenReg: the deliberately
minimal fixture backend and the faulty one (segfault in getDeviceFromPtr,
hang in isPinnedPtr). Each must get a complete run and a complete report."""

from __future__ import annotations

import pytest

from kit_support import FIXTURE_DIR, run_suite
from privateuse1_conformance.harness import registry as registry_mod

FAILURE_VERDICTS = {"fail", "error"}

pytestmark = pytest.mark.skipif(
    not any(FIXTURE_DIR.glob("pu1_minimal*.so")), reason="fixture backends are not built (make build)")


@pytest.fixture(scope="module")
def registry():
    return registry_mod.load(registry_mod.default_path())


@pytest.fixture(scope="module")
def minimal_run(tmp_path_factory):
    return run_suite("pu1_minimal", tmp_path_factory.mktemp("minimal"), "--contract-timeout=20")


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    return run_suite("pu1_faulty", tmp_path_factory.mktemp("faulty"), "--contract-timeout=5")


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
    for contract_id in ("HK-CTX-001", "HK-GEN-001", "HK-PTR-001"):
        assert verdicts[contract_id] in FAILURE_VERDICTS, (contract_id, verdicts[contract_id])
        messages = " ".join(t["message"] for t in minimal_run.contract(contract_id)["tests"])
        assert "PrivateUse1HooksInterface" in messages, (contract_id, messages[:500])
    streams = " ".join(t["message"] for t in minimal_run.contract("ST-NEW-001")["tests"])
    assert verdicts["ST-NEW-001"] in FAILURE_VERDICTS and "Stream" in streams
    for result in minimal_run.report["contracts"]:
        for test in result["tests"]:
            if test["verdict"] in FAILURE_VERDICTS:
                assert test["message"].strip(), f"{test['nodeid']} failed without a message"
    # What the minimal backend does implement passes.
    assert verdicts["DM-NAME-001"] == "pass"
    assert verdicts["DM-PARSE-001"] == "pass"


def test_faulty_backend_crash_and_hang_cost_only_their_contracts(faulty_run, registry):
    assert faulty_run.returncode == 1, faulty_run.stdout[-3000:] + faulty_run.stderr[-3000:]
    assert faulty_run.report["complete"] is True
    verdicts = faulty_run.verdicts()
    assert set(verdicts) == {c.id for c in registry.active()}
    crashed = {c for c, v in verdicts.items() if v == "crash"}
    hung = {c for c, v in verdicts.items() if v == "hang"}
    assert "HK-PTR-001" in crashed, verdicts["HK-PTR-001"]
    assert "HK-PIN-002" in hung, verdicts["HK-PIN-002"]
    # Only contracts whose checks call the two faulty hooks may crash or hang.
    assert crashed <= {"HK-PTR-001"}, crashed
    assert hung <= {"HK-PIN-001", "HK-PIN-002", "MM-PIN-001", "MM-COPY-001"}, hung
    crash = faulty_run.contract("HK-PTR-001")["tests"]
    assert any("SIGSEGV" in t["message"] for t in crash)
    # Every other contract still got a real verdict.
    assert "no-test" not in verdicts.values()
    assert verdicts["DM-NAME-001"] == "pass"
