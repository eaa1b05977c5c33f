"""A self-contained HTML page: one file, inline CSS and JavaScript, no network
(a Content-Security-Policy forbids every fetch and every script but its own),
readable offline and without JavaScript (filtering needs it).

Escaping: Jinja2's autoescape HTML-escapes every value; before that, every
string of the document is made printable (text.printable), so control
characters cannot hide text either.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from .text import (VERDICT_COLOURS, VERDICT_ORDER, backend_label, cell_problems, failing_cells, failing_contracts,
                   known_fixes, map_strings, matrix_dtypes, narrowed_by, optional_claimed, printable, provenance_rows,
                   satisfied_percent, source_links, title, truncate, unsatisfied_of_level)

# One letter per verdict in the operator matrix's squares (the colour says it
# too; the letter is for people who do not tell the colours apart).
CELL_LETTERS = {"pass": "", "xpass": "+", "fail": "F", "error": "E", "crash": "C", "hang": "H", "not-claimed": "n",
                "skip": "s", "xfail": "x", "inconclusive": "?", "no-test": "-"}

TEMPLATES = Path(__file__).resolve().parent / "templates"


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True)
    environment.filters["truncate_text"] = truncate
    environment.globals["source_links"] = source_links
    environment.globals["known_fixes"] = known_fixes
    return environment


def render(document: dict[str, Any]) -> str:
    display = map_strings(document, printable)
    script = (TEMPLATES / "report.js").read_text(encoding="utf-8")
    script_hash = "sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    summary = display["summary"]
    return _environment().get_template("report.html.j2").render(
        doc=display,
        s=summary,
        p=display["provenance"],
        title=title(display),
        backend_label=backend_label(display),
        optional=optional_claimed(display),
        narrowed=narrowed_by(display),
        percent=satisfied_percent(display),
        test_count=sum(summary["test_verdicts"].values()),
        failures=failing_contracts(display),
        unsatisfied={level["level"]: unsatisfied_of_level(display, level["level"]) for level in summary["levels"]},
        verdict_columns=[v for v in reversed(VERDICT_ORDER) if summary["verdicts"][v]],
        colours=VERDICT_COLOURS,
        provenance_rows=provenance_rows(display["provenance"]),
        css=Markup((TEMPLATES / "report.css").read_text(encoding="utf-8")),
        script=Markup(script),
        script_hash=script_hash,
        **_matrix(display),
    )


def _matrix(display: dict[str, Any]) -> dict[str, Any]:
    """The operator matrix as rows of (operator, [cell or None per dtype column])."""
    dtypes = matrix_dtypes(display)
    rows = []
    for operator in display.get("operators", []):
        by_dtype = {cell["dtype"]: cell for cell in operator["cells"]}
        rows.append((operator, [by_dtype.get(dtype) for dtype in dtypes]))
    return {"matrix_dtypes": dtypes, "matrix_rows": rows, "failing_cells": failing_cells(display),
            "cell_problems": cell_problems, "cell_letters": CELL_LETTERS}
