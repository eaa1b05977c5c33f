"""The operators area: every claimed OpInfo operator, checked against the CPU.

One test per OpInfo entry (``test_operator[add]``), each in its own forked
process like every test of the suite: a crash or a hang costs that operator
only, and is charged to the check (and dtype) it happened in. The checks
are conformance/_opinfo.py's; the entries come from ``--operators`` (the
default subset, ``all``, or names and patterns) and the claims from the
manifest's ``[operators]`` table (harness/operators.py, docs/operators.md).

A test whose process crashes goes on in a fresh process after the dtype
it crashed in, so a crash costs that dtype's remaining checks, not the
operator's other dtypes. A test's outcome per contract is the worst over
its checks of that contract: a wrong forward result fails OP-INFO-001 while the same
operator's gradients may pass OP-INFO-003. Each (dtype, check) cell goes
to the report's operator matrix.
"""

from __future__ import annotations

import pytest

from privateuse1_conformance.harness import evidence
from privateuse1_conformance.harness.evidence import Violation, decided, inconclusive, not_applicable
from privateuse1_conformance.harness.operators import (CELLS_PROPERTY, DEFAULT_SET_CLAUSE, OUTCOMES_PROPERTY, default_set_refusal,
                                                      in_default_set)

from . import _opinfo

CONTRACTS = ("OP-INFO-001", "OP-INFO-002", "OP-INFO-003", "OP-INFO-004")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "opinfo_key" in metafunc.fixturenames:
        session = metafunc.config.pluginmanager.get_plugin("privateuse1-conformance-session")
        metafunc.parametrize("opinfo_key", session.operator_keys(CONTRACTS) if session else [])


# decides OP-INFO-001.1
# decides OP-INFO-001.2
# decides OP-INFO-001.4
# decides OP-INFO-002.1
# decides OP-INFO-002.2
# decides OP-INFO-002.3
# decides OP-INFO-003.1
# decides OP-INFO-004.1
# checks OP-INFO-001.3 for the default set's operators (default_set_claimed)
@pytest.mark.contract(*CONTRACTS)
def test_operator(opinfo_key: str, session, request) -> None:
    """All checks of one OpInfo entry, for every claimed dtype the CPU supports."""
    op = session.operator(opinfo_key)
    claims = session.backend.manifest.operators
    dtypes = []
    not_claimed = {}
    for dtype in sorted(op.supported_dtypes("cpu"), key=str):
        name = _opinfo.dtype_name(dtype)
        reason = claims.excluded(opinfo_key, op.name, name)
        if reason:
            not_claimed[name] = reason
        else:
            dtypes.append(dtype)
    check = _opinfo.OperatorCheck(op, session.backend.device_type, dtypes, derived=claims.derived,
                                  backward=claims.backward, device_count=session.device_count)
    # After a crash of an earlier process of this test, go on after the
    # dtype it crashed in (harness/plugin.py's _go_on_after_crash).
    resumed = evidence.resumed(CELLS_PROPERTY)
    report = check.run(resumed["cells"] if resumed else None)
    for name, reason in not_claimed.items():
        report.cells[name] = {"forward": _opinfo.Outcome("not-claimed", reason)}
    request.node.user_properties.append((CELLS_PROPERTY, report.property()))
    outcomes = per_contract(report)
    if in_default_set(opinfo_key, op.name):
        refusal = default_set_claimed(report, not_claimed, claims)
        if refusal:
            outcomes["OP-INFO-001"] = ["fail", default_set_refusal(opinfo_key, refusal), DEFAULT_SET_CLAUSE]
    request.node.user_properties.append((OUTCOMES_PROPERTY, outcomes))
    failed = [(c, o) for c, o in outcomes.items() if o[0] in ("fail", "error")]
    if failed:
        contract, (verdict, message, clause) = failed[0]
        more = f" (and {len(failed) - 1} more contract(s) of this operator failed)" if len(failed) > 1 else ""
        if verdict == "fail":
            raise Violation(message + more, contract, clause)
        raise OperatorError(message + more)
    if all(o[0] == "inconclusive" for o in outcomes.values()):
        inconclusive(next((o.message for checks in report.cells.values() for o in checks.values()
                           if o.verdict == "not-claimed"), "no check of this operator had a sample to compare"))


def default_set_claimed(report: _opinfo.OperatorReport, not_claimed: dict[str, str], claims) -> str | None:
    """OP-INFO-001.3 for an operator of the default set: None when the
    backend claims it (some dtype it ran, or none of its dtypes among the
    manifest's [operators] dtypes, which the backend claims for no operator),
    else why it is not claimed."""
    ran = [dtype for dtype, checks in report.cells.items() if dtype not in (_opinfo.ERRORS_DTYPE,)
           and any(o.verdict != "not-claimed" for o in checks.values())]
    if ran:
        decided(DEFAULT_SET_CLAUSE)
        return None
    if not report.cells and not not_claimed:
        not_applicable(DEFAULT_SET_CLAUSE, f"{report.name} has no dtype the CPU supports (a variant for other devices)")
        return None
    if not_claimed and claims.dtypes is not None and all(
            reason.endswith("is not among the manifest's [operators] dtypes") for reason in not_claimed.values()):
        not_applicable(DEFAULT_SET_CLAUSE, f"{report.name} has no dtype among the manifest's [operators] dtypes")
        return None
    reasons = [o.message for checks in report.cells.values() for o in checks.values() if o.verdict == "not-claimed"]
    reasons += [r for r in not_claimed.values() if not r.endswith("is not among the manifest's [operators] dtypes")]
    return next(iter(reasons), "no dtype of it was claimed")


class OperatorError(RuntimeError):
    """A check of the operator could not reach a verdict (its samples could not be made on the device)."""


def per_contract(report: _opinfo.OperatorReport) -> dict[str, list]:
    """contract -> [verdict, message, clause] over its checks' outcomes: the
    first failure or error (the worse first), else pass when some check
    passed, else inconclusive (nothing claimed, or no sample was evidence)."""
    outcomes = {contract: ["inconclusive", "", ""] for contract in CONTRACTS}
    rank = {"inconclusive": 0, "pass": 1, "error": 2, "fail": 3}
    for checks in report.cells.values():
        for check, outcome in checks.items():
            clause = _opinfo.CHECKS[check][0]
            contract = clause.split(".")[0]
            verdict = outcome.verdict if outcome.verdict in rank else "inconclusive"
            if rank[verdict] > rank[outcomes[contract][0]]:
                outcomes[contract] = [verdict, outcome.message if verdict != "pass" else "", clause]
            elif outcome.verdict == "not-claimed" and outcomes[contract] == ["inconclusive", "", ""]:
                outcomes[contract] = ["inconclusive", f"not claimed: {outcome.message}", clause]
    return outcomes
