"""The kit as a product (issue 11): the pytest plugin's entry point, the
supported torch range and contracts' minimum torch, expectations naming one
test, the backend's display name, and the C++ probe's build errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from kit_support import FIXTURE_DIR, PU1_SYNC_MANIFEST, REPO, run_pytest
from privateuse1_conformance.conformance import _probe
from privateuse1_conformance.harness import backend as backend_mod
from privateuse1_conformance.harness import expectations as expectations_mod
from privateuse1_conformance.harness import registry as registry_mod
from privateuse1_conformance.harness import versions


# ------------------------------------------------------------ the pytest plugin

def test_pytest_backend_runs_the_installed_suite_from_any_folder(tmp_path):
    """No -p, no path: the pytest11 entry point loads the plugin, which runs the installed suite."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--backend=openreg",
         "--contract=DM-ACC-001", f"--report-dir={tmp_path / 'report'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "passed" in proc.stdout and (tmp_path / "report" / "report.json").exists()


def _vendor_repository(root: Path) -> Path:
    """A backend's repository, flat layout: the source tree `pu1_sync/` of an
    installed backend (here one that fails on import, as a source tree
    without its built extension does) beside a conftest.py and
    tests/conftest.py that record being loaded."""
    (root / "pu1_sync").mkdir(parents=True)
    (root / "pu1_sync" / "__init__.py").write_text(
        "raise ImportError(\"cannot import name '_C' from partially initialized module 'pu1_sync' (the source "
        "tree, not the installed package)\")\n")
    (root / "tests").mkdir()
    for conftest in (root / "conftest.py", root / "tests" / "conftest.py"):
        conftest.write_text(f"import pathlib\npathlib.Path({str(conftest) + '.loaded'!r}).write_text('')\n")
    return root


def _installed_pu1_sync() -> dict:
    """The environment where pu1_sync is importable as if installed."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(FIXTURE_DIR), os.environ.get("PYTHONPATH"))
                                                        if p)}


@pytest.mark.parametrize("command", ["cli", "pytest", "ci-recipe"])
def test_a_run_from_a_backends_repository_imports_the_installed_backend(command, tmp_path):
    """Run from the root of a flat-layout backend repository (as the CI
    recipes do): the repository's conftest files stay out of the run, so the
    source tree does not shadow the installed backend."""
    repository = _vendor_repository(tmp_path / "repository")
    bin_dir = Path(sys.executable).parent
    selection = ["--contract=DM-ACC-001", f"--report-dir={tmp_path / 'report'}"]
    env = _installed_pu1_sync()
    if command == "ci-recipe":  # (docs/ci/conformance.sh: a narrowed run, which its gate then refuses)
        env.update(BACKEND="pu1_sync", MANIFEST=str(PU1_SYNC_MANIFEST), KIT="", BACKEND_PACKAGE="",
                   PYTHON=sys.executable, REPORT_DIR=str(tmp_path / "report"))
        args = ["bash", str(REPO / "docs" / "ci" / "conformance.sh"), "-j", "1", "--contract=DM-ACC-001"]
    elif command == "cli":
        args = [str(bin_dir / "privateuse1-conformance"), "run", "-j", "1", "--backend=pu1_sync",
                f"--manifest={PU1_SYNC_MANIFEST}", *selection]
    else:
        args = [str(bin_dir / "pytest"), "-p", "no:cacheprovider", "-q", "--backend=pu1_sync",
                f"--manifest={PU1_SYNC_MANIFEST}", *selection]
    proc = subprocess.run(args, cwd=repository, env=env, capture_output=True, text=True, timeout=600)
    if command == "ci-recipe":
        assert "the run exited with status 0" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not list(repository.rglob("*.loaded")), "the repository's conftest files were loaded into the run"


def test_python_m_pytest_in_a_backends_repository_names_the_shadowing(tmp_path):
    """`python -m pytest` puts the working directory on sys.path: the source
    tree is imported, and the usage error says so."""
    repository = _vendor_repository(tmp_path / "repository")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--backend=pu1_sync",
                           f"--manifest={PU1_SYNC_MANIFEST}", "--contract=DM-ACC-001"], cwd=repository,
                          env=_installed_pu1_sync(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "the working directory holds pu1_sync/ and is on sys.path" in proc.stderr, proc.stderr[-3000:]


def test_the_plugin_is_inert_without_backend(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and "PrivateUse1 conformance" not in proc.stdout
    # And it can be turned off: then --backend is unknown to pytest.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:privateuse1_conformance",
                           "-p", "no:cacheprovider", "-q", "--backend=openreg"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4 and "unrecognized arguments: --backend" in proc.stderr


# A suite of another project's, in the same environment as the kit: its own
# --level and --backend (a conftest's options), or a --level it only passes.
PEER_CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--level", type=int, default=0)
    parser.addoption("--backend", default="none")
"""
PEER_TEST = """
def test_options(request):
    assert request.config.getoption("level") == 8
    assert request.config.getoption("backend") == "theirs"
"""


