"""Verifying a published report, in the spirit of Khronos' verify_submission:
a reviewer runs it on the vendor's report.json with the kit's own registry.

A report verifies for level L when
1. it is valid against the published schema of the current format (older
   formats predate the checks below: rerun with this kit);
2. its digest matches (nothing was edited after the run);
3. it is self-consistent: every derived field (contract verdicts, clause
   status, messages, summaries, the level reached) is what the kit computes
   from the test results, so a re-sealed edit of a summary is caught;
4. the run is complete, and whole: nothing narrowed its selection (options,
   paths, plugins; provenance.selection), and every test function of the
   kit's suite up to L appears in it (the list comes from the verifier's
   own suite, never from the report);
5. the provenance is complete (REQUIRED_PROVENANCE present and not empty)
   and trustworthy: a torch the kit supports, run without
   --allow-untested-torch, with process isolation, by this kit (the same
   version, registry and files: provenance.kit_files against the verifier's
   own, not modified or unidentifiable), and, given the backend's module,
   on the backend files installed here (provenance.backend_files);
6. it is the report of a whole run: not one shard's (``--shard K/N``), and,
   when merged from shards, every shard 1..N is listed once and the tests
   are exactly the ones the shards' run selected (the sha256 of their IDs);
7. every active contract of the verifier's registry up to L is present
   exactly once and satisfied: pass or xpass with every clause the
   verifier's registry requires decided or not applicable, or not-claimed
   where every unclaimed feature is one the contract needs and the registry
   marks optional — exactly what model.level_reached requires; the level's
   requirement (at least one of its optional features claimed) holds. No
   unknown or duplicated contract appears.

Exit status 0 means "consistent and complete": produced by this kit on
these files, with nothing narrowed or left out. It cannot prove that a
backend did not lie inside its own process, or that a document re-sealed
with the kit's (unkeyed) digest was not edited: a CI that attests the run
(signing the report's digest with its own identity) is what proves that
(docs/reports.md, "What verify proves").

Levels, areas, clauses and optional features come from the registry given
to verify(), never from the report. This module knows no registry format:
the caller passes the contracts and the kit's facts (harness/cli.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from . import json_report
from .model import (LEVELS, ContractInfo, ContractResult, TestResult, Verdict, contract_satisfied, requirement_met,
                    selection_digest)
from .text import one_line, single_line

REQUIRED_PROVENANCE = (
    "kit_version", "torch_version", "torch_build", "python", "platform", "backend_requested", "backend_name",
    "backend_module", "backend_version", "device_type", "command_line", "level_checked", "isolation",
    "started", "registry", "selection",
)
SHOWN_DIFFERENCES = 10


@dataclass
class KitFacts:
    """What the verifying kit knows of itself, to compare a report with
    (harness/cli.py collects it). Fields left empty are not compared."""

    version: str = ""
    registry_sha256: str = ""
    files: dict[str, str] = field(default_factory=dict)          # provenance.kit_files of this kit
    tests: dict[str, str] = field(default_factory=dict)          # "file::function" -> the lowest level it checks
    torch_problem: Callable[[str], str | None] | None = None     # why a torch version is not supported, or None
    backend_module: str = ""                                      # verify --backend MODULE
    backend_files: dict[str, str] | None = None                  # that module's files as installed here


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


def consistency_problems(document: dict[str, Any]) -> list[str]:
    """Where `document` differs from what its own tests compute (verdicts,
    levels, summary): an edit re-sealed with a new digest shows here."""
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


SHOWN_FILES = 5


def _files(paths: list[str]) -> str:
    more = f" and {len(paths) - SHOWN_FILES} more" if len(paths) > SHOWN_FILES else ""
    return ", ".join(paths[:SHOWN_FILES]) + more


def _differing(recorded: dict[str, str], installed: dict[str, str]) -> list[str]:
    return sorted(path for path in set(recorded) | set(installed) if recorded.get(path) != installed.get(path))


def _trust_problems(provenance: dict[str, Any], kit: KitFacts) -> tuple[list[str], list[str]]:
    """(problems, notes) of where and how the run ran."""
    problems, notes = [], []
    if kit.torch_problem is not None:
        problem = kit.torch_problem(provenance["torch_version"])
        if problem:
            problems.append(f"torch: {problem}")
    if "--allow-untested-torch" in provenance["command_line"]:
        problems.append("the run was started with --allow-untested-torch: its torch is outside what the kit supports")
    if provenance["isolation"] != "fork":
        problems.append(f"isolation {provenance['isolation']!r}: the tests did not run in fresh processes, so a crash "
                        "or an initialization in one test could hide another test's result")
    if kit.version and provenance["kit_version"] != kit.version:
        problems.append(f"the run used kit {provenance['kit_version']}, this is kit {kit.version}: verify with the "
                        "kit that ran it")
    if not provenance.get("kit_files") and provenance["kit_version"] in ("", "unknown"):
        problems.append("the kit that ran is unidentifiable: no version and no file hashes")
    if str(provenance.get("kit_commit") or "").endswith("-dirty"):
        problems.append(f"the kit was run from a modified checkout ({provenance['kit_commit']})")
    recorded = (provenance.get("registry") or {}).get("sha256")
    if kit.registry_sha256 and recorded != kit.registry_sha256:
        problems.append(f"the run used another contract registry than this kit's (sha256 {recorded} vs "
                        f"{kit.registry_sha256})")
    if kit.files:
        differing = _differing(provenance.get("kit_files") or {}, kit.files)
        if differing:
            problems.append(f"the kit that ran differs from this kit in {len(differing)} file(s): {_files(differing)}")
    if kit.backend_files is not None:
        if provenance["backend_module"].split(".")[0] != kit.backend_module.split(".")[0]:
            problems.append(f"the report is of backend module {provenance['backend_module']!r}, not "
                            f"{kit.backend_module!r}")
        elif not kit.backend_files:
            problems.append(f"the backend module {kit.backend_module!r} is not installed here: its files cannot be "
                            "compared")
        else:
            differing = _differing(provenance.get("backend_files") or {}, kit.backend_files)
            if differing:
                problems.append(f"the backend's files differ from those installed here in {len(differing)} "
                                f"file(s): {_files(differing)}")
            else:
                notes.append(f"the backend's {len(kit.backend_files)} files are those installed here")
    return problems, notes


def _selection_problems(document: dict[str, Any], kit: KitFacts, level: str) -> list[str]:
    """A narrowed run certifies nothing; a complete one holds every test
    function of the kit's suite up to `level`."""
    selection = document["provenance"]["selection"]
    problems = []
    if selection["narrowed_by"]:
        problems.append("the run was narrowed (" + "; ".join(selection["narrowed_by"]) + "): a run of part of the "
                        "suite certifies nothing; run the whole suite")
    if kit.tests:
        ran = {t["nodeid"].partition("[")[0] for c in document["contracts"] for t in c["tests"]}
        rank = LEVELS.index(level)
        missing = sorted(t for t, at in kit.tests.items() if LEVELS.index(at) <= rank and t not in ran)
        if missing:
            problems.append(f"{len(missing)} test(s) of this kit's suite up to {level} are not in the report: "
                            f"{_files(missing)}")
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
    tests = [TestResult(t["nodeid"], t["contracts"], Verdict(t["verdict"]), clauses=dict(t.get("clauses", {})))
             for t in entry["tests"]]
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
           level: str | None = None, kit: KitFacts | None = None,
           level_requirements: dict[str, list[str]] | None = None) -> Verification:
    """Check `document` against the active contracts `registry` for `level`
    (default: the level the report claims, else the level it says it reached)."""
    kit = kit or KitFacts()
    problems = json_report.schema_problems(document)
    if problems:
        return Verification(level, problems)  # the rest would read fields that may not exist
    if document["format_version"] != json_report.FORMAT_VERSION:
        return Verification(level, [f"format {document['format_version']}: reports of formats before "
                                    f"{json_report.FORMAT_VERSION} do not record what verify checks (the run's "
                                    "selection, the files that ran, the clauses); rerun the suite with this kit"])
    summary, provenance = document["summary"], document["provenance"]
    level = level or summary["claimed_level"] or summary["level_reached"]
    result = Verification(level)
    digest = json_report.digest_problem(document)
    if digest:
        result.problems.append(digest)
    result.problems += consistency_problems(document)
    if not document["complete"]:
        result.problems.append("the run is incomplete (interrupted or crashed): complete is false")
    result.problems += _provenance_problems(provenance)
    trust, notes = _trust_problems(provenance, kit)
    result.problems += trust
    result.notes += notes
    result.problems += _shard_problems(document)
    if level is None:
        result.problems.append("the report claims no level and reaches none: nothing to verify (pass --level)")
    else:
        if LEVELS.index(provenance["level_checked"]) < LEVELS.index(level):
            result.problems.append(f"the run checked contracts up to {provenance['level_checked']} only, "
                                   f"not up to {level}")
        result.problems += _selection_problems(document, kit, level)
        result.problems += _contract_problems(document, registry, optional_features, level)
        requirements = summary["level_requirements"] if level_requirements is None else level_requirements
        for at in LEVELS[: LEVELS.index(level) + 1]:
            if not requirement_met(at, requirements, summary["unclaimed_features"]):
                result.problems.append(f"level {at} needs at least one of the optional features "
                                       f"{', '.join(requirements[at])} claimed; the backend claims none of them")
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
