"""A level is unreachable without conforming: the ways a reviewer tried to
get a broken backend certified, each tried again here end to end (the
kit's functions alone are tried in test_reports.py, test_kit_evidence.py
and test_mutants.py).

- a run narrowed by options, paths or a plugin certifies nothing, and
  `verify` refuses it for any level;
- a run stopped early (-x) is incomplete;
- a check without the instrumentation's gate that never saw work in flight
  decides nothing: its contract stays inconclusive on a backend that claims
  asynchronous operators, and its clause is not applicable on one that
  computes synchronously;
- `--operators none` runs to the end and writes a complete, narrowed report.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kit_support import FIXTURE_DIR, REPO, SUITE, run_pytest, run_suite

CLI = [sys.executable, "-m", "privateuse1_conformance.harness.cli"]
SYNC_MANIFEST = REPO / "tests" / "fixtures" / "pu1_sync" / "manifest.toml"


def _verify(report_dir, level: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, "verify", str(report_dir / "report.json"), "--level", level],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def dodged(tmp_path_factory):
    """DM-SET-002 broken (a mutant), its failing test deselected with -k,
    and the operators area switched off (DM-NAME-002's test keeps the run
    from selecting nothing)."""
    folder = tmp_path_factory.mktemp("dodged")
    return folder, run_suite("openreg", folder, "--contract=DM-NAME-002,DM-SET-002", "--operators=none",
                             "-k", "not test_set_device_rejects_out_of_range",
                             env={"OPENREG_MUTANT": "set-device-ignores-out-of-range"})


def test_a_narrowed_run_says_so_and_reaches_no_level(dodged):
    folder, run = dodged
    assert run.report is not None and run.report["complete"] is True, run.stdout[-3000:] + run.stderr[-3000:]
    narrowed = run.report["provenance"]["selection"]["narrowed_by"]
    assert any(r.startswith("--contract DM-NAME-002,DM-SET-002") for r in narrowed), narrowed
    assert any(r.startswith("-k ") for r in narrowed) and "--operators none" in narrowed, narrowed
    assert run.report["summary"]["level_reached"] is None and run.report["summary"]["certifies"] is False
    assert "Narrowed run" in run.stdout and "it certifies no level" in run.stdout
    for level in ("core", "standard", "full"):
        proc = _verify(folder / "report", level)
        assert proc.returncode == 1 and "the run was narrowed" in proc.stdout, proc.stdout[-3000:]


def test_operators_none_runs_to_the_end(dodged):
    _, run = dodged
    assert "INTERNALERROR" not in run.stdout + run.stderr
    assert run.report["operators"] == []
    assert run.report["provenance"]["selection"]["operators"] == "none"


DROPPER = '''
def pytest_collection_modifyitems(items):
    # A plugin that keeps one test and drops the rest without telling pytest.
    items[:] = [item for item in items if "test_backend_name_is_the_device_type" in item.nodeid][:1]
'''


def test_tests_dropped_by_a_plugin_narrow_the_run(tmp_path):
    (tmp_path / "dropper.py").write_text(DROPPER)
    run = run_pytest(["--backend=openreg", "--pyargs", SUITE, "--level=core", "-p", "dropper"], tmp_path,
                     env={"PYTHONPATH": str(tmp_path)})
    assert run.report is not None, run.stdout[-3000:] + run.stderr[-3000:]
    narrowed = run.report["provenance"]["selection"]["narrowed_by"]
    assert len(narrowed) == 1 and "deselected by another option or plugin" in narrowed[0], narrowed
    assert run.report["summary"]["level_reached"] is None


def test_a_suite_file_instead_of_the_suite_narrows_the_run(tmp_path):
    from privateuse1_conformance import conformance

    suite_file = f"{conformance.__path__[0]}/test_device_management.py"
    run = run_pytest(["--backend=openreg", f"{suite_file}::test_backend_name_is_the_device_type"], tmp_path)
    assert run.report is not None, run.stdout[-3000:] + run.stderr[-3000:]
    narrowed = run.report["provenance"]["selection"]["narrowed_by"]
    assert any("not the whole suite" in r for r in narrowed), narrowed


def test_a_run_stopped_early_is_incomplete(tmp_path):
    run = run_suite("openreg", tmp_path, "--contract=DM-XCHG-001", "--operators=none", "-x",
                    env={"OPENREG_MUTANT": "exchange-returns-new"})
    assert run.report is not None, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.report["complete"] is False, run.report["summary"]["test_verdicts"]
    assert any("the run is incomplete" in w for w in run.report["provenance"]["warnings"])


@pytest.fixture(scope="module")
def sync_runs(tmp_path_factory):
    """pu1_sync (synchronous, no instrumentation) on the ordering contracts:
    as it is, and with a manifest that claims asynchronous operators."""
    if not (FIXTURE_DIR / "pu1_sync").is_dir():
        pytest.fail("the pu1_sync fixture backend is not built (make build)")
    claiming = tmp_path_factory.mktemp("claiming") / "manifest.toml"
    claiming.write_text('[backend]\nname = "pu1_sync"\nclaims = "full"\n'
                        'unclaimed = ["autoload", "sdpa-override", "quantization", "inductor"]\n')
    args = ("--contract=ST-SYNC-001,ST-WAIT-001", "--operators=none")
    return {
        "synchronous": run_suite("pu1_sync", tmp_path_factory.mktemp("sync"), f"--manifest={SYNC_MANIFEST}", *args),
        "claims async": run_suite("pu1_sync", claiming.parent, f"--manifest={claiming}", *args),
    }


def test_a_check_that_saw_nothing_in_flight_decides_nothing(sync_runs):
    """pu1_sync finishes every launch before it returns: no amount of work is
    ever seen in flight. Claiming async-operators, its ordering clauses are
    undecided and the contracts inconclusive (never a pass); declaring itself
    synchronous (async-operators unclaimed), they do not apply and it passes."""
    claims = sync_runs["claims async"]
    assert claims.report is not None, claims.stdout[-3000:] + claims.stderr[-3000:]
    for contract in ("ST-SYNC-001", "ST-WAIT-001"):
        result = claims.contract(contract)
        assert result["verdict"] == "inconclusive" and not result["satisfied"], result["clauses"]
        assert "no work was seen in flight" in result["message"], result["message"]
    assert claims.contract("ST-SYNC-001")["clauses"]["ST-SYNC-001.1"].startswith("undecided")
    synchronous = sync_runs["synchronous"]
    for contract in ("ST-SYNC-001", "ST-WAIT-001"):
        result = synchronous.contract(contract)
        assert result["verdict"] == "pass", (result["message"], result["clauses"])
    clauses = synchronous.contract("ST-SYNC-001")["clauses"]
    assert clauses["ST-SYNC-001.1"].startswith("n/a: ") and "computes synchronously" in clauses["ST-SYNC-001.1"]
    assert not [c for c, status in clauses.items() if status.startswith("undecided")], clauses
