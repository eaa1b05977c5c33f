"""Helpers for the project's tests of the conformance kit: running the suite
(or a scratch suite) in a subprocess, the way a vendor would, and reading
the JSON report it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURE_DIR = REPO / "build" / "dev" / "fixtures"
# The plugin, by its pytest11 entry point's name (loaded even with
# PYTEST_DISABLE_PLUGIN_AUTOLOAD set).
PLUGIN = "privateuse1_conformance"
SUITE = "privateuse1_conformance.conformance"


@dataclass
class SuiteRun:
    returncode: int
    stdout: str
    stderr: str
    report: dict | None

    def verdicts(self) -> dict[str, str]:
        """Contract ID -> verdict."""
        assert self.report is not None, f"no report was written:\n{self.stdout[-3000:]}\n{self.stderr[-3000:]}"
        return {c["id"]: c["verdict"] for c in self.report["contracts"]}

    def contract(self, contract_id: str) -> dict:
        return next(c for c in self.report["contracts"] if c["id"] == contract_id)


def run_pytest(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 900) -> SuiteRun:
    """Run pytest with the conformance plugin in a fresh interpreter in `cwd`
    (a neutral folder: the repository's conftest files stay out of it)."""
    report_dir = cwd / "report"
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(FIXTURE_DIR), full_env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider",
         f"--report-dir={report_dir}", "-q", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )
    report_file = report_dir / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else None
    return SuiteRun(proc.returncode, proc.stdout, proc.stderr, report)


def run_suite(backend: str, cwd: Path, *args: str, env: dict | None = None, timeout: float = 900) -> SuiteRun:
    """Run the whole conformance suite against `backend`."""
    return run_pytest([f"--backend={backend}", "--pyargs", SUITE, *args], cwd, env, timeout)
