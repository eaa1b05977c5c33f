"""The result model of a conformance run: verdicts, per-test and per-contract
results, and the level a backend reached.

Everything in ``reports`` is computed from these objects; the harness fills
them in. This module imports nothing from the kit and nothing from pytest.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from enum import Enum

LEVELS = ("core", "standard", "full")


class Verdict(str, Enum):
    """The outcome of one test, or of one contract (the worst of its tests)."""

    PASS = "pass"
    FAIL = "fail"            # the backend broke the contract
    ERROR = "error"          # the check could not reach a verdict (unexpected exception)
    CRASH = "crash"          # the test process died (signal or abnormal exit)
    HANG = "hang"            # the test exceeded its time limit and was killed
    NOT_CLAIMED = "not-claimed"  # the manifest declares a needed feature absent
    XFAIL = "xfail"          # failed, as the expectations file says it would
    XPASS = "xpass"          # passed although the expectations file says it fails
    SKIP = "skip"            # could not run here (reason given)
    INCONCLUSIVE = "inconclusive"  # no evidence about the contract: the test stopped at another
                                   # contract's failure first, or needs what the backend lacks


    @property
    def severity(self) -> int:
        """Higher is worse; a contract takes its worst test's verdict."""
        return _SEVERITY[self]

    @property
    def satisfies(self) -> bool:
        """Whether the contract counts as met (pass, or pass despite an expectation)."""
        return self in (Verdict.PASS, Verdict.XPASS)

    @property
    def is_failure(self) -> bool:
        return self in (Verdict.FAIL, Verdict.ERROR, Verdict.CRASH, Verdict.HANG)


_SEVERITY = {
    Verdict.PASS: 0,
    Verdict.INCONCLUSIVE: 1,   # within one test: worse than a pass (the checks did not all run)
    Verdict.XPASS: 2,
    Verdict.SKIP: 3,
    Verdict.NOT_CLAIMED: 4,
    Verdict.XFAIL: 5,
    Verdict.ERROR: 6,
    Verdict.FAIL: 7,
    Verdict.HANG: 8,
    Verdict.CRASH: 9,
}


def worst(verdicts: list[Verdict]) -> Verdict | None:
    return max(verdicts, key=lambda v: v.severity) if verdicts else None


@dataclass
class TestResult:
    """One test. A test may check several contracts; its evidence about each
    is `verdict_for(contract)`: a failure is charged to the one contract
    whose check failed, and the others get what the test showed about them
    (a pass, or inconclusive when it stopped before their checks ran)."""

    nodeid: str
    contracts: list[str]
    verdict: Verdict         # the test's own verdict: the worst of its contracts'
    duration: float = 0.0
    message: str = ""        # what went wrong, in one line or a few: the assertion, the
                             # exception, the crash signal, the hang timeout, the skip reason
    details: str = ""        # the full report: traceback, crash output, thread dump
    rerun: str = ""          # a command that reruns just this test
    expectation: str = ""    # the expectations file's reason, when it applied
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # per contract, where not `verdict`
    messages: dict[str, str] = field(default_factory=dict)      # per contract, where not `message`
    cause: str = ""          # the underlying error, the same text for every test it broke
    clause: str = ""         # the clause of the statement whose check failed (e.g. DM-SET-001.2)
    step: str = ""           # where in a multi-step test it happened (a state machine's rule and step)
    # What the test found about each clause it checked (ID.k -> DECIDED, "n/a: <why>" or
    # "undecided: <why>"; format 5): see ContractResult.clause_status.
    clauses: dict[str, str] = field(default_factory=dict)
    # A known fix for the failure's symptom (the registry's known_fix): what to
    # change, and where the kit's vendor guide explains it (format 5, optional).
    fix: str = ""

    def verdict_for(self, contract: str) -> Verdict:
        return self.verdicts.get(contract, self.verdict)

    def message_for(self, contract: str) -> str:
        return self.messages.get(contract, self.message)

    def compacted(self) -> TestResult:
        """A copy whose per-contract entries are only those that differ from
        the test's own verdict and message (the canonical form)."""
        verdicts, messages = {}, {}
        for contract in self.contracts:
            verdict, message = self.verdict_for(contract), self.message_for(contract)
            if verdict is not self.verdict or message != self.message:
                verdicts[contract], messages[contract] = verdict, message
        return replace(self, verdicts=verdicts, messages=messages)


