"""Comparing two reports contract by contract, the way a CI gate needs it:
regressions must not hide behind an unchanged pass count.

A contract present in both reports is
* a regression if it was satisfied and is not any more, or if it stays
  unsatisfied with a worse verdict (fail -> crash);
* a fix if it was not satisfied and now is;
* otherwise "changed" if its verdict changed (pass -> xpass, crash -> fail).
Contracts in only one report are added or removed. The level reached is
compared too; a lower level counts as a regression.

The operator matrix is compared cell by cell (operator x dtype), by the same
rules: a cell that passed and now fails, crashes or hangs (or fails worse) is
an operator regression, and gates like a contract's. A contract that was
already failing for one operator hides nothing: a second operator breaking
shows here.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from . import json_report, markdown
from .model import LEVELS, Verdict
from .text import FAILING, cell_problems, one_line, single_line, title

# Severity of a contract verdict; a contract without a result is worst of all.
_SEVERITY = {**{v.value: v.severity for v in Verdict}, json_report.NO_TEST: max(v.severity for v in Verdict) + 1}


@dataclass
class TestChange:
    nodeid: str
    old: str | None   # None: the test is not in that report
    new: str | None


@dataclass
class Change:
    id: str
    area: str
    level: str
    old: str | None   # the contract's verdict; None: not in that report
    new: str | None
    message: str = ""  # the newer report's message for the contract
    tests: list[TestChange] = field(default_factory=list)


@dataclass
class CellChange:
    operator: str
    dtype: str
    old: str | None   # the cell's verdict; None: not in that report
    new: str | None
    message: str = ""  # the newer report's checks that did not pass


@dataclass
class Diff:
    old: str                  # title of each report ("openreg: full 100%")
    new: str
    old_level: str | None
    new_level: str | None
    regressions: list[Change] = field(default_factory=list)
    fixes: list[Change] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    added: list[Change] = field(default_factory=list)
    removed: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    operator_regressions: list[CellChange] = field(default_factory=list)
    operator_fixes: list[CellChange] = field(default_factory=list)

    @property
    def level_dropped(self) -> bool:
        return _level_rank(self.new_level) < _level_rank(self.old_level)

    @property
    def regressed(self) -> bool:
        return bool(self.regressions) or bool(self.operator_regressions) or self.level_dropped


def _level_rank(level: str | None) -> int:
    return LEVELS.index(level) if level else -1


def _test_changes(old: dict[str, Any], new: dict[str, Any]) -> list[TestChange]:
    old_tests = {t["nodeid"]: t["verdict"] for t in old["tests"]}
    new_tests = {t["nodeid"]: t["verdict"] for t in new["tests"]}
    return [TestChange(nodeid, old_tests.get(nodeid), new_tests.get(nodeid))
            for nodeid in dict.fromkeys([*old_tests, *new_tests])
            if old_tests.get(nodeid) != new_tests.get(nodeid)]


def _notes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    notes = []
    for label, document in (("old", old), ("new", new)):
        problem = json_report.digest_problem(document)
        if problem:
            notes.append(f"the {label} report does not verify: {problem}")
        if not document["complete"]:
            notes.append(f"the {label} report is incomplete (the run was interrupted)")
    for key, what in (("backend_name", "backends"), ("kit_version", "kit versions"),
                      ("torch_version", "torch versions"), ("level_checked", "levels checked")):
        if old["provenance"][key] != new["provenance"][key]:
            notes.append(f"different {what}: {old['provenance'][key]} -> {new['provenance'][key]}")
    return notes


def diff(old: dict[str, Any], new: dict[str, Any]) -> Diff:
    """Compare two schema-valid report documents."""
    result = Diff(title(old), title(new), old["summary"]["level_reached"], new["summary"]["level_reached"],
                  notes=_notes(old, new))
    old_contracts = {c["id"]: c for c in old["contracts"]}
    new_contracts = {c["id"]: c for c in new["contracts"]}
    for contract_id in dict.fromkeys([*old_contracts, *new_contracts]):
        before, after = old_contracts.get(contract_id), new_contracts.get(contract_id)
        either = after or before
        change = Change(contract_id, either["area"], either["level"],
                        before and before["verdict"], after and after["verdict"],
                        message=one_line((after or {}).get("message", "")))
        if before is None:
            result.added.append(change)
        elif after is None:
            result.removed.append(change)
        elif before["verdict"] != after["verdict"] or before["satisfied"] != after["satisfied"]:
            change.tests = _test_changes(before, after)
            worse = _SEVERITY[after["verdict"]] > _SEVERITY[before["verdict"]]
            if before["satisfied"] and not after["satisfied"]:
                result.regressions.append(change)
            elif after["satisfied"] and not before["satisfied"]:
                result.fixes.append(change)
            elif not after["satisfied"] and worse:
                result.regressions.append(change)
            else:
                result.changed.append(change)
    _diff_cells(old, new, result)
    return result


def _cells(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["name"], c["dtype"]): c for o in document.get("operators", []) for c in o["cells"]}


def _diff_cells(old: dict[str, Any], new: dict[str, Any], result: Diff) -> None:
    """Operator regressions and fixes: cells present in both reports (an
    operator not checked in one of them, as with another --operators, is no
    change)."""
    before, after = _cells(old), _cells(new)
    for key, cell in after.items():
        previous = before.get(key)
        if previous is None or previous["verdict"] == cell["verdict"]:
            continue
        change = CellChange(key[0], key[1], previous["verdict"], cell["verdict"], one_line(cell_problems(cell)))
        was = Verdict(previous["verdict"]).satisfies
        if cell["verdict"] in FAILING and (was or _SEVERITY[cell["verdict"]] > _SEVERITY[previous["verdict"]]):
            result.operator_regressions.append(change)
        elif Verdict(cell["verdict"]).satisfies and previous["verdict"] in FAILING:
            result.operator_fixes.append(change)


# ------------------------------------------------------------------ output

SECTIONS = (("regressions", "Regressions"), ("fixes", "Fixes"), ("changed", "Other verdict changes"),
            ("added", "Added contracts"), ("removed", "Removed contracts"))


def _verdicts(change: Change) -> str:
    return f"{change.old or '(absent)'} -> {change.new or '(absent)'}"


def _level_line(result: Diff) -> str:
    old, new = result.old_level or "none", result.new_level or "none"
    if old == new:
        return f"Level reached: {new} (unchanged)"
    return f"Level reached: {old} -> {new} ({'dropped' if result.level_dropped else 'raised'})"


CELL_SECTIONS = (("operator_regressions", "Operator regressions"), ("operator_fixes", "Operator fixes"))


def _verdict_line(result: Diff) -> str:
    counts = ", ".join(f"{len(getattr(result, key))} {label.lower()}" for key, label in SECTIONS + CELL_SECTIONS)
    gate = "REGRESSED" if result.regressed else "no regression"
    return f"{gate}: {counts}"


def format_text(result: Diff) -> str:
    lines = [f"old: {result.old}", f"new: {result.new}", _level_line(result)]
    lines += [f"note: {note}" for note in result.notes]
    for key, label in SECTIONS:
        changes = getattr(result, key)
        if not changes:
            continue
        lines += ["", f"{label} ({len(changes)}):"]
        for change in changes:
            lines.append(f"  {change.id:<14} {change.area:<18} {change.level:<9} {_verdicts(change)}"
                         + (f"  {change.message}" if change.message and key != "fixes" else ""))
            for test in change.tests:
                lines.append(f"      {test.nodeid}: {test.old or '(absent)'} -> {test.new or '(absent)'}")
    for key, label in CELL_SECTIONS:
        cells = getattr(result, key)
        if cells:
            lines += ["", f"{label} ({len(cells)}):"]
            lines += [f"  {c.operator} {c.dtype}: {c.old} -> {c.new}" + (f"  {c.message}" if c.message else "")
                      for c in cells]
    lines += ["", _verdict_line(result)]
    return "\n".join(map(single_line, lines)) + "\n"


def format_markdown(result: Diff) -> str:
    lines = [f"## Conformance diff: {markdown.escape(result.old)} → {markdown.escape(result.new)}", "",
             f"**{_level_line(result)}** · {_verdict_line(result)}"]
    for note in result.notes:
        lines += ["", f"> note: {markdown.escape(note, 400)}"]
    for key, label in SECTIONS:
        changes = getattr(result, key)
        if changes:
            rows = [[f"`{c.id}`", markdown.escape(c.area), c.level, markdown.escape(_verdicts(c)),
                     markdown.escape(c.message)] for c in changes]
            lines += ["", f"### {label} ({len(changes)})", "",
                      *markdown.table(["contract", "area", "level", "verdict", "message"], rows)]
    for key, label in CELL_SECTIONS:
        cells = getattr(result, key)
        if cells:
            rows = [[markdown.escape(c.operator, inline=True), markdown.escape(c.dtype, inline=True),
                     markdown.escape(f"{c.old} -> {c.new}", inline=True), markdown.escape(c.message, inline=True)]
                    for c in cells]
            lines += ["", f"### {label} ({len(cells)})", "", *markdown.table(["operator", "dtype", "verdict", "checks"], rows)]
    return "\n".join(lines) + "\n"


def format_json(result: Diff) -> str:
    data = dataclasses.asdict(result)
    data["level_dropped"], data["regressed"] = result.level_dropped, result.regressed
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


FORMATS = {"text": format_text, "markdown": format_markdown, "json": format_json}
