"""Helpers shared by the renderings: making backend-derived text safe to
embed, and the numbers every rendering shows the same way."""

from __future__ import annotations

import re
from typing import Any

# Control characters (other than tab and newline), DEL, C1 controls and the
# two non-characters XML 1.0 forbids even as character references. They can
# reach us from a backend (terminal colour codes, NULs in C strings) and would
# make XML invalid, or hide text in a terminal or a browser.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffe\uffff]")

FAILING = ("fail", "error", "crash", "hang")
# Display order (worst first) and colours, shared by HTML, badge and Markdown.
VERDICT_ORDER = ("crash", "hang", "fail", "error", "no-test", "xfail", "not-claimed", "skip", "xpass", "pass")
VERDICT_COLOURS = {
    "pass": "#2e7d32", "xpass": "#66bb6a", "skip": "#9e9e9e", "not-claimed": "#78909c",
    "xfail": "#f9a825", "error": "#ef6c00", "fail": "#c62828", "hang": "#6a1b9a",
    "crash": "#000000", "no-test": "#bdbdbd",
}


def printable(text: str) -> str:
    """`text` with unprintable characters written as visible escapes (\\x1b)
    and CR LF / CR turned into LF."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                            else "\ufffd", text)


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def one_line(text: str, limit: int = 200) -> str:
    """The first non-empty line of `text`, printable and at most `limit` characters."""
    line = next((l.strip() for l in printable(text).split("\n") if l.strip()), "")
    return truncate(line, limit)


def percent(satisfied: int, checked: int) -> int:
    """Whole percent, rounded down: 99.6 % must not read as 100 %."""
    return satisfied * 100 // checked if checked else 0


def satisfied_percent(document: dict[str, Any]) -> int:
    summary = document["summary"]
    return percent(summary["satisfied"], summary["contracts"])


def title(document: dict[str, Any]) -> str:
    """'openreg: full 100%' — the line a badge, a page title and a summary share."""
    level = document["summary"]["level_reached"] or "no level"
    incomplete = "" if document["complete"] else " (incomplete)"
    return f"{document['provenance']['backend_name']}: {level} {satisfied_percent(document)}%{incomplete}"


def failing_contracts(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Contracts that keep the backend from the level it was checked up to,
    worst verdict first (stable within a verdict)."""
    unsatisfied = [c for c in document["contracts"] if not c["satisfied"]]
    return sorted(unsatisfied, key=lambda c: VERDICT_ORDER.index(c["verdict"]))
