"""The reports of real runs, through the `privateuse1-conformance` command as
a vendor and a reviewer use it: a reference run against OpenReg leaves every
format, `verify` accepts it and rejects edits, `diff` against a fixture
backend's run reports the regressions, and a run killed midway still leaves
a valid, incomplete report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kit_support import DECIDE_ALL, FIXTURE_DIR, pu1_minimal_run, run_pytest, verify_problems
from privateuse1_conformance.reports import json_report, writer
from privateuse1_conformance.reports.model import Verdict

REPORT_FILES = {"report.json", "report.junit.xml", "report.md", "report.html", "badge.svg"}


def cli(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(FIXTURE_DIR), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run([sys.executable, "-m", "privateuse1_conformance.harness.cli", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The README's main job: the suite against the reference backend."""
    folder = tmp_path_factory.mktemp("reference")
    run = cli("run", "--backend", "openreg", "--report-dir", "out", cwd=folder)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Reports: " in run.stdout
    return folder / "out"


@pytest.fixture(scope="module")
def minimal(tmp_path_factory) -> Path:
    """The minimal fixture backend's run (shared with test_kit_fixture_backends.py)."""
    if not any(FIXTURE_DIR.glob("pu1_minimal*.so")):
        pytest.skip("fixture backends are not built (make build)")
    folder, run = pu1_minimal_run(tmp_path_factory)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    return folder


def test_reference_run_leaves_every_format(reference):
    assert REPORT_FILES <= {p.name for p in reference.iterdir()}
    document = json_report.load(reference / "report.json")
    assert json_report.schema_problems(document) == []
    assert json_report.digest_problem(document) is None
    assert document["complete"] is True and document["summary"]["level_reached"] == "full"
    provenance = document["provenance"]
    assert provenance["command_line"][1:] == ["run", "--backend", "openreg", "--report-dir", "out"]
    assert provenance["registry"]["sha256"] and provenance["backend_version"]
    junit = ET.parse(reference / "report.junit.xml").getroot()
    assert int(junit.get("tests")) == sum(document["summary"]["test_verdicts"].values())
    assert junit.get("failures") == "0" and junit.get("errors") == "0"
    assert "openreg: full · 12/12 optional · 100%" in (reference / "badge.svg").read_text()
    assert "**Level reached: full**" in (reference / "report.md").read_text()
    assert 'id="level-reached" class="level">full<' in (reference / "report.html").read_text()


