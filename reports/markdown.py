"""A Markdown summary, sized for a pull-request comment (GitHub caps those at
65,536 characters) or a CI step summary ($GITHUB_STEP_SUMMARY).

Backend-derived text goes only into escaped table cells and paragraphs
(every ASCII punctuation character backslash-escaped: no links, emphasis,
raw HTML or extra table columns), into fenced code blocks whose fence is
longer than any backtick run inside, or HTML-escaped into <summary>.
"""

from __future__ import annotations

import html
import re
from typing import Any

from .text import (FAILING, VERDICT_ORDER, failing_contracts, one_line, printable, provenance_rows, satisfied_percent,
                   title, truncate, unsatisfied_of_level)

BUDGET = 60_000  # characters: under GitHub's comment limit, with room for a header
# How much of each failure to show, tried in order until the summary fits.
DETAIL_LIMITS = (3000, 800, 0)
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")  # every ASCII punctuation character
_BACKTICKS = re.compile("`+")


def escape(text: str, limit: int = 200) -> str:
    """One line of backend-derived text, inert in a paragraph or a table cell."""
    return _PUNCTUATION.sub(r"\\\1", one_line(text, limit))


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
    lines = [f"## PrivateUse1 conformance: {escape(title(document))}", ""]
    claimed = summary["claimed_level"]
    lines.append(
        f"**Level reached: {summary['level_reached'] or 'none'}**"
        + (f" (claimed: {claimed})" if claimed else "")
        + f" · checked up to {provenance['level_checked']}"
        + f" · {summary['satisfied']} of {summary['contracts']} contracts satisfied"
        + f" ({satisfied_percent(document)}%)"
        + f" · {provenance['duration_ms'] / 1000:.1f} s")
    lines.append("")
    lines.append(
        f"Backend {escape(provenance['backend_name'])} (module {escape(provenance['backend_module'])}"
        f" {escape(provenance['backend_version'] or 'unversioned')}), {provenance['device_count']} device(s);"
        f" torch {escape(provenance['torch_version'])}; kit {escape(provenance['kit_version'])}."
    )
    if not document["complete"]:
        lines += ["", "> **Incomplete run**: the run was interrupted or crashed; this report holds only "
                      "the tests that finished. It cannot be verified."]
    columns = _verdict_columns(document)
    rows = [[escape(a["area"]), str(a["contracts"]), str(a["satisfied"])] + [str(a["verdicts"][v]) for v in columns]
            for a in summary["areas"]]
    lines += ["", *table(["area", "contracts", "satisfied", *columns], rows)]
    level_rows = [
        [level["level"], str(level["contracts"]), str(level["satisfied"]), "yes" if level["reached"] else "no",
         escape(", ".join(unsatisfied_of_level(document, level["level"])), 300) or "—"]
        for level in summary["levels"] if level["contracts"]
    ]
    lines += ["", *table(["level", "contracts", "satisfied", "reached", "not satisfied"], level_rows)]
    return lines


def _failure(contract: dict[str, Any], detail_limit: int) -> list[str]:
    lines = [f"#### {contract['id']}: {contract['verdict']} ({escape(contract['area'])}, {contract['level']})",
             "", escape(contract["statement"], 400), ""]
    if contract["unclaimed_features"]:
        lines += [f"Not claimed: {escape(', '.join(contract['unclaimed_features']))}", ""]
    if contract["message"]:
        lines += [fenced(truncate(contract["message"], max(detail_limit, 400))), ""]
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


def _lists(document: dict[str, Any]) -> list[str]:
    summary, lines = document["summary"], []
    causes = summary.get("root_causes", [])  # (format 2)
    if causes:
        lines += ["", "**Shared root causes** (one underlying error behind several failing tests):", ""]
        lines += [f"- {group['verdict']}, {len(group['tests'])} tests ({escape(', '.join(group['contracts']), 300)}): "
                  f"{escape(group['cause'], 300)}" for group in causes[:20]]
        if len(causes) > 20:
            lines.append(f"- and {len(causes) - 20} more (see report.json)")
    for key, label in (("stale_expectations", "Stale expectations (these contracts now pass)"),
                       ("uncovered", "Contracts without any test"),
                       ("unclaimed_features", "Features the backend does not claim")):
        if summary[key]:
            lines += ["", f"**{label}:** {escape(', '.join(summary[key]), 2000)}"]
    for warning in document["provenance"]["warnings"]:
        lines += ["", f"**Warning:** {escape(warning, 500)}"]
    return lines


def _provenance(document: dict[str, Any]) -> list[str]:
    rows = [[escape(key), escape(value, 300)] for key, value in provenance_rows(document["provenance"])]
    rows.append(["digest", f"sha256 {document['digest']['value']}"])
    return ["", *collapsed("Provenance", "\n".join(table(["", ""], rows)))]


def render(document: dict[str, Any], budget: int = BUDGET) -> str:
    head = _overview(document) + _lists(document)
    tail = _provenance(document)
    failures = failing_contracts(document)

    def build(shown: list[dict[str, Any]], detail_limit: int) -> str:
        body = []
        if failures:
            body = ["", f"### Not satisfied ({len(failures)})", ""]
            for contract in shown:
                body += _failure(contract, detail_limit)
            if len(shown) < len(failures):
                body += [f"… and {len(failures) - len(shown)} more: see report.html or report.json.", ""]
        return "\n".join(head + body + tail) + "\n"

    # Shorter details first, then fewer failures, until the summary fits.
    for detail_limit in DETAIL_LIMITS:
        text = build(failures, detail_limit)
        if len(text) <= budget:
            return text
    shown = failures
    while len(text) > budget and shown:
        shown = shown[: len(shown) // 2]
        text = build(shown, 0)
    return text