DECIDED = "decided"
NOT_APPLICABLE = "n/a"
UNDECIDED = "undecided"


@dataclass
class ContractInfo:
    id: str
    area: str
    level: str
    statement: str
    source: str
    features: list[str] = field(default_factory=list)
    # The clauses of the statement a pass needs decided (every clause that has a check; format 5).
    clauses: list[str] = field(default_factory=list)


@dataclass
class ContractResult:
    contract: ContractInfo
    tests: list[TestResult] = field(default_factory=list)
    unclaimed_features: list[str] = field(default_factory=list)
    rerun: str = ""          # a command that reruns just this contract's tests

    @property
    def tests_verdict(self) -> Verdict | None:
        """Worst verdict of the contract's tests, counting only the tests that
        are evidence about it (inconclusive ones count only if all are);
        None if no test ran."""
        verdicts = [t.verdict_for(self.contract.id) for t in self.tests]
        return worst([v for v in verdicts if v is not Verdict.INCONCLUSIVE] or verdicts)

    @property
    def verdict(self) -> Verdict | None:
        """The tests' verdict, except that a pass needs every clause of the
        contract decided or not applicable (clause_status): a clause whose
        checks all were inconclusive, could not observe, or did not run
        leaves the contract inconclusive."""
        verdict = self.tests_verdict
        if verdict in (Verdict.PASS, Verdict.XPASS) and self.undecided():
            return Verdict.INCONCLUSIVE
        return verdict

    def clause_status(self) -> dict[str, str]:
        """Each required clause -> DECIDED (a check of it ran in a test that
        passed, or that was inconclusive only after it), "undecided: <why>"
        (no check decided it and one could not observe it: that outranks
        another test's finding that the clause does not apply, which may come
        from a test that merely mentions it), "n/a: <why>" (no check decided
        it and a check found it does not apply to the backend), or
        undecided because no check of it ran to the end."""
        status = {}
        evidence = [t for t in self.tests if t.verdict_for(self.contract.id) in (
            Verdict.PASS, Verdict.XPASS, Verdict.INCONCLUSIVE)]
        if self.tests and all(t.verdict_for(self.contract.id) is Verdict.NOT_CLAIMED for t in self.tests):
            return {clause: f"{NOT_APPLICABLE}: not claimed" for clause in self.contract.clauses}
        for clause in self.contract.clauses:
            found = [t.clauses.get(clause, "") for t in self.tests]
            if any(t.clauses.get(clause) == DECIDED for t in evidence):
                status[clause] = DECIDED
            elif any(f.startswith(UNDECIDED) for f in found):
                status[clause] = next(f for f in found if f.startswith(UNDECIDED))
            elif any(f.startswith(NOT_APPLICABLE) for f in found):
                status[clause] = next(f for f in found if f.startswith(NOT_APPLICABLE))
            else:
                status[clause] = f"{UNDECIDED}: no check of it ran to the end in a test that passed"
        return status

    def undecided(self) -> list[str]:
        return [c for c, s in self.clause_status().items() if s.startswith(UNDECIDED)]


def contract_satisfied(result: ContractResult, optional_features: set[str]) -> bool:
    """Whether a contract counts towards its level.

    A pass counts. A not-claimed contract counts only if every feature that
    made it not-claimed is optional (see the registry's [features]).
    Expected failures never count.
    """
    verdict = result.verdict
    if verdict is None:
        return False
    if verdict.satisfies:
        return True
    if verdict is Verdict.NOT_CLAIMED:
        return bool(result.unclaimed_features) and all(
            f in optional_features for f in result.unclaimed_features
        )
    return False


