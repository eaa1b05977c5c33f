"""Operators checked against the CPU with PyTorch's OpInfo database.

One OpInfo entry (an operator, or a variant of one such as
``as_strided.partial_views``) is checked per test process, for every dtype
the backend claims and the CPU supports. Samples are generated the way
PyTorch's own device-generic tests generate them (``op.sample_inputs(device,
dtype)``, seeded per sample, on the device, so that a sample function's
device-dependent choices are the device's), copied to the CPU, and run on
both sides. The checks, each the evidence of one clause:

=============  ==============  ==================================================
check          clause          what
=============  ==============  ==================================================
forward        OP-INFO-001.1   each sample's results: values, dtype and shape
noncontiguous  OP-INFO-001.2   the same samples made non-contiguous on the device
layout         OP-INFO-001.4   results' strides (the CPU's, or PyTorch's meta
                               kernel's), also from inputs of another dense
                               layout (the last two dimensions swapped in
                               memory; the first dtype of each operator)
out            OP-INFO-002.1   ``out=``: the CPU's result written into, and
                               returned as, the tensors given
out-device     OP-INFO-002.3   ``out=`` tensors on the CPU (or another device):
                               an error, or the CPU's result written into them
inplace        OP-INFO-002.2   the in-place variant: the CPU's result, in the
                               input, which is returned
backward       OP-INFO-003.1   gradients of every input for random output
                               gradients (the same on both sides)
errors         OP-INFO-004.1   OpInfo's error inputs raise the exception type
                               the CPU raises
=============  ==============  ==================================================

Fairness. Values are compared within PyTorch's own tolerance for comparing
a device with the CPU (``TestCommon.test_compare_cpu``: 1e-3 absolute and
relative, or the operator's toleranceOverride for that test), widened for
the reduced-precision dtypes to 8 units of their resolution (PyTorch's own
composite kernels, which a backend without a kernel of its own runs, compute
in the dtype and differ from the CPU's float-accumulating kernels by a few
units), and narrowed for float64 and complex128 to the same number of units
of their own resolution (about 1.9e-12: a double result computed in single
precision fails). OpInfo's skips and expected failures for the corresponding PyTorch
test apply when they hold for every device (``device_type`` unset): PyTorch
itself says such a comparison is meaningless. Operators that draw random
numbers (an aten operator tagged ``nondeterministic_seeded`` runs) are not
compared by value: a device's generator need not reproduce the CPU's; their
results must have the CPU's dtype and shape. Error checks compare the
exception type only: wording is the backend's choice. A sample the CPU
itself rejects is no evidence and is skipped.

One root cause, one verdict: when a sample's forward result is wrong, the
other checks of that sample (its non-contiguous form, out=, in-place,
backward) are not run for it, so a broken kernel is charged to
OP-INFO-001 only.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from privateuse1_conformance.harness.evidence import progress, reference_work, scope
from privateuse1_conformance.harness.operators import CELLS_PROPERTY, CHECK_CLAUSES

# check -> (clause, the PyTorch test whose OpInfo decorators apply to it)
_PYTORCH_TESTS = {
    "forward": ("TestCommon", "test_compare_cpu"),
    "layout": ("TestCommon", "test_compare_cpu"),
    "noncontiguous": ("TestCommon", "test_noncontiguous_samples"),
    "out": ("TestCommon", "test_out"),
    "out-device": ("TestCommon", "test_out"),
    "inplace": ("TestCommon", "test_variant_consistency_eager"),
    "backward": ("TestCommon", "test_compare_cpu"),
    "errors": ("TestCommon", "test_errors"),
}
CHECKS = {check: (clause, _PYTORCH_TESTS[check]) for check, clause in CHECK_CLAUSES.items()}
# The checks whose PyTorch test compares a device with the CPU (or a device's
# errors): an expected failure there says the comparison fails everywhere.
# The others' tests compare variants on one device: their expected failures
# (a deprecated signature, an inconsistent variant) say nothing about the
# device against the CPU, which run the same variant here; only skips apply.
CROSS_DEVICE_CHECKS = {"forward", "backward", "errors"}
BASE_TOLERANCE = 1e-3          # test_compare_cpu's atol and rtol
# float64 and complex128 at their own precision: test_compare_cpu's 1e-3 is
# about 8,400 units of float32's resolution, and the same number of units
# of float64's (about 1.9e-12) leaves another summation order, fused
# arithmetic or another libm as much room as float32 gets, while a float64
# result computed in float32 (off by about 1e-7) fails. OpInfo's
# toleranceOverride for a double dtype still applies where it is wider.
DOUBLE_PRECISION = {torch.float64, torch.complex128}
DOUBLE_TOLERANCE = BASE_TOLERANCE * torch.finfo(torch.float64).eps / torch.finfo(torch.float32).eps
REDUCED_PRECISION = {torch.float16, torch.bfloat16, torch.complex32}
REDUCED_PRECISION_UNITS = 8    # of the dtype's resolution (finfo.eps)
OUT_SAMPLES = 3                # samples checked with out= (test_out checks one)


def _geometry(t: torch.Tensor) -> tuple:
    """(shape, strides) where strides can matter: none for a tensor without
    elements, and none for a dimension of size 1 (any stride addresses the
    same elements)."""
    if t.numel() == 0:
        return tuple(t.shape), None
    return tuple(t.shape), tuple(None if size == 1 else stride for size, stride in zip(t.shape, t.stride()))


def _noncontiguous_out(like: torch.Tensor, device) -> torch.Tensor:
    from torch.testing._internal.common_utils import noncontiguous_like

    return noncontiguous_like(torch.zeros(like.shape, dtype=like.dtype, device=device))


# out= tensors of other layouts than the result's, as test_out tries them:
# layout -> (how to make one like a result on a device, whether its strides
# afterwards must be the CPU's). A non-contiguous out= of the right shape
# keeps its strides (test_out compares them); an empty one is resized, and
# the strides it gets are the kernel's choice (test_out compares its values
# only: PyTorch's stock CPU fallback gives it contiguous strides where the
# CPU's geqrf makes it column-major).
OUT_LAYOUTS = {
    "non-contiguous": (_noncontiguous_out, True),
    "empty": (lambda like, device: torch.empty(0, dtype=like.dtype, device=device), False),
}
ERRORS_DTYPE = "any"           # the cell of the error checks, which have no dtype
# The errors an operator may raise for out= tensors on another device than
# its inputs (CUDA raises RuntimeError; the types ER-MSG-001 accepts for a
# refused device).
REFUSALS = (RuntimeError, ValueError, TypeError, IndexError)

NO_EVIDENCE = {
    "forward": "the CPU rejects every sample of this dtype: nothing to compare",
    "noncontiguous": "no sample whose forward result matched the CPU's to make non-contiguous",
    "layout": "no sample whose forward result matched the CPU's had a strided tensor result",
    "out": "no sample the CPU accepts out= for",
    "out-device": "no sample whose out= result matched the CPU's to give out= tensors on another device",
    "inplace": "no sample the CPU can compute in place (type promotion, broadcasting)",
    "backward": "no sample with a differentiable result whose forward result matched the CPU's",
    "errors": "no error input the CPU rejects with OpInfo's exception type (or OpInfo defines none)",
}

# How the dispatcher says a backend has no kernel for an operator (and no fallback).
# Also the kernels ATen keeps for an out-of-tree device to override (the
# convolution of ConvBackend::Overrideable), which only raise until it does.
_NO_KERNEL = re.compile(r"Could not run '([^']+)' with arguments from the '[^']+' backend"
                        r"|^(\w+) not implemented\. You are likely triggering this with tensor backend other than")

SEVERITY = {"": -1, "pass": 0, "skip": 1, "inconclusive": 1, "not-claimed": 2, "error": 6, "fail": 7}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def op_key(op) -> str:
    """An OpInfo entry's name in claims and reports: its name, with its
    variant after a dot (``as_strided.partial_views``)."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def load_op_db() -> list:
    """PyTorch's OpInfo database. Importing it runs common_utils, which sets
    up PyTorch's own test runs: it freezes torch.backends' flags and loads a
    hypothesis profile of its own. The kit's other checks set those flags
    and choose their own hypothesis settings, so both are put back."""
    import torch.backends

    try:
        import hypothesis

        profile = getattr(hypothesis.settings, "_current_profile", None)
    except ImportError:  # pragma: no cover - the kit depends on hypothesis
        hypothesis, profile = None, None
    from torch.testing._internal import common_utils
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.opinfo import core

    # (torch.backends' functions keep the flag in their own globals)
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
    if hypothesis is not None and profile:
        hypothesis.settings.load_profile(profile)
    for module in (common_utils, core):
        if hasattr(module, "extract_test_fn"):
            module.extract_test_fn = _calling_test_case_fn
    return list(op_db)


