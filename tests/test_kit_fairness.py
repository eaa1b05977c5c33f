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
a pass, but for autoload: pu1_sync is no installed distribution, so its
manifest lists autoload as unclaimed, and the last test here installs it
with an entry point. Being synchronous, it does not claim async-operators
either (and keeps every ordering rule of the stream contracts).

The two-device run is the CI recipe's, in the environment where the kit
install test installed the kit (tests/kit_install.sh, made once per test
session for test_kit_install.py, test_ci_recipe.py and this module: the CLI,
its default workers); the one-device run is pytest's here, with one worker
(made by kit_support.py, side by side with the other). The tests of the
one-device run come first: the other is usually still being made.
"""

from __future__ import annotations

import pytest

from kit_support import FIXTURE_DIR, installed_kit, pu1_sync_one_device_run, run_suite

NOT_FAIR = {"fail", "error", "crash", "hang"}

pytestmark = pytest.mark.skipif(not (FIXTURE_DIR / "pu1_sync").is_dir(),
                                reason="the pu1_sync fixture backend is not built (make build)")


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """The whole suite with two devices, through the CI recipe."""
    return installed_kit(tmp_path_factory).ci


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """The whole suite with one device, by `pytest --backend`."""
    return pu1_sync_one_device_run(tmp_path_factory)


def _unfair(run) -> list[str]:
    problems = []
    for contract in run.report["contracts"]:
        for test in contract["tests"]:
            if test["verdict"] in NOT_FAIR:
                problems.append(f"{contract['id']} {test['nodeid']}: {test['verdict']}: {test['message'][:300]}")
    return problems


def _judge_level(run) -> None:
    assert run.report is not None, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.report["complete"] is True
    problems = _unfair(run)
    assert not problems, "the kit failed a conforming backend:\n  " + "\n  ".join(problems)
    assert run.report["summary"]["level_reached"] == "full", run.stdout[-4000:]
    assert run.returncode == 0, run.stdout[-3000:]


def _judge_earned(run, unclaimed: set[str]) -> None:
    """Every contract it claims is decided by a test that ran: a pass, never
    a skip or an inconclusive result standing in for one; a contract it does
    not claim is left out for the features `unclaimed` only."""
    verdicts = run.verdicts()
    undecided = {c: v for c, v in verdicts.items() if v not in ("pass", "not-claimed")}
    assert not undecided, undecided
    not_claimed = {c for c, v in verdicts.items() if v == "not-claimed"}
    features = {c["id"]: set(c["unclaimed_features"]) for c in run.report["contracts"]}
    wrong = {c: features[c] for c in not_claimed if not features[c] or not features[c] <= unclaimed}
    assert not wrong, f"not-claimed for other reasons than {unclaimed}: {wrong}"


UNCLAIMED = {"autoload", "backend-metadata", "sdpa-override", "quantization", "inductor", "async-operators", "graphs",
             "distributed"}


def test_with_one_device_a_conforming_backend_gets_no_failure_and_its_level(one_device):
    _judge_level(one_device)


def test_with_one_device_its_verdicts_are_earned_not_skipped(one_device):
    _judge_earned(one_device, UNCLAIMED | {"multi-device"})


def test_with_one_device_every_not_claimed_verdict_says_which_feature(one_device):
    """Also where a test checks other contracts too (the state machines):
    each contract charged not-claimed names the feature it needs."""
    silent = [(c["id"], t["nodeid"], message) for c in one_device.report["contracts"] for t in c["tests"]
              if t.get("verdicts", {}).get(c["id"], t["verdict"]) == "not-claimed"
              and not (message := t.get("messages", {}).get(c["id"], t["message"])).startswith(
                  "not claimed: the backend does not claim feature(s) ")]
    assert not silent, silent[:5]


def _installed_pu1_sync(folder, entry_point: bool):
    """pu1_sync as an installed distribution (a dist-info folder on the path),
    with or without a torch.backends entry point, and a manifest that claims
    every feature."""
    info = folder / "site" / "pu1_sync-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pu1-sync\nVersion: 0.1.0\n")
    (info / "top_level.txt").write_text("pu1_sync\n")
    if entry_point:  # (the target does nothing: importing pu1_sync does the work)
        (info / "entry_points.txt").write_text("[torch.backends]\npu1_sync = pu1_sync:_autoload\n")
    manifest = folder / "manifest.toml"
    manifest.write_text('[backend]\nname = "pu1_sync"\nclaims = "full"\n')
    return run_suite("pu1_sync", folder, f"--manifest={manifest}", "--contract=AL-LOAD-001",
                     env={"PYTHONPATH": str(folder / "site")})


def test_autoload_passes_with_an_entry_point_and_fails_without(tmp_path):
    """OpenReg, installed here, declares one too (and yields to pu1_sync's)."""
    (tmp_path / "with").mkdir()
    declared = _installed_pu1_sync(tmp_path / "with", entry_point=True)
    assert declared.report is not None, declared.stdout[-3000:] + declared.stderr[-3000:]
    assert not _unfair(declared), _unfair(declared)
    assert declared.verdicts()["AL-LOAD-001"] == "pass", declared.contract("AL-LOAD-001")
    (tmp_path / "without").mkdir()
    missing = _installed_pu1_sync(tmp_path / "without", entry_point=False)
    assert missing.verdicts()["AL-LOAD-001"] == "fail", missing.contract("AL-LOAD-001")
    message = missing.contract("AL-LOAD-001")["tests"][0]["message"]
    assert "'pu1-sync' declares no entry point in the group torch.backends" in message, message


def test_with_two_devices_a_conforming_backend_gets_no_failure_and_its_level(two_devices):
    _judge_level(two_devices)


def test_with_two_devices_its_verdicts_are_earned_not_skipped(two_devices):
    _judge_earned(two_devices, UNCLAIMED)
