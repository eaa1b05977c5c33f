"""Collecting a run's reports into the result model, and summarizing it.

Lives in the process that logs results: the main process, or the xdist
controller (workers only run tests).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import time
import warnings
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

import pytest

from privateuse1_conformance.reports import model
from privateuse1_conformance.reports.model import Verdict

from . import registry as registry_mod

if TYPE_CHECKING:
    from .plugin import ConformanceSession

MESSAGE_LIMIT = 8000
# report.json is rewritten after every finished test, unless writing takes
# long compared with testing: then at most 1/WRITE_SHARE of the run's time.
WRITE_SHARE = 20
CLI = "privateuse1-conformance"


def _trim(text: str) -> str:
    if len(text) > MESSAGE_LIMIT:
        return text[: MESSAGE_LIMIT // 2] + "\n[...]\n" + text[-MESSAGE_LIMIT // 2 :]
    return text


def _message(report: pytest.TestReport, verdict: Verdict) -> tuple[str, str]:
    """(message, details): the short statement of what went wrong, and the
    full report it comes from."""
    if verdict is Verdict.PASS:
        return "", ""
    if verdict is Verdict.XPASS:
        return getattr(report, "wasxfail", ""), ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]), ""
    details = report.longreprtext
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else details.split("\n--- ", 1)[0]
    message = message.removeprefix("Failed: ")  # pytest.fail's prefix says nothing
    if verdict is Verdict.XFAIL:
        message = f"{getattr(report, 'wasxfail', '')} (expected; actual: {message})"
    return _trim(message), _trim(details)


def contract_info(contract: registry_mod.Contract) -> model.ContractInfo:
    """The result model's view of a registry contract."""
    return model.ContractInfo(id=contract.id, area=contract.area, level=contract.level,
                              statement=contract.statement, source=contract.source,
                              features=list(contract.features))


