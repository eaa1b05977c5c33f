"""The canonical JSON document of a run, its schema and its digest.

Every other format is rendered from this document (not from the model), so
that a reviewer can re-render, diff and verify a published report with
nothing but the JSON file. See docs/reports.md for the format.

The document holds no floating-point numbers (durations are integer
milliseconds): number formatting differs between JSON libraries, so without
them the canonical form (canonical_bytes) is easy to reproduce outside Python.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from .model import (LEVELS, UNDECIDED, ContractInfo, ContractResult, OperatorCell, OperatorResult, Provenance, Run,
                    TestResult, Verdict, claimed_optional_features, contract_satisfied, root_causes)
from .text import map_strings

FORMAT = "privateuse1-conformance-report"
FORMAT_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)   # older documents are read (diff, render), never written
SCHEMA_DIR = Path(__file__).resolve().parent / "schema"
SCHEMA_PATH = SCHEMA_DIR / f"report-{FORMAT_VERSION}.schema.json"
DIGEST_ALGORITHM = "sha256"
NO_TEST = "no-test"  # the verdict of a contract none of whose tests ran
VERDICTS = [v.value for v in Verdict] + [NO_TEST]

# Lone surrogates cannot be encoded as UTF-8 (a backend's message decoded
# with surrogateescape could hold some): they would make the document unwritable.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def _verdict_name(verdict: Verdict | None) -> str:
    return verdict.value if verdict else NO_TEST


def _count(verdicts: list[str]) -> dict[str, int]:
    counts = dict.fromkeys(VERDICTS, 0)
    for verdict in verdicts:
        counts[verdict] += 1
    return counts


# ------------------------------------------------------------- model -> document

def _test_document(test: TestResult, contract: str) -> dict[str, Any]:
    """A test as evidence about `contract`: its verdict and message are the
    ones it gave that contract (a test checking several contracts appears
    under each, with what it showed about each)."""
    return {
        "nodeid": test.nodeid,
        "contracts": list(test.contracts),
        "verdict": test.verdict_for(contract).value,
        "duration_ms": _ms(test.duration),
        "message": test.message_for(contract),
        "details": test.details,
        "rerun": test.rerun,
        "expectation": test.expectation,
        "cause": test.cause,
        "clause": test.clause,
        "step": test.step,
        "clauses": dict(sorted(test.clauses.items())),
        **({"fix": test.fix} if test.fix else {}),
    }


def _contract_message(result: ContractResult, verdict: Verdict | None, clauses: dict[str, str]) -> str:
    """The message of the (first) test that gave the contract its verdict;
    for a pass that needed a clause no check decided, that clause and why."""
    info = result.contract
    if verdict is Verdict.INCONCLUSIVE and result.tests_verdict is not Verdict.INCONCLUSIVE:
        undecided = [c for c, s in clauses.items() if s.startswith(UNDECIDED)]
        return "no check decided " + "; ".join(f"{c} ({clauses[c].removeprefix(UNDECIDED + ': ')})"
                                                for c in undecided)
    return next((t.message_for(info.id) for t in result.tests if t.verdict_for(info.id) is verdict), "")


def _contract_document(result: ContractResult, optional: set[str]) -> dict[str, Any]:
    info = result.contract
    tests = [_test_document(t, info.id) for t in result.tests]
    verdict = result.verdict
    clauses = result.clause_status()
    return {
        "id": info.id, "area": info.area, "level": info.level, "statement": info.statement,
        "source": info.source, "features": list(info.features),
        "unclaimed_features": list(result.unclaimed_features),
        "verdict": _verdict_name(verdict),
        "satisfied": contract_satisfied(result, optional),
        "clauses": clauses,
        "message": _contract_message(result, verdict, clauses),
        "rerun": result.rerun,
        "duration_ms": sum(t["duration_ms"] for t in tests),
        "tests": tests,
    }


def _operator_document(result: OperatorResult) -> dict[str, Any]:
    return {
        "name": result.name,
        "nodeid": result.nodeid,
        "verdict": result.verdict.value,
        "claimed": result.claimed,
        "cells": [{"dtype": cell.dtype, "verdict": cell.verdict.value,
                   "checks": {check: verdict.value for check, verdict in cell.checks.items()},
                   "messages": dict(cell.messages)} for cell in result.cells],
    }


def _operators_summary(operators: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of the operator matrix: operators by verdict, and cells by verdict."""
    return {
        "operators": len(operators),
        "claimed": sum(o["claimed"] for o in operators),
        "verdicts": _count([o["verdict"] for o in operators]),
        "cells": _count([c["verdict"] for o in operators for c in o["cells"]]),
    }


