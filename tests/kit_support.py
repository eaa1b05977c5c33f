"""Helpers for the project's tests of the conformance kit: running the suite
(or a scratch suite) in a subprocess, the way a vendor would, and reading
the JSON report it writes."""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

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
    report_dir: str = ""   # where the run wrote its reports

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
    return SuiteRun(proc.returncode, proc.stdout, proc.stderr, report, str(report_dir))


def run_suite(backend: str, cwd: Path, *args: str, env: dict | None = None, timeout: float = 900) -> SuiteRun:
    """Run the whole conformance suite against `backend`."""
    return run_pytest([f"--backend={backend}", "--pyargs", SUITE, *args], cwd, env, timeout)


def shared_folder(tmp_path_factory) -> Path:
    """A folder of this test session's, the same in every pytest-xdist worker
    (under the session's base temporary folder: pytest removes old ones)."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"
    folder.mkdir(exist_ok=True)
    return folder


def shared_run(tmp_path_factory, name: str, produce: Callable[[Path], SuiteRun]) -> SuiteRun:
    """`produce(folder)`'s run, made once per test session and shared by the
    tests of every pytest-xdist worker that need the same run: the first
    makes it (in a folder of its own) while the others wait, then each reads
    it. A whole-suite run of a fixture backend costs minutes; the tests that
    judge it need not pay it each."""
    folder = shared_folder(tmp_path_factory)
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = folder / f"{name}.json"
        if record.exists():
            return SuiteRun(**json.loads(record.read_text()))
        work = folder / name
        work.mkdir(exist_ok=True)  # (left by a maker that failed: made again)
        run = produce(work)
        record.write_text(json.dumps(dataclasses.asdict(run)))
        return run


# --- the CI recipe (docs/ci/conformance.sh) on the independent fixture backend

CI_SCRIPT = REPO / "docs" / "ci" / "conformance.sh"
PU1_SYNC_MANIFEST = REPO / "tests" / "fixtures" / "pu1_sync" / "manifest.toml"
BIN = Path(sys.executable).parent


def pu1_sync_site(site: Path) -> str:
    """PYTHONPATH for pu1_sync as a vendor's CI has it: importable, and
    installed as a versioned distribution in `site` (verify refuses a
    backend without a version; the fixture module has none)."""
    if not any((FIXTURE_DIR / "pu1_sync").glob("_C*")):
        raise AssertionError(f"the fixture backend pu1_sync is not built in {FIXTURE_DIR}: run make build")
    info = site / "pu1_sync-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pu1-sync\nVersion: 0.1.0\n")
    (info / "top_level.txt").write_text("pu1_sync\n")
    return os.pathsep.join((str(FIXTURE_DIR), str(site)))


CI_SETTINGS = ("BACKEND", "KIT", "BACKEND_PACKAGE", "MANIFEST", "EXPECTATIONS", "LEVEL", "REPORT_DIR", "PYTHON")


def job_env(*dropped: str) -> dict:
    """This process's environment without the CI recipe's settings, pytest's,
    GitHub's and the runner's variables, and `dropped`: where a CI job starts."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTEST_", "GITHUB_", "RUNNER_")) and k not in CI_SETTINGS + dropped}


def ci_env(folder: Path, **settings: str) -> dict:
    """The environment of a CI job that has torch, the backend and the kit
    installed (this interpreter's environment), with GitHub's job summary
    in `folder`."""
    env = job_env()
    env["PATH"] = os.pathsep.join((str(BIN), env.get("PATH", "")))
    summary = folder / "step-summary.md"
    summary.touch()
    env["GITHUB_STEP_SUMMARY"] = str(summary)
    env.update(settings)
    return env


def ci_settings(backend_path: str, **more: str) -> dict:
    return {"BACKEND": "pu1_sync", "KIT": "", "BACKEND_PACKAGE": "", "PYTHON": sys.executable,
            "MANIFEST": str(PU1_SYNC_MANIFEST), "PYTHONPATH": backend_path, **more}


