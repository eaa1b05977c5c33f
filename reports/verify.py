"""Verifying a published report, in the spirit of Khronos' verify_submission:
a reviewer runs it on the vendor's report.json with the kit's own registry.

A report verifies for level L when
1. it is valid against the published schema;
2. its digest matches (nothing was edited after the run);
3. it is self-consistent: every derived field (contract verdicts, messages,
   summaries, the level reached) is what the kit computes from the test
   results, so a re-sealed edit of a summary is caught;
4. the run is complete;
5. the provenance is complete (REQUIRED_PROVENANCE present and not empty);
6. it is the report of a whole run: not one shard's (``--shard K/N``), and,
   when merged from shards, every shard 1..N is listed once and the tests
   are exactly the ones the shards' run selected (the sha256 of their IDs);
7. every active contract of the verifier's registry up to L is present
   exactly once and satisfied: pass or xpass, or not-claimed where every
   unclaimed feature is one the contract needs and the registry marks
   optional — exactly what model.level_reached requires. No unknown or
   duplicated contract appears.

Levels, areas and optional features come from the registry given to
verify(), never from the report. This module knows no registry format: the
caller passes the contracts (harness/cli.py loads the kit's registry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from . import json_report
from .model import LEVELS, ContractInfo, ContractResult, TestResult, Verdict, contract_satisfied, selection_digest
from .text import one_line, single_line

REQUIRED_PROVENANCE = (
    "kit_version", "torch_version", "torch_build", "python", "platform", "backend_requested", "backend_name",
    "backend_module", "backend_version", "device_type", "command_line", "level_checked", "isolation",
    "started", "registry",
)
SHOWN_DIFFERENCES = 10


@dataclass
class Verification:
    level: str | None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # worth a reviewer's look, not failures

    @property
    def ok(self) -> bool:
        return not self.problems


def _differences(expected: Any, actual: Any, path: str = "") -> Iterator[str]:
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in dict.fromkeys([*expected, *actual]):
            yield from _differences(expected.get(key), actual.get(key), f"{path}/{key}")
    elif isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for index, (e, a) in enumerate(zip(expected, actual)):
            yield from _differences(e, a, f"{path}/{index}")
    elif expected != actual or type(expected) is not type(actual):
        yield f"{path or '/'}: recorded {_short(actual)}, computed {_short(expected)}"


def _short(value: Any) -> str:
    return one_line(repr(value), 80)


def _consistency_problems(document: dict[str, Any]) -> list[str]:
    recomputed = json_report.to_document(json_report.from_document(document))
    differences = list(_differences(
        {k: v for k, v in recomputed.items() if k != "digest"},
        {k: v for k, v in document.items() if k != "digest"}))
    problems = [f"inconsistent: {d}" for d in differences[:SHOWN_DIFFERENCES]]
    if len(differences) > SHOWN_DIFFERENCES:
        problems.append(f"inconsistent: {len(differences) - SHOWN_DIFFERENCES} more differences")
    return problems


def _provenance_problems(provenance: dict[str, Any]) -> list[str]:
    problems = []
    for key in REQUIRED_PROVENANCE:
        value = provenance.get(key)
        if value in (None, "", [], {}) or value == "unknown":
            problems.append(f"provenance: {key} is missing or empty")
    return problems


def _shard_problems(document: dict[str, Any]) -> list[str]:
    """A shard's report is part of a run, never a run; a merged report must
    hold every shard once and exactly the tests the shards' run selected."""
    provenance = document["provenance"]
    shard = provenance.get("shard")  # (format 4)
    if shard:
        return [f"the report of shard {shard['index']} of {shard['count']} is part of a run, not a run: merge the "
                f"{shard['count']} shards' reports (privateuse1-conformance merge) and verify that"]
    records = provenance.get("shards") or []
    if not records:
        return []
    problems = []
    count = records[0]["count"]
    indices = [r["index"] for r in records]
    if indices != list(range(1, count + 1)) or any(r["count"] != count for r in records):
        problems.append(f"shards: expected shards 1..{count} of {count} once each, in order; the report lists "
                        + ", ".join(f"{r['index']}/{r['count']}" for r in records))
    for key in ("selected", "selection_sha256"):
        if len({r[key] for r in records}) > 1:
            problems.append(f"shards: the shards disagree on {key}")
    tests = list(dict.fromkeys(t["nodeid"] for c in document["contracts"] for t in c["tests"]))
    if sum(r["tests"] for r in records) != len(tests):
        problems.append(f"shards: the shards ran {sum(r['tests'] for r in records)} tests, the report holds "
                        f"{len(tests)}")
    first = records[0]
    if len(tests) != first["selected"] or selection_digest(tests) != first["selection_sha256"]:
        problems.append(f"shards: the report's {len(tests)} tests are not the {first['selected']} tests the "
                        "shards' run selected (their sha256 differs from selection_sha256)")
    return problems