def _calling_test_case_fn():
    """PyTorch's ``extract_test_fn`` without ``inspect.stack()``: the test
    method of the ``unittest.TestCase`` that is running, found up the call
    stack, else None. OpInfo calls it each time it makes a sample iterator
    (for per-test skips and a per-test seed); ``inspect.stack()`` reads the
    source of every frame on the way and looks each file up among all
    loaded modules, 3 to 30 ms a call, most of a small operator's test in a
    forked child whose caches are cold. Walking the frames finds the same
    test method (the kit's tests are not TestCases, so it is None)."""
    import sys
    import unittest

    try:
        frame = sys._getframe(1)
        while frame is not None:
            self_val = frame.f_locals.get("self")
            if isinstance(self_val, unittest.TestCase):
                *_, cls_name, test_name = self_val.id().rsplit(".", 2)
                if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                    return getattr(self_val, test_name).__func__
            frame = frame.f_back
    except Exception:  # noqa: BLE001 - as PyTorch's: no test function
        pass
    return None


@dataclass
class Outcome:
    """The outcome of one check of one (operator, dtype)."""

    verdict: str = ""           # pass | fail | error | skip | not-claimed; "" while nothing was recorded
    message: str = ""
    samples: int = 0            # samples that were evidence (compared)

    def record(self, verdict: str, message: str = "") -> None:
        if SEVERITY[verdict] > SEVERITY[self.verdict] or (verdict == "pass" and self.verdict == "skip"):
            self.verdict, self.message = verdict, message

    def close(self, why_empty: str) -> None:
        """After the check: a check no sample was evidence for is a skip that says why."""
        if not self.verdict:
            self.verdict, self.message = "skip", why_empty


@dataclass
class OperatorReport:
    """Everything one OpInfo entry showed: dtype -> check -> outcome."""

    name: str
    cells: dict[str, dict[str, Outcome]] = field(default_factory=dict)
    random: bool = False

    def outcome(self, dtype: str, check: str) -> Outcome:
        return self.cells.setdefault(dtype, {}).setdefault(check, Outcome())

    def close(self) -> None:
        for checks in self.cells.values():
            for check, outcome in checks.items():
                outcome.close(NO_EVIDENCE.get(check, "no sample was evidence"))

    def to_json(self) -> dict[str, Any]:
        return {dtype: {check: [o.verdict, o.message, o.samples] for check, o in checks.items()}
                for dtype, checks in self.cells.items()}

    def property(self) -> dict[str, Any]:
        """The value of the test's cells property (harness/operators.py)."""
        return {"operator": self.name, "cells": self.to_json()}


class NotClaimed(Exception):
    """The backend has no kernel for an operator this sample needs."""


def _no_kernel(error: BaseException, derived: bool) -> str | None:
    """The missing operator, when `error` is the dispatcher saying the
    backend has no kernel and the claim was derived (not declared)."""
    if not derived or not isinstance(error, NotImplementedError):
        return None
    match = _NO_KERNEL.search(str(error))
    return (match.group(1) or match.group(2)) if match else None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:400]


def _decorations(op, check: str, device_type: str, dtype: torch.dtype | None) -> dict[str, Any]:
    """What OpInfo's decorators for the PyTorch test behind `check` say for
    every device: {"skip": reason} and/or {"atol": .., "rtol": ..}."""
    cls_name, test_name = CHECKS[check][1]
    names = [test_name] + (["test_fn_grad"] if check == "backward" else [])
    found: dict[str, Any] = {}
    for info in getattr(op, "decorators", ()) or ():
        if hasattr(info, "is_active"):  # a DecorateInfo
            if info.device_type is not None:
                continue  # said about one device, not about every device
            if not any(info.is_active(cls_name, name, device_type, dtype, {}) for name in names):
                continue
            decorators = info.decorators
        else:  # a bare decorator: every test of the operator
            decorators = [info]
        for decorator in decorators:
            overrides = getattr(decorator, "d", None)
            if isinstance(overrides, dict) and dtype in overrides:  # toleranceOverride / precisionOverride
                tol = overrides[dtype]
                atol = getattr(tol, "atol", tol)
                rtol = getattr(tol, "rtol", 0.0)
                found["atol"] = max(found.get("atol", 0.0), float(atol))
                found["rtol"] = max(found.get("rtol", 0.0), float(rtol))
                continue
            try:
                marked = decorator(lambda: None)
            except Exception:  # noqa: BLE001 - a decorator that wants a test class: not a skip
                continue
            if getattr(marked, "__unittest_skip__", False):
                found.setdefault("skip", f"OpInfo skips {test_name} for this operator on every device: "
                                         f"{getattr(marked, '__unittest_skip_why__', '')}")
            elif getattr(marked, "__unittest_expecting_failure__", False) and check in CROSS_DEVICE_CHECKS:
                found.setdefault("skip", f"OpInfo expects {test_name} to fail for this operator on every device")
    return found