def ci_script(cwd: Path, env: dict, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(CI_SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


KIT_INSTALL_SCRIPT = REPO / "tests" / "kit_install.sh"


@dataclass
class InstalledKit:
    """tests/kit_install.sh's run against pu1_sync (made once per test
    session): the kit installed alone into a fresh environment, then, from
    an unrelated folder, the CI recipe with its defaults (the whole suite,
    two devices, the level the manifest claims, the CLI's default workers)
    and `pytest --backend` (the core level, one worker)."""

    work: Path  # the script's folder: venv/, times.tsv, probe-cache/, pytest-report/
    ci_folder: Path  # where the recipe ran: conformance-report/, step-summary.md
    ci_env: dict  # the recipe's environment (its job summary, the backend's path)
    ci: SuiteRun  # the script's status and output, the recipe's report
    serial: SuiteRun  # the script's status and output, pytest's report


def installed_kit(tmp_path_factory) -> InstalledKit:
    """The one install-and-run of the kit that test_kit_install.py judges as
    a vendor's install, test_ci_recipe.py as the CI recipe, and
    test_kit_fairness.py by the verdicts of its two-device run."""
    folder = shared_folder(tmp_path_factory) / "kit-install"
    ci_folder = folder / "unrelated"
    backend_path = os.pathsep.join((str(FIXTURE_DIR), str(folder / "site")))
    env = job_env("PYTHONPATH", "VIRTUAL_ENV", "PU1C_PROBE_CACHE")  # (nothing of this environment's)
    # The base interpreter, not this venv's: the new environment must not see this one's packages.
    env["BASE_PYTHON"] = getattr(sys, "_base_executable", sys.executable)
    env["GITHUB_STEP_SUMMARY"] = str(ci_folder / "step-summary.md")

    def produce(work: Path) -> SuiteRun:
        pu1_sync_site(work / "site")
        (work / "unrelated").mkdir(exist_ok=True)
        (work / "unrelated" / "step-summary.md").write_text("")
        proc = subprocess.run(["bash", str(KIT_INSTALL_SCRIPT), str(work), "pu1_sync", backend_path,
                               str(PU1_SYNC_MANIFEST)], capture_output=True, text=True, env=env, timeout=2400)
        return SuiteRun(proc.returncode, proc.stdout, proc.stderr, None)

    script = shared_run(tmp_path_factory, "kit-install", produce)

    def report(path: Path) -> dict | None:
        return json.loads(path.read_text()) if path.exists() else None

    return InstalledKit(
        folder, ci_folder, {**env, "PYTHONPATH": backend_path},
        dataclasses.replace(script, report=report(ci_folder / "conformance-report" / "report.json")),
        dataclasses.replace(script, report=report(folder / "pytest-report" / "report.json")))


def pu1_sync_one_device_run(tmp_path_factory) -> SuiteRun:
    """The whole suite against pu1_sync with one device, by pytest with one
    worker, in this environment (test_kit_fairness.py): made once per test
    session by whichever worker needs it first, independently of the install
    above, so that the two whole runs can proceed side by side."""
    return shared_run(tmp_path_factory, "pu1_sync-one-device",
                      lambda work: run_suite("pu1_sync", work, f"--manifest={PU1_SYNC_MANIFEST}",
                                             env={"PU1_SYNC_DEVICE_COUNT": "1"}))


# OpenReg as the kit's rank launcher (conformance/_distributed.py) sees a
# backend under test, and the environment its ranks need to import the
# scenario modules of this folder (kit_dist_scenarios.py,
# openreg_pg_scenarios.py): for the tests that drive ranks directly.
OPENREG_RANKS = SimpleNamespace(module_name="openreg", device_type="openreg",
                                manifest=SimpleNamespace(instrumentation=None))
SCENARIO_ENV = {"PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}


# A few operators: the runs of the other fixture backends are about the
# contracts' verdicts (the operators area's own tests are test_kit_operators.py).
FEW_OPERATORS = "--operators=add,mul,sum"


def pu1_minimal_run(tmp_path_factory) -> tuple[Path, SuiteRun]:
    """(its report's folder, the run) of the suite against the deliberately
    minimal fixture backend, with a few operators: made once per test session
    for test_kit_fixture_backends.py and test_reports_run.py."""
    run = shared_run(tmp_path_factory, "pu1_minimal",
                     lambda work: run_suite("pu1_minimal", work, "--contract-timeout=20", FEW_OPERATORS))
    return shared_folder(tmp_path_factory) / "pu1_minimal" / "report", run


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


@functools.cache
def _mutation_module(name: str):
    """A module of mutation/ (no installed package), loaded by its path."""
    spec = importlib.util.spec_from_file_location(f"_kit_support_{name}", REPO / "mutation" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def weaver():
    """mutation/weave.py, the mutant weaver."""
    return _mutation_module("weave")


def mutation_runner():
    """mutation/run.py, the mutation run's command."""
    return _mutation_module("run")
