"""The operators area: claims, selection, per-contract outcomes, and a run
that charges each operator's failure to the contract whose check broke."""

from __future__ import annotations

import textwrap

import pytest

from kit_support import FIXTURE_DIR, run_suite
from privateuse1_conformance.harness import backend as backend_mod
from privateuse1_conformance.harness import operators as operators_mod

ENTRIES = [("add", "add"), ("max.reduction_with_dim", "max"), ("max.binary", "max"), ("linalg.svd", "linalg.svd"),
           ("nn.functional.conv2d", "nn.functional.conv2d"), ("sparse.mm", "sparse.mm")]


def test_selection_by_name_pattern_and_variant():
    assert operators_mod.select(ENTRIES, "add") == ["add"]
    assert operators_mod.select(ENTRIES, "max") == ["max.reduction_with_dim", "max.binary"]  # a name covers its variants
    assert operators_mod.select(ENTRIES, "max.binary,linalg.*") == ["max.binary", "linalg.svd"]
    assert operators_mod.select(ENTRIES, "all") == [k for k, _ in ENTRIES]
    assert operators_mod.select(ENTRIES, "none") == []
    assert "add" in operators_mod.select(ENTRIES, "default")
    with pytest.raises(operators_mod.OperatorsError, match="no OpInfo entry matches nosuchop"):
        operators_mod.select(ENTRIES, "add,nosuchop")


def test_claims_exclude_operators_and_dtypes_with_reasons():
    claims = operators_mod.Claims.from_table({
        "dtypes": ["float32", "int64"],
        "exclude": {"sparse.*": "strided only", "nn.functional.conv2d": {"dtypes": ["int64"], "reason": "no int conv"}},
    }, "test")
    assert claims.derived
    assert claims.excluded("sparse.mm", "sparse.mm") == "strided only"
    assert claims.excluded("nn.functional.conv2d", "nn.functional.conv2d") is None  # only one dtype is excluded
    assert claims.excluded("nn.functional.conv2d", "nn.functional.conv2d", "int64") == "no int conv"
    assert claims.excluded("add", "add", "float16") == "float16 is not among the manifest's [operators] dtypes"
    assert claims.excluded("add", "add", "float32") is None
    declared = operators_mod.Claims.from_table({"claim": ["add", "max"]}, "test")
    assert not declared.derived
    assert declared.excluded("max.binary", "max") is None
    assert declared.excluded("linalg.svd", "linalg.svd") == "not in the manifest's [operators] claim"


@pytest.mark.parametrize("table, error", [
    ({"claim": "add"}, "claim must be a list"),
    ({"dtypes": [1]}, "dtypes must be a list"),
    ({"backward": "yes"}, "backward must be true or false"),
    ({"exclude": {"add": 3}}, "must be a reason"),
    ({"bogus": 1}, "unknown keys"),
])
def test_invalid_claims_name_the_key(table, error):
    with pytest.raises(operators_mod.OperatorsError, match=error):
        operators_mod.Claims.from_table(table, "test")


def test_the_manifest_carries_the_claims(tmp_path):
    manifest = tmp_path / "m.toml"
    manifest.write_text(textwrap.dedent("""
        [backend]
        name = "x"
        [operators]
        claim = ["add"]
        [operators.exclude]
        "add" = { dtypes = ["bool"], reason = "r" }
    """))
    loaded = backend_mod.Manifest.load(manifest)
    assert loaded.operators.patterns == ("add",)
    assert loaded.operators.excluded("add", "add", "bool") == "r"
    manifest.write_text('[backend]\nname = "x"\n[operators]\nclaim = "add"\n')
    with pytest.raises(backend_mod.BackendError, match="claim must be a list"):
        backend_mod.Manifest.load(manifest)


def test_each_contract_gets_its_own_checks_outcome():
    from privateuse1_conformance.conformance import _opinfo, test_opinfo

    report = _opinfo.OperatorReport("x")
    report.outcome("float32", "forward").record("fail", "wrong")
    report.outcome("float32", "backward").record("pass")
    report.outcome("float64", "forward").record("pass")
    report.outcome("any", "errors").record("skip", "none")
    outcomes = test_opinfo.per_contract(report)
    assert outcomes["OP-INFO-001"] == ["fail", "wrong", "OP-INFO-001.1"]
    assert outcomes["OP-INFO-003"][0] == "pass"
    assert outcomes["OP-INFO-002"][0] == "inconclusive"   # no out= or in-place variant checked
    assert outcomes["OP-INFO-004"][0] == "inconclusive"   # skipped: no evidence