def _pytest(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)


def test_another_suites_level_and_backend_options_are_theirs(tmp_path):
    """The plugin loads into every session: its short option names give way
    to a conftest's options of the same names, and a session of another
    suite is not a conformance run."""
    (tmp_path / "conftest.py").write_text(PEER_CONFTEST)
    (tmp_path / "test_peer.py").write_text(PEER_TEST)
    proc = _pytest(["--level", "8", "--backend=theirs"], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout and "PrivateUse1 conformance" not in proc.stdout


def test_a_level_the_kit_does_not_know_stops_only_a_conformance_run(tmp_path):
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    proc = _pytest(["--level", "8"], tmp_path)  # another suite's value, passed through
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    for option in ("--level", "--pu1-level"):
        proc = _pytest(["--backend=openreg", option, "8"], tmp_path)
        assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "--level: '8' is not a level; the levels are core, standard, full" in proc.stderr, proc.stderr


def test_the_canonical_option_names_run_the_suite(tmp_path):
    proc = _pytest(["--pu1-backend=openreg", "--pu1-contract=DM-ACC-001", f"--pu1-report-dir={tmp_path / 'report'}"],
                   tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "passed" in proc.stdout and (tmp_path / "report" / "report.json").exists()


# ------------------------------------------------------------ torch versions

def test_supported_torch_range():
    import torch

    assert versions.torch_problem(torch.__version__) is None
    for outside in ("2.12.1", "2.16.0", "3.0.0+cpu", "2.16.0a0+git1234"):
        problem = versions.torch_problem(outside)
        assert problem is not None and outside in problem
        assert str(versions.SUPPORTED_TORCH) in problem and "--allow-untested-torch" in problem
    for inside in ("2.13.1+cu128", "2.14.1+cu130", "2.15.0+cu132", "2.15.0a0+git1234"):
        assert versions.torch_problem(inside) is None
    with pytest.raises(ValueError, match="not a torch version"):
        versions.release("banana")


def test_the_supported_range_is_the_one_tested_declared_and_documented():
    """Every tested release is in the range; the kit's and OpenReg's package
    metadata declare the same range; the Makefile's matrix runs the tested
    releases, and docs/torch-matrix.md shows each with both backends at the
    level they claim, in reports that verified."""
    import tomllib

    assert all(versions.release(t) in versions.SUPPORTED_TORCH for t in versions.TESTED_TORCH)
    for project in (REPO / "pyproject.toml", REPO / "reference_backend" / "pyproject.toml"):
        declared = [d for d in tomllib.loads(project.read_text())["project"]["dependencies"]
                    if d.startswith("torch")]
        assert declared and SpecifierSet(declared[0][len("torch"):]) == versions.SUPPORTED_TORCH, (project, declared)
    makefile = (REPO / "Makefile").read_text()
    assert f"TORCH_MATRIX := {' '.join(versions.TESTED_TORCH)}\n" in makefile
    assert f"NEWEST_TORCH := {versions.TESTED_TORCH[-1]}\n" in makefile
    rows = [line.split(" | ") for line in (REPO / "docs" / "torch-matrix.md").read_text().splitlines()
            if line.startswith("| 2.")]
    for release in versions.TESTED_TORCH:
        for backend in ("openreg", "pu1_sync"):
            row = [r for r in rows if str(versions.release(r[0].lstrip("| "))) == release and r[1] == backend]
            assert len(row) == 1, (release, backend, rows)
            claims, reached, verified = row[0][2], row[0][3], row[0][-1]
            assert reached == claims and verified.startswith("yes"), row


RANGE_PLUGIN = '''
from packaging.specifiers import SpecifierSet
from privateuse1_conformance.harness import versions
versions.SUPPORTED_TORCH = SpecifierSet(">=99.0")   # this torch is outside it
'''


def test_a_torch_outside_the_range_stops_the_run_unless_allowed(tmp_path):
    (tmp_path / "narrow_range.py").write_text(RANGE_PLUGIN)
    env = {"PYTHONPATH": str(tmp_path)}
    args = ["-p", "narrow_range", "--backend=openreg", "--pyargs", "privateuse1_conformance.conformance",
            "--contract=DM-ACC-001"]
    refused = run_pytest(args, tmp_path, env=env)
    assert refused.returncode == 4, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "outside the range this kit supports" in refused.stderr and "--allow-untested-torch" in refused.stderr
    allowed = run_pytest([*args, "--allow-untested-torch"], tmp_path, env=env)
    assert allowed.returncode == 0, allowed.stdout[-3000:] + allowed.stderr[-3000:]
    assert "outside the kit's supported range" in allowed.stdout


def _registry_with(tmp_path: Path, contract_id: str, line: str) -> Path:
    text = registry_mod.default_path().read_text()
    anchor = f'id = "{contract_id}"\n'
    assert anchor in text
    path = tmp_path / "contracts.toml"
    path.write_text(text.replace(anchor, anchor + line + "\n", 1))
    return path


def test_min_torch_is_validated(tmp_path):
    registry = registry_mod.load(_registry_with(tmp_path, "DM-SET-001", 'min_torch = "2.14"'))
    assert registry.get("DM-SET-001").min_torch == "2.14"
    assert registry.leave_out_for_torch("2.13.0+cpu")["DM-SET-001"] == "needs torch >= 2.14, this run has 2.13.0+cpu"
    assert registry.get("DM-SET-001").retired and "DM-SET-001" not in {c.id for c in registry.active()}
    assert "DM-SET-001" not in registry_mod.load(_registry_with(tmp_path, "DM-SET-001", 'min_torch = "2.13"')) \
        .leave_out_for_torch("2.13.0")
    # The registry's own contracts of newer releases: each left out before its release, kept from it on.
    real = registry_mod.load(registry_mod.default_path())
    newer = {c.id: c.min_torch for c in real.contracts.values() if c.min_torch}
    assert {"RG-ACCEL-001", "DI-IFACE-002", "DI-INDUCTOR-002"} <= set(newer)
    assert set(registry_mod.load(registry_mod.default_path()).leave_out_for_torch("2.13.0")) == set(newer)
    assert set(registry_mod.load(registry_mod.default_path()).leave_out_for_torch("2.14.1")) == \
        {c for c, t in newer.items() if t == "2.15"}
    assert registry_mod.load(registry_mod.default_path()).leave_out_for_torch("2.15.0") == {}
    with pytest.raises(registry_mod.RegistryError, match="min_torch"):
        registry_mod.load(_registry_with(tmp_path, "DM-SET-001", 'min_torch = "soon"'))


# ------------------------------------------------------------ expectations naming one test

SCRATCH = '''
import pytest

@pytest.mark.contract("DM-MOD-001")
@pytest.mark.parametrize("case", [1, 2])
def test_param(case):
    assert case == 2, "case 1 fails"

@pytest.mark.contract("DM-MOD-001")
def test_other():
    assert False, "another failure of the same contract, not excused"

@pytest.mark.contract("DM-SET-001")
def test_needs_a_newer_torch():
    raise AssertionError("must not run on this torch")

@pytest.mark.contract("DM-SET-002")
def test_excused_by_contract():
    assert False, "excused by the contract-wide entry"

@pytest.mark.contract("DM-SET-002")
def test_excused_by_its_own_entry():
    assert False, "excused by its own entry"
'''

EXPECTATIONS = '''
[[expect]]
contract = "DM-MOD-001"
test = "test_scratch.py::test_param[1]"
reason = "only case 1"

[[expect]]
contract = "DM-SET-002"
reason = "the whole contract"

[[expect]]
contract = "DM-SET-002"
test = "test_scratch.py::test_excused_by_its_own_entry"
reason = "this test's own reason"
'''


@pytest.fixture(scope="module")
def scratch_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scratch")
    (folder / "test_scratch.py").write_text(SCRATCH)
    (folder / "expect.toml").write_text(EXPECTATIONS)
    registry = _registry_with(folder, "DM-SET-001", 'min_torch = "99.0"')
    return run_pytest(["--backend=openreg", f"--registry={registry}", "--expectations=expect.toml",
                       "test_scratch.py"], folder)


def _tests(run) -> dict[str, dict]:
    return {t["nodeid"]: t for c in run.report["contracts"] for t in c["tests"]}


def test_an_expectation_can_name_one_test(scratch_run):
    tests = _tests(scratch_run)
    assert tests["test_scratch.py::test_param[1]"]["verdict"] == "xfail"
    assert tests["test_scratch.py::test_param[2]"]["verdict"] == "pass"
    assert tests["test_scratch.py::test_other"]["verdict"] == "fail"
    assert scratch_run.verdicts()["DM-MOD-001"] == "fail"
    # The test's own entry wins over the contract's.
    assert tests["test_scratch.py::test_excused_by_its_own_entry"]["expectation"] == "this test's own reason"
    assert tests["test_scratch.py::test_excused_by_contract"]["expectation"] == "the whole contract"


def test_a_contract_needing_a_newer_torch_is_left_out(scratch_run):
    assert "test_scratch.py::test_needs_a_newer_torch" not in _tests(scratch_run)
    assert "DM-SET-001" not in scratch_run.verdicts()
    assert "DM-SET-001 left out: needs torch >= 99.0" in scratch_run.stdout


def test_an_expectation_for_a_test_that_does_not_exist_is_rejected(tmp_path):
    (tmp_path / "test_scratch.py").write_text(SCRATCH)
    (tmp_path / "expect.toml").write_text(textwrap.dedent('''
        [[expect]]
        contract = "DM-MOD-001"
        test = "test_scratch.py::test_renamed"
        reason = "stale"
    '''))
    run = run_pytest(["--backend=openreg", "--expectations=expect.toml", "test_scratch.py"], tmp_path)
    assert run.returncode == 4, run.stdout[-2000:] + run.stderr[-2000:]
    assert "DM-MOD-001 test 'test_scratch.py::test_renamed'" in run.stderr


def test_expectation_entries_are_validated(tmp_path):
    registry = registry_mod.load(registry_mod.default_path())
    bad = tmp_path / "bad.toml"
    for text in ('[[expect]]\ncontract = "DM-SET-001"\ntest = ""\nreason = "r"\n',
                 '[[expect]]\ncontract = "DM-SET-001"\ntests = "x"\nreason = "r"\n',
                 '[[expect]]\ncontract = "DM-SET-001"\ntest = "a.py::t"\nreason = "r"\n'
                 '[[expect]]\ncontract = "DM-SET-001"\ntest = "a.py::t"\nreason = "again"\n'):
        bad.write_text(text)
        with pytest.raises(expectations_mod.ExpectationsError):
            expectations_mod.load(bad, registry)
    bad.write_text('[[expect]]\ncontract = "DM-SET-001"\ntest = "a.py::t"\nreason = "r"\n'
                   '[[expect]]\ncontract = "DM-SET-001"\nreason = "all"\n')
    loaded = expectations_mod.load(bad, registry)
    assert loaded.for_test("DM-SET-001", "a.py::t[3]").reason == "r"
    assert loaded.for_test("DM-SET-001", "a.py::u").reason == "all"
    assert loaded.for_test("DM-SET-002", "a.py::t") is None


# ------------------------------------------------------------ display name

def _backend(manifest_name, distribution, module_name="torch_acme"):
    return backend_mod.Backend(
        requested=module_name, module_name=module_name, module=None, device_type="openreg",
        device_module=None, manifest=backend_mod.Manifest(name=manifest_name), version=None,
        distribution=distribution)


def test_display_name_never_falls_back_to_the_device_type():
    assert _backend("Acme NPU", "acme-npu").name == "Acme NPU"
    assert _backend(None, "acme-npu").name == "acme-npu"
    assert _backend(None, None).name == "torch_acme"
    assert backend_mod._distribution_of("openreg") == "openreg"
    assert backend_mod._distribution_of("no_such_module_anywhere") is None


# ------------------------------------------------------------ the C++ probe's build

def test_missing_googletest_is_named_with_how_to_get_it(tmp_path):
    with pytest.raises(_probe.ProbeBuildError) as error:
        _probe._gtest_flags([tmp_path])
    message = str(error.value)
    assert "GoogleTest" in message and "libgtest-dev" in message and "GTEST_ROOT" in message


def test_googletest_is_found_under_gtest_root(tmp_path):
    (tmp_path / "include" / "gtest").mkdir(parents=True)
    (tmp_path / "include" / "gtest" / "gtest.h").write_text("")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libgtest.a").write_bytes(b"")
    includes, ldflags = _probe._gtest_flags([tmp_path])
    assert includes == [str(tmp_path / "include")] and str(tmp_path / "lib" / "libgtest.a") in ldflags


def test_missing_compiler_is_named(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-anywhere")
    with pytest.raises(_probe.ProbeBuildError, match="no-such-compiler-anywhere.*g\\+\\+"):
        _probe._check_compiler()


def test_the_probe_is_cached_per_torch_build():
    import torch

    key = _probe.build_key()
    assert torch.__version__ in key and f"abi{int(torch._C._GLIBCXX_USE_CXX11_ABI)}" in key
    module = _probe.load()
    assert Path(module.__file__).parent.name == key and module.gtest_list()
