"""A Markdown summary, sized for a pull-request comment (GitHub caps those at
65,536 characters) or a CI step summary ($GITHUB_STEP_SUMMARY).

Backend-derived text goes only into escaped table cells and paragraphs
(the characters that can start Markdown or HTML syntax inside a line are
backslash-escaped, and so is one that would start a block at the beginning
of a line: no links, emphasis, raw HTML, math or extra table columns, while
'DM-SET-001: 47%' stays as it is written), into fenced code blocks whose
fence is longer than any backtick run inside, or HTML-escaped into <summary>.
IDs are never cut: a long list of them is shortened by whole IDs.
"""

from __future__ import annotations

import html
import re
from typing import Any

from .text import (FAILING, VERDICT_ORDER, cell_problems, failing_cells, failing_contracts, known_fixes, narrowed_by,
                   one_line, optional_claimed, printable, provenance_rows, satisfied_percent, source_links, title, truncate,
                   unsatisfied_of_level)

BUDGET = 60_000  # characters: under GitHub's comment limit, with room for a header
# The most of each failure's details to show; shortened step by step (every
# detail alike) until the summary fits, and dropped only below the last.
DETAIL_LIMITS = (3000, 2000, 1400, 1000, 700, 500, 350, 250, 180, 120)
# Inside a line: escapes, code spans, emphasis, links and images, raw HTML and
# entities, table cells, strikethrough, math.
# An underscore between two letters or digits (pu1_sync) cannot start or end
# emphasis (CommonMark's flanking rules) and stays as written.
_INLINE = re.compile(r"([\\`*\[\]<>|~$&]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")
# At the start of a line: headings, block quotes, list items, thematic breaks.
_LINE_START = re.compile(r"^(\s*)(?:([#>+=-])|(\d+)([.)]))")
_BACKTICKS = re.compile("`+")
MAX_IDS = 25  # a list of contract IDs longer than this is shortened by whole IDs
MAX_CELLS = 40  # failing cells of the operator matrix listed (the rest: report.html, report.json)


def escape(text: str, limit: int = 200, inline: bool = False) -> str:
    """One line of backend-derived text, inert in a paragraph or a table cell.
    `inline`: the text follows other text on its line (or sits in a table
    cell), where '1.' or '#' cannot start a block and need no escape."""
    line = _INLINE.sub(r"\\\1", one_line(text, limit))
    return line if inline else _LINE_START.sub(_escape_line_start, line, count=1)


def _escape_line_start(match: re.Match) -> str:
    if match.group(2):  # '# x', '> x', '- x', '+ x', '=' (setext)
        return match.group(1) + "\\" + match.group(2)
    return match.group(1) + match.group(3) + "\\" + match.group(4)  # '1. x', '1) x'


def id_list(ids: list[str], limit: int = MAX_IDS) -> str:
    """Escaped, comma-separated IDs (or names), never cut inside one."""
    shown = [escape(i, 500, inline=True) for i in ids[:limit]]
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return ", ".join(shown) + more


def fenced(text: str, info: str = "") -> str:
    """A fenced code block that `text` cannot close early."""
    text = printable(text).rstrip("\n")
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Table lines; cells must already be escaped."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def collapsed(summary: str, body: str) -> list[str]:
    """A <details> block (GitHub renders Markdown inside it after a blank line)."""
    return [f"<details><summary>{html.escape(printable(summary))}</summary>", "", body, "", "</details>"]


def _verdict_columns(document: dict[str, Any]) -> list[str]:
    counts = document["summary"]["verdicts"]
    return [v for v in reversed(VERDICT_ORDER) if counts[v]]


