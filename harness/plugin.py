"""The pytest plugin that turns the conformance suite into a conformance run.

Load it with ``-p privateuse1_conformance.harness.plugin`` (the repository's
root conftest.py and the ``privateuse1-conformance`` command do). It stays
inert unless ``--backend`` is given, so it never disturbs other test runs.

What it does for a run:

* resolves and imports the backend in the (warm) parent process, after
  checking in a throw-away process that importing it does not crash;
* requires every test to declare its contracts with
  ``@pytest.mark.contract("DM-SET-001", ...)`` and fails collection on an
  unknown or retired ID;
* deselects tests above ``--level``;
* runs each test in a child forked from the warm parent (see isolation.py),
  so crashes and hangs become verdicts instead of ending the run;
* assigns verdicts: pass, fail (assertion), error (other exception), crash,
  hang, not-claimed (feature declared absent), xfail / xpass (expectations
  file), skip;
* aggregates per contract, computes the level reached, prints a summary and
  hands the run to ``reports`` (``--report-dir``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import backend as backend_mod
from . import expectations as expectations_mod
from . import isolation, registry as registry_mod
from .results import RunRecorder

MARKER = "contract"
DEFAULT_TIMEOUT = 60.0
PREFLIGHT_TIMEOUT = 300.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("privateuse1-conformance", "PrivateUse1 conformance")
    group.addoption("--backend", help="backend under test: a registered profile name or an importable module")
    group.addoption("--level", choices=registry_mod.LEVELS, default=None,
                    help="run contracts up to this level (default: the manifest's claim, else full)")
    group.addoption("--manifest", default=None, help="manifest TOML of the backend (overrides the profile's)")
    group.addoption("--expectations", default=None,
                    help="expectations TOML (known failures by contract ID; overrides the manifest's)")
    group.addoption("--report-dir", default=None, help="write the compliance report into this folder")
    group.addoption("--contract", action="append", default=[], metavar="ID[,ID...]",
                    help="run only the tests of these contracts (repeatable)")
    group.addoption("--registry", default=None,
                    help="contract registry TOML (default: the suite's own; for testing the kit itself)")
    group.addoption("--isolation", choices=("fork", "none"), default="fork",
                    help="run each test in a forked child (default) or in-process (debugging only)")
    group.addoption("--contract-timeout", type=float, default=DEFAULT_TIMEOUT,
                    help=f"seconds before a test counts as hung (default {DEFAULT_TIMEOUT:g})")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(*ids): the contract IDs (conformance/contracts.toml) a test checks"
    )
    if config.getoption("backend"):
        config.pluginmanager.register(ConformanceSession(config), "privateuse1-conformance-session")


def _preflight_import(module_name: str) -> None:
    """Import the backend in a throw-away process first: a backend that crashes
    or hangs on import must give a clear message, not kill the run silently."""
    code = f"import torch, importlib; importlib.import_module({module_name!r})"
    try:
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                timeout=PREFLIGHT_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise pytest.UsageError(
            f"importing the backend module {module_name!r} did not finish within "
            f"{PREFLIGHT_TIMEOUT:g} s (hang on import)") from None
    if result.returncode != 0:
        cause = (f"was killed by signal {-result.returncode}" if result.returncode < 0
                 else f"failed (exit status {result.returncode})")
        raise pytest.UsageError(
            f"importing the backend module {module_name!r} {cause}:\n{result.stderr[-4000:]}")


class ConformanceSession:
    """State and hooks of one conformance run (registered only with --backend)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        registry_path = config.getoption("registry") or registry_mod.default_path()
        try:
            self.registry = registry_mod.load(registry_path)
        except (OSError, registry_mod.RegistryError) as e:
            raise pytest.UsageError(f"cannot load the contract registry: {e}") from e
        name = config.getoption("backend")
        if not hasattr(config, "workerinput"):  # xdist workers: the controller checked
            profile = backend_mod.find_profile(name) or {}
            _preflight_import(profile.get("module", name))
        try:
            self.backend = backend_mod.load(name, config.getoption("manifest"), self.registry)
        except backend_mod.BackendError as e:
            raise pytest.UsageError(str(e)) from e
        manifest = self.backend.manifest
        self.level = config.getoption("level") or manifest.claims or "full"
        expectations_path = config.getoption("expectations") or manifest.expectations
        try:
            self.expectations = (
                expectations_mod.load(expectations_path, self.registry) if expectations_path else {}
            )
        except expectations_mod.ExpectationsError as e:
            raise pytest.UsageError(str(e)) from e
        self.expectations_path = Path(expectations_path) if expectations_path else None
        self.only = {c.strip() for option in config.getoption("contract") for c in option.split(",") if c.strip()}
        unknown = sorted(self.only - set(self.registry.contracts))
        if unknown:
            raise pytest.UsageError(f"--contract: unknown contract ID(s) {', '.join(unknown)}")
        self.timeout = config.getoption("contract_timeout")
        self.isolation = config.getoption("isolation")
        self.device_count = self._device_count()
        # Features the backend does not have: declared absent, or implied by
        # the hardware (one device cannot show multi-device behaviour).
        self.unclaimed = set(manifest.unclaimed)
        if self.device_count < 2:
            self.unclaimed.add("multi-device")
        self.parent_initialized = self._is_initialized()
        # Warm the parent: PyTorch imports these lazily on the first operator
        # that needs a Python meta kernel (seconds); every forked test would
        # pay that again. Importing them touches no device.
        import torch._dynamo  # noqa: F401
        import torch._meta_registrations  # noqa: F401
        self.covered: set[str] = set()
        self.recorder = RunRecorder(self)
        self._start = time.time()

    # ------------------------------------------------------------ helpers

    def _device_count(self) -> int:
        """The device count, from the first layer that answers: the module,
        then the hooks. Disagreement is a contract failure the suite reports;
        here we only need a number to plan the run."""
        import torch

        for ask in (lambda: self.backend.device_module.device_count(),
                    torch._C._accelerator_hooks_device_count):
            try:
                count = int(ask())
            except Exception:  # noqa: BLE001
                continue
            if count > 0:
                return count
        return 0

    def _is_initialized(self) -> bool:
        is_initialized = getattr(self.backend.device_module, "is_initialized", None)
        try:
            return bool(is_initialized()) if callable(is_initialized) else False
        except Exception:  # noqa: BLE001
            return False

    @staticmethod
    def contracts_of(item: pytest.Item) -> list[str]:
        ids: list[str] = []
        for marker in item.iter_markers(MARKER):
            ids.extend(marker.args)
        return ids

    def rerun_command(self, nodeid: str) -> str:
        """A command that reruns one test from any folder: the test file is
        named by its absolute path (a node ID is relative to the rootdir)."""
        path, _, rest = nodeid.partition("::")
        target = str((self.config.rootpath / path).resolve()) + (f"::{rest}" if rest else "")
        args = ["pytest", "-p", "privateuse1_conformance.harness.plugin", f"--backend={self.backend.requested}"]
        for option in ("manifest", "expectations"):
            value = self.config.getoption(option)
            if value:
                args.append(f"--{option}={Path(value).resolve()}")
        return " ".join(shlex.quote(a) for a in args + [target])

    # -------------------------------------------------------- collection

    # tryfirst: see every collected test (before -k / -m deselect) for coverage.
    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        problems = []
        selected, deselected = [], []
        rank = registry_mod.LEVELS.index(self.level)
        for item in items:
            ids = self.contracts_of(item)
            if not ids:
                problems.append(f"{item.nodeid}: declares no contract (use @pytest.mark.contract(ID, ...))")
                continue
            for contract_id in ids:
                contract = self.registry.contracts.get(contract_id)
                if contract is None:
                    problems.append(f"{item.nodeid}: unknown contract ID {contract_id!r}")
                elif contract.retired:
                    problems.append(f"{item.nodeid}: contract {contract_id} is retired ({contract.retired})")
            if any(c not in self.registry.contracts for c in ids):
                continue
            self.covered.update(ids)
            in_level = min(self.registry.contracts[c].level_rank for c in ids) <= rank
            if in_level and (not self.only or self.only.intersection(ids)):
                selected.append(item)
            else:
                deselected.append(item)
        if problems:
            raise pytest.UsageError("invalid contract declarations:\n  " + "\n  ".join(problems))
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = selected
        if hasattr(config, "workeroutput"):  # xdist worker: tell the controller
            config.workeroutput["privateuse1_covered"] = sorted(self.covered)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:  # xdist controller
        self.covered.update(getattr(node, "workeroutput", {}).get("privateuse1_covered", []))

    # ---------------------------------------------------------- running

    def _unclaimed_features(self, item: pytest.Item) -> list[str]:
        features = set()
        for contract_id in self.contracts_of(item):
            features.update(self.registry.contracts[contract_id].features)
        return sorted(features & self.unclaimed)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool:
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        contracts = ",".join(self.contracts_of(item))
        unclaimed = self._unclaimed_features(item)
        if unclaimed:
            reports = [self._not_claimed_report(item, unclaimed)]
        elif self.isolation == "fork":
            reports = isolation.run_forked(item, self.timeout)
        else:
            from _pytest.runner import runtestprotocol

            reports = runtestprotocol(item, log=False, nextitem=nextitem)
        for report in reports:
            self._finalize(report, contracts)
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _not_claimed_report(self, item: pytest.Item, features: list[str]) -> pytest.TestReport:
        why = ", ".join(features)
        reason = f"not claimed: the backend does not claim feature(s) {why}"
        if "multi-device" in features and "multi-device" not in self.backend.manifest.unclaimed:
            reason += f" (it has {self.device_count} device(s); this needs 2)"
        return pytest.TestReport(
            nodeid=item.nodeid, location=item.location, keywords={k: 1 for k in item.keywords},
            outcome="skipped", longrepr=(str(item.path), item.location[1] or 0, reason),
            when="setup", sections=[], duration=0.0,
            user_properties=[("verdict", "not-claimed"), ("unclaimed", why)],
        )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        """Runs where the test runs (the child): tell fail from error."""
        report = yield
        if report.passed:
            verdict = "pass"
        elif report.skipped:
            verdict = "xfail" if hasattr(report, "wasxfail") else "skip"
        elif call.excinfo is not None and call.when == "call" and call.excinfo.errisinstance(
            (AssertionError, pytest.fail.Exception)
        ):
            verdict = "fail"
        else:
            verdict = "error"
        report.user_properties.append(("verdict", verdict))
        return report

    def _finalize(self, report: pytest.TestReport, contracts: str) -> None:
        """Parent side: expectations, contract IDs, rerun hints."""
        props = dict(report.user_properties)
        verdict = props.get("verdict") or ("pass" if report.passed else "skip" if report.skipped else "error")
        expected = [self.expectations[c] for c in contracts.split(",") if c in self.expectations]
        if expected and verdict in ("fail", "error"):
            report.outcome = "skipped"
            report.wasxfail = "; ".join(e.reason for e in expected)
            verdict = "xfail"
        elif expected and verdict == "pass" and report.when == "call":
            report.wasxfail = "; ".join(e.reason for e in expected)
            verdict = "xpass"
        report.user_properties = [p for p in report.user_properties if p[0] != "verdict"]
        report.user_properties += [("verdict", verdict), ("contracts", contracts)]
        if expected:
            report.user_properties.append(("expectation", report.wasxfail if hasattr(report, "wasxfail") else ""))

    # ------------------------------------------------------------ results

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.recorder.add(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        isolation.reap_exited(block=True)
        self.recorder.finish(exitstatus, self._start, time.time() - self._start)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        self.recorder.print_summary(terminalreporter)