# The order people read provenance in (the renderings follow it).
PROVENANCE_ORDER = (
    "backend_name", "backend_requested", "backend_module", "backend_version", "backend_file", "device_type",
    "device_count", "kit_version", "kit_commit", "registry", "torch_version", "torch_build", "torch_cxx11_abi",
    "torch_git_version", "python", "packages", "platform", "command_line", "working_directory", "level_checked",
    "isolation", "workers", "timeout_ms", "manifest", "expectations", "seeds", "environment", "started", "duration_ms",
    "shard", "shards", "selection", "kit_files", "backend_files", "warnings",
)


def _provenance_document(provenance: Provenance) -> dict[str, Any]:
    fields = dataclasses.asdict(provenance)
    fields["timeout_ms"] = _ms(fields.pop("timeout_s"))
    fields["duration_ms"] = _ms(fields.pop("duration_s"))
    return {key: fields[key] for key in PROVENANCE_ORDER
            if not (key == "workers" and fields[key] is None)}  # (a report of an earlier kit: not recorded)


def _group_summary(contracts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "contracts": len(contracts),
        "satisfied": sum(c["satisfied"] for c in contracts),
        "verdicts": _count([c["verdict"] for c in contracts]),
    }


def _summary(run: Run, contracts: list[dict[str, Any]], operators: list[dict[str, Any]]) -> dict[str, Any]:
    """Summaries of the contract documents (built from their verdicts and
    satisfied flags, which model computed: the report is rewritten after
    every test, so nothing is computed twice)."""
    reached = run.level_reached
    areas = list(dict.fromkeys(c["area"] for c in contracts))  # registry order
    # A test may check several contracts: its own verdict is the worst it gave any.
    tests: dict[str, str] = {}
    for contract in contracts:
        for test in contract["tests"]:
            before = tests.get(test["nodeid"])
            if before is None or Verdict(test["verdict"]).severity > Verdict(before).severity:
                tests[test["nodeid"]] = test["verdict"]
    levels = []
    for rank, level in enumerate(LEVELS):
        levels.append({
            "level": level,
            **_group_summary([c for c in contracts if c["level"] == level]),
            "reached": reached is not None and rank <= LEVELS.index(reached),
            # What model.blocking_contracts returns, from the flags already computed.
            "blocking": [c["id"] for c in contracts if LEVELS.index(c["level"]) <= rank and not c["satisfied"]],
        })
    claimed = [c for c in contracts if c["verdict"] != Verdict.NOT_CLAIMED.value]
    return {
        "level_reached": reached,
        "claimed_level": run.claimed_level,
        # A shard certifies nothing alone: only the merged set of shards does.
        "certifies": run.complete and not run.narrowed_by and run.provenance.shard is None,
        "level_requirements": {level: list(features) for level, features in run.level_requirements.items()},
        "claimed_optional_features": claimed_optional_features(run.optional_features, run.unclaimed_features),
        "claimed_contracts": len(claimed),
        "claimed_satisfied": sum(c["satisfied"] for c in claimed),
        **_group_summary(contracts),
        "test_verdicts": _count(list(tests.values())),
        "levels": levels,
        "areas": [{"area": area, **_group_summary([c for c in contracts if c["area"] == area])} for area in areas],
        "unclaimed_features": list(run.unclaimed_features),
        "optional_features": list(run.optional_features),
        "uncovered": list(run.uncovered),
        "stale_expectations": list(run.stale_expectations),
        "root_causes": [
            {"cause": group.cause, "verdict": group.verdict.value, "tests": group.tests, "contracts": group.contracts}
            for group in root_causes(run.contracts)
        ],
        "operators": _operators_summary(operators),
    }


def to_document(run: Run) -> dict[str, Any]:
    """The canonical document of `run`, sealed with its digest."""
    optional = set(run.optional_features)
    contracts = [_contract_document(r, optional) for r in run.contracts]
    operators = [_operator_document(o) for o in run.operators]
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "complete": run.complete,
        "provenance": _provenance_document(run.provenance),
        "summary": _summary(run, contracts, operators),
        "contracts": contracts,
        "operators": operators,
    }
    try:
        return seal(document)
    except UnicodeEncodeError:  # rare: walk the document only then (it is rewritten after every test)
        return seal(map_strings(document, lambda text: _LONE_SURROGATE.sub("\ufffd", text)))


# ------------------------------------------------------------- document -> model