def _overview(document: dict[str, Any]) -> list[str]:
    summary, provenance = document["summary"], document["provenance"]
    lines = [f"## PrivateUse1 conformance: {escape(title(document), inline=True)}", ""]
    claimed = summary["claimed_level"]
    optional = optional_claimed(document)
    claimed_count = summary.get("claimed_contracts", summary["contracts"])
    lines.append(
        f"**Level reached: {summary['level_reached'] or 'none'}**"
        + (f" (claimed: {claimed})" if claimed else "")
        + (f" · {optional} claimed" if optional else "")
        + f" · checked up to {provenance['level_checked']}"
        + f" · {summary.get('claimed_satisfied', summary['satisfied'])} of {claimed_count} claimed contracts "
          f"satisfied ({satisfied_percent(document)}%)"
        + f" · {provenance['duration_ms'] / 1000:.1f} s"
        + (f" on {provenance['workers']} workers" if provenance.get("workers", 1) > 1 else ""))
    if summary.get("claimed_optional_features") is not None:
        unclaimed = sorted(set(summary["optional_features"]) - set(summary["claimed_optional_features"]))
        lines += ["", "Optional features claimed: "
                  + (", ".join(f"`{f}`" for f in summary["claimed_optional_features"]) or "none")
                  + "; not claimed: " + (", ".join(f"`{f}`" for f in unclaimed) or "none") + "."]
    narrowed = narrowed_by(document)
    if narrowed:
        lines += ["", "> **Narrowed run: it certifies nothing.** Only part of the suite was selected ("
                  + escape("; ".join(narrowed), inline=True) + "): the verdicts below are those of the selected "
                  "tests, and no level is reached. Run the whole suite to certify a level."]
    lines.append("")
    lines.append(
        f"Backend {escape(provenance['backend_name'], inline=True)} "
        f"(module {escape(provenance['backend_module'], inline=True)}"
        f" {escape(provenance['backend_version'] or 'unversioned', inline=True)}), "
        f"{provenance['device_count']} device(s);"
        f" torch {escape(provenance['torch_version'], inline=True)}; "
        f"kit {escape(provenance['kit_version'], inline=True)}."
    )
    shard, shards = provenance.get("shard"), provenance.get("shards")  # (format 4)
    if shard:
        lines += ["", f"> **Shard {shard['index']} of {shard['count']}**: this report holds part of a run of "
                      f"{shard['selected']} tests. Its verdicts and level are the shard's; the run's come from "
                      "`privateuse1-conformance merge` of all the shards' reports."]
    elif shards:
        lines += ["", f"Merged from {len(shards)} shards ({sum(r['tests'] for r in shards)} tests); the provenance "
                      "lists each shard's report digest and job."]
    if not document["complete"]:
        lines += ["", "> **Incomplete run**: the run was interrupted or crashed; this report holds only "
                      "the tests that finished. It cannot be verified."]
    columns = _verdict_columns(document)
    rows = [[escape(a["area"], inline=True), str(a["contracts"]), str(a["satisfied"])] + [str(a["verdicts"][v]) for v in columns]
            for a in summary["areas"]]
    lines += ["", *table(["area", "contracts", "satisfied", *columns], rows)]
    level_rows = [
        [level["level"], str(level["contracts"]), str(level["satisfied"]), "yes" if level["reached"] else "no",
         id_list(unsatisfied_of_level(document, level["level"]), 12) or "—"]
        for level in summary["levels"] if level["contracts"]
    ]
    lines += ["", *table(["level", "contracts", "satisfied", "reached", "not satisfied"], level_rows)]
    return lines


def _source(contract: dict[str, Any], torch_version: str | None) -> list[str]:
    source = contract.get("source") or ""
    if not source:
        return []
    links = source_links(source, torch_version)
    linked = "".join(f" · [{escape(path, inline=True)}]({url})" for path, url in links)
    return [f"Source: {escape(source, 400, inline=True)}{linked}", ""]


def _failure(contract: dict[str, Any], detail_limit: int, torch_version: str | None = None) -> list[str]:
    lines = [f"#### {contract['id']}: {contract['verdict']} ({escape(contract['area'], inline=True)}, {contract['level']})",
             "", escape(contract["statement"], 600), "", *_source(contract, torch_version)]
    if contract["unclaimed_features"]:
        lines += [f"Not claimed: {escape(', '.join(contract['unclaimed_features']), inline=True)}", ""]
    if contract["message"]:
        # With per-test details the message is shortened like them; without,
        # it is all the evidence shown, so it keeps more.
        lines += [fenced(truncate(contract["message"], detail_limit or 400)), ""]
    for fix in known_fixes(contract):
        lines += [f"Known fix: {escape(fix, 600, inline=True)}", ""]
    if contract["rerun"]:
        lines += ["Rerun this contract:", "", fenced(contract["rerun"], "sh"), ""]
    if detail_limit:
        for test in contract["tests"]:
            if test["verdict"] in FAILING or test["verdict"] == "xfail":
                body = "\n".join(part for part in (test["details"] or test["message"],
                                                   f"rerun: {test['rerun']}") if part)
                lines += [*collapsed(f"{test['verdict']}: {test['nodeid']}",
                                     fenced(truncate(body, detail_limit))), ""]
    return lines


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{counts[v]} {v}" for v in reversed(VERDICT_ORDER) if counts.get(v))


