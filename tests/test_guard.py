"""The PrivateUse1 DeviceGuardImplInterface (contracts GD-*), through the kit's
probe ``_cxx`` and the Python APIs built on it (torch.Stream, torch.accelerator)."""

from __future__ import annotations

import pytest
import torch

from _support import N, _cxx, assert_range_error, error_text


def test_guard_registered_for_openreg(n_devices):
    assert _cxx.guard_registered() is True, "no DeviceGuardImpl registered for PrivateUse1"
    assert _cxx.guard_type() == "openreg"
    assert _cxx.guard_device_count() == n_devices == torch.openreg.device_count(), (
        f"guard.deviceCount()={_cxx.guard_device_count()} != module count {n_devices}")


def test_guard_set_get_exchange(two_devices):
    """GD-DEV-001 (impl level): setDevice / getDevice / exchangeDevice."""
    for i in range(N):
        _cxx.guard_set_device(i)
        assert _cxx.guard_get_device() == ("openreg", i)
        assert torch.openreg.current_device() == i, "guard.setDevice is invisible to the module"
    _cxx.guard_set_device(0)
    assert _cxx.guard_exchange_device(1) == ("openreg", 0)
    assert _cxx.guard_get_device() == ("openreg", 1)


@pytest.mark.parametrize("method", ["set", "exchange", "stream"])
def test_guard_rejects_devices_of_another_type(two_devices, method):
    """GD-DEV-004: a CPU device raises a clear error naming the wrong type; no change."""
    torch.openreg.set_device(1)
    fn = {"set": _cxx.guard_set_device_of_type, "exchange": _cxx.guard_exchange_device_of_type,
          "stream": _cxx.guard_get_stream_of_type}[method]
    with pytest.raises(RuntimeError) as excinfo:
        fn("cpu", 0)
    message = error_text(excinfo)
    assert "cpu" in message.lower(), f"error does not name the wrong device type: {message!r}"
    assert torch.openreg.current_device() == 1, f"guard {method} with a CPU device moved the device"


@pytest.mark.parametrize("index", [N, N + 1, 127, -2, -128])
def test_guard_set_device_bad_index_raises(two_devices, index):
    """GD-DEV-003/ER-MSG-001: setDevice / exchangeDevice validate the index."""
    torch.openreg.set_device(1)
    for fn in (_cxx.guard_set_device, _cxx.guard_exchange_device):
        with pytest.raises(RuntimeError) as excinfo:
            fn(index)
        assert_range_error(excinfo, index, N)
        assert _cxx.guard_get_device() == ("openreg", 1)


@pytest.mark.parametrize("index", [N, N + 1, 127, -1, -2, -128])
def test_unchecked_set_device_bad_index_never_raises_and_changes_nothing(two_devices, index):
    """GD-DEV-005: uncheckedSetDevice never throws, even for a bad index."""
    torch.openreg.set_device(1)
    _cxx.guard_unchecked_set_device(index)
    assert _cxx.guard_get_device() == ("openreg", 1), (
        f"uncheckedSetDevice({index}) changed the current device")
    assert torch.openreg.current_device() == 1


def test_unchecked_set_device_valid_index_switches(two_devices):
    _cxx.guard_unchecked_set_device(1)
    assert torch.openreg.current_device() == 1, "uncheckedSetDevice(1) did not switch"
    _cxx.guard_unchecked_set_device(0)
    assert torch.openreg.current_device() == 0


def test_synchronize_device_each_index(n_devices):
    """GD synchronizeDevice(i) works for every device; bad indices raise."""
    for i in range(n_devices):
        _cxx.guard_synchronize_device(i)
        torch.accelerator.synchronize(i)
        torch.openreg.synchronize(i)
    for bad in (n_devices, 127, -2):
        with pytest.raises(RuntimeError) as excinfo:
            _cxx.guard_synchronize_device(bad)
        assert_range_error(excinfo, bad, n_devices)


def test_synchronize_device_waits_for_the_named_device(two_devices):
    """ST-DEVSYNC-001: synchronizeDevice(1) called from device 0 waits for device 1's work."""
    src = torch.ones(4 << 20, dtype=torch.float32, device="openreg:1")
    for _ in range(3):
        dst = torch.empty(4 << 20, dtype=torch.float64, device="openreg:1")
        torch.openreg.set_device(0)
        dst.copy_(src)  # a converting same-device copy: an asynchronous kernel
        _cxx.guard_synchronize_device(1)
        assert torch.accelerator.current_stream(1).query(), (
            "device 1's stream still busy after guard.synchronizeDevice(1) from device 0")
        assert torch.openreg.current_device() == 0, "synchronizeDevice(1) changed the device"
    assert dst[-1].item() == 1.0


def test_get_stream_of_each_device(n_devices):
    """getStream(openreg:i) is the current (initially default) stream of device i."""
    for i in range(n_devices):
        stream_id, device_index = _cxx.guard_get_stream_of_type("openreg", i)
        assert device_index == i
        current = torch.accelerator.current_stream(i)
        assert (current.stream_id, current.device_index) == (stream_id, i)


def test_python_stream_context_switches_and_restores_device_and_stream(two_devices):
    """GD-PY-001 / GD-STR-001: `with torch.Stream(...)` sets device and stream, restores both;
    the origin device's stream is untouched."""
    torch.openreg.set_device(0)
    origin_stream = torch.accelerator.current_stream(0)
    before_1 = torch.accelerator.current_stream(1)
    s = torch.Stream(device="openreg:1")
    assert s.device_index == 1
    with s:
        assert torch.openreg.current_device() == 1, "inside `with stream` the device is not 1"
        assert torch.accelerator.current_stream(1) == s, "inside `with stream` it is not current"
        assert torch.accelerator.current_stream(0) == origin_stream
    assert torch.openreg.current_device() == 0, "device not restored after `with stream`"
    assert torch.accelerator.current_stream(1) == before_1, "stream of device 1 not restored"
    assert torch.accelerator.current_stream(0) == origin_stream


def test_python_stream_context_restores_on_exception(two_devices):
    torch.openreg.set_device(0)
    before_1 = torch.accelerator.current_stream(1)
    with pytest.raises(KeyError):
        with torch.Stream(device="openreg:1"):
            raise KeyError("boom")
    assert torch.openreg.current_device() == 0
    assert torch.accelerator.current_stream(1) == before_1