def from_document(document: dict[str, Any]) -> Run:
    """The run a (schema-valid) document describes. Derived fields (contract
    verdicts, summaries, the digest) are not read: they are recomputed by
    to_document, which is how `verify` detects a forged summary."""
    provenance = dict(document["provenance"])
    provenance["timeout_s"] = provenance.pop("timeout_ms") / 1000
    provenance["duration_s"] = provenance.pop("duration_ms") / 1000
    info_fields = [f.name for f in dataclasses.fields(ContractInfo)]
    contracts = []
    tests_by_id: dict[str, TestResult] = {}  # one object per test, whatever contracts it checked
    for entry in document["contracts"]:
        tests = []
        for t in entry["tests"]:
            test = tests_by_id.get(t["nodeid"])
            if test is None:
                test = tests_by_id[t["nodeid"]] = TestResult(
                    nodeid=t["nodeid"], contracts=list(t["contracts"]), verdict=Verdict(t["verdict"]),
                    duration=t["duration_ms"] / 1000, message=t["message"], details=t["details"],
                    rerun=t["rerun"], expectation=t["expectation"], cause=t.get("cause", ""),
                    clause=t.get("clause", ""), step=t.get("step", ""), clauses=dict(t.get("clauses", {})),
                    fix=t.get("fix", ""))
            verdict = Verdict(t["verdict"])
            test.verdicts[entry["id"]] = verdict
            test.messages[entry["id"]] = t["message"]
            if verdict.severity > test.verdict.severity:
                test.verdict, test.message = verdict, t["message"]
            tests.append(t["nodeid"])
        contracts.append((entry, tests))
    compact = {nodeid: test.compacted() for nodeid, test in tests_by_id.items()}
    contracts = [
        ContractResult(
            contract=ContractInfo(**{name: list(entry.get(name, ())) if name == "clauses" else entry[name]
                                     for name in info_fields}),
            tests=[compact[nodeid] for nodeid in tests], unclaimed_features=list(entry["unclaimed_features"]),
            rerun=entry["rerun"],
        )
        for entry, tests in contracts
    ]
    operators = [
        OperatorResult(entry["name"], entry["nodeid"], [
            OperatorCell(cell["dtype"], {check: Verdict(v) for check, v in cell["checks"].items()},
                         dict(cell["messages"]))
            for cell in entry["cells"]])
        for entry in document.get("operators", [])  # (format 3)
    ]
    summary = document["summary"]
    return Run(
        provenance=Provenance(**provenance),
        contracts=contracts,
        optional_features=list(summary["optional_features"]),
        unclaimed_features=list(summary["unclaimed_features"]),
        claimed_level=summary["claimed_level"],
        complete=document["complete"],
        uncovered=list(summary["uncovered"]),
        stale_expectations=list(summary["stale_expectations"]),
        operators=operators,
        level_requirements={k: list(v) for k, v in summary.get("level_requirements", {}).items()},  # (format 5)
    )


# ------------------------------------------------------------- canonical form, digest

def canonical_bytes(document: dict[str, Any]) -> bytes:
    """The canonical form: the document without its top-level "digest" member,
    as compact JSON with keys sorted by code point and non-ASCII characters
    written as themselves, encoded as UTF-8."""
    body = {k: v for k, v in document.items() if k != "digest"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def compute_digest(document: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_bytes(document)).hexdigest()


def seal(document: dict[str, Any]) -> dict[str, Any]:
    """Set (or replace) the document's digest; returns the document."""
    document.pop("digest", None)
    document["digest"] = {"algorithm": DIGEST_ALGORITHM, "value": compute_digest(document)}
    return document


def digest_problem(document: dict[str, Any]) -> str | None:
    """Why the stored digest does not match the document, or None if it does."""
    stored = document.get("digest")
    if not isinstance(stored, dict) or stored.get("algorithm") != DIGEST_ALGORITHM:
        return f"the document has no {DIGEST_ALGORITHM} digest"
    actual = compute_digest(document)
    if stored.get("value") != actual:
        return (f"digest mismatch: the document was changed after it was written "
                f"(stored {stored.get('value')}, computed {actual})")
    return None


# ------------------------------------------------------------- reading, schema

def dumps(document: dict[str, Any], indent: int | None = 1) -> str:
    """The text of report.json: indented for people, or compact (four times
    faster: for the reports rewritten during a run). The digest does not
    depend on the layout."""
    separators = None if indent else (",", ":")
    return json.dumps(document, indent=indent, separators=separators, ensure_ascii=False, allow_nan=False) + "\n"


def load(path: str | Path) -> dict[str, Any]:
    """Read a report; raises ValueError if it is not a JSON object."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}") from e
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a JSON object")
    return document


@lru_cache(maxsize=None)
def schema(version: int = FORMAT_VERSION) -> dict[str, Any]:
    return json.loads((SCHEMA_DIR / f"report-{version}.schema.json").read_text(encoding="utf-8"))


def schema_problems(document: dict[str, Any]) -> list[str]:
    """Every violation of the published schema of the document's format
    version, as 'where: what' lines."""
    import jsonschema

    version = document.get("format_version")
    if version not in READABLE_VERSIONS:
        return [f"schema: format_version: {version!r} is not one this kit reads ({READABLE_VERSIONS})"]
    validator = jsonschema.Draft202012Validator(schema(version))
    problems = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path))):
        where = "/".join(str(p) for p in error.absolute_path) or "(document)"
        problems.append(f"schema: {where}: {error.message[:300]}")
    return problems