def _contract_problem(entry: dict[str, Any], contract: ContractInfo, optional: set[str], level: str) -> str | None:
    """Why the report's entry for a mandatory contract does not satisfy it, if it does not."""
    if (entry["area"], entry["level"]) != (contract.area, contract.level):
        return (f"{contract.id}: recorded as {entry['area']}/{entry['level']}, the registry says "
                f"{contract.area}/{contract.level}")
    unclaimed = entry["unclaimed_features"]
    if not set(unclaimed) <= set(contract.features):
        return f"{contract.id}: not-claimed for features it does not need: {', '.join(unclaimed)}"
    tests = [TestResult(t["nodeid"], t["contracts"], Verdict(t["verdict"])) for t in entry["tests"]]
    if contract_satisfied(ContractResult(contract, tests, list(unclaimed)), optional):
        return None
    verdict = entry["verdict"]
    why = f" ({one_line(entry['message'], 160)})" if entry["message"] else ""
    if verdict == Verdict.NOT_CLAIMED.value:
        mandatory = sorted(set(unclaimed) - optional)
        if mandatory:
            why = f" (the feature{'s' if len(mandatory) > 1 else ''} {', '.join(mandatory)} " \
                  f"{'are' if len(mandatory) > 1 else 'is'} not optional for the level)"
        else:
            why = " (its tests were not run for a feature the backend does not claim, but the report names no " \
                  "unclaimed feature of this contract)"
    return f"{contract.id} ({contract.level}): verdict {verdict} does not satisfy level {level}{why}"


def _contract_problems(document: dict[str, Any], registry: list[ContractInfo], optional: set[str],
                       level: str) -> list[str]:
    problems = []
    entries: dict[str, list[dict[str, Any]]] = {}
    for entry in document["contracts"]:
        entries.setdefault(entry["id"], []).append(entry)
    known = {c.id for c in registry}
    for contract_id, found in entries.items():
        if contract_id not in known:
            problems.append(f"{contract_id}: not an active contract of the kit's registry")
        if len(found) > 1:
            problems.append(f"{contract_id}: present {len(found)} times")
    rank = LEVELS.index(level)
    for contract in registry:
        if LEVELS.index(contract.level) > rank:
            continue
        found = entries.get(contract.id, [])
        if not found:
            problems.append(f"{contract.id} ({contract.level}): missing from the report")
        elif len(found) == 1:
            problem = _contract_problem(found[0], contract, optional, level)
            if problem:
                problems.append(problem)
    return problems


def verify(document: dict[str, Any], registry: list[ContractInfo], optional_features: set[str],
           level: str | None = None, registry_sha256: str | None = None) -> Verification:
    """Check `document` against the active contracts `registry` for `level`
    (default: the level the report claims, else the level it says it reached)."""
    problems = json_report.schema_problems(document)
    if problems:
        return Verification(level, problems)  # the rest would read fields that may not exist
    summary, provenance = document["summary"], document["provenance"]
    level = level or summary["claimed_level"] or summary["level_reached"]
    result = Verification(level)
    digest = json_report.digest_problem(document)
    if digest:
        result.problems.append(digest)
    result.problems += _consistency_problems(document)
    if not document["complete"]:
        result.problems.append("the run is incomplete (interrupted or crashed): complete is false")
    result.problems += _provenance_problems(provenance)
    result.problems += _shard_problems(document)
    if level is None:
        result.problems.append("the report claims no level and reaches none: nothing to verify (pass --level)")
    else:
        if LEVELS.index(provenance["level_checked"]) < LEVELS.index(level):
            result.problems.append(f"the run checked contracts up to {provenance['level_checked']} only, "
                                   f"not up to {level}")
        result.problems += _contract_problems(document, registry, optional_features, level)
    if str(provenance.get("kit_commit") or "").endswith("-dirty"):
        result.notes.append(f"the kit was run from a modified checkout ({provenance['kit_commit']})")
    recorded = (provenance.get("registry") or {}).get("sha256")
    if registry_sha256 and recorded and recorded != registry_sha256:
        result.notes.append("the run used a different contract registry than this kit's "
                            f"(sha256 {recorded} vs {registry_sha256}); judged by this kit's")
    return result


def format_text(result: Verification, path: str = "") -> str:
    where = f"{path}: " if path else ""
    if result.ok:
        lines = [f"{where}VERIFIED for level {result.level}"]
    else:
        lines = [f"{where}NOT VERIFIED for level {result.level or '(none)'}: {len(result.problems)} problem(s)"]
        lines += [f"  - {problem}" for problem in result.problems]
    lines += [f"  note: {note}" for note in result.notes]
    return "\n".join(map(single_line, lines)) + "\n"