def tolerance(op, check: str, device_type: str, dtype: torch.dtype) -> tuple[float, float]:
    found = _decorations(op, check, device_type, dtype)
    base = DOUBLE_TOLERANCE if dtype in DOUBLE_PRECISION else BASE_TOLERANCE
    atol, rtol = found.get("atol", base), found.get("rtol", base)
    if dtype in REDUCED_PRECISION:
        resolution = REDUCED_PRECISION_UNITS * torch.finfo(dtype).eps
        atol, rtol = max(atol, resolution), max(rtol, resolution)
    return atol, rtol


class _DeviceClock:
    """Seconds spent in the backend (device calls, and copies of the
    device's tensors to the CPU): the rest of an entry's time is the kit's
    own work, the CPU's reference results above all, whose measure lets the
    parent give a long entry time in proportion (evidence.reference_work).
    Nested device calls count once."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._since = 0.0

    @contextmanager
    def on_device(self):
        if self._depth == 0:
            self._since = time.perf_counter()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.seconds += time.perf_counter() - self._since


_device_clock = _DeviceClock()


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        with _device_clock.on_device():
            return value.detach().cpu().requires_grad_(value.requires_grad)
    return value


def _cpu_sample(sample, device_type: str):
    """The sample on the CPU: its tensors copied, and a `device` keyword
    naming the device (factory functions) made the CPU; None when a sample
    cannot be copied (a meta tensor in it). A tensor that occurs twice in the
    sample (`cat((x, y), out=x)`) becomes two copies, as PyTorch's stock CPU
    fallback makes it: an error input whose error is that aliasing is then
    no evidence (the CPU does not raise either)."""
    try:
        moved = sample.transform(_to_cpu)
    except Exception:  # noqa: BLE001
        return None
    for key, value in list(moved.kwargs.items()):
        if key == "device" and torch.device(value).type == device_type:
            moved.kwargs[key] = "cpu"
    return moved


def _clone_sample(sample):
    """A copy of the sample (operators may write into their inputs)."""
    return sample.transform(lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                            if isinstance(t, torch.Tensor) else t)


_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _unlike(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of t's shape and dtype whose every element differs from
    t's (but NaN and inf): an out= tensor the operator leaves unwritten cannot
    pass for its result. Floating x + 1 + 2|x| is off by more than |x|;
    integers (compared exactly) get their lowest bit flipped."""
    t = t.detach().cpu()
    if t.dtype == torch.bool:
        return t.logical_not()
    if t.is_floating_point() or t.is_complex():
        wide = t.to(torch.complex128 if t.is_complex() else torch.float64)
        return (wide + 1 + 2 * wide.abs()).to(t.dtype)
    signed = _SAME_SIZE_INT[t.element_size()]
    return (t.view(signed) ^ 1).view(t.dtype)


def _misplaced(raw, sample, device: str) -> str | None:
    """Why the device's results (`raw`, before any copy) are not all on
    `device`, where the sample's tensors are, or None. Samples without a
    tensor on the device, or that name a device themselves (factories,
    `to`), are not judged here."""
    want = torch.device(device)
    inputs = tree_flatten((sample.input, sample.args, sample.kwargs))[0]
    if "device" in sample.kwargs or any(isinstance(a, torch.device) for a in inputs) \
            or not any(isinstance(t, torch.Tensor) and t.device == want for t in inputs):
        return None
    tensors = [t for t in tree_flatten(raw)[0] if isinstance(t, torch.Tensor)]
    wrong = [f"result {k} is on {t.device}" for k, t in enumerate(tensors) if t.device != want]
    return f"{', '.join(wrong)}, not on {want} where its inputs are" if wrong else None


def _results_to_cpu(result):
    with _device_clock.on_device():
        return tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, result)


_NO_TOLERANCE = {d for d in vars(torch).values() if isinstance(d, torch.dtype) and "float8" in str(d)}


def _comparable(value):
    """float8 tensors as float32 (assert_close compares them bitwise only)."""
    return tree_map(lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype in _NO_TOLERANCE else t, value)


