"""The C++ guard contracts: c10::DeviceGuard, OptionalDeviceGuard, StreamGuard,
OptionalStreamGuard, MultiStreamGuard and the backend's DeviceGuardImplInterface,
probed in C++ with GoogleTest against whatever backend is loaded.

The GoogleTest cases (conformance/cxx/contracts_*.cpp) are compiled into the
kit's probe module. This module turns each case into one pytest test, run in
its own forked process like every other test, so that a crash (a throw out of
a noexcept method terminates the process) or a hang becomes a verdict. The
suite name of a case is its contract ID with '_' for '-' (GD_DEV_001.X checks
GD-DEV-001): a case whose suite is no registry ID fails collection.

Rules that need the backend's instrumentation (GD-DEV-002: no redundant
device switch) are checked here in Python around C++ probes.
"""

from __future__ import annotations

import pytest

from privateuse1_conformance.conformance import _cxx

from ._helpers import must

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

GUARD_KINDS = ("DeviceGuard", "nested DeviceGuard", "OptionalDeviceGuard")
REPEATS = 20


def switches_during(count, call) -> int:
    before = count()
    call()
    return count() - before


def _check_no_switch(count, kinds, n) -> None:
    for index in sorted({0, n - 1}):
        must(lambda: _cxx.guard_set_device(index), f"the guard's setDevice({index})")
        for kind in kinds:
            # Warm up: lazy initialization, first streams, ... may switch.
            must(lambda: _cxx.guard_current_device(kind, 1), f"a {kind} to the current device")
            switched = switches_during(count, lambda: _cxx.guard_current_device(kind, REPEATS))
            assert switched == 0, (
                f"{REPEATS} {kind}s to the current device {index} made the runtime switch the "
                f"device {switched} time(s): exchangeDevice() and uncheckedSetDevice() must skip "
                f"the runtime's set-device call when the device is already current")


@contract("GD-DEV-002")
def test_guarding_the_current_device_does_not_switch(instrument, n):
    count = instrument("device_switch_count")
    if n >= 2:
        # The counter must count, or "no switch" proves nothing.
        must(lambda: _cxx.guard_set_device(0), "the guard's setDevice(0)")
        must(lambda: _cxx.guard_other_device(1), "a DeviceGuard to device 1")
        switched = switches_during(count, lambda: _cxx.guard_other_device(1))
        assert switched >= 1, (
            "the instrumentation's device_switch_count() did not change when a DeviceGuard "
            f"switched from device 0 to device 1 and back ({switched}): it does not count switches")
    _check_no_switch(count, GUARD_KINDS, n)


@contract("GD-DEV-002")
def test_stream_guard_on_the_current_device_does_not_switch(instrument, n, session):
    if "streams" in session.unclaimed:
        pytest.skip("the backend does not claim streams")
    count = instrument("device_switch_count")
    _check_no_switch(count, ("StreamGuard",), n)
