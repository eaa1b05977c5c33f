"""The kit as a product (issue 11): the pytest plugin's entry point, the
supported torch range and contracts' minimum torch, expectations naming one
test, the backend's display name, and the C++ probe's build errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kit_support import run_pytest
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


# ------------------------------------------------------------ torch versions

def test_supported_torch_range():
    import torch

    assert versions.torch_problem(torch.__version__) is None
    for outside in ("2.12.1", "2.14.0", "3.0.0+cpu", "2.14.0a0+git1234"):
        problem = versions.torch_problem(outside)
        assert problem is not None and outside in problem
        assert str(versions.SUPPORTED_TORCH) in problem and "--allow-untested-torch" in problem
    assert versions.torch_problem("2.13.1+cu128") is None
    with pytest.raises(ValueError, match="not a torch version"):
        versions.release("banana")


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
    assert registry.leave_out_for_torch("2.13.0+cpu") == {
        "DM-SET-001": "needs torch >= 2.14, this run has 2.13.0+cpu"}
    assert registry.get("DM-SET-001").retired and "DM-SET-001" not in {c.id for c in registry.active()}
    assert registry_mod.load(_registry_with(tmp_path, "DM-SET-001", 'min_torch = "2.13"')) \
        .leave_out_for_torch("2.13.0") == {}
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