class RunRecorder:
    def __init__(self, session: ConformanceSession) -> None:
        self.session = session
        self.is_worker = hasattr(session.config, "workerinput")
        self.tests: dict[str, model.TestResult] = {}
        self.results: list[model.ContractResult] = []
        self.reached: str | None = None
        self.started = time.time()
        self.report_dir = None if self.is_worker else session.config.getoption("report_dir")
        self._provenance: model.Provenance | None = None
        self._next_write = 0.0
        if self.report_dir:
            # For the hooks below (the incremental report).
            session.config.pluginmanager.register(self, "privateuse1-conformance-recorder")

    def add(self, report: pytest.TestReport) -> None:
        if self.is_worker:
            return
        props = dict(report.user_properties)
        if "verdict" not in props:
            return  # not a conformance test report
        verdict = Verdict(props["verdict"])
        contracts = [c for c in props.get("contracts", "").split(",") if c]
        existing = self.tests.get(report.nodeid)
        message, details = _message(report, verdict)
        if existing is None:
            self.tests[report.nodeid] = model.TestResult(
                nodeid=report.nodeid, contracts=contracts, verdict=verdict,
                duration=report.duration, message=message, details=details,
                rerun=self.session.rerun_command(report.nodeid),
                expectation=props.get("expectation", ""),
            )
            return
        existing.duration += report.duration
        # A teardown pass must not hide a setup or call problem.
        if verdict.severity > existing.verdict.severity:
            existing.verdict = verdict
            existing.message = message
            existing.details = details
            existing.expectation = props.get("expectation", existing.expectation)

    def build(self) -> list[model.ContractResult]:
        registry = self.session.registry
        by_contract: dict[str, list[model.TestResult]] = defaultdict(list)
        for test in self.tests.values():
            for contract_id in test.contracts:
                by_contract[contract_id].append(test)
        results = []
        for contract in registry.up_to(self.session.level):
            info = contract_info(contract)
            unclaimed = sorted(set(contract.features) & self.session.unclaimed)
            results.append(model.ContractResult(info, by_contract.get(contract.id, []), unclaimed,
                                                rerun=self.contract_rerun_command(contract.id)))
        return results

    def contract_rerun_command(self, contract_id: str) -> str:
        """A command that reruns the installed suite's tests of one contract,
        from any folder (paths made absolute)."""
        return shlex.join([*self._rerun_options, f"--contract={contract_id}"])

    @functools.cached_property
    def _rerun_options(self) -> list[str]:
        from .plugin import DEFAULT_TIMEOUT  # not at the top: plugin imports this module

        config = self.session.config
        args = [CLI, "run", f"--backend={self.session.backend.requested}"]
        for option in ("manifest", "expectations"):
            if config.getoption(option):
                args.append(f"--{option}={os.path.abspath(config.getoption(option))}")
        if config.getoption("level"):
            args.append(f"--level={config.getoption('level')}")
        if self.session.timeout != DEFAULT_TIMEOUT:
            args.append(f"--timeout={self.session.timeout:g}")
        return args

    def optional_features(self) -> set[str]:
        return {f.name for f in self.session.registry.features.values() if f.optional}

    def provenance(self, started: float, duration: float) -> model.Provenance:
        # Collected once (it runs git and hashes files), then only timed again.
        from .provenance import collect

        if self._provenance is None:
            self._provenance = collect(self.session, started, duration)
        return dataclasses.replace(self._provenance, duration_s=round(duration, 3))

    def run(self, complete: bool, started: float, duration: float) -> model.Run:
        session = self.session
        self.results = self.build()
        self.reached = model.level_reached(self.results, self.optional_features())
        return model.Run(
            provenance=self.provenance(started, duration),
            contracts=self.results,
            optional_features=sorted(self.optional_features()),
            unclaimed_features=sorted(session.unclaimed),
            claimed_level=session.backend.manifest.claims,
            complete=complete,
            # Known only once collection is over everywhere (xdist workers
            # report it when they stop): empty in the reports written meanwhile.
            uncovered=[c.id for c in session.registry.up_to(session.level) if c.id not in session.covered]
            if complete else [],
            stale_expectations=self.stale_expectations(),
        )

    def finish(self, exitstatus: int, started: float, duration: float) -> None:
        if self.is_worker:
            return
        run = self.run(complete=exitstatus in (0, 1), started=started, duration=duration)
        if self.report_dir:
            from privateuse1_conformance.reports import writer

            writer.write_all(self.report_dir, run)

    # ------------------------------------------------ incremental report

    def _write_partial(self) -> None:
        """Rewrite report.json with what has finished so far, marked
        incomplete: a run that is killed or crashes leaves it behind."""
        from privateuse1_conformance.reports import json_report, writer

        run = self.run(complete=False, started=self.started, duration=time.time() - self.started)
        began = time.monotonic()  # the first run() collects the provenance: not a writing cost
        try:
            writer.write_json(self.report_dir, json_report.to_document(run), compact=True)
        except OSError as e:
            # The run goes on; the final report is tried again (and fails loudly) at the end.
            warnings.warn(f"cannot update the report in {self.report_dir}: {e}", stacklevel=1)
            self._next_write = float("inf")
            return
        ended = time.monotonic()
        self._next_write = ended + (WRITE_SHARE - 1) * (ended - began)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        from privateuse1_conformance.reports import writer

        writer.remove_renderings(self.report_dir)
        self._write_partial()  # even a run killed in its first test leaves a report

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        if time.monotonic() >= self._next_write:
            self._write_partial()

    # ----------------------------------------------------------- summary

    def stale_expectations(self) -> list[str]:
        stale = []
        for contract_id in self.session.expectations:
            verdicts = [t.verdict for t in self.tests.values() if contract_id in t.contracts]
            if verdicts and all(v in (Verdict.PASS, Verdict.XPASS) for v in verdicts):
                stale.append(contract_id)
        return stale

    def print_summary(self, terminal) -> None:
        if self.is_worker or not self.results:
            return
        session = self.session
        backend = session.backend
        terminal.section(f"PrivateUse1 conformance: {backend.name}", sep="=")
        terminal.line(
            f"backend {backend.requested!r} (module {backend.module_name}"
            + (f" {backend.version}" if backend.version else "")
            + f"), device type {backend.device_type!r}, {session.device_count} device(s)"
        )
        verdict_columns = [v for v in Verdict]
        counts: dict[str, Counter] = defaultdict(Counter)
        for result in self.results:
            verdict = result.verdict
            # No result: either no test declares the contract, or its tests
            # were not selected (--contract, -k, --level).
            missing = "no test" if result.contract.id not in session.covered else "not run"
            counts[result.contract.area][verdict.value if verdict else missing] += 1
        # Only the verdicts that occur (pass always), so the table stays narrow.
        seen = {v for area_counts in counts.values() for v in area_counts}
        columns = [c for c in [v.value for v in verdict_columns] + ["not run", "no test"]
                   if c == "pass" or c in seen]
        terminal.line(f"{'area':<18}" + "".join(f"{c:>12}" for c in columns))
        for area in session.registry.areas:
            if area in counts:
                terminal.line(f"{area:<18}" + "".join(f"{counts[area][c]:>12}" for c in columns))
        claimed = backend.manifest.claims
        terminal.line("")
        terminal.line(
            f"Level reached: {self.reached or 'none'}"
            + (f" (claimed: {claimed})" if claimed else "")
            + f"; contracts checked up to: {session.level}"
        )
        for level in model.LEVELS[: model.LEVELS.index(session.level) + 1]:
            if self.reached and model.LEVELS.index(level) <= model.LEVELS.index(self.reached):
                continue
            blocking = model.blocking_contracts(self.results, self.optional_features(), level)
            shown = ", ".join(
                f"{r.contract.id} ({r.verdict.value if r.verdict else 'not run' if r.contract.id in session.covered else 'no test'})"
                for r in blocking[:12]
            )
            more = f" and {len(blocking) - 12} more" if len(blocking) > 12 else ""
            terminal.line(f"Blocking {level}: {shown}{more}")
            break
        uncovered = [c.id for c in session.registry.up_to(session.level) if c.id not in session.covered]
        if uncovered:
            terminal.line(f"Contracts without any test: {', '.join(uncovered)}", red=True)
        stale = self.stale_expectations()
        if stale:
            terminal.line(f"Stale expectations (these now pass): {', '.join(stale)}", yellow=True)
        if session.parent_initialized:
            terminal.line(
                "Warning: the backend was already initialized after import; every test ran in a "
                "process forked from an initialized backend.", yellow=True)
