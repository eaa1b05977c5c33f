"""JUnit XML for CI systems (GitLab, Jenkins, GitHub test reporters).

One <testsuite> per area and one <testcase> per test, under the area of the
first contract it checks (a test is never counted twice). classname is
"<area>.<contract IDs>", so CI tools that split on the last dot show the
area as the package and the contracts as the class. A test checking several
contracts takes its worst verdict, and its message names the contract that
verdict was charged to. Verdicts map as pytest's own junitxml does: fail ->
<failure>; error, crash, hang -> <error>; skip, not-claimed, inconclusive,
xfail -> <skipped>; pass, xpass -> a plain testcase. A contract no test
reported on gets a <skipped> testcase, so that it is visible.

An operators-area test (one operator) carries its row of the operator
matrix: every dtype's verdict in <system-out>, the failing cells with their
checks' messages in its <failure> or <error>. The cells are not testcases
of their own: a wrong kernel fails one test, and counts once.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from .text import FAILING, SHOWN_CELL_VERDICTS, VERDICT_ORDER, cell_problems, printable, truncate

MESSAGE_LIMIT = 1000  # attribute values; the full text goes into the element body
ERRORS = ("error", "crash", "hang")
SKIPS = ("skip", "not-claimed", "xfail", "no-test", "inconclusive")


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.3f}"


def _element(parent: ET.Element, tag: str, text: str = "", **attributes: str) -> ET.Element:
    # ElementTree escapes markup; printable() removes what XML cannot hold at all.
    element = ET.SubElement(parent, tag, {k: printable(v) for k, v in attributes.items()})
    if text:
        element.text = printable(text)
    return element


def _matrix_row(operator: dict[str, Any]) -> tuple[str, str]:
    """(every cell's verdict, one per line; the failing cells with their checks)."""
    cells = [f"{c['dtype']}: {c['verdict']}" for c in operator["cells"]]
    failing = [f"{operator['name']} {c['dtype']}: {c['verdict']}: {cell_problems(c)}" for c in operator["cells"]
               if c["verdict"] in SHOWN_CELL_VERDICTS]
    return "\n".join(cells), "\n".join(failing)


def _testcase(suite: ET.Element, area: str, test: dict[str, Any],
              contracts: dict[str, dict[str, Any]] | None = None,
              operator: dict[str, Any] | None = None) -> ET.Element:
    case = _element(suite, "testcase", classname=f"{area}.{'+'.join(test['contracts'])}",
                    name=test["nodeid"], time=_seconds(test["duration_ms"]))
    verdict = test["verdict"]
    message = truncate(f"{verdict}: {test['message']}" if test["message"] else verdict, MESSAGE_LIMIT)
    # What the failure is evidence against: the contract's statement and the
    # PyTorch doc or header that defines it.
    charged = (contracts or {}).get(test.get("charged") or test["contracts"][0])
    contract = (f"{charged['id']}: {charged['statement']}\nSource: {charged['source']}"
                if charged and verdict in FAILING else "")
    cells, failing = _matrix_row(operator) if operator else ("", "")
    fix = f"Known fix: {test['fix']}" if test.get("fix") and verdict in FAILING else ""
    body = "\n\n".join(part for part in (test["message"], fix, failing, contract, test["details"]) if part)
    if verdict == "fail":
        _element(case, "failure", body, message=message, type=verdict)
    elif verdict in ERRORS:
        _element(case, "error", body, message=message, type=verdict)
    elif verdict in SKIPS:
        _element(case, "skipped", message=message, type=verdict)
    out = "\n".join(part for part in (f"rerun: {test['rerun']}" if test["rerun"] else "",
                                      f"operator matrix ({operator['name']}):\n{cells}" if operator else "") if part)
    if out:
        _element(case, "system-out", out)
    return case


def _properties(parent: ET.Element, document: dict[str, Any]) -> None:
    provenance = document["provenance"]
    properties = ET.SubElement(parent, "properties")
    values = {
        "level_reached": document["summary"]["level_reached"] or "none",
        "complete": str(document["complete"]).lower(),
        "backend": provenance["backend_name"],
        "backend_version": provenance["backend_version"] or "",
        "kit_version": provenance["kit_version"],
        "torch_version": provenance["torch_version"],
        "digest": document["digest"]["value"],
    }
    for name, value in values.items():
        _element(properties, "property", name=name, value=value)


def render(document: dict[str, Any]) -> str:
    provenance = document["provenance"]
    root = ET.Element("testsuites", {"name": printable(f"privateuse1-conformance {provenance['backend_name']}")})
    suites: dict[str, ET.Element] = {}
    counts: dict[str, dict[str, int]] = {}
    seen: set[str] = set()

    def _count(suite: ET.Element, test: dict[str, Any]) -> None:
        area = suite.get("name", "")
        _testcase(suite, area, test, by_id, matrix.get(test["nodeid"]))
        verdict = test["verdict"]
        counts[area]["tests"] += 1
        counts[area]["failures"] += verdict == "fail"
        counts[area]["errors"] += verdict in ERRORS
        counts[area]["skipped"] += verdict in SKIPS
        counts[area]["time"] += test["duration_ms"]

    def suite_of(area: str) -> ET.Element:
        if area not in suites:
            suites[area] = _element(root, "testsuite", name=area, timestamp=provenance["started"])
            if len(suites) == 1:
                # Run-level facts ride on the first suite (<testsuites> has no
                # <properties> in the schema CI tools follow; they come first).
                _properties(suites[area], document)
            counts[area] = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0}
        return suites[area]

    # A test checking several contracts appears under each in the document,
    # with what it showed about each; here it is one testcase with its worst
    # verdict, the message naming the contract that verdict belongs to.
    tests: dict[str, dict[str, Any]] = {}
    areas = {c["id"]: c["area"] for c in document["contracts"]}
    by_id = {c["id"]: c for c in document["contracts"]}
    matrix = {o["nodeid"]: o for o in document.get("operators", [])}  # (format 3)
    for contract in document["contracts"]:
        for test in contract["tests"]:
            known = tests.get(test["nodeid"])
            if known is None or VERDICT_ORDER.index(test["verdict"]) < VERDICT_ORDER.index(known["verdict"]):
                tests[test["nodeid"]] = {**test, "charged": contract["id"]}
    for contract in document["contracts"]:
        for test in contract["tests"]:
            if test["nodeid"] in seen:
                continue
            seen.add(test["nodeid"])
            test = tests[test["nodeid"]]
            if len(test["contracts"]) > 1 and test["verdict"] in FAILING:
                test = {**test, "message": f"[{test['charged']}] {test['message']}"}
            _count(suite_of(areas.get(test["contracts"][0], contract["area"])), test)
        if not contract["tests"]:
            _count(suite_of(contract["area"]),
                   {"nodeid": f"{contract['id']} (no test result)", "contracts": [contract["id"]],
                    "verdict": "no-test", "duration_ms": 0, "rerun": contract["rerun"], "details": "",
                    "message": "no test reported on this contract (the run is incomplete, "
                               "or the contract has no test)"})
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time": 0}
    for area, suite in suites.items():
        for key, value in counts[area].items():
            suite.set(key, _seconds(value) if key == "time" else str(value))
            totals[key] += value
    for key, value in totals.items():
        root.set(key, _seconds(value) if key == "time" else str(value))
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
