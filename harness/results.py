"""Collecting a run's reports into the result model, and summarizing it.

Lives in the process that logs results: the main process, or the xdist
controller (workers only run tests).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import time
import warnings
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

import pytest

from privateuse1_conformance.reports import model
from privateuse1_conformance.reports.model import Verdict
from privateuse1_conformance.reports.text import one_line

from . import options
from . import registry as registry_mod
from . import shard as shard_mod
from .operators import CELLS_PROPERTY, OUTCOMES_PROPERTY, operator_result
from .paths import portable

if TYPE_CHECKING:
    from .session_view import RunSession

MESSAGE_LIMIT = 8000
# report.json is rewritten as tests finish, at most every WRITE_INTERVAL
# seconds (a killed run loses at most that much), and for at most
# 1/WRITE_SHARE of the run's time when building and writing it takes long.
WRITE_SHARE = 20
WRITE_INTERVAL = 0.5
CLI = "privateuse1-conformance"


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")
_SPACES = re.compile(r"\s+")
CAUSE_LIMIT = 300


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def cause_of(error: BaseException) -> str:
    """The underlying error of a failure, worded the same for every test it
    breaks: the backend's exception (type and first line) when a check
    wrapped one, else the exception itself. Addresses are blanked so that
    one error raised for different objects groups as one cause."""
    backend_error = error
    while True:  # the innermost exception a check chained (must() raises from the backend's)
        inner = backend_error.__cause__
        if inner is None or isinstance(inner, (AssertionError, pytest.fail.Exception)):
            break
        backend_error = inner
    if backend_error is not error or not isinstance(error, (AssertionError, pytest.fail.Exception)):
        text = f"{type(backend_error).__name__}: {str(backend_error).strip()}"
    else:
        text = str(error).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    first = _SPACES.sub(" ", _ADDRESS.sub("0x…", first))
    return first[:CAUSE_LIMIT]


_KIT_PREFIX = re.compile(r"^privateuse1_conformance\.harness\.evidence\.(?:Inconclusive|Violation): ")
# The lines of a long report that are kept when it is cut to fit: the
# backend's frames (with the source line under each), the error lines of a
# pytest traceback, and the first line of a crash dump.
_KEEP = re.compile(r"^(?:.*<[\w.]+>/(?!site-packages|stdlib|python|privateuse1_conformance|tmp)[^\n]*"
                   r"|E .*|Fatal Python error: .*|CRASH: .*|HANG: .*)$")


def _trim(text: str) -> str:
    """`text`, or when longer than MESSAGE_LIMIT its first lines, the lines
    that say where the backend was (_KEEP, as many as fit) and its end."""
    if len(text) <= MESSAGE_LIMIT:
        return text
    head, tail = text[: MESSAGE_LIMIT // 4], text[-MESSAGE_LIMIT // 2:]
    head = head[: head.rfind("\n") + 1] or head
    tail = tail[tail.find("\n") + 1:] if "\n" in tail else tail
    middle = text[len(head): len(text) - len(tail)].splitlines()
    budget = MESSAGE_LIMIT - len(head) - len(tail) - 200
    kept, cut = [], 0
    for index, line in enumerate(middle):
        keep = _KEEP.match(line) or (index and _KEEP.match(middle[index - 1]) and "<" in middle[index - 1]
                                     and line.startswith("    "))  # a backend frame's source line
        if keep and len(line) < budget:
            if cut:
                kept.append(f"[... {cut} lines cut ...]")
                cut = 0
            kept.append(line)
            budget -= len(line) + 1
        else:
            cut += 1
    if cut:
        kept.append(f"[... {cut} lines cut ...]")
    return head + "\n".join(kept) + "\n" + tail


def _message(report: pytest.TestReport, verdict: Verdict) -> tuple[str, str]:
    """(message, details): the short statement of what went wrong, and the
    full report it comes from."""
    if verdict is Verdict.PASS:
        return "", ""
    if verdict is Verdict.XPASS:
        return getattr(report, "wasxfail", ""), ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return _KIT_PREFIX.sub("", str(report.longrepr[2])), ""
    props = dict(report.user_properties)
    if verdict is Verdict.NOT_CLAIMED and not props.get("message"):
        # A test that ran for its other contracts: each unclaimed one's reason.
        reasons = list(dict.fromkeys((props.get("not_claimed") or {}).values()))
        return "; ".join(reasons) or "not claimed: the backend does not claim a feature this test needs", ""
    details = props.get("details") or report.longreprtext
    crash = getattr(report.longrepr, "reprcrash", None)
    if props.get("message"):  # a check's Violation: its own words, without the exception's class
        message = props["message"]
    else:
        message = crash.message if crash is not None else details.split("\n--- ", 1)[0]
        # The prefixes of pytest.fail, of a plain assert and of the kit's own
        # exceptions say nothing.
        message = _KIT_PREFIX.sub("", message.removeprefix("Failed: ").removeprefix("AssertionError: "))
    if props.get("note"):
        message = f"{props['note']}: {message}"
    if verdict is Verdict.XFAIL:
        message = f"{getattr(report, 'wasxfail', '')} (expected; actual: {message})"
    return _trim(portable(message)), _trim(portable(details))


def known_fixes(result: model.ContractResult) -> list[str]:
    """The known fixes of the symptoms a contract's failing tests show, once each."""
    def shown(test: model.TestResult) -> bool:
        verdict = test.verdict_for(result.contract.id)
        return verdict.is_failure or verdict is Verdict.XFAIL
    return list(dict.fromkeys(t.fix for t in result.tests if t.fix and shown(t)))


