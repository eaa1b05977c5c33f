"""Writing a run's reports into a folder (atomically: a reader never sees a
half-written file)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from . import json_report
from .model import Run


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_all(report_dir: str | Path, run: Run) -> dict[str, Path]:
    """Write every format; return {format: path}."""
    report_dir = Path(report_dir)
    written = {}
    path = report_dir / "report.json"
    atomic_write(path, json.dumps(json_report.to_document(run), indent=2, sort_keys=False) + "\n")
    written["json"] = path
    return written