def level_reached(results: list[ContractResult], optional_features: set[str],
                  requirements: dict[str, list[str]] | None = None,
                  unclaimed_features: set[str] | frozenset = frozenset()) -> str | None:
    """The highest level whose contracts, and those of the levels below, are
    all satisfied, and whose requirement (`requirements`: level -> optional
    features of which the backend must claim at least one, e.g. full needs
    AMP or torch.compile) is met; None if not even core is."""
    reached = None
    for level in LEVELS:
        rank = LEVELS.index(level)
        # A level none of whose contracts were checked (a run with --level
        # below it) is not reached, however well the levels below went.
        if not any(r.contract.level == level for r in results):
            break
        relevant = [r for r in results if LEVELS.index(r.contract.level) <= rank]
        if not all(contract_satisfied(r, optional_features) for r in relevant):
            break
        if not requirement_met(level, requirements, unclaimed_features):
            break
        reached = level
    return reached


def requirement_met(level: str, requirements: dict[str, list[str]] | None, unclaimed_features) -> bool:
    """Whether the backend claims one of the features `level` requires one
    of (no requirement: met)."""
    needed = (requirements or {}).get(level)
    return not needed or not set(needed) <= set(unclaimed_features)


def claimed_optional_features(optional_features, unclaimed_features) -> list[str]:
    """The optional features the backend claims (declares present)."""
    return sorted(set(optional_features) - set(unclaimed_features))


def blocking_contracts(
    results: list[ContractResult], optional_features: set[str], level: str
) -> list[ContractResult]:
    """Contracts of `level` (and below) that keep the backend from reaching it."""
    rank = LEVELS.index(level)
    return [
        r
        for r in results
        if LEVELS.index(r.contract.level) <= rank and not contract_satisfied(r, optional_features)
    ]


@dataclass
class RootCause:
    """One underlying error and everything it broke."""

    cause: str
    verdict: Verdict             # the worst verdict it caused
    tests: list[str]             # node IDs, in run order
    contracts: list[str]         # the contracts those failures were charged to


def root_causes(results: list[ContractResult], minimum: int = 2) -> list[RootCause]:
    """Failures that share one cause (one missing kernel failing twenty
    checks), largest group first: causes of at least `minimum` failing tests."""
    groups: dict[str, RootCause] = {}
    seen: set[tuple[str, str]] = set()
    for result in results:
        contract = result.contract.id
        for test in result.tests:
            verdict = test.verdict_for(contract)
            if not verdict.is_failure or not test.cause:
                continue
            group = groups.setdefault(test.cause, RootCause(test.cause, verdict, [], []))
            if (test.nodeid, test.cause) not in seen:
                seen.add((test.nodeid, test.cause))
                group.tests.append(test.nodeid)
            if contract not in group.contracts:
                group.contracts.append(contract)
            if verdict.severity > group.verdict.severity:
                group.verdict = verdict
    shared = [g for g in groups.values() if len(g.tests) >= minimum]
    return sorted(shared, key=lambda g: (-len(g.tests), -g.verdict.severity, g.cause))


def evidence_verdict(verdicts: list[Verdict]) -> Verdict | None:
    """The worst of `verdicts` that are evidence (neither skip nor
    inconclusive); the worst of all when none is; None for none."""
    return worst([v for v in verdicts if v not in (Verdict.SKIP, Verdict.INCONCLUSIVE)] or verdicts)


@dataclass
class OperatorCell:
    """One dtype of one operator in the operator matrix: each check's verdict
    (forward, layout, noncontiguous, out, out-device, inplace, backward, errors: see
    docs/operators.md) and, where it is not a pass, why."""

    dtype: str                 # "float32"; "any" for the error checks; "all" when the whole operator is unclaimed
    checks: dict[str, Verdict]
    messages: dict[str, str] = field(default_factory=dict)

    @property
    def verdict(self) -> Verdict:
        """The worst check that was evidence; skip when none was."""
        return evidence_verdict(list(self.checks.values())) or Verdict.SKIP