def rerun_options(session: RunSession) -> list[str]:
    """The `privateuse1-conformance run` options that reproduce this run's
    setting (backend, manifest, expectations, level, time limit). The suite
    is found by its package, so the command works from any folder; a vendor's
    own manifest and expectations files are named by absolute path."""
    cached = getattr(session, "_rerun_options", None)
    if cached is not None:
        return cached
    config = session.config
    args = [CLI, "run", f"--backend={session.backend.requested}"]
    for option in ("manifest", "expectations"):
        if options.value(config, option):
            # (relative to the working directory, or a placeholder: harness/paths.py)
            args.append(f"--{option}={portable(os.path.abspath(options.value(config, option)))}")
    if options.value(config, "level"):
        args.append(f"--level={options.value(config, 'level')}")
    if session.timeout != options.DEFAULT_TIMEOUT:
        args.append(f"--timeout={session.timeout:g}")
    operators = options.value(config, "operators")
    if operators and operators != "default":
        args.append(f"--operators={operators}")
    session._rerun_options = args
    return args


def contract_info(contract: registry_mod.Contract) -> model.ContractInfo:
    """The result model's view of a registry contract."""
    return model.ContractInfo(id=contract.id, area=contract.area, level=contract.level,
                              statement=contract.statement, source=contract.source,
                              features=list(contract.features), clauses=contract.checked_clauses())


