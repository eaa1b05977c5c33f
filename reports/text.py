"""Helpers shared by the renderings: making backend-derived text safe to
embed, and the numbers every rendering shows the same way."""

from __future__ import annotations

import json
import re
from typing import Any

# Control characters (other than tab and newline), DEL, C1 controls, the
# two non-characters XML 1.0 forbids even as character references, and the
# bidirectional overrides that can make text read differently than it is.
# They can reach us from a backend (terminal colour codes, NULs in C strings)
# and would make XML invalid, or hide or disguise text.
_UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ufffe\uffff]")

FAILING = ("fail", "error", "crash", "hang")
# Display order (worst first) and colours, shared by HTML, badge and Markdown.
VERDICT_ORDER = ("crash", "hang", "fail", "error", "no-test", "inconclusive", "xfail", "not-claimed", "skip", "xpass",
                 "pass")
VERDICT_COLOURS = {
    "pass": "#2e7d32", "xpass": "#66bb6a", "skip": "#9e9e9e", "not-claimed": "#78909c",
    "xfail": "#f9a825", "error": "#ef6c00", "fail": "#c62828", "hang": "#6a1b9a",
    "crash": "#000000", "no-test": "#bdbdbd", "inconclusive": "#8d6e63",
}


def printable(text: str) -> str:
    """`text` with unprintable characters written as visible escapes (\\x1b,
    \\u202e) and CR LF / CR turned into LF."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _UNPRINTABLE.sub(_visible_escape, text)


def _visible_escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def map_strings(value: Any, function) -> Any:
    """`value` (JSON data) with `function` applied to every string in it."""
    if isinstance(value, str):
        return function(value)
    if isinstance(value, dict):
        return {k: map_strings(v, function) for k, v in value.items()}
    if isinstance(value, list):
        return [map_strings(v, function) for v in value]
    return value


def single_line(text: str) -> str:
    """`text` printable and on one line (for a terminal's line-oriented output)."""
    return printable(text).replace("\n", " ")


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
    """Satisfied contracts among those the backend claims (format 5; before,
    among all checked)."""
    summary = document["summary"]
    if "claimed_contracts" in summary:
        return percent(summary["claimed_satisfied"], summary["claimed_contracts"])
    return percent(summary["satisfied"], summary["contracts"])


def narrowed_by(document: dict[str, Any]) -> list[str]:
    """What selected only part of the suite (format 5): such a run certifies nothing."""
    return list((document["provenance"].get("selection") or {}).get("narrowed_by", []))


def optional_claimed(document: dict[str, Any]) -> str:
    """'3/9 optional features' (format 5), or '' for older reports."""
    summary = document["summary"]
    if "claimed_optional_features" not in summary:
        return ""
    return f"{len(summary['claimed_optional_features'])}/{len(summary['optional_features'])} optional features"


def backend_label(document: dict[str, Any]) -> str:
    """The backend's name and, when it says something else, its module."""
    provenance = document["provenance"]
    name, module = provenance["backend_name"], provenance["backend_module"]
    return name if not module or module == name else f"{name} ({module})"


def level_label(document: dict[str, Any]) -> str:
    """'full · 3/9 optional features': the level with what was claimed
    beside it, so that a level reached with every option declared absent
    never reads like one with all of them."""
    level = document["summary"]["level_reached"] or "no level"
    optional = optional_claimed(document)
    return f"{level} · {optional}" if optional else level


def title(document: dict[str, Any]) -> str:
    """'openreg: full · 10/10 optional features · 100%' — the line a badge, a
    page title and a summary share. The percentage counts claimed contracts."""
    incomplete = "" if document["complete"] else " (incomplete)"
    narrowed = " (narrowed run: certifies nothing)" if narrowed_by(document) else ""
    shard = document["provenance"].get("shard")  # (format 4) a shard's verdicts are not the run's
    part = f" (shard {shard['index']}/{shard['count']})" if shard else ""
    return (f"{backend_label(document)}: {level_label(document)} · {satisfied_percent(document)}%"
            f"{part}{narrowed}{incomplete}")


def failing_contracts(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Contracts that keep the backend from the level it was checked up to,
    worst verdict first (stable within a verdict)."""
    unsatisfied = [c for c in document["contracts"] if not c["satisfied"]]
    return sorted(unsatisfied, key=lambda c: VERDICT_ORDER.index(c["verdict"]))


def unsatisfied_of_level(document: dict[str, Any], level: str) -> list[str]:
    """IDs of the contracts of `level` itself that are not satisfied (the
    summary's `blocking` also repeats those of the levels below)."""
    return [c["id"] for c in document["contracts"] if c["level"] == level and not c["satisfied"]]


def provenance_rows(provenance: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value) pairs for a provenance table: lists and mappings flattened
    to one readable string each."""
    rows = []
    for key, value in provenance.items():
        if key == "shard" and value:
            value = (f"{value['index']} of {value['count']}: part of a run of {value['selected']} tests "
                     f"(sha256 of their IDs {value['selection_sha256']})")
        elif key == "shards":
            if not value:
                continue  # a run in one job
            for record in value:
                rows.append((f"shard {record['index']}/{record['count']}",
                             f"{record['tests']} tests, started {record['started']}, "
                             f"{record['duration_ms'] / 1000:.1f} s, on {record['platform']}; report sha256 "
                             f"{record['digest']}; {' '.join(record['command_line'])}"))
            continue
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = " ".join(value) if key == "command_line" else "; ".join(value)
        elif isinstance(value, dict) or value is None:
            value = json.dumps(value, ensure_ascii=False, sort_keys=True) if value else "—"
        rows.append((key, str(value)))
    return rows


def known_fixes(contract: dict[str, Any]) -> list[str]:
    """The known fixes (format 5's optional `fix`) of the symptoms a
    contract's failing tests show in a report document, once each."""
    return list(dict.fromkeys(test["fix"] for test in contract["tests"]
                              if test.get("fix") and (test["verdict"] in FAILING or test["verdict"] == "xfail")))


# Paths in a contract's `source` that name a file of PyTorch's repository
# (docs pages, headers, sources); an installed header may be cited from
# torch/include.
_SOURCE_PATH = re.compile(r"(?<![\w/.-])(?:torch/include/)?((?:docs|aten|c10|torch|caffe2)/[\w./-]+?\.(?:md|rst|h|hpp|cpp|cu|py))\b")


def source_links(source: str, torch_version: str | None) -> list[tuple[str, str]]:
    """(path, URL) of every PyTorch repository file `source` names, linked to
    the tag of the torch version the report was made with (main when the
    version has no release tag)."""
    match = re.match(r"(\d+\.\d+\.\d+)(?:[+a-z]|$)", torch_version or "")
    ref = f"v{match.group(1)}" if match and "+git" not in (torch_version or "") else "main"
    links, seen = [], set()
    for found in _SOURCE_PATH.finditer(source):
        path = found.group(1)
        if path not in seen:
            seen.add(path)
            links.append((path, f"https://github.com/pytorch/pytorch/blob/{ref}/{path}"))
    return links


# ------------------------------------------------------------ operator matrix

# The order of a matrix's columns: floating types first, then complex,
# integer and boolean ones; then "any" (the error checks) and "all" (an
# operator excluded whole). Unknown dtypes go last, by name.
_DTYPE_ORDER = ("float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32", "int64",
                "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool", "any", "all")


def matrix_dtypes(document: dict[str, Any]) -> list[str]:
    """The dtypes of the operator matrix's columns, in display order."""
    found = {c["dtype"] for o in document.get("operators", []) for c in o["cells"]}
    rank = {d: i for i, d in enumerate(_DTYPE_ORDER)}
    return sorted(found, key=lambda d: (rank.get(d, len(rank)), d))


# The verdicts of the matrix's cells (and checks) the renderings list: the
# failures, and those the expectations file expects.
SHOWN_CELL_VERDICTS = (*FAILING, "xfail")


def failing_cells(document: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(operator, cell) for every cell whose verdict is a failure or an
    expected one, worst verdict first (stable within a verdict)."""
    cells = [(o, c) for o in document.get("operators", []) for c in o["cells"]
             if c["verdict"] in SHOWN_CELL_VERDICTS]
    return sorted(cells, key=lambda oc: VERDICT_ORDER.index(oc[1]["verdict"]))


def cell_problems(cell: dict[str, Any]) -> str:
    """'forward: fail (why); out: fail (why)': the checks of a cell that did
    not pass, with their messages."""
    parts = []
    for check, verdict in cell["checks"].items():
        if verdict in SHOWN_CELL_VERDICTS:
            why = cell["messages"].get(check, "")
            parts.append(f"{check}: {verdict}" + (f" ({why})" if why else ""))
    return "; ".join(parts)
