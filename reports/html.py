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
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from .text import VERDICT_COLOURS, VERDICT_ORDER, failing_contracts, printable, satisfied_percent, title, truncate

TEMPLATES = Path(__file__).resolve().parent / "templates"


def _printable_copy(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: _printable_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable_copy(v) for v in value]
    return value


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True)
    environment.filters["truncate_text"] = truncate
    return environment


def _provenance_rows(provenance: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for key, value in provenance.items():
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = " ".join(value) if key == "command_line" else "; ".join(value)
        elif isinstance(value, dict) or value is None:
            value = json.dumps(value, ensure_ascii=False, sort_keys=True) if value else "—"
        rows.append((key, str(value)))
    return rows


def render(document: dict[str, Any]) -> str:
    display = _printable_copy(document)
    script = (TEMPLATES / "report.js").read_text(encoding="utf-8")
    script_hash = "sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    summary = display["summary"]
    return _environment().get_template("report.html.j2").render(
        doc=display,
        s=summary,
        p=display["provenance"],
        title=title(display),
        percent=satisfied_percent(display),
        test_count=sum(summary["test_verdicts"].values()),
        failures=failing_contracts(display),
        verdict_columns=[v for v in reversed(VERDICT_ORDER) if summary["verdicts"][v]],
        colours=VERDICT_COLOURS,
        provenance_rows=_provenance_rows(display["provenance"]),
        css=Markup((TEMPLATES / "report.css").read_text(encoding="utf-8")),
        script=Markup(script),
        script_hash=script_hash,
    )