def _operators(document: dict[str, Any]) -> list[str]:
    """The operator matrix, summarized: counts, then the cells that failed."""
    operators = document.get("operators", [])  # (format 3)
    if not operators:
        return []
    counts = document["summary"]["operators"]
    lines = ["", "### Operators", "",
             f"{counts['operators']} operators checked, {counts['claimed']} claimed by the backend. "
             f"Operators: {_counts(counts['verdicts'])}. Cells (operator × dtype): {_counts(counts['cells'])}."]
    cells = failing_cells(document)
    if cells:
        rows = [[escape(o["name"], 100, inline=True), escape(c["dtype"], 40, inline=True), c["verdict"],
                 escape(cell_problems(c), 240, inline=True)] for o, c in cells[:MAX_CELLS]]
        lines += ["", *table(["operator", "dtype", "verdict", "checks"], rows)]
        if len(cells) > MAX_CELLS:
            lines += ["", f"… and {len(cells) - MAX_CELLS} more failing cells: see report.html or report.json."]
    return lines


def _lists(document: dict[str, Any]) -> list[str]:
    summary, lines = document["summary"], []
    causes = summary.get("root_causes", [])  # (format 2)
    if causes:
        lines += ["", "**Shared root causes** (one underlying error behind several failing tests):", ""]
        lines += [f"- {group['verdict']}, {len(group['tests'])} tests ({id_list(group['contracts'], 12)}): "
                  f"{escape(group['cause'], 300, inline=True)}" for group in causes[:20]]
        if len(causes) > 20:
            lines.append(f"- and {len(causes) - 20} more (see report.json)")
    for key, label in (("stale_expectations", "Stale expectations (these contracts now pass)"),
                       ("uncovered", "Contracts without any test"),
                       ("unclaimed_features", "Features the backend does not claim")):
        if summary[key]:
            lines += ["", f"**{label}:** {id_list(summary[key], 60)}"]
    for warning in document["provenance"]["warnings"]:
        lines += ["", f"**Warning:** {escape(warning, 500, inline=True)}"]
    return lines


def _provenance(document: dict[str, Any]) -> list[str]:
    rows = [[escape(key, inline=True), escape(value, 300, inline=True)] for key, value in provenance_rows(document["provenance"])]
    rows.append(["digest", f"sha256 {document['digest']['value']}"])
    return ["", *collapsed("Provenance", "\n".join(table(["", ""], rows)))]


def render(document: dict[str, Any], budget: int = BUDGET) -> str:
    head = _overview(document) + _operators(document) + _lists(document)
    tail = _provenance(document)
    failures = failing_contracts(document)
    torch_version = document["provenance"].get("torch_version")

    def build(shown: list[dict[str, Any]], detail_limit: int) -> str:
        body = []
        if failures:
            body = ["", f"### Not satisfied ({len(failures)})", ""]
            for contract in shown:
                body += _failure(contract, detail_limit, torch_version)
            if len(shown) < len(failures):
                body += [f"… and {len(failures) - len(shown)} more: see report.html or report.json.", ""]
        return "\n".join(head + body + tail) + "\n"

    # Every detail shorter, step by step; then without per-test details; then
    # fewer failures, until the summary fits.
    for detail_limit in (*DETAIL_LIMITS, 0):
        text = build(failures, detail_limit)
        if len(text) <= budget:
            return text
    shown = failures
    while len(text) > budget and shown:
        shown = shown[: len(shown) // 2]
        text = build(shown, 0)
    return text