def test_a_missing_kernel_after_recorded_outcomes_keeps_them_and_fails():
    """Under the derived claim a dispatcher-worded NotImplementedError makes
    a dtype not-claimed only when nothing of it ran yet; after a recorded
    pass or fail it is a failure of the check it happened in, and what was
    recorded stays (a kernel wrong on some inputs that refuses others must
    not turn OP-INFO-001 from fail to pass)."""
    from privateuse1_conformance.conformance import _opinfo, test_opinfo

    check = _opinfo.OperatorCheck.__new__(_opinfo.OperatorCheck)
    check.report = _opinfo.OperatorReport("x")
    missing = _opinfo.NotClaimed("the backend has no kernel (and no fallback) for aten::x")
    check._not_claimed("float64", "forward", missing)
    assert check.report.cells["float64"]["forward"].verdict == "not-claimed"
    check.report.outcome("float32", "forward").record("fail", "wrong on large inputs")
    check._running = ("float32", "noncontiguous")
    check.report.outcome("float32", "noncontiguous")
    check._not_claimed("float32", "forward", missing)
    cell = check.report.cells["float32"]
    assert cell["forward"].verdict == "fail" and cell["forward"].message == "wrong on large inputs"
    assert cell["noncontiguous"].verdict == "fail" and "after the device had run others" in cell["noncontiguous"].message
    assert test_opinfo.per_contract(check.report)["OP-INFO-001"][0] == "fail"


def test_an_operator_of_the_default_set_must_be_claimed():
    from privateuse1_conformance.conformance import _opinfo, test_opinfo

    claims = operators_mod.Claims()
    ran = _opinfo.OperatorReport("cumsum")
    ran.outcome("float32", "forward").record("pass")
    ran.outcome("int8", "forward").record("not-claimed", "no kernel for aten::cumsum")
    assert test_opinfo.default_set_claimed(ran, {}, claims) is None
    refused = _opinfo.OperatorReport("cumsum")
    refused.outcome("float32", "forward").record("not-claimed", "no kernel for aten::cumsum")
    assert "no kernel for aten::cumsum" in test_opinfo.default_set_claimed(refused, {}, claims)
    excluded = test_opinfo.default_set_claimed(_opinfo.OperatorReport("cumsum"), {"float32": "not ours"}, claims)
    assert excluded == "not ours"
    assert test_opinfo.default_set_claimed(_opinfo.OperatorReport("nn.functional.batch_norm.without_cudnn"), {},
                                           claims) is None  # (no dtype on the CPU: a CUDA-only variant)
    float_only = operators_mod.Claims(dtypes=("float32",))
    reason = "int8 is not among the manifest's [operators] dtypes"
    assert test_opinfo.default_set_claimed(_opinfo.OperatorReport("bitwise_and"), {"int8": reason}, float_only) is None
    assert operators_mod.in_default_set("cumsum", "cumsum") and not operators_mod.in_default_set("sparse.mm",
                                                                                                 "sparse.mm")


@pytest.fixture(scope="module")
def mutated_run(tmp_path_factory):
    """OpenReg with int32 mul wrong, on three operators."""
    folder = tmp_path_factory.mktemp("operators")
    return run_suite("openreg", folder, "--contract=OP-INFO-001,OP-INFO-003", "--operators=mul,tanh,sparse.mm",
                     env={"OPENREG_MUTANT": "opinfo-mul-int32-off-by-one"})


def _tests(run, contract):
    entry = next(c for c in run.report["contracts"] if c["id"] == contract)
    return {t["nodeid"].split("[")[1].rstrip("]"): t for t in entry["tests"]}


def test_a_wrong_operator_fails_only_the_contract_it_breaks(mutated_run):
    forward, backward = _tests(mutated_run, "OP-INFO-001"), _tests(mutated_run, "OP-INFO-003")
    assert forward["mul"]["verdict"] == "fail"
    assert forward["mul"]["clause"] == "OP-INFO-001.1"
    assert "int32: forward" in forward["mul"]["message"]
    assert backward["mul"]["verdict"] == "pass"      # its gradients (float dtypes) are right
    assert forward["tanh"]["verdict"] == "pass"


