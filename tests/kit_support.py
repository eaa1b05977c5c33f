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


# For scratch suites: a passing scratch test decides every clause of its
# contracts with this (a contract passes only with every clause decided:
# harness/evidence.py), as the suite's own checks would.
DECIDE_ALL = """
from privateuse1_conformance.harness import registry as _registry
from privateuse1_conformance.harness.evidence import decided as _decided

def decide_all(*contracts):
    registry = _registry.load(_registry.default_path())
    for contract in contracts:
        for clause in registry.get(contract).clause_ids():
            _decided(clause)
"""


def _checkout_is_modified() -> bool:
    import subprocess as sp
    try:
        out = sp.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                     text=True, timeout=60).stdout
    except (OSError, sp.SubprocessError):
        return False
    return bool(out.strip())


def verify_problems(stdout: str) -> list[str]:
    """The problems `privateuse1-conformance verify` printed. A kit run from
    a modified checkout is a problem verify must report, and is one in a
    developer's tree with uncommitted changes: it is left out only there
    (CI's clean clone keeps it)."""
    problems = [line.strip()[2:] for line in stdout.splitlines() if line.startswith("  - ")]
    if _checkout_is_modified():
        problems = [p for p in problems if "modified checkout" not in p]
    return problems
