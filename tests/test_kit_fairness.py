"""The kit is fair to a conforming backend it did not write.

tests/fixtures/pu1_sync is a PrivateUse1 backend written independently of
OpenReg and of the suite's checks, from the contract statements alone, making
other legitimate choices: every operation is synchronous, set_device takes
ints only (TypeError otherwise), memory statistics are aggregate only (no
large/small pools), its error messages use its own words, autocast covers
the matrix products only (bfloat16 preferred), and it ships no
instrumentation module. It implements every contract; the kit must give it
no failure of any kind and the level it claims, with two devices and with
one (multi-device is an optional feature); with two devices every verdict is
a pass.
"""

from __future__ import annotations

import pytest

from kit_support import FIXTURE_DIR, REPO, run_suite

MANIFEST = REPO / "tests" / "fixtures" / "pu1_sync" / "manifest.toml"
NOT_FAIR = {"fail", "error", "crash", "hang"}

pytestmark = pytest.mark.skipif(not (FIXTURE_DIR / "pu1_sync").is_dir(),
                                reason="the pu1_sync fixture backend is not built (make build)")


def _run(tmp_path_factory, devices: int):
    folder = tmp_path_factory.mktemp(f"pu1_sync_{devices}")
    return run_suite("pu1_sync", folder, f"--manifest={MANIFEST}",
                     env={"PU1_SYNC_DEVICE_COUNT": str(devices)})


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    return _run(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    return _run(tmp_path_factory, 1)


def _unfair(run) -> list[str]:
    problems = []
    for contract in run.report["contracts"]:
        for test in contract["tests"]:
            if test["verdict"] in NOT_FAIR:
                problems.append(f"{contract['id']} {test['nodeid']}: {test['verdict']}: {test['message'][:300]}")
    return problems


@pytest.mark.parametrize("which", ["two_devices", "one_device"])
def test_a_conforming_backend_gets_no_failure_and_its_level(which, request):
    run = request.getfixturevalue(which)
    assert run.report is not None, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.report["complete"] is True
    problems = _unfair(run)
    assert not problems, "the kit failed a conforming backend:\n  " + "\n  ".join(problems)
    assert run.report["summary"]["level_reached"] == "full", run.stdout[-4000:]
    assert run.returncode == 0, run.stdout[-3000:]


@pytest.mark.parametrize("which", ["two_devices", "one_device"])
def test_its_verdicts_are_earned_not_skipped(which, request):
    """Every contract it claims is decided by a test that ran: a pass, never
    a skip or an inconclusive result standing in for one."""
    run = request.getfixturevalue(which)
    verdicts = run.verdicts()
    undecided = {c: v for c, v in verdicts.items() if v not in ("pass", "not-claimed")}
    assert not undecided, undecided
    not_claimed = {c for c, v in verdicts.items() if v == "not-claimed"}
    features = {c["id"]: set(c["unclaimed_features"]) for c in run.report["contracts"]}
    expected = set() if which == "two_devices" else {"multi-device"}
    wrong = {c: features[c] for c in not_claimed if not features[c] or not features[c] <= expected}
    assert not wrong, f"not-claimed for other reasons than {expected}: {wrong}"