def _equal(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Whether two strided tensors of the same dtype and shape hold the same
    elements (False where torch.equal cannot say: complex32, quantized)."""
    if got.shape != expected.shape or got.layout != torch.strided or expected.layout != torch.strided \
            or got.is_quantized or expected.is_quantized or got.dtype in _NO_TOLERANCE:
        return False
    try:
        return torch.equal(got, expected)
    except Exception:  # noqa: BLE001 - no equality kernel for the dtype: assert_close decides
        return False


def _mismatch(got, expected, atol: float, rtol: float) -> str | None:
    """Why `got` (already on the CPU) is not `expected`, or None. Integer
    and boolean results must be equal: no tolerance applies to them."""
    try:
        flat_got, got_spec = tree_flatten(got)
        flat_expected, expected_spec = tree_flatten(expected)
        pairs = [(g, e) for g, e in zip(flat_got, flat_expected)
                 if isinstance(g, torch.Tensor) and isinstance(e, torch.Tensor)]
        dtypes = [(g.dtype, e.dtype) for g, e in pairs]
        if any(g != e for g, e in dtypes):
            return "; ".join(f"result dtype {g}, on the CPU {e}" for g, e in dtypes if g != e)
        for k, (g, e) in enumerate(pairs):
            if (g.dtype == torch.bool or not (g.dtype.is_floating_point or g.dtype.is_complex)) \
                    and g.shape == e.shape and not torch.equal(g, e):
                differing = int((g != e).sum())
                return (f"result {k} ({g.dtype}) differs from the CPU's in {differing} of {e.numel()} elements "
                        f"(integers are compared exactly)")
        # Results equal to the CPU's element for element (same structure,
        # every leaf a tensor of the same dtype and shape) pass whatever the
        # tolerance: assert_close would say the same, at many times the cost.
        if got_spec == expected_spec and len(pairs) == len(flat_got) == len(flat_expected) and all(
                _equal(g, e) for g, e in pairs):
            return None
        got, expected = _comparable(got), _comparable(expected)
        torch.testing.assert_close(got, expected, atol=atol, rtol=rtol, equal_nan=True, check_device=False,
                                   check_layout=False, check_stride=False)
    except AssertionError as e:
        return " ".join(str(e).split())[:600]
    except Exception as e:  # noqa: BLE001 - results assert_close cannot compare: say what they are
        return f"results cannot be compared ({_first_line(e)})"
    return None


def _shape_mismatch(got, expected) -> str | None:
    """For random operators: the results' structure, dtypes and shapes."""
    flat_got, spec_got = tree_flatten(got)
    flat_expected, spec_expected = tree_flatten(expected)
    if spec_got != spec_expected:
        return f"the results have another structure than on the CPU: {spec_got} vs {spec_expected}"
    for k, (g, e) in enumerate(zip(flat_got, flat_expected)):
        if isinstance(e, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.dtype != e.dtype or g.shape != e.shape:
                what = f"{g.dtype} {tuple(g.shape)}" if isinstance(g, torch.Tensor) else type(g).__name__
                return f"result {k} is {what}, on the CPU {e.dtype} {tuple(e.shape)}"
    return None


def _permuted(sample):
    """A copy of `sample` whose tensors of 2 dimensions or more have the same
    values in another dense layout: the last two dimensions swapped in
    memory (column-major matrices), as a transposed weight or a channels-last
    activation is laid out. Operators that keep their input's layout
    (elementwise ones: TensorIterator) give the CPU's results that layout."""
    def permute(t):
        if not isinstance(t, torch.Tensor) or t.dim() < 2 or t.layout != torch.strided:
            return t
        return t.detach().transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_(t.requires_grad)

    return sample.transform(permute)


def _strided_results(result) -> list:
    """The flat results, strided tensors kept and anything else None."""
    return [t if isinstance(t, torch.Tensor) and t.layout == torch.strided else None for t in tree_flatten(result)[0]]


_COMPOSITE_KEYS = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutograd")


def _pytorch_composite(func) -> bool:
    """Whether aten operator `func` runs PyTorch's own composite kernel on
    the device (the backend registered no kernel of its own for it): the
    layout of what it returns is PyTorch's choice, not the backend's (a
    functional operator that PyTorch computes through its out= kernel with an
    empty result, which the backend may resize contiguously: OP-INFO-002's
    statement; layer_norm's math kernel)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    name = func.name()
    return not has(name, "PrivateUse1") and any(has(name, key) for key in _COMPOSITE_KEYS)


def _producers(call) -> dict[int, tuple[Any, torch.Tensor]]:
    """Runs call() and returns, for every tensor an aten operator returned
    at the top level, id -> (the operator, the tensor, kept alive so that ids
    stay unique)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    produced: dict[int, tuple[Any, torch.Tensor]] = {}

    class Producers(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    produced[id(t)] = (func, t)
            return out

    with Producers():
        result = call()
    for t in tree_flatten(result)[0]:  # (the results themselves, by position)
        if isinstance(t, torch.Tensor) and id(t) not in produced:
            produced[id(t)] = (None, t)
    produced[-1] = (None, result)
    return produced


def _draws_random_numbers(op, cpu_sample) -> bool:
    """Whether the operator runs an aten operator PyTorch tags as seeded
    random (dropout, bernoulli, normal, randint, ...) on the CPU."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
                seen.append(func)
            return func(*args, **(kwargs or {}))

    try:
        with Recorder():
            op(cpu_sample.input, *cpu_sample.args, **cpu_sample.kwargs)
    except Exception:  # noqa: BLE001 - the reference run will say so
        return False
    return bool(seen)


SAMPLE_SEED = 0


def _seed_generators(seed: int, device_type: str) -> None:
    """What PyTorch's set_rng_seed seeds, for the generators a sample can
    draw from (Python's, NumPy's, the CPU's, the backend's), without
    torch.manual_seed: on a machine where CUDA, XPU and MTIA are not
    initialized, it formats the caller's whole stack for each of them on
    every call (their _lazy_call keeps it for a later initialization).
    Measured: 1.4 ms a call at the depth of a test under pytest, 15 us
    here. OpInfo seeds before every sample, and an operator such as
    max_pool2d_with_indices_backward has over 11,000 of them."""
    import random

    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:  # pragma: no cover - the kit depends on numpy
        pass
    torch.default_generator.manual_seed(seed)
    module = getattr(torch, device_type, None)
    if hasattr(module, "manual_seed_all"):
        module.manual_seed_all(seed)


def _seeded(inputs, device_type: str):
    """OpInfo's sample (or error) inputs, each generated from the same
    seeded state, as OpInfo's own iterator makes them (set_seed=True) but
    seeded by _seed_generators: a sample does not depend on the ones before
    it, so the backward check's regenerated samples are the forward's."""
    iterator = iter(inputs)
    while True:
        _seed_generators(SAMPLE_SEED, device_type)
        try:
            item = next(iterator)
        except StopIteration:
            return
        yield item


_SUMMARY = "_conformance_summary"  # a sample's summary, kept on it: each check names the sample again


def _describe(sample, index: int) -> str:
    text = getattr(sample, _SUMMARY, None)
    if text is None:
        try:
            text = sample.summary()
        except Exception:  # noqa: BLE001
            text = repr(sample)
        text = " ".join(text.split())[:300]
        try:
            setattr(sample, _SUMMARY, text)
        except Exception:  # noqa: BLE001 - (a sample that takes no attributes is described each time)
            pass
    return f"sample {index} ({text})"


class OperatorCheck:
    """Runs the checks of one OpInfo entry on `device_type` (device index 0)."""

    def __init__(self, op, device_type: str, dtypes: list[torch.dtype], derived: bool,
                 backward: bool = True, device_count: int = 1) -> None:
        self.op = op
        self.device_type = device_type
        self.device = f"{device_type}:0"
        # out= tensors on another device than the inputs: the CPU, and the
        # backend's last device when it has more than one.
        self.foreign_devices = ["cpu"] + ([f"{device_type}:{device_count - 1}"] if device_count > 1 else [])
        self.dtypes = dtypes
        self.derived = derived       # the claim is the default (missing kernels are not-claimed)
        self.backward = backward
        self.report = OperatorReport(op_key(op))
        self._permuted_done = False  # column-major samples ran (for the first dtype that had some)
        self._started = time.perf_counter()
        self._device_seconds_before = _device_clock.seconds

    # ------------------------------------------------------------ helpers

    def _run_device(self, call: Callable[[], Any], clause: str, step: str, not_claimed: bool = True):
        """`call` on the device, inside the evidence scope of `clause` (a crash
        or hang inside it is charged there). Raises NotClaimed for a missing
        kernel of a derived claim (unless `not_claimed` is false: a kernel
        missing only for this call's arguments is the call's outcome)."""
        self._report_reference(throttled=True)
        with scope(clause, step), _device_clock.on_device():
            try:
                return call()
            except Exception as e:  # noqa: BLE001
                missing = _no_kernel(e, self.derived) if not_claimed else None
                if missing:
                    raise NotClaimed(f"the backend has no kernel (and no fallback) for {missing}") from e
                raise

    def _skip_reason(self, check: str, dtype: torch.dtype | None) -> str | None:
        return _decorations(self.op, check, self.device_type, dtype).get("skip")

    def reference_seconds(self) -> float:
        """The entry's time so far outside the backend: the CPU's reference
        results and the comparisons (see _DeviceClock)."""
        device = _device_clock.seconds - self._device_seconds_before
        return max(0.0, time.perf_counter() - self._started - device)

    def _report_reference(self, throttled: bool = False) -> None:
        """Tell the parent the reference work so far (at most once a second
        when `throttled`: between a cell's many device calls)."""
        now = time.perf_counter()
        if throttled and now - getattr(self, "_reported_at", 0.0) < 1.0:
            return
        self._reported_at = now
        reference_work(self.reference_seconds())

    def _at(self, dtype: str, check: str) -> Outcome:
        """The outcome of `check` for `dtype`, which starts now: the parent
        is told (the cells so far, and this one), so that a crash or hang
        lands on this cell and the cells done before keep their verdicts."""
        outcome = self.report.outcome(dtype, check)
        self._running = (dtype, check)
        progress(CELLS_PROPERTY, {**self.report.property(), "at": [dtype, check]})
        self._report_reference()
        return outcome

    def _begin(self, check: str, dtype: torch.dtype) -> Outcome | None:
        """The outcome of `check` for `dtype`, or None when OpInfo skips the
        check on every device or the operator is random (recorded as skips)."""
        outcome = self._at(dtype_name(dtype), check)
        skip = self._skip_reason(check, dtype)
        if skip or self.report.random:
            outcome.record("skip", skip or "random operator: values are not compared")
            return None
        return outcome

    # -------------------------------------------------------------- run

    def run(self, resumed: dict | None = None) -> OperatorReport:
        """Every check of every dtype; after a crash, `resumed` holds the
        cells that earlier processes finished (the crash's dtype included:
        its checks after the crash are not run), which are not run again."""
        for dtype, checks in (resumed or {}).items():
            self.report.cells[dtype] = {check: Outcome(*found) for check, found in checks.items()}
        for dtype in self.dtypes:
            if dtype_name(dtype) in self.report.cells:
                continue
            try:
                self._run_dtype(dtype)
            except NotClaimed as e:
                self._not_claimed(dtype_name(dtype), "forward", e)
        if self.op.error_inputs_func is not None and ERRORS_DTYPE not in self.report.cells:
            try:
                self._check_errors()
            except NotClaimed as e:
                self._not_claimed(ERRORS_DTYPE, "errors", e)
        self.report.close()
        return self.report

    def _not_claimed(self, name: str, first_check: str, error: NotClaimed) -> None:
        """A missing kernel of the derived claim: the dtype (cell `name`) is
        not claimed, unless the device already ran some of its inputs. Then
        the operator is claimed for it by running, and a kernel that refuses
        other inputs fails the check it happened in; what was recorded stays."""
        recorded = self.report.cells.get(name, {})
        if not any(o.verdict in ("pass", "fail", "error") for o in recorded.values()):
            self.report.cells[name] = {first_check: Outcome("not-claimed", str(error))}
            return
        at = getattr(self, "_running", None)
        running = at[1] if at and at[0] == name else first_check
        self.report.outcome(name, running).record(
            "fail", f"{error}, for inputs of {name} after the device had run others of {name}: a claimed operator and "
                    "dtype must run every input (a kernel that refuses some inputs fails; it is not 'not claimed')")

    def _samples(self, dtype: torch.dtype, requires_grad: bool, clause: str):
        name = dtype_name(dtype)
        return list(self._run_device(lambda: _seeded(self.op.sample_inputs(self.device, dtype,
                                                                            requires_grad=requires_grad,
                                                                            set_seed=False), self.device_type),
                                     clause, f"{name}: generating OpInfo's samples on the device"))

    def _run_dtype(self, dtype: torch.dtype) -> None:
        name = dtype_name(dtype)
        op = self.op
        forward = self._at(name, "forward")
        skip = self._skip_reason("forward", dtype)
        if skip:
            forward.record("skip", skip)
            return
        try:
            samples = self._samples(dtype, False, CHECKS["forward"][0])
        except NotClaimed:
            raise
        except Exception as e:  # noqa: BLE001
            forward.record("error", f"generating OpInfo's samples on the device failed: {_first_line(e)}")
            return
        atol, rtol = tolerance(op, "forward", self.device_type, dtype)
        passed = []   # (index, device sample, cpu sample, cpu result) of samples whose forward passed
        layouts = []  # (step, device sample, device results, cpu results) of the same samples
        for index, sample in enumerate(samples):
            cpu_sample = _cpu_sample(sample, self.device_type)
            if cpu_sample is None:
                continue
            # Each sample until one draws: some draw only with some arguments
            # (alpha_dropout with training=True, its third sample), and a
            # device need not draw the CPU's numbers.
            if not self.report.random:
                self.report.random = _draws_random_numbers(op, cpu_sample)
            cpu_pristine = _clone_sample(cpu_sample)
            try:
                cpu_raw = op(cpu_sample.input, *cpu_sample.args, **cpu_sample.kwargs)
                expected = cpu_sample.output_process_fn_grad(cpu_raw)
            except Exception:  # noqa: BLE001 - the CPU rejects it: no evidence
                continue
            step = f"{name}: forward, {_describe(sample, index)}"
            try:
                pristine = self._run_device(lambda: _clone_sample(sample), CHECKS["forward"][0],
                                            f"{name}: copying {_describe(sample, index)} on the device")
                raw = self._run_device(lambda: op(sample.input, *sample.args, **sample.kwargs),
                                       CHECKS["forward"][0], step)
                got = _results_to_cpu(sample.output_process_fn_grad(raw))
            except NotClaimed:
                raise
            except Exception as e:  # noqa: BLE001
                forward.record("fail", f"{step}: raised {_first_line(e)} on the device; the CPU returned a result")
                continue
            forward.samples += 1
            problem = _misplaced(raw, sample, self.device) or (
                _shape_mismatch(got, expected) if self.report.random else _mismatch(got, expected, atol, rtol))
            if problem:
                forward.record("fail", f"{step}: {problem}")
                continue
            forward.record("pass")
            passed.append((index, pristine, cpu_pristine, expected))
            layouts.append((step, pristine, _strided_results(raw), _strided_results(cpu_raw)))
        self._check_layout(dtype, layouts, passed, atol, rtol)
        self._check_noncontiguous(dtype, passed, atol, rtol)
        self._check_out(dtype, passed, atol, rtol)
        self._check_inplace(dtype, passed, atol, rtol)
        if self.backward and op.supports_autograd and dtype in op.supported_backward_dtypes("cpu"):
            self._check_backward(dtype, {index for index, *_ in passed})

    def _layout_mismatch(self, sample, got: list, expected: list) -> str | None:
        """Why the device's results (flat, strided tensors or None) are not
        laid out as the CPU's, or None. Strides are compared where they
        matter (dimensions of size more than 1 of results with elements).
        Where they differ, the strides PyTorch's meta kernel gives the same
        call (the layout compiled code and fake tensors assume) pass too."""
        differing = [k for k, (g, e) in enumerate(zip(got, expected))
                     if g is not None and e is not None and _geometry(g) != _geometry(e)]
        if not differing:
            return None
        meta = self._meta_results(sample)
        composite = None
        problems = []
        for k in differing:
            m = meta[k] if meta is not None and k < len(meta) else None
            if m is not None and _geometry(m) == _geometry(got[k]):
                continue
            if composite is None:
                composite = self._composite_results(sample)
            if k in composite:
                continue  # PyTorch's composite kernel chose the layout
            problems.append(f"result {k} of shape {tuple(got[k].shape)} has strides {tuple(got[k].stride())} on the "
                            f"device, {tuple(expected[k].stride())} on the CPU"
                            + (f" and {tuple(m.stride())} from PyTorch's meta kernel" if m is not None else ""))
        return "; ".join(problems) or None

    def _composite_results(self, sample) -> set[int]:
        """The positions of the results that PyTorch's own composite kernels
        return for the sample on the device (the operator run again on a
        copy, its aten operators watched)."""
        try:
            copy = _clone_sample(sample)
            produced = _producers(lambda: self.op(copy.input, *copy.args, **copy.kwargs))
        except Exception:  # noqa: BLE001 - it ran before; no excuse found
            return set()
        flat = tree_flatten(produced.pop(-1)[1])[0]
        return {k for k, t in enumerate(flat) if isinstance(t, torch.Tensor) and id(t) in produced
                and produced[id(t)][0] is not None and _pytorch_composite(produced[id(t)][0])}

    def _meta_results(self, sample) -> list | None:
        """The flat results of the operator on meta tensors of the sample's
        geometry, or None where the meta kernel cannot run it."""
        def to_meta(t):
            if not isinstance(t, torch.Tensor):
                return t
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

        try:
            meta = sample.transform(to_meta)
            for key, value in list(meta.kwargs.items()):
                if key == "device" and torch.device(value).type == self.device_type:
                    meta.kwargs[key] = "meta"
            return _strided_results(self.op(meta.input, *meta.args, **meta.kwargs))
        except Exception:  # noqa: BLE001 - no meta kernel, or one that needs the values
            return None

    def _check_layout(self, dtype, layouts, passed, atol, rtol) -> None:
        """The strides of the forward check's results, and, for the first
        dtype of the operator with such samples, the same samples with their
        matrices laid out column-major: values and strides as on the CPU."""
        name = dtype_name(dtype)
        outcome = self._at(name, "layout")
        skip = self._skip_reason("layout", dtype)
        if skip:
            outcome.record("skip", skip)
            return
        clause = CHECKS["layout"][0]
        for step, sample, got, expected in layouts:
            if not any(g is not None for g in got):
                continue
            outcome.samples += 1
            problem = self._layout_mismatch(sample, got, expected)
            outcome.record("fail" if problem else "pass", f"{step}: {problem}" if problem else "")
        if self._permuted_done:
            return
        for index, sample, cpu_sample, _ in passed:
            if not any(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in tree_flatten(
                    (sample.input, sample.args, sample.kwargs))[0]):
                continue
            self._permuted_done = True
            self._compare_transformed(outcome, clause, f"{name}: inputs laid out column-major, "
                                      f"{_describe(sample, index)}", _permuted, sample, cpu_sample, atol, rtol,
                                      layout=True)

    def _check_noncontiguous(self, dtype, passed, atol, rtol) -> None:
        name = dtype_name(dtype)
        outcome = self._begin("noncontiguous", dtype)
        if outcome is None:
            return
        clause = CHECKS["noncontiguous"][0]
        # The reference is the CPU's result for the same non-contiguous sample
        # (noncontiguous_like lays every tensor out the same way, filler
        # included), not its contiguous result: some operators legitimately
        # answer otherwise for another layout (as_strided reads the storage;
        # view_as_complex needs a unit last stride).
        for index, sample, cpu_sample, _ in passed:
            self._compare_transformed(outcome, clause, f"{name}: non-contiguous, {_describe(sample, index)}",
                                      lambda s: _clone_sample(s).noncontiguous(), sample, cpu_sample, atol, rtol)

    def _compare_transformed(self, outcome, clause, step, transform, sample, cpu_sample, atol, rtol,
                             layout: bool = False) -> None:
        """The operator on `transform` of the CPU's sample (a rejection is no
        evidence) and of the device's (raising is a failure): the device's
        results must have the CPU's values and, with `layout`, its strides."""
        try:
            cpu_transformed = transform(cpu_sample)
            cpu_raw = self.op(cpu_transformed.input, *cpu_transformed.args, **cpu_transformed.kwargs)
            expected = cpu_transformed.output_process_fn_grad(cpu_raw)
        except Exception:  # noqa: BLE001 - the CPU rejects these inputs: no evidence
            return
        try:
            transformed = self._run_device(lambda: transform(sample), clause, step)
            raw = self._run_device(lambda: self.op(transformed.input, *transformed.args, **transformed.kwargs),
                                   clause, step)
            got = _results_to_cpu(transformed.output_process_fn_grad(raw))
        except NotClaimed:
            raise
        except Exception as e:  # noqa: BLE001
            outcome.record("fail", f"{step}: raised {_first_line(e)} on the device; the CPU returned a result for "
                                   "the same inputs")
            return
        outcome.samples += 1
        problem = _misplaced(raw, transformed, self.device) or (
            _shape_mismatch(got, expected) if self.report.random else _mismatch(got, expected, atol, rtol))
        if layout:
            problem = problem or self._layout_mismatch(transformed, _strided_results(raw), _strided_results(cpu_raw))
        outcome.record("fail" if problem else "pass", f"{step}: {problem}" if problem else "")

    def _check_out(self, dtype, passed, atol, rtol) -> None:
        op = self.op
        if not op.supports_out:
            return
        name = dtype_name(dtype)
        outcome = self._begin("out", dtype)
        if outcome is None:
            return
        clause = CHECKS["out"][0]
        written = []  # (index, sample, CPU out= tensors, spec, expected, returns_out) of samples whose out= passed
        for index, pristine, cpu_pristine, _ in passed[:OUT_SAMPLES]:
            sample, cpu_sample = _clone_sample(pristine), _clone_sample(cpu_pristine)
            try:  # the CPU's out= result, into tensors the CPU accepts
                cpu_result = op(cpu_sample.input, *cpu_sample.args, **cpu_sample.kwargs)
                flat, spec = tree_flatten(cpu_result)
                if not flat or not all(isinstance(t, torch.Tensor) for t in flat):
                    continue
                cpu_out = spec.unflatten([torch.empty_like(t) for t in flat]) if len(flat) > 1 else \
                    torch.empty_like(flat[0])
                cpu_returned = op(cpu_sample.input, *cpu_sample.args, **cpu_sample.kwargs, out=cpu_out)
                returns_out = tree_flatten(cpu_returned)[0] != [] and all(
                    r is o for r, o in zip(tree_flatten(cpu_returned)[0], tree_flatten(cpu_out)[0]))
                expected = cpu_sample.output_process_fn_grad(cpu_out)
            except Exception:  # noqa: BLE001 - the CPU takes no out= here: no evidence
                continue
            if not self.report.random and _mismatch(expected, cpu_sample.output_process_fn_grad(cpu_result),
                                                    atol, rtol):
                # The CPU's out= disagrees with its own result (fft.ihfftn
                # writes garbage there): no reference to compare with.
                continue
            step = f"{name}: out=, {_describe(sample, index)}"

            def call(flat=flat, spec=spec, sample=sample):
                outs = [torch.empty(t.shape, dtype=t.dtype, device=self.device) for t in flat]
                given = spec.unflatten(outs) if len(outs) > 1 else outs[0]
                returned = op(sample.input, *sample.args, **sample.kwargs, out=given)
                return outs, given, returned

            try:
                outs, given, returned = self._run_device(call, clause, step)
            except NotClaimed:
                raise
            except Exception as e:  # noqa: BLE001
                outcome.record("fail", f"{step}: raised {_first_line(e)} on the device; the CPU accepted out=")
                continue
            outcome.samples += 1
            returned_flat, _ = tree_flatten(returned)
            if returns_out and (len(returned_flat) != len(outs) or any(r is not o for r, o in zip(returned_flat, outs))):
                outcome.record("fail", f"{step}: did not return the tensor(s) passed as out=, as the CPU does")
                continue
            got = _results_to_cpu(sample.output_process_fn_grad(given))
            problem = _shape_mismatch(got, expected) if self.report.random else _mismatch(got, expected, atol, rtol)
            outcome.record("fail" if problem else "pass", f"{step}: out= holds {problem}" if problem else "")
            if not problem and not self.report.random:
                for layout in OUT_LAYOUTS:
                    self._check_out_layout(outcome, layout, pristine, cpu_pristine, flat, spec, expected, name,
                                           index, atol, rtol)
                written.append((index, pristine, tree_flatten(cpu_out)[0], spec, expected, returns_out))
        self._check_out_device(dtype, written, atol, rtol)

    def _check_out_device(self, dtype, written, atol, rtol) -> None:
        """out= tensors on the CPU (and on another device of the backend) for
        device inputs. CUDA refuses them (PyTorch's test_out expects a
        RuntimeError); PyTorch's stock CPU fallback computes on the CPU and
        writes the result into them. Either is right; returning with the
        tensors unwritten, holding other values, or not returned as the CPU
        returns them is not. Each out= tensor starts with values unlike the
        result's everywhere, so an unwritten one cannot pass."""
        if not written:
            return
        name = dtype_name(dtype)
        outcome = self._begin("out-device", dtype)
        if outcome is None:
            return
        clause = CHECKS["out-device"][0]
        for index, pristine, cpu_outs, spec, expected, returns_out in written:
            for where in self.foreign_devices:
                step = f"{name}: out= on {where}, {_describe(pristine, index)}"
                sample = _clone_sample(pristine)

                def call(sample=sample, where=where, cpu_outs=cpu_outs, spec=spec):
                    outs = [_unlike(t).to(where) for t in cpu_outs]
                    given = spec.unflatten(outs) if len(outs) > 1 else outs[0]
                    return outs, given, self.op(sample.input, *sample.args, **sample.kwargs, out=given)

                try:  # (the operator ran with out= on the device: a kernel missing for these out= is a refusal)
                    outs, given, returned = self._run_device(call, clause, step, not_claimed=False)
                except REFUSALS:
                    outcome.samples += 1
                    outcome.record("pass")
                    continue
                except Exception as e:  # noqa: BLE001
                    outcome.samples += 1
                    outcome.record("fail", f"{step}: raised {_first_line(e)}; an out= tensor on another device is "
                                           f"refused with {' or '.join(t.__name__ for t in REFUSALS)}, or filled "
                                           "with the result")
                    continue
                outcome.samples += 1
                returned_flat, _ = tree_flatten(returned)
                if returns_out and (len(returned_flat) != len(outs) or
                                    any(r is not o for r, o in zip(returned_flat, outs))):
                    outcome.record("fail", f"{step}: accepted the out= tensor(s) on {where} but did not return "
                                           "them, as the CPU returns its out= tensors")
                    continue
                moved = [o.device != torch.device(where) for o in outs]
                if any(moved):
                    outcome.record("fail", f"{step}: accepted the out= tensor(s) on {where} and moved them to "
                                           f"{outs[moved.index(True)].device}")
                    continue
                problem = _mismatch(_results_to_cpu(pristine.output_process_fn_grad(given)), expected, atol, rtol)
                outcome.record("fail" if problem else "pass",
                               f"{step}: accepted the out= tensor(s) on {where} (neither refused nor filled with the "
                               f"result): they hold {problem}" if problem else "")

    def _check_out_layout(self, outcome, layout, sample, cpu_sample, flat, spec, reference, name, index, atol,
                          rtol) -> None:
        """out= tensors of another layout than the result's: non-contiguous
        ones (written through their strides, which stay), or empty ones (the
        operator resizes them). The device must do what the CPU does with the
        same tensors: the same values and shapes afterwards, and for the
        non-contiguous ones the same strides (OUT_LAYOUTS). Where
        the CPU's values differ from its out= result with a fresh tensor
        (`reference`), the CPU is no reference: no evidence."""
        op, clause = self.op, CHECKS["out"][0]

        def run(sample, device):
            make, strides = OUT_LAYOUTS[layout]
            outs = [make(t, device) for t in flat]
            given = spec.unflatten(outs) if len(outs) > 1 else outs[0]
            op(sample.input, *sample.args, **sample.kwargs, out=given)
            return [_geometry(o) if strides else (tuple(o.shape),) for o in outs], sample.output_process_fn_grad(given)

        try:  # (fresh copies of the samples: operators may write into their inputs)
            cpu_sample = _clone_sample(cpu_sample)
            expected_layout, expected = run(cpu_sample, "cpu")
        except Exception:  # noqa: BLE001 - the CPU takes no such out=: no evidence
            return
        if _mismatch(expected, reference, atol, rtol):
            return
        step = f"{name}: out= {layout}, {_describe(sample, index)}"
        try:
            device_sample = _clone_sample(sample)
            got_layout, got = self._run_device(lambda: run(device_sample, self.device), clause, step)
        except NotClaimed:
            raise
        except Exception as e:  # noqa: BLE001
            outcome.record("fail", f"{step}: raised {_first_line(e)} on the device; the CPU accepted the same out=")
            return
        outcome.samples += 1
        if got_layout != expected_layout:
            what = "(shape, strides)" if OUT_LAYOUTS[layout][1] else "shape"
            outcome.record("fail", f"{step}: out= has {what} {got_layout} afterwards; the CPU's has "
                                   f"{expected_layout}")
            return
        problem = _mismatch(_results_to_cpu(got), expected, atol, rtol)
        outcome.record("fail" if problem else "pass", f"{step}: out= holds {problem}" if problem else "")

    def _check_inplace(self, dtype, passed, atol, rtol) -> None:
        op = self.op
        inplace = op.inplace_variant
        if inplace is None:
            return
        name = dtype_name(dtype)
        outcome = self._begin("inplace", dtype)
        if outcome is None:
            return
        clause = CHECKS["inplace"][0]
        for index, sample, cpu_sample, _ in passed:
            if sample.broadcasts_input or not isinstance(sample.input, torch.Tensor):
                continue
            sample, cpu_sample = _clone_sample(sample), _clone_sample(cpu_sample)
            try:
                cpu_input = cpu_sample.input.clone()
                inplace(cpu_input, *cpu_sample.args, **cpu_sample.kwargs)
            except Exception:  # noqa: BLE001 - the CPU cannot do it in place (type promotion): no evidence
                continue
            step = f"{name}: in-place, {_describe(sample, index)}"

            def call(sample=sample):
                target = sample.input.detach().clone()
                return target, inplace(target, *sample.args, **sample.kwargs)

            try:
                target, returned = self._run_device(call, clause, step)
            except NotClaimed:
                raise
            except Exception as e:  # noqa: BLE001
                outcome.record("fail", f"{step}: raised {_first_line(e)} on the device; the CPU did it in place")
                continue
            outcome.samples += 1
            if returned is not target:
                outcome.record("fail", f"{step}: the in-place variant did not return its input")
                continue
            problem = _mismatch(_results_to_cpu(target), cpu_input, atol, rtol)
            outcome.record("fail" if problem else "pass", f"{step}: the input holds {problem}" if problem else "")

    def _check_backward(self, dtype, forward_passed: set[int]) -> None:
        op = self.op
        name = dtype_name(dtype)
        outcome = self._begin("backward", dtype)
        if outcome is None:
            return
        clause = CHECKS["backward"][0]
        atol, rtol = tolerance(op, "backward", self.device_type, dtype)
        try:
            samples = self._samples(dtype, True, clause)
        except NotClaimed:
            raise
        except Exception as e:  # noqa: BLE001
            outcome.record("error", f"generating OpInfo's samples with requires_grad on the device failed: "
                                    f"{_first_line(e)}")
            return
        for index, sample in enumerate(samples):
            if index not in forward_passed:
                continue  # its forward failed (charged there) or the CPU rejected it
            cpu_sample = _cpu_sample(sample, self.device_type)
            if cpu_sample is None:
                continue
            try:
                expected, seeds = self._gradients(cpu_sample, None)
            except Exception:  # noqa: BLE001 - no CPU gradient to compare with
                continue
            if expected is None:
                continue
            step = f"{name}: backward, {_describe(sample, index)}"
            try:
                # Fresh leaves on the device too, as the CPU copy's are: a
                # sample tensor may be a leaf view that autograd gives no
                # gradient on any device (istft's window[:8]).
                got, _ = self._run_device(lambda: self._gradients(_clone_sample(sample), seeds), clause, step)
            except NotClaimed:
                raise
            except Exception as e:  # noqa: BLE001
                outcome.record("fail", f"{step}: the backward pass raised {_first_line(e)} on the device; on the "
                                       "CPU it computed the gradients")
                continue
            outcome.samples += 1
            got = _results_to_cpu(list(got))
            problem = None
            for k, (g, e) in enumerate(zip(got, expected)):
                if g is None and e is None:
                    continue
                g = torch.zeros_like(e) if g is None else g
                e = torch.zeros_like(g) if e is None else e
                problem = _mismatch(g, e, atol, rtol)
                if problem:
                    problem = f"the gradient of input {k}: {problem}"
                    break
            outcome.record("fail" if problem else "pass", f"{step}: {problem}" if problem else "")

    def _gradients(self, sample, seeds: list[torch.Tensor] | None):
        """Gradients of the sample's inputs that require grad, for output
        gradients `seeds` (drawn on the CPU when None): (gradients, seeds),
        or (None, None) when no output is differentiable."""
        result = self.op(sample.input, *sample.args, **sample.kwargs)
        outputs = [t for t in tree_flatten(sample.output_process_fn_grad(result))[0]
                   if isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())]
        inputs = [t for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.requires_grad]
        if not outputs or not inputs:
            return None, None
        if seeds is None:
            generator = torch.Generator().manual_seed(1)
            seeds = [torch.randn(t.shape, dtype=t.dtype, generator=generator) if t.dtype not in (torch.complex32,)
                     else torch.randn(t.shape, dtype=torch.complex64, generator=generator).to(t.dtype)
                     for t in outputs]
        grad_outputs = [s.to(t.device) for s, t in zip(seeds, outputs)]
        grads = torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True)
        return list(grads), seeds

    def _check_errors(self) -> None:
        outcome = self._at(ERRORS_DTYPE, "errors")
        skip = self._skip_reason("errors", None)
        if skip:
            outcome.record("skip", skip)
            return
        clause = CHECKS["errors"][0]
        try:
            error_inputs = list(self._run_device(lambda: _seeded(self.op.error_inputs(self.device, set_seed=False),
                                                                 self.device_type), clause,
                                                 "generating OpInfo's error inputs on the device"))
        except NotClaimed:
            raise
        except Exception as e:  # noqa: BLE001
            outcome.record("error", f"generating OpInfo's error inputs on the device failed: {_first_line(e)}")
            return
        for index, error_input in enumerate(error_inputs):
            sample, expected_type = error_input.sample_input, error_input.error_type
            cpu_sample = _cpu_sample(sample, self.device_type)
            if cpu_sample is None:
                continue
            try:
                self.op(cpu_sample.input, *cpu_sample.args, **cpu_sample.kwargs)
                continue  # the CPU accepts it (a device-specific error input): no evidence
            except expected_type:
                pass
            except Exception:  # noqa: BLE001 - the CPU raises something else: no evidence about the type
                continue
            step = f"error input {index} ({' '.join(sample.summary().split())[:200]})"
            try:
                self._run_device(lambda: self.op(sample.input, *sample.args, **sample.kwargs), clause, step)
            except NotClaimed:
                raise
            except expected_type:
                outcome.samples += 1
                outcome.record("pass")
                continue
            except Exception as e:  # noqa: BLE001
                outcome.samples += 1
                outcome.record("fail", f"{step}: raised {_first_line(e)} on the device; the CPU raises "
                                       f"{expected_type.__name__}")
                continue
            outcome.samples += 1
            outcome.record("fail", f"{step}: returned on the device; the CPU raises {expected_type.__name__}")