def test_an_operator_the_manifest_excludes_is_not_run_and_counts_for_nothing(mutated_run):
    forward = _tests(mutated_run, "OP-INFO-001")
    sparse = [t for name, t in forward.items() if name.startswith("sparse.mm")]  # (OpInfo: sparse.mm.reduce)
    assert sparse and all(t["verdict"] == "inconclusive" for t in sparse)
    assert all("strided tensors only" in t["message"] for t in sparse)


def test_the_matrix_shows_the_wrong_cell_and_the_excluded_operator(mutated_run):
    operators = {o["name"]: o for o in mutated_run.report["operators"]}
    mul = {c["dtype"]: c for c in operators["mul"]["cells"]}
    assert mul["int32"]["verdict"] == "fail" and mul["int32"]["checks"]["forward"] == "fail"
    assert mul["float32"]["verdict"] == "pass" and mul["int64"]["verdict"] == "pass"
    assert operators["tanh"]["verdict"] == "pass"
    sparse = [o for name, o in operators.items() if name.startswith("sparse.mm")]
    assert sparse and all(o["verdict"] == "not-claimed" and not o["claimed"] for o in sparse)
    assert mutated_run.report["summary"]["operators"]["verdicts"]["fail"] == 1


@pytest.fixture(scope="module")
def faulty_operators_run(tmp_path_factory):
    """pu1_faulty, a backend we did not write for OpenReg: expm1 is wrong for
    float32, log1p crashes for float64 (tests/fixtures/fixture_backend.cpp)."""
    if not any(FIXTURE_DIR.glob("pu1_faulty*.so")):
        pytest.skip("fixture backends are not built (make build)")
    folder = tmp_path_factory.mktemp("faulty-operators")
    return run_suite("pu1_faulty", folder, "--contract=OP-INFO-001,OP-INFO-002,OP-INFO-003,OP-INFO-004",
                     "--operators=add,expm1,log1p", "--contract-timeout=60")


def _row(run, name):
    return {c["dtype"]: c for o in run.report["operators"] if o["name"] == name for c in o["cells"]}


def test_a_backend_we_did_not_write_fails_its_wrong_operator(faulty_operators_run):
    forward = _tests(faulty_operators_run, "OP-INFO-001")
    assert forward["expm1"]["verdict"] == "fail" and forward["expm1"]["clause"] in ("OP-INFO-001.1", "OP-INFO-001.4")
    expm1 = _row(faulty_operators_run, "expm1")
    assert expm1["float32"]["verdict"] == "fail" and expm1["float32"]["checks"]["forward"] == "fail"
    assert "float32: forward" in expm1["float32"]["messages"]["forward"]
    # Every other real dtype passes every check but three. The area finds four
    # bugs of the fixture nobody planted: its fallback copies an out= result
    # into the out= tensor's memory as if it were contiguous (fails the
    # non-contiguous out= check, OP-INFO-002.1, and, since PyTorch gives a
    # structured operator's result the layout of column-major inputs before
    # the fallback fills it, the layout check, OP-INFO-001.4, for the dtype
    # that check runs column-major inputs for); an out= tensor on its
    # second device comes back on its first (its allocator allocates on the
    # current device when the out= tensor grows: OP-INFO-002.3); and the
    # complex gradients go through conjugate views it does not handle (not
    # always on the same samples).
    others = {dtype: c for dtype, c in expm1.items() if dtype != "float32" and "complex" not in dtype}
    assert {"float64", "bfloat16", "int32"} <= set(others), others
    layout = [c["messages"]["layout"] for c in expm1.values() if c["checks"].get("layout") == "fail"]
    assert len(layout) == 1 and "inputs laid out column-major" in layout[0], expm1
    for dtype, cell in others.items():
        assert {v for check, v in cell["checks"].items()
                if check not in ("out", "out-device", "layout")} <= {"pass", "skip"}, (dtype, cell)
        assert cell["checks"]["out"] == "fail" and "out= non-contiguous" in cell["messages"]["out"], (dtype, cell)
        assert cell["checks"]["out-device"] == "fail" and "out= on faulty:1" in cell["messages"]["out-device"] \
            and "moved them to faulty:0" in cell["messages"]["out-device"], (dtype, cell)


