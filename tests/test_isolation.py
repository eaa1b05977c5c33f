"""Memory isolation: device memory is not host-accessible (DESIGN: "a host
dereference of a device pointer faults"), and device 0 work does not reach
device 1 memory."""

from __future__ import annotations

import signal

import pytest
import torch

from _support import run_python

SIGSEGV_RC = -signal.SIGSEGV


@pytest.mark.parametrize("device", ["openreg:1"])  # openreg:0: test_acceptance.py
def test_host_read_of_device_memory_kills_the_process(device):
    """A host read of device memory (ctypes.string_at) dies with SIGSEGV, while the same
    read of pinned host memory works (the control: the crash is specific to device memory)."""
    rc, out, err = run_python(f"""
        import ctypes
        pinned = torch.arange(4, dtype=torch.uint8).pin_memory()
        print("pinned", list(ctypes.string_at(pinned.data_ptr(), 4)), flush=True)
        t = torch.ones(4, device="{device}")
        print("allocated", flush=True)
        ctypes.string_at(t.data_ptr(), 4)
        print("SURVIVED", flush=True)
    """)
    assert "pinned [0, 1, 2, 3]" in out, f"the control read of pinned memory failed\n{out}\n{err}"
    assert "allocated" in out, f"allocating on {device} failed\n{out}\n{err}"
    assert "SURVIVED" not in out, f"a host read of {device} memory succeeded"
    assert rc == SIGSEGV_RC, f"expected death by SIGSEGV (rc {SIGSEGV_RC}), got rc {rc}\n{err[-2000:]}"


def test_device_work_cannot_mix_devices(two_devices):
    """An op on device 0 given device 1 memory is refused (not silently computed)."""
    a = torch.ones(4, device="openreg:0")
    b = torch.full((4,), 2.0, device="openreg:1")
    with pytest.raises(RuntimeError, match="same device"):
        a.add_(b)
    assert a.cpu().tolist() == [1.0] * 4 and b.cpu().tolist() == [2.0] * 4
