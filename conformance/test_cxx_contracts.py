"""The C++ guard contracts: c10::DeviceGuard, OptionalDeviceGuard, StreamGuard,
OptionalStreamGuard, MultiStreamGuard and the backend's DeviceGuardImplInterface,
probed in C++ with GoogleTest against whatever backend is loaded.

The GoogleTest cases (conformance/cxx/contracts_*.cpp) are compiled into the
kit's probe module. This module turns each case into one pytest test, run in
its own forked process like every other test, so that a crash (a throw out of
a noexcept method terminates the process) or a hang becomes a verdict. The
suite name of a case is its contract ID with '_' for '-' (GD_DEV_001.X checks
GD-DEV-001): a case whose suite is no registry ID fails collection.

GD-DEV-002 (no redundant device switch) is checked here in Python around C++
probes: its consequences are observed through PyTorch, and the switches
themselves are counted where the backend offers instrumentation.
"""

from __future__ import annotations

import pytest

from privateuse1_conformance.conformance import _cxx

from privateuse1_conformance.harness.evidence import not_applicable

from ._helpers import check, initialized_by, must, scope

contract = pytest.mark.contract

# Suites whose cases are meaningful with no device (the cases handle it).
ZERO_DEVICES_OK = {"GD_CNT_001"}


def contract_of(case: str) -> str:
    """The contract ID a GoogleTest case checks, from its suite name."""
    return case.split(".", 1)[0].replace("_", "-")


def _params() -> list:
    params = []
    for case in _cxx.gtest_list():
        marks = [contract(contract_of(case))]
        if case.split(".", 1)[0] in ZERO_DEVICES_OK:
            marks.append(pytest.mark.zero_devices_ok)
        params.append(pytest.param(case, id=case, marks=marks))
    return params


@pytest.mark.parametrize("case", _params())
def test_cxx(case):
    passed, skipped, message = _cxx.gtest_run(case)
    if skipped:
        pytest.skip(message or f"the C++ case {case} skipped itself")
    if not passed:
        pytest.fail(f"C++ contract test {case} failed:\n{message}", pytrace=False)


# ------------------------------------------------------------ GD-DEV-002

DEVICE_GUARDS = ("DeviceGuard", "nested DeviceGuard", "OptionalDeviceGuard")
REPEATS = 20


def pytest_generate_tests(metafunc):
    """guard_kind: the device guards, and StreamGuard where the backend claims streams."""
    if "guard_kind" not in metafunc.fixturenames:
        return
    session = metafunc.config.pluginmanager.get_plugin("privateuse1-conformance-session")
    kinds = list(DEVICE_GUARDS)
    if session is None or "streams" not in session.unclaimed:
        kinds.append("StreamGuard")
    metafunc.parametrize("guard_kind", kinds)


@contract("GD-DEV-002")
def test_guarding_the_current_device_keeps_it_and_creates_no_context(mod, n):
    """A redundant switch that reaches the runtime is visible where the
    runtime creates a context on set-device (CUDA's cudaSetDevice does): in
    a fresh process, guarding device 0 must leave every device without one."""
    def guard_everything() -> None:
        for kind in DEVICE_GUARDS:
            with scope("GD-DEV-002.2"):
                must(lambda: _cxx.guard_current_device(kind, REPEATS), f"{REPEATS} {kind}s to the current device 0")

    initialized_by("GD-DEV-002.2", guard_everything, "guarding the current device 0 in a fresh process", mod, _cxx, n)


@contract("GD-DEV-002")
def test_guarding_the_current_device_switches_nothing(guard_kind, instrument, mod, n):
    count = instrument("device_switch_count")
    if count is None:
        not_applicable("GD-DEV-002.3", "the runtime's device switches are counted by the instrumentation's "
                                       "device_switch_count(), which the backend does not offer")
    if count is not None and n >= 2:
        # The counter must count, or "no switch" proves nothing.
        must(lambda: _cxx.guard_set_device(0), "the guard's setDevice(0)")
        must(lambda: _cxx.guard_other_device(1), "a DeviceGuard to device 1")
        before = count()
        _cxx.guard_other_device(1)
        check("GD-DEV-002.3", count() - before >= 1,
              "the instrumentation's device_switch_count() did not change when a DeviceGuard switched from device 0 "
              "to device 1 and back: it does not count switches")
    for index in sorted({0, n - 1}):
        with scope("GD-DEV-002.1"):
            must(lambda: _cxx.guard_set_device(index), f"the guard's setDevice({index})")
            # Warm up: lazy initialization, first streams, ... may switch.
            must(lambda: _cxx.guard_current_device(guard_kind, 1), f"a {guard_kind} to the current device")
        before = count() if count is not None else None
        with scope("GD-DEV-002.1"):
            must(lambda: _cxx.guard_current_device(guard_kind, REPEATS), f"{REPEATS} {guard_kind}s to device {index}")
        check("GD-DEV-002.1", _cxx.guard_get_device()[1] == index and mod.current_device() == index,
              f"after {REPEATS} {guard_kind}s to the current device {index}, the current device is "
              f"{_cxx.guard_get_device()[1]} (guard) / {mod.current_device()} (module)")
        if count is not None:
            switched = count() - before
            check("GD-DEV-002.3", switched == 0,
                  f"{REPEATS} {guard_kind}s to the current device {index} made the runtime switch the device "
                  f"{switched} time(s) (instrumentation device_switch_count()): exchangeDevice() and "
                  "uncheckedSetDevice() must skip the runtime's set-device call when the device is already current")