def test_a_crash_in_one_operator_costs_that_operator_only(faulty_operators_run):
    forward = _tests(faulty_operators_run, "OP-INFO-001")
    assert forward["log1p"]["verdict"] == "crash" and "SIGSEGV" in forward["log1p"]["message"]
    assert "float64: forward" in forward["log1p"]["message"]
    assert forward["expm1"]["verdict"] == "fail"
    # add fails only its layout check (the fixture's out= bug above, for the
    # column-major inputs of its first dtype)
    add = _row(faulty_operators_run, "add")
    assert {v for c in add.values() for check, v in c["checks"].items()
            if check not in ("out", "out-device", "layout")} <= {"pass", "skip"}, add
    assert forward["add"]["verdict"] == "fail" and forward["add"]["clause"] == "OP-INFO-001.4", forward["add"]
    assert _tests(faulty_operators_run, "OP-INFO-003")["add"]["verdict"] == "pass"
    # The matrix keeps the dtypes log1p finished before it crashed, puts the
    # crash on the check that was under way, and has the dtypes after it too:
    # the test went on in a fresh process after the crashed dtype.
    log1p = _row(faulty_operators_run, "log1p")
    assert log1p["float64"]["verdict"] == "crash" and log1p["float64"]["checks"] == {"forward": "crash"}
    assert log1p["float32"]["checks"]["forward"] == "pass" and log1p["bfloat16"]["checks"]["forward"] == "pass"
    # It crashes again for int16, after float64: the test goes on once more.
    assert log1p["int16"]["verdict"] == "crash" and log1p["int16"]["checks"] == {"forward": "crash"}
    after = [dtype for dtype in ("int32", "int64", "int8", "uint8") if dtype in log1p]
    assert after and all(log1p[d]["checks"]["forward"] == "pass" for d in after), log1p
    assert "remaining dtypes ran in 2 fresh process" in forward["log1p"]["details"], forward["log1p"]
    # Each contract is charged by its own checks: the crash is OP-INFO-001's;
    # the gradients of the other dtypes were checked (and the complex ones
    # fail through the fixture's conjugate-view bug, see above).
    assert _tests(faulty_operators_run, "OP-INFO-003")["log1p"]["verdict"] in ("pass", "fail")
    assert faulty_operators_run.report["complete"] is True


def test_loading_the_opinfo_database_leaves_torch_and_hypothesis_as_they_were():
    """common_utils freezes torch.backends' flags and loads PyTorch's own
    hypothesis profile on import: the kit's other checks must not see either."""
    code = ("import hypothesis, torch\n"
            "before = hypothesis.settings._current_profile\n"
            "from privateuse1_conformance.conformance import _opinfo\n"
            "_opinfo.load_op_db()\n"
            "assert not torch.backends.flags_frozen()\n"
            "assert hypothesis.settings._current_profile == before, hypothesis.settings._current_profile\n")
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_operators_whose_result_depends_on_the_layout_pass_on_a_correct_backend(tmp_path):
    """as_strided_copy reads the storage (filler included) and view_as_complex
    rejects a last dimension whose stride is not 1: the CPU does the same for
    the same non-contiguous samples, so OpenReg doing it too is no failure
    (the check once compared with the CPU's contiguous result)."""
    run = run_suite("openreg", tmp_path, "--contract=OP-INFO-001", "--operators=as_strided_copy,view_as_complex")
    operators = {o["name"]: o for o in run.report["operators"]}
    assert set(operators) == {"as_strided_copy", "view_as_complex"}, run.stdout[-2000:]
    as_strided = {c["dtype"]: c["checks"] for c in operators["as_strided_copy"]["cells"]}
    assert as_strided["float32"]["noncontiguous"] == "pass"       # compared, and equal
    view = {c["dtype"]: c["checks"] for c in operators["view_as_complex"]["cells"]}
    assert view["float32"]["forward"] == "pass"
    assert view["float32"]["noncontiguous"] == "skip"             # the CPU rejects the layout: no evidence
    assert all(o["verdict"] == "pass" for o in operators.values()), operators


def test_an_out_variant_the_cpu_gets_wrong_is_no_evidence(tmp_path):
    """PyTorch's CPU fft.ihfftn writes other values into out= than it returns
    (OpInfo expects its test_out to fail everywhere): with no reference, the
    device's out= is not judged; index_select's out= still is."""
    import torch

    x = torch.linspace(-1, 1, 5 * 6 * 7).reshape(5, 6, 7)
    out = torch.empty(5, 6, 5, dtype=torch.complex64)
    torch.fft.ihfftn(x, s=(8,), out=out)
    if torch.equal(out, torch.fft.ihfftn(x, s=(8,))):
        pytest.skip("this torch's CPU fft.ihfftn out= is right: nothing to show")
    run = run_suite("openreg", tmp_path, "--contract=OP-INFO-002", "--operators=fft.ihfftn,index_select")
    operators = {o["name"]: o for o in run.report["operators"]}
    assert all(o["verdict"] == "pass" for o in operators.values()), operators
    index_select = {c["dtype"]: c["checks"] for c in operators["index_select"]["cells"]}
    assert index_select["float32"]["out"] == "pass"