def test_renderings_come_from_the_json_alone(reference, tmp_path):
    rendered = cli("render", str(reference / "report.json"), "--report-dir", str(tmp_path), cwd=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    for name, _ in writer.RENDERINGS.values():
        assert (tmp_path / name).read_text() == (reference / name).read_text(), name


def test_verify_accepts_the_reference_report(reference):
    result = cli("verify", str(reference / "report.json"), cwd=reference)
    assert verify_problems(result.stdout) == [], result.stdout + result.stderr


def test_verify_rejects_one_changed_verdict(reference, tmp_path):
    document = json_report.load(reference / "report.json")
    document["contracts"][0]["verdict"] = "fail"
    edited = tmp_path / "report.json"
    edited.write_text(json.dumps(document))
    result = cli("verify", str(edited), cwd=tmp_path)
    assert result.returncode == 1
    assert "NOT VERIFIED" in result.stdout and "digest mismatch" in result.stdout


def test_verify_rejects_a_resealed_failing_mandatory_contract(reference, tmp_path):
    # Re-rendered by the kit itself: digest and summaries are consistent, but a
    # core contract now fails.
    run = json_report.from_document(json_report.load(reference / "report.json"))
    contract = next(r for r in run.contracts if r.contract.level == "core")
    contract.tests[0].verdict = Verdict.FAIL
    writer.write_json(tmp_path, json_report.to_document(run))
    result = cli("verify", str(tmp_path / "report.json"), "--level", "core", cwd=tmp_path)
    assert result.returncode == 1, result.stdout
    assert f"{contract.contract.id} (core): verdict fail does not satisfy level core" in result.stdout
    assert "digest" not in result.stdout and "inconsistent" not in result.stdout


def test_verify_and_diff_refuse_what_is_not_a_report(tmp_path):
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    (tmp_path / "broken.json").write_text("{")
    assert cli("verify", "broken.json", cwd=tmp_path).returncode == 2
    result = cli("verify", "bad.json", cwd=tmp_path)
    assert result.returncode == 1 and "schema:" in result.stdout
    assert cli("diff", "bad.json", "bad.json", cwd=tmp_path).returncode == 2


def test_diff_reference_against_a_fixture_backend(reference, minimal):
    result = cli("diff", str(reference / "report.json"), str(minimal / "report.json"), cwd=minimal)
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "Level reached: full -> none (dropped)" in out
    assert "Regressions (" in out and "HK-CTX-001" in out and "pass -> fail" in out
    assert "note: different backends: openreg -> pu1_minimal" in out
    assert out.rstrip().splitlines()[-1].startswith("REGRESSED")
    # The other way round, everything that differs is a fix.
    reverse = cli("diff", str(minimal / "report.json"), str(reference / "report.json"), "--format", "json",
                  cwd=minimal)
    assert reverse.returncode == 0, reverse.stdout
    data = json.loads(reverse.stdout)
    assert data["fixes"] and not data["regressions"] and data["regressed"] is False
    same = cli("diff", str(reference / "report.json"), str(reference / "report.json"), cwd=minimal)
    assert same.returncode == 0 and "no regression" in same.stdout
    verified = cli("verify", str(minimal / "report.json"), "--level", "core", cwd=minimal)
    assert verified.returncode == 1 and "HK-CTX-001 (core): verdict fail" in verified.stdout


KILLED_SUITE = '''
import os, signal, time
import pytest

@pytest.mark.contract("DM-NAME-001")
def test_first():
    decide_all("DM-NAME-001")
    time.sleep(1)  # long enough for the report to be rewritten after it (see WRITE_INTERVAL)

@pytest.mark.contract("DM-NAME-002")
def test_kills_the_run():
    os.kill(os.getppid(), signal.SIGKILL)  # the pytest process, as an OOM killer or a CI timeout would

@pytest.mark.contract("DM-MOD-001")
def test_never_runs():
    pass
'''


def test_killed_run_leaves_a_valid_incomplete_report(tmp_path):
    (tmp_path / "test_killed.py").write_text(KILLED_SUITE + DECIDE_ALL)
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    (report_dir / "report.html").write_text("from an earlier run")
    run = run_pytest(["--backend=openreg", "test_killed.py"], tmp_path)
    assert run.returncode == -9, run.stdout[-2000:] + run.stderr[-2000:]
    document = run.report
    assert document is not None, "the killed run left no report"
    assert json_report.schema_problems(document) == []
    assert json_report.digest_problem(document) is None
    assert document["complete"] is False
    verdicts = run.verdicts()
    assert verdicts["DM-NAME-001"] == "pass"
    assert verdicts["DM-NAME-002"] == verdicts["DM-MOD-001"] == "no-test"
    assert not (report_dir / "report.html").exists(), "a stale rendering must not outlive the new run's start"
    verified = cli("verify", str(report_dir / "report.json"), "--level", "core", cwd=tmp_path)
    assert verified.returncode == 1 and "the run is incomplete" in verified.stdout
    rendered = cli("render", str(report_dir / "report.json"), cwd=tmp_path)
    assert rendered.returncode == 0 and "Incomplete run" in (report_dir / "report.html").read_text()


def _machine_roots() -> set[str]:
    import tempfile

    from kit_support import REPO

    return {os.path.expanduser("~"), tempfile.gettempdir(), sys.prefix, os.path.realpath(sys.prefix), str(REPO)}


@pytest.mark.parametrize("which", ["reference", "minimal"])
def test_a_published_report_carries_no_path_of_the_machine(which, request):
    """Reports are published and rerun elsewhere: no rendering names the
    run machine's home, temporary folder, Python environment or checkout
    (paths are relative to the working directory or placeholders such as
    <site-packages>/, harness/paths.py). The minimal backend's run has
    tracebacks in its details; the reference run has the command lines."""
    folder = request.getfixturevalue(which)
    for name in sorted(REPORT_FILES):
        text = (folder / name).read_text()
        for root in _machine_roots():
            assert root + "/" not in text, f"{name} names {root}/: ...{text[text.index(root + '/') - 200:][:400]}"
    document = json.loads((folder / "report.json").read_text())
    rerun = next(t["rerun"] for c in document["contracts"] for t in c["tests"])
    assert rerun.startswith("privateuse1-conformance run --backend="), rerun