@dataclass
class OperatorResult:
    """One operator (an OpInfo entry) of the operators area: its test and its
    dtype cells. The test's verdicts per contract are in the contract results;
    the matrix says which dtypes and checks they come from."""

    name: str
    nodeid: str
    cells: list[OperatorCell] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return evidence_verdict([c.verdict for c in self.cells]) or Verdict.SKIP

    @property
    def claimed(self) -> bool:
        """Whether the backend claims any dtype of the operator."""
        return any(c.verdict is not Verdict.NOT_CLAIMED for c in self.cells)


@dataclass
class Provenance:
    """Where a result comes from: enough to reproduce and to trust it."""

    kit_version: str
    kit_commit: str | None
    torch_version: str
    torch_build: str            # "cpu" or "cuda <version>" etc.
    torch_cxx11_abi: bool
    python: str
    platform: str
    backend_requested: str
    backend_module: str
    backend_version: str | None
    device_type: str
    device_count: int
    command_line: list[str]
    level_checked: str
    isolation: str
    timeout_s: float
    seeds: dict[str, str] = field(default_factory=dict)
    manifest: dict[str, str] | None = None       # {"path", "sha256"}
    expectations: dict[str, str] | None = None   # {"path", "sha256"}
    started: str = ""                            # ISO 8601, UTC
    duration_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    backend_name: str = ""                       # the manifest's name, else the distribution's, else the module's
    backend_file: str = ""                       # where the backend module was imported from
    torch_git_version: str = ""
    registry: dict[str, str] | None = None       # the contract registry used: {"path", "sha256"}
    packages: dict[str, str] = field(default_factory=dict)     # versions of the tools that ran it
    environment: dict[str, str] = field(default_factory=dict)  # variables that steer torch / the backend
    working_directory: str = ""                  # relative paths on the command line are relative to it
    shard: dict | None = None                    # a shard's run (--shard K/N): ShardRecord fields (format 4)
    shards: list[dict] = field(default_factory=list)  # a merged report: one record per shard (format 4)
    # The tests the run selected (format 5): {"tests", "sha256" (selection_digest), "operators" (the
    # --operators value), "narrowed_by" (what selected part of the suite: a narrowed run certifies nothing)}.
    selection: dict | None = None
    # sha256 of every file of the kit that ran and of the backend (its Python files and binaries),
    # by path relative to the kit's package / the backend's package (format 5).
    kit_files: dict[str, str] = field(default_factory=dict)
    backend_files: dict[str, str] = field(default_factory=dict)
    # How many processes ran tests at once (pytest-xdist's workers; format 5, absent from earlier kits' reports).
    workers: int | None = None


def selection_digest(test_ids) -> str:
    """The sha256 of a set of test IDs: sorted by code point, one per line.
    A shard's run records it for the tests of the whole run (before the
    split); the merged report's tests must have it (reports/merge.py)."""
    return hashlib.sha256("".join(f"{t}\n" for t in sorted(set(test_ids))).encode("utf-8")).hexdigest()


@dataclass
class Run:
    provenance: Provenance
    contracts: list[ContractResult]
    optional_features: list[str]
    unclaimed_features: list[str]
    claimed_level: str | None
    complete: bool                # False while running, or if the run was cut short
    uncovered: list[str] = field(default_factory=list)
    stale_expectations: list[str] = field(default_factory=list)
    operators: list[OperatorResult] = field(default_factory=list)   # the operator matrix, in run order
    # Level -> optional features of which the backend must claim one to reach it (format 5).
    level_requirements: dict[str, list[str]] = field(default_factory=dict)

    @property
    def narrowed_by(self) -> list[str]:
        """What selected only part of the suite (empty for a whole run;
        reports written before format 5 record nothing)."""
        return list((self.provenance.selection or {}).get("narrowed_by", []))

    @property
    def level_reached(self) -> str | None:
        """The level the run shows; none for a narrowed run, which
        certifies nothing whatever its verdicts, nor for one cut short (the
        tests that did not run decide nothing)."""
        if self.narrowed_by or not self.complete:
            return None
        return level_reached(self.contracts, set(self.optional_features), self.level_requirements,
                             set(self.unclaimed_features))
