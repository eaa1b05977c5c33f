"""Device loss (docs/reference-backend/runtime.md, "Device loss"): a fault
injected into one device (``openreg._C._inject_device_fault``) in the middle
of queued work. The process goes on; every call on the lost device raises a
RuntimeError naming the device and the cause; the other device keeps working;
tensors of the lost device can still be freed, and the process exits
cleanly. Each case runs in a fresh interpreter: a lost device stays lost.

The queued work is held behind a gate, so "in the middle of queued work" is
certain, not a matter of timing.
"""

from __future__ import annotations

import pytest

from _support import N, run_json

pytestmark = [pytest.mark.timeout(200),
              pytest.mark.skipif(N < 2, reason="needs two OpenReg devices")]


# (execution mode, how the device is lost, what the cause says)
LOSSES = [
    pytest.param("thread", "inject", ["killed by the test"], id="thread-injected"),
    pytest.param("process", "inject", ["killed by the test"], id="process-injected"),
    pytest.param("process", "kill", ["signal 9", "SIGKILL"], id="process-executor-killed"),
]


@pytest.mark.parametrize("mode, how, cause", LOSSES)
def test_a_device_lost_in_the_middle_of_queued_work_fails_alone(mode, how, cause):
    result = run_json("""
        import os, signal, time
        HOW = """ + repr(how) + """
        x1 = torch.arange(1000.0, device="openreg:1")
        y0 = torch.arange(1000.0, device="openreg:0")
        # The first call with new metadata runs synchronously; the next ones queue.
        x1 * 2, x1 + 0.5
        torch.openreg.synchronize()
        s = torch.openreg.Stream(device=1)
        gate = openreg._C._testing_block_stream(s)
        with torch.openreg.stream(s):
            z1 = x1 * 2          # queued behind the gate
            after = x1 + 0.5     # queued too
        lost_before = openreg._C._is_device_lost(1)
        process_mode = openreg._C._process_mode()
        if HOW == "inject":
            openreg._C._inject_device_fault(1, "killed by the test")
        else:
            # From outside, as an OOM killer or an operator would; the driver
            # notices the executor's exit on its own (bounded wait).
            os.kill(openreg._C._executor_pid(1), signal.SIGKILL)
            deadline = time.monotonic() + 60
            while not openreg._C._is_device_lost(1) and time.monotonic() < deadline:
                time.sleep(0.01)
        errors = {}
        calls = {
            "synchronize": lambda: torch.openreg.synchronize(1),
            "stream.synchronize": s.synchronize,
            "stream.query": s.query,
            "cpu": lambda: x1.cpu(),
            "item": lambda: x1[0].item(),
            "empty": lambda: torch.empty(3, device="openreg:1"),
            "operator": lambda: x1 * 2,
            "copy to it": lambda: y0.to("openreg:1"),
            "copy from it": lambda: x1.to("openreg:0"),
            "mem_get_info": lambda: torch.openreg.mem_get_info(1),
        }
        for name, call in calls.items():
            try:
                call()
                errors[name] = None
            except RuntimeError as e:
                errors[name] = str(e).split("\\nException raised from")[0]
        # The other device: computes, copies, synchronizes.
        other = (y0 * 2 + 1).sum().item()
        torch.openreg.synchronize(0)
        lost = [openreg._C._is_device_lost(i) for i in range(2)]
        openreg._C._testing_open_gate(gate)
        del x1, z1, after
        torch.openreg.empty_cache()
        emit({"lost_before": lost_before, "errors": errors, "other": other, "lost": lost,
              "process_mode": process_mode})
    """, env={"OPENREG_EXECUTOR": mode})
    assert result["process_mode"] == (mode == "process")
    assert result["lost_before"] is False
    assert result["lost"] == [False, True]
    for name, message in result["errors"].items():
        assert message is not None, f"{name} on the lost device did not raise"
        assert "device 1 was lost" in message and all(part in message for part in cause), (name, message)
    assert result["other"] == float(sum(2 * i + 1 for i in range(1000)))


def test_a_second_fault_keeps_the_first_cause_and_bad_devices_are_rejected():
    result = run_json("""
        openreg._C._inject_device_fault(1)
        openreg._C._inject_device_fault(1, "second")
        try:
            torch.ones(2, device="openreg:1")
            message = None
        except RuntimeError as e:
            message = str(e)
        try:
            openreg._C._inject_device_fault(7)
            bad = None
        except RuntimeError as e:
            bad = str(e).split("\\nException raised from")[0]
        emit({"message": message, "bad": bad, "zero": torch.ones(2, device="openreg:0").sum().item()})
    """, env={"OPENREG_DEVICE_COUNT": "2"})
    assert "a fault injected by orDeviceInjectFault" in result["message"]
    assert "second" not in result["message"]
    assert result["bad"] is not None and "device=7" in result["bad"] and "[0, 2)" in result["bad"]
    assert result["zero"] == 2.0
