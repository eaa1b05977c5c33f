"""The canonical JSON document of a run."""

from __future__ import annotations

import dataclasses
from typing import Any

from .model import Run, Verdict

FORMAT_VERSION = 1


def _test(t) -> dict[str, Any]:
    return {
        "nodeid": t.nodeid,
        "verdict": t.verdict.value,
        "duration_s": round(t.duration, 6),
        "message": t.message,
        "details": t.details,
        "rerun": t.rerun,
        "expectation": t.expectation,
    }


def to_document(run: Run) -> dict[str, Any]:
    counts = {v.value: 0 for v in Verdict}
    counts["no-test"] = 0
    contracts = []
    for result in run.contracts:
        verdict = result.verdict
        counts[verdict.value if verdict else "no-test"] += 1
        contracts.append({
            **dataclasses.asdict(result.contract),
            "verdict": verdict.value if verdict else "no-test",
            "unclaimed_features": result.unclaimed_features,
            "tests": [_test(t) for t in result.tests],
        })
    return {
        "format": "privateuse1-conformance-report",
        "format_version": FORMAT_VERSION,
        "complete": run.complete,
        "provenance": dataclasses.asdict(run.provenance),
        "summary": {
            "level_reached": run.level_reached,
            "claimed_level": run.claimed_level,
            "verdicts": counts,
            "unclaimed_features": run.unclaimed_features,
            "optional_features": run.optional_features,
            "uncovered": run.uncovered,
            "stale_expectations": run.stale_expectations,
        },
        "contracts": contracts,
    }
