"""Merging the reports of a split run (``--shard K/N``) into the report of
the whole run, which `verify` judges like any other.

The shards must be the N parts of one run: each one complete, untouched
(its digest matches), from the same kit, registry, torch, backend, manifest,
expectations, options and environment (every provenance member but the
per-job ones below; files by their sha256), with the same record of the whole run's selection
(how many tests, the sha256 of their IDs), every index 1..N present once.
The merged report's tests must be exactly that selection: a test in two
shards, or a shard's test missing, refuses the merge.

The merged report keeps, in `provenance.shards`, each shard's part, the
digest of its report and its own job's provenance (start, duration, command
line, folder, platform, warnings); its `started` is the earliest shard's
and its `duration_ms` spans from there to the end of the last. Contract
verdicts, the summary and the level are recomputed from the merged tests
(json_report.to_document), as for a run in one job.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from . import json_report, verify
from .model import ContractResult, Provenance, Run, TestResult, selection_digest
from .text import one_line

# Provenance members that belong to one shard's job: recorded per shard,
# never compared. Every other member must be the same in every shard, but
# files are compared by content: CI jobs may check out or install to other
# folders (the merged report keeps the first shard's paths).
PER_SHARD = ("started", "duration_ms", "command_line", "working_directory", "platform", "warnings", "shard",
             "shards", "backend_file", "workers")
FILE_RECORDS = ("manifest", "expectations", "registry")
# Summary members the run's settings decide (the rest is recomputed).
SETTINGS = ("claimed_level", "optional_features", "unclaimed_features", "uncovered", "level_requirements")
SHARD_OPTION = "--shard"


class MergeError(ValueError):
    """The reports are not the shards of one run; `problems` says why, each
    problem one line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _tests(document: dict[str, Any]) -> list[str]:
    """The document's test IDs, each once, in report order."""
    return list(dict.fromkeys(t["nodeid"] for c in document["contracts"] for t in c["tests"]))


def _shard_problems(documents: list[tuple[str, dict[str, Any]]]) -> list[str]:
    problems = []
    for name, document in documents:
        if document["format_version"] != json_report.FORMAT_VERSION:
            problems.append(f"{name}: format {document['format_version']}; this kit merges format "
                            f"{json_report.FORMAT_VERSION} (run the shards with the same kit)")
            continue
        digest = json_report.digest_problem(document)
        if digest:
            problems.append(f"{name}: {digest}")
        else:  # (a shard edited and re-sealed: its digest holds, its verdicts do not follow from its tests)
            problems += [f"{name}: {problem}" for problem in verify.consistency_problems(document)]
        if not document["complete"]:
            problems.append(f"{name}: the shard's run is incomplete (interrupted or crashed): rerun that shard")
        if document["provenance"]["shard"] is None:
            problems.append(f"{name}: not a shard's report (the run had no --shard K/N)")
    return problems


