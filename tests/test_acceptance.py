"""Acceptance checks of the issue that introduced configurable devices, real
memory isolation and validated device selection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from _support import N, assert_range_error, run_python

ISSUE_COMMAND = ("import torch, openreg; x = torch.ones(2, 2, device='openreg:1'); "
                 "print(x.device, x.cpu())")


def test_issue_command_runs():
    """`python -c "import torch, openreg; x = torch.ones(2, 2, device='openreg:1');
    print(x.device, x.cpu())"` works (default configuration: 2 devices)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENREG_")}
    proc = subprocess.run([sys.executable, "-c", ISSUE_COMMAND], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith("openreg:1 tensor([[1., 1.],"), proc.stdout
    assert "[1., 1.]])" in proc.stdout, proc.stdout


def test_four_devices():
    """With OPENREG_DEVICE_COUNT=4 there are 4 devices, all usable, everywhere."""
    rc, out, err = run_python("""
        counts = [torch.openreg.device_count(), torch.accelerator.device_count(),
                  _cxx.hooks_device_count(), _cxx.guard_device_count()]
        sums = [torch.ones(2, 2, device=f"openreg:{i}").cpu().sum().item() for i in range(4)]
        try:
            torch.ones(1, device="openreg:4")
            fifth = "created"
        except RuntimeError as e:
            fifth = str(e).splitlines()[0]
        print(json.dumps({"counts": counts, "sums": sums, "fifth": fifth}))
    """, env={"OPENREG_DEVICE_COUNT": "4"})
    assert rc == 0, f"rc {rc}\n{err}"
    r = json.loads(out.strip().splitlines()[-1])
    assert r["counts"] == [4, 4, 4, 4], f"device counts with OPENREG_DEVICE_COUNT=4: {r['counts']}"
    assert r["sums"] == [4.0] * 4
    assert "[0, 4)" in r["fifth"], f"openreg:4 with 4 devices: {r['fifth']}"


def test_zero_devices_is_clean():
    """With OPENREG_DEVICE_COUNT=0: is_available() is False, nothing crashes, and creating a
    tensor raises a clean RuntimeError."""
    rc, out, err = run_python("""
        r = {"available": torch.openreg.is_available(), "count": torch.openreg.device_count(),
             "acc": [torch.accelerator.is_available(), torch.accelerator.device_count()],
             "hooks": [_cxx.hooks_is_available(), _cxx.hooks_device_count(),
                       _cxx.guard_device_count()],
             "initialized": torch.openreg.is_initialized()}
        errors = {}
        for name, fn in [("tensor", lambda: torch.ones(2, 2, device="openreg")),
                         ("tensor:0", lambda: torch.ones(2, device="openreg:0")),
                         ("to", lambda: torch.ones(2).to("openreg")),
                         ("set_device", lambda: torch.openreg.set_device(0)),
                         ("current_device", torch.openreg.current_device)]:
            try:
                fn()
                errors[name] = None
            except Exception as e:
                errors[name] = [type(e).__name__, str(e).splitlines()[0]]
        r["errors"] = errors
        r["seed"] = torch.manual_seed(0) is not None
        print(json.dumps(r))
    """, env={"OPENREG_DEVICE_COUNT": "0"})
    assert rc == 0, f"0 devices: the process died with rc {rc}\n{err}"
    r = json.loads(out.strip().splitlines()[-1])
    assert r["available"] is False and r["count"] == 0
    assert r["acc"] == [False, 0] and r["hooks"] == [False, 0, 0]
    assert r["initialized"] is False
    for name, error in r["errors"].items():
        assert error is not None, f"{name} succeeded with 0 devices"
        assert error[0] == "RuntimeError", f"{name} with 0 devices raised {error}"
        assert "no OpenReg devices" in error[1], f"{name}: unclear message {error[1]!r}"
    assert r["seed"], "torch.manual_seed failed with 0 devices"


def test_set_device_five_on_two_devices():
    """torch.openreg.set_device(5) on 2 devices raises RuntimeError naming 5 and the range;
    the current device is unchanged."""
    if N != 2:  # the test process was configured otherwise: check in a 2-device process
        rc, out, err = run_python("""
            torch.openreg.set_device(1)
            try:
                torch.openreg.set_device(5)
            except RuntimeError as e:
                print("ERROR", str(e).splitlines()[0])
            print("CURRENT", torch.openreg.current_device())
        """, env={"OPENREG_DEVICE_COUNT": "2"})
        assert rc == 0, err
        assert "ERROR" in out and "5" in out and "[0, 2)" in out, out
        assert "CURRENT 1" in out, out
        return
    torch.openreg.set_device(1)
    with pytest.raises(RuntimeError) as excinfo:
        torch.openreg.set_device(5)
    assert_range_error(excinfo, 5, 2)
    assert torch.openreg.current_device() == 1, "set_device(5) changed the current device"


def test_host_read_of_device_memory_kills_the_process():
    """Reading a device tensor's memory from the host via ctypes kills the process (SIGSEGV)."""
    rc, out, err = run_python("""
        import ctypes
        t = torch.ones(4, device="openreg")
        print("allocated", flush=True)
        data = ctypes.string_at(t.data_ptr(), 4)
        print("SURVIVED", list(data), flush=True)
    """)
    assert "allocated" in out, f"allocation failed\n{err}"
    assert "SURVIVED" not in out, f"the host read of device memory succeeded: {out}"
    assert rc == -signal.SIGSEGV, f"expected death by SIGSEGV (rc -11), got rc {rc}\n{err[-2000:]}"


@pytest.mark.parametrize("dynamo_first", [False, True], ids=["openreg-first", "dynamo-first"])
def test_dynamo_device_interface_registered_in_either_import_order(dynamo_first):
    """The dynamo DeviceInterface is registered when torch._dynamo is imported
    after openreg (a post-import hook) and when it was imported before (at
    once, which must happen after the module's whole API exists)."""
    imports = "import torch._dynamo, openreg" if dynamo_first else "import openreg, torch._dynamo"
    rc, out, err = run_python(f"""
        import torch
        {imports}
        from torch._dynamo.device_interface import get_interface_for_device
        interface = get_interface_for_device("openreg")
        print(interface.Event is openreg.Event, interface.device_count() == openreg.device_count())
    """, prelude=False)
    assert rc == 0, err[-3000:]
    assert out.split() == ["True", "True"], out