def test_an_operator_that_draws_only_for_some_samples_is_not_compared_by_value(tmp_path):
    """alpha_dropout draws random numbers only in its samples with
    training=True (not the first): OpenReg's generator does not draw the
    CPU's numbers, as a CUDA device does not, so comparing those samples'
    values would fail a correct backend. Once a sample draws, the operator is
    random: shapes and dtypes are compared, not values."""
    run = run_suite("openreg", tmp_path, "--contract=OP-INFO-001", "--operators=nn.functional.alpha_dropout,add")
    operators = {o["name"]: o for o in run.report["operators"]}
    assert set(operators) == {"nn.functional.alpha_dropout", "add"}, run.stdout[-2000:]
    assert all(o["verdict"] == "pass" for o in operators.values()), operators
    dropout = {c["dtype"]: c["checks"] for c in operators["nn.functional.alpha_dropout"]["cells"]}
    assert dropout["float32"]["forward"] == "pass"
    assert dropout["float32"]["noncontiguous"] == "skip"    # random: values are not compared
    add = {c["dtype"]: c["checks"] for c in operators["add"]["cells"]}
    assert add["float32"]["noncontiguous"] == "pass"         # not random: compared by value


OPDB_PROBE = '''
import sys

def pytest_unconfigure(config):
    loaded = "torch.testing._internal.common_methods_invocations" in sys.modules
    print(f"OPINFO-DATABASE-IMPORTED={loaded}")
'''


@pytest.mark.parametrize("args, imported", [
    (["--contract=DM-COUNT-001"], False),
    (["--level=core", "--contract=DM-COUNT-001,OP-INFO-001"], False),  # (OP-INFO-001 is above core)
    (["--contract=OP-INFO-001", "--operators=add"], True),
])
def test_the_opinfo_database_is_imported_only_when_the_operators_area_can_run(tmp_path, args, imported):
    """Importing PyTorch's OpInfo database costs seconds: a run whose level
    or --contract leaves the operators area out does not import it, and
    still counts the area's contracts as covered (not "without any test").
    An expectation of an operator test is not an error there."""
    (tmp_path / "opdb_probe.py").write_text(OPDB_PROBE)
    (tmp_path / "expect.toml").write_text(
        '[[expect]]\ncontract = "OP-INFO-001"\ntest = "test_opinfo.py::test_operator[add]"\n'
        'reason = "an expectation of an operator test"\n')
    run = run_suite("openreg", tmp_path, "-p", "opdb_probe", "--expectations=expect.toml", *args,
                    env={"PYTHONPATH": str(tmp_path)})
    assert run.report is not None, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"OPINFO-DATABASE-IMPORTED={imported}" in run.stdout, run.stdout[-3000:]
    assert run.report["summary"]["uncovered"] == []
    assert run.returncode == 0, run.stdout[-3000:]


def test_the_kit_finds_the_running_test_case_as_pytorch_does_without_reading_sources():
    """OpInfo asks extract_test_fn() for the running TestCase's method each
    time it makes a sample iterator; PyTorch's walks inspect.stack() (which
    reads every frame's source: most of a small operator's test). The kit's
    replacement must give the same answer: the method inside a TestCase,
    None elsewhere, and it must be what OpInfo calls once the database is loaded."""
    import unittest

    from privateuse1_conformance.conformance import _opinfo

    _opinfo.load_op_db()
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    assert common_utils.extract_test_fn is _opinfo._calling_test_case_fn
    assert core.extract_test_fn is _opinfo._calling_test_case_fn
    found = {}

    class Case(unittest.TestCase):
        def test_something(self):
            found["nested"] = (lambda: _opinfo._calling_test_case_fn())()

    result = unittest.TestResult()
    Case("test_something").run(result)
    assert result.wasSuccessful(), result.errors + result.failures
    assert found["nested"] is Case.test_something
    assert _opinfo._calling_test_case_fn() is None  # a pytest function is no TestCase