class RunRecorder:
    def __init__(self, session: RunSession) -> None:
        self.session = session
        self.is_worker = hasattr(session.config, "workerinput")
        self.tests: dict[str, model.TestResult] = {}
        self.operators: dict[str, model.OperatorResult] = {}  # the operator matrix, by node ID
        self.results: list[model.ContractResult] = []
        self.reached: str | None = None
        self.started = time.time()
        self.report_dir = None if self.is_worker else options.value(session.config, "report-dir")
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
        charges = {c: Verdict(v) for c, v in props.get("charges", {}).items()}
        message, details = _message(report, verdict)
        test = self.tests.get(report.nodeid)
        if test is None:
            test = self.tests[report.nodeid] = model.TestResult(
                nodeid=self.session.test_id(report.nodeid), contracts=contracts, verdict=verdict,
                rerun=self.session.rerun_command(report.nodeid))
        test.duration += report.duration
        for clause, found in props.get("clauses", {}).items():  # a decision wins over what a phase could not see
            if test.clauses.get(clause) != model.DECIDED:
                test.clauses[clause] = found
        # The phase that went worst (a teardown pass must not hide a setup or
        # call problem) gives the test its verdict and message.
        if verdict.severity > test.verdict.severity or not (test.message or test.details):
            test.verdict = verdict
            test.message, test.details = message, details
            test.expectation = props.get("expectation", test.expectation)
            test.cause = props.get("cause", "")
            test.clause = props.get("clause", "")
            test.step = props.get("step", "")
            test.fix = self._known_fix(charges or dict.fromkeys(contracts, verdict), verdict,
                                       test.clause, "\n".join((message, test.cause, details)))
        # Per contract, likewise: the worst of the phases' charges.
        outcomes = self._contract_outcomes(charges, verdict, message, props.get("not_claimed") or {})
        operator_outcomes = props.get(OUTCOMES_PROPERTY)
        if operator_outcomes and report.when == "call":  # an operators-area test: each contract's own outcome
            outcomes = {c: (charge, operator_outcomes.get(c, ["", ""])[1] or (
                "" if charge is Verdict.PASS else
                "no check of this contract had evidence for this operator (no sample, variant or error input "
                "that applies, or nothing claimed)")) for c, (charge, _) in outcomes.items()}
        for contract_id, (charge, text) in outcomes.items():
            before = test.verdicts.get(contract_id)
            if before is None or charge.severity > before.severity:
                test.verdicts[contract_id] = charge
                test.messages[contract_id] = text
        cells = props.get(CELLS_PROPERTY)
        if cells is not None:  # an operators-area test: its row of the operator matrix
            self.operators[report.nodeid] = operator_result(test.nodeid, cells, verdict, message, test.verdicts)

    def _known_fix(self, charges: dict[str, Verdict], verdict: Verdict, clause: str, text: str) -> str:
        """The registry's known fix for a failure's symptom, with where the
        vendor guide explains it ("" when none is known, or nothing failed)."""
        if not (verdict.is_failure or verdict is Verdict.XFAIL):
            return ""
        for contract_id, charge in charges.items():
            contract = self.session.registry.contracts.get(contract_id)
            if charge is verdict and contract is not None:
                fix = contract.known_fix(clause, text)
                if fix is not None:
                    return f"{fix.fix} (the kit's docs/{fix.guide})"
        return ""

    @staticmethod
    def _contract_outcomes(charges: dict[str, Verdict], verdict: Verdict, message: str,
                           not_claimed: dict[str, str]) -> dict[str, tuple[Verdict, str]]:
        """(verdict, message) per contract for one phase whose own verdict and
        message are `verdict` and `message`; `not_claimed`: the reason of
        each contract charged not-claimed (the features it needs)."""
        failed = next((c for c, v in charges.items()
                       if v is verdict and (v.is_failure or v is Verdict.XFAIL)), None)
        outcomes = {}
        for contract_id, charge in charges.items():
            if charge is Verdict.NOT_CLAIMED and not_claimed.get(contract_id):
                text = not_claimed[contract_id]
            elif charge is verdict:
                text = message
            elif charge is Verdict.INCONCLUSIVE and failed:
                text = (f"no evidence: the test stopped at {_article(verdict.value)} {verdict.value} charged to {failed} "
                        "before this contract's checks were done")
            elif charge is Verdict.NOT_CLAIMED:
                text = "not claimed: the backend does not claim a feature this contract needs"
            else:
                text = ""
            outcomes[contract_id] = (charge, text)
        return outcomes

    def build(self) -> list[model.ContractResult]:
        registry = self.session.registry
        by_contract: dict[str, list[model.TestResult]] = defaultdict(list)
        for test in self.tests.values():
            test = test.compacted()  # a copy: the recording goes on merging into the full entries
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
        from any folder."""
        return shlex.join([*rerun_options(self.session), f"--contract={contract_id}"])

    def optional_features(self) -> set[str]:
        return {f.name for f in self.session.registry.features.values() if f.optional}

    def provenance(self, started: float, duration: float) -> model.Provenance:
        # Collected once (it runs git and hashes files), then only timed again.
        from .provenance import collect, warnings_of

        if self._provenance is None:
            self._provenance = collect(self.session, started, duration)
        return dataclasses.replace(self._provenance, duration_s=round(duration, 3),
                                   warnings=warnings_of(self.session))

    def selection(self) -> dict:
        """provenance.selection: the tests the run selected (before a shard
        split) and what, if anything, narrowed the selection."""
        session = self.session
        return {"tests": len(session.selected_ids), "sha256": model.selection_digest(session.selected_ids),
                "operators": (options.value(session.config, "operators") or "default").strip(),
                "narrowed_by": list(session.narrowed_by)}

    def missing(self) -> list[str]:
        """Selected tests of this process's part of the run without a result
        (a run stopped by -x, --maxfail or an interrupt)."""
        session = self.session
        expected = set(session.selected_ids)
        if session.sharding is not None:
            expected = shard_mod.part(session.selected_ids, session.sharding.shard)
        return sorted(expected - {test.nodeid for test in self.tests.values()})

    def run(self, complete: bool, started: float, duration: float) -> model.Run:
        session = self.session
        self.results = self.build()
        provenance = dataclasses.replace(self.provenance(started, duration), selection=self.selection())
        if session.sharding is not None:
            provenance = dataclasses.replace(provenance, shard=session.sharding.record(list(self._decided())))
        run = model.Run(
            provenance=provenance,
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
            operators=list(self.operators.values()),
            level_requirements={k: list(v) for k, v in session.registry.level_requirements.items()},
        )
        self.reached = run.level_reached
        return run

    def finish(self, exitstatus: int, started: float, duration: float) -> None:
        if self.is_worker:
            return
        missing = self.missing()
        if missing and exitstatus in (0, 1):
            self.session.warnings.append(
                f"the run is incomplete: {len(missing)} selected test(s) have no result (the run stopped early, "
                f"e.g. -x or --maxfail), such as {missing[0]}")
        run = self.run(complete=exitstatus in (0, 1) and not missing, started=started, duration=duration)
        if self.report_dir:
            from privateuse1_conformance.reports import writer

            writer.write_all(self.report_dir, run)

    # ------------------------------------------------ incremental report

    def _write_partial(self) -> None:
        """Rewrite report.json with what has finished so far, marked
        incomplete: a run that is killed or crashes leaves it behind."""
        from privateuse1_conformance.reports import json_report, writer

        first = self._provenance is None  # its run() collects the provenance: not a writing cost
        began = time.monotonic()
        run = self.run(complete=False, started=self.started, duration=time.time() - self.started)
        if first:
            began = time.monotonic()
        try:
            writer.write_json(self.report_dir, json_report.to_document(run), compact=True)
        except OSError as e:
            # The run goes on; the final report is tried again (and fails loudly) at the end.
            warnings.warn(f"cannot update the report in {self.report_dir}: {e}", stacklevel=1)
            self._next_write = float("inf")
            return
        ended = time.monotonic()
        self._next_write = ended + max(WRITE_INTERVAL, (WRITE_SHARE - 1) * (ended - began))

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        from privateuse1_conformance.reports import writer

        writer.remove_renderings(self.report_dir)
        self._write_partial()  # even a run killed in its first test leaves a report

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        if time.monotonic() >= self._next_write:
            self._write_partial()

    # ----------------------------------------------------------- summary

    def _decided(self) -> dict[str, list[Verdict]]:
        """Expectations entry label -> the verdicts of the tests it decided
        (a contract entry does not decide a test that an entry of its own
        covers; an inconclusive test is no evidence either way)."""
        decided = {}
        for entry in self.session.expectations:
            verdicts = [t.verdict_for(entry.contract) for t in self.tests.values()
                        if entry.contract in t.contracts
                        and self.session.expectations.for_test(entry.contract, t.nodeid) is entry
                        and t.verdict_for(entry.contract) is not Verdict.INCONCLUSIVE]
            if verdicts:
                decided[entry.label] = verdicts
        return decided

    def stale_expectations(self) -> list[str]:
        return [label for label, verdicts in self._decided().items()
                if all(v in (Verdict.PASS, Verdict.XPASS) for v in verdicts)]

    def print_details(self, terminal) -> None:
        """What precedes pytest's own short summary: shared root causes,
        contracts without tests, stale expectations, warnings."""
        if self.is_worker or not self.results:
            return
        session = self.session
        causes = model.root_causes(self.results)
        if causes:
            terminal.section("PrivateUse1 conformance: shared root causes", sep="-")
            for group in causes:
                terminal.line(f"{group.verdict.value}, {len(group.tests)} tests ({', '.join(group.contracts)}): "
                              f"{group.cause}", red=group.verdict.is_failure)
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
        for warning in session.warnings:
            terminal.line(f"Warning: {warning}", yellow=True)

    def print_summary(self, terminal) -> None:
        """The last thing on the terminal: the verdict table, the level and
        every contract that blocks the next level, each with its message."""
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
        counts: dict[str, Counter] = defaultdict(Counter)
        not_run = []
        for result in self.results:
            verdict = result.verdict
            # No result: either no test declares the contract, or its tests
            # were not selected (--contract, --test, -k, --level).
            if verdict is None and result.contract.id in session.covered:
                not_run.append(result.contract.id)
            missing = "no test" if result.contract.id not in session.covered else "not run"
            counts[result.contract.area][verdict.value if verdict else missing] += 1
        # Only the verdicts that occur (pass always), so the table stays narrow.
        seen = {v for area_counts in counts.values() for v in area_counts}
        columns = [c for c in [v.value for v in Verdict] + ["not run", "no test"] if c == "pass" or c in seen]
        width = max(12, *(len(c) + 2 for c in columns))
        terminal.line(f"{'area':<18}" + "".join(f"{c:>{width}}" for c in columns))
        for area in session.registry.areas:
            if area in counts:
                terminal.line(f"{area:<18}" + "".join(f"{counts[area][c]:>{width}}" for c in columns))
        claimed = backend.manifest.claims
        terminal.line("")
        if self.report_dir:
            terminal.line(f"Reports: {os.path.abspath(self.report_dir)}")
        if session.sharding is not None:
            shard = session.sharding
            terminal.line(f"Shard {shard.shard}: {len(self.tests)} of the run's {shard.selected or 0} tests. The "
                          f"verdicts and the level below are this shard's; the run's are those of the report "
                          f"`privateuse1-conformance merge` makes of the {shard.shard.count} shards' reports.",
                          yellow=True)
        if session.narrowed_by:
            terminal.line(f"Narrowed run ({'; '.join(session.narrowed_by)}): the verdicts are the selected tests'; "
                          "it certifies no level.", yellow=True)
        elif not_run and session.sharding is None:
            terminal.line(f"Partial run: {len(not_run)} contract(s) were not run; the level below counts them as "
                          "not satisfied.", yellow=True)
        optional = self.optional_features()
        claimed_optional = model.claimed_optional_features(optional, session.unclaimed)
        terminal.line(
            f"Level reached: {self.reached or 'none'} · {len(claimed_optional)}/{len(optional)} optional features "
            f"claimed ({', '.join(claimed_optional) or 'none'})"
            + (f" (claimed level: {claimed})" if claimed else "")
            + f"; contracts checked up to: {session.level}"
        )
        for level in model.LEVELS[: model.LEVELS.index(session.level) + 1]:
            if self.reached and model.LEVELS.index(level) <= model.LEVELS.index(self.reached):
                continue
            blocking = [r for r in model.blocking_contracts(self.results, self.optional_features(), level)
                        if r.contract.id not in not_run]
            if not blocking:
                break
            terminal.line(f"Blocking {level} ({len(blocking)}):")
            for r in blocking:
                verdict = r.verdict.value if r.verdict else "no test"
                message = next((t.message_for(r.contract.id) for t in r.tests
                                if r.verdict and t.verdict_for(r.contract.id) is r.verdict), "")
                terminal.line(f"  {r.contract.id:<14} {verdict:<13} {one_line(message, 160)}",
                              red=bool(r.verdict and r.verdict.is_failure))
                for fix in known_fixes(r):
                    terminal.line(f"  {'':<14} {'':<13} known fix: {fix}")
            break