def _agreement_problems(documents: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Where the shards disagree on what must be one run's."""
    problems = []
    first_name, first = documents[0]
    shard = first["provenance"]["shard"]
    count = shard["count"]
    for name, document in documents:
        mine = document["provenance"]["shard"]
        for key in ("count", "selected", "selection_sha256"):
            if mine[key] != shard[key]:
                problems.append(f"{name}: shard {key} {mine[key]!r}, but {first_name} has {shard[key]!r} "
                                "(the shards were not split from the same selection of tests)")
        for key, value in document["provenance"].items():
            if key in PER_SHARD:
                continue
            theirs = first["provenance"][key]
            if key in FILE_RECORDS and value and theirs:
                value, theirs = value["sha256"], theirs["sha256"]
            if value != theirs:
                problems.append(f"{name}: provenance {key} is {one_line(repr(value), 120)}, but {first_name} has "
                                f"{one_line(repr(theirs), 120)}")
        for key in SETTINGS:
            if document["summary"][key] != first["summary"][key]:
                problems.append(f"{name}: summary {key} is {one_line(repr(document['summary'][key]), 120)}, but "
                                f"{first_name} has {one_line(repr(first['summary'][key]), 120)}")
        contracts = [c["id"] for c in document["contracts"]]
        if contracts != [c["id"] for c in first["contracts"]]:
            problems.append(f"{name}: holds other contracts than {first_name}")
    indices = sorted(document["provenance"]["shard"]["index"] for _, document in documents)
    missing = sorted(set(range(1, count + 1)) - set(indices))
    duplicated = sorted({i for i in indices if indices.count(i) > 1})
    if missing:
        problems.append(f"missing shard(s) {', '.join(f'{i}/{count}' for i in missing)}")
    if duplicated:
        problems.append(f"shard(s) given more than once: {', '.join(f'{i}/{count}' for i in duplicated)}")
    return problems


def _without_shard_option(command: list[str]) -> list[str]:
    """The shard's command line without its --shard option: the whole run's."""
    result, skip = [], False
    for arg in command:
        if skip:
            skip = False
        elif arg == SHARD_OPTION:
            skip = True
        elif not arg.startswith(f"{SHARD_OPTION}="):
            result.append(arg)
    return result


def _time(started: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(started)


def _provenance(documents: list[dict[str, Any]], runs: list[Run]) -> Provenance:
    records = []
    for document, run in zip(documents, runs):
        p = document["provenance"]
        records.append({**p["shard"], "digest": document["digest"]["value"], "tests": len(_tests(document)),
                         "started": p["started"], "duration_ms": p["duration_ms"],
                         "command_line": list(p["command_line"]), "working_directory": p["working_directory"],
                         "platform": p["platform"], "warnings": list(p["warnings"])})
    starts = [_time(d["provenance"]["started"]) for d in documents]
    ends = [s + datetime.timedelta(milliseconds=d["provenance"]["duration_ms"]) for s, d in zip(starts, documents)]
    first = runs[0].provenance
    return dataclasses.replace(
        first,
        started=min(starts).isoformat(),
        duration_s=(max(ends) - min(starts)).total_seconds(),
        command_line=_without_shard_option(first.command_line),
        platform="; ".join(dict.fromkeys(r.provenance.platform for r in runs)),
        warnings=list(dict.fromkeys(w for r in runs for w in r.provenance.warnings)),
        shard=None,
        shards=records,
        # (each job's own: the most processes any one of them ran at once)
        workers=max((r.provenance.workers for r in runs if r.provenance.workers), default=None),
    )


def _stale_expectations(documents: list[dict[str, Any]]) -> list[str]:
    """An expectation is stale when every test it decided passed: in every
    shard where it decided a test, it was stale."""
    decided: dict[str, bool] = {}
    for document in documents:
        stale = set(document["summary"]["stale_expectations"])
        for label in document["provenance"]["shard"]["expectations_decided"]:
            decided[label] = decided.get(label, True) and label in stale
    return [label for label, stale in decided.items() if stale]


def merge(named: list[tuple[str, dict[str, Any]]]) -> Run:
    """The run whose shards' schema-valid report documents are `named`
    ((file name, document) pairs, any order); MergeError if they are not
    the complete, untouched shards of one run."""
    if not named:
        raise MergeError(["no shard reports given"])
    problems = _shard_problems(named)
    if problems:
        raise MergeError(problems)
    problems = _agreement_problems(named)
    if problems:
        raise MergeError(problems)
    named = sorted(named, key=lambda pair: pair[1]["provenance"]["shard"]["index"])
    documents = [document for _, document in named]
    runs = [json_report.from_document(document) for document in documents]

    owner: dict[str, str] = {}
    for name, document in named:
        for test in _tests(document):
            if test in owner:
                problems.append(f"{test}: in both {owner[test]} and {name}")
            owner.setdefault(test, name)
    shard = documents[0]["provenance"]["shard"]
    if not problems and (len(owner) != shard["selected"] or selection_digest(owner) != shard["selection_sha256"]):
        problems.append(f"the shards hold {len(owner)} tests, not the {shard['selected']} the run selected "
                        "(sha256 of their IDs differs from the shards' selection_sha256): a shard is not the "
                        "part of the run its index says")
    if problems:
        raise MergeError(problems)

    contracts = []
    for index, first in enumerate(runs[0].contracts):
        tests: list[TestResult] = [t for run in runs for t in run.contracts[index].tests]
        contracts.append(ContractResult(first.contract, tests, list(first.unclaimed_features), rerun=first.rerun))
    base = runs[0]
    return Run(
        provenance=_provenance(documents, runs),
        contracts=contracts,
        optional_features=list(base.optional_features),
        unclaimed_features=list(base.unclaimed_features),
        claimed_level=base.claimed_level,
        complete=True,
        uncovered=list(base.uncovered),
        stale_expectations=_stale_expectations(documents),
        operators=[operator for run in runs for operator in run.operators],
        level_requirements={level: list(features) for level, features in base.level_requirements.items()},
    )
