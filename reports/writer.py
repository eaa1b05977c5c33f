"""Writing a run's reports into a folder, atomically: a reader (or a run
killed in the middle) never sees a half-written file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from . import badge, html, json_report, junit, markdown
from .model import Run

JSON_FILE = "report.json"
# Renderings of the JSON document, by format name.
RENDERINGS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "junit": ("report.junit.xml", junit.render),
    "markdown": ("report.md", markdown.render),
    "html": ("report.html", html.render),
    "badge": ("badge.svg", badge.render),
}


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files readable by their owner only; reports are for sharing.
FILE_MODE = 0o666 & ~_umask()


def atomic_write(path: Path, text: str) -> None:
    """Replace `path` by `text` at once: a reader sees the old file or the
    new one. Interrupted anywhere (SIGINT is a KeyboardInterrupt here), it
    leaves no temporary file and lets the interrupt through: the cleanup
    never raises in its place (the file may already be renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchmod(f.fileno(), FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


def write_json(report_dir: str | Path, document: dict[str, Any], compact: bool = False) -> Path:
    path = Path(report_dir) / JSON_FILE
    atomic_write(path, json_report.dumps(document, indent=None if compact else 1))
    return path


def remove_renderings(report_dir: str | Path) -> None:
    """Delete the renderings of an earlier run, so that none can disagree with
    the report.json a new (possibly interrupted) run is writing."""
    for name, _ in RENDERINGS.values():
        try:
            (Path(report_dir) / name).unlink()
        except FileNotFoundError:
            pass


def render_all(report_dir: str | Path, document: dict[str, Any]) -> dict[str, Path]:
    """Write every rendering of `document`; return {format: path}."""
    written = {}
    for format_name, (name, render) in RENDERINGS.items():
        path = Path(report_dir) / name
        atomic_write(path, render(document))
        written[format_name] = path
    return written


def write_all(report_dir: str | Path, run: Run) -> dict[str, Path]:
    """Write the JSON document of `run` and every rendering; return {format: path}."""
    document = json_report.to_document(run)
    return {"json": write_json(report_dir, document), **render_all(report_dir, document)}
