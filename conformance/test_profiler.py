"""The profiler with the device: torch.autograd.profiler.profile(use_device=name).

That profiler (use_kineto=False: ProfilerState.KINETO_PRIVATEUSE1_FALLBACK)
calls the backend's PrivateUse1 ProfilerStubs
(torch/csrc/profiler/stubs/base.h, registerPrivateUse1Methods) when every
operator and record_function scope starts and ends, to record a device
event, and later asks for the time between the two, in microseconds.
PyTorch's default stubs throw: each operator then logs an exception with a
backtrace and an internal assert, and its event keeps an uninitialized start
time."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time

import pytest
import torch

from ._async import new_stream
from ._helpers import check, inconclusive, must

contract = pytest.mark.contract

# What PyTorch logs when a profiler callback of the backend throws.
CALLBACK_ERRORS = ("Exception in RecordFunction callback", "INTERNAL ASSERT FAILED",
                   "used in profiler but not enabled")
HELD_SECONDS = 0.05


@contextlib.contextmanager
def stderr_text(into: list[str]):
    """Capture file descriptor 2 (C++ logging) while the block runs."""
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        try:
            os.dup2(sink.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            into.append(sink.read().decode(errors="replace"))


def profile(dt: str, body) -> tuple[object, float, str, list]:
    """Runs body() under the profiler with the device; returns the profile,
    the window's wall time in microseconds (an upper bound for every time in
    it), what was logged meanwhile and the events."""
    logged: list[str] = []
    start = time.perf_counter()
    with stderr_text(logged):
        with torch.autograd.profiler.profile(use_device=dt) as prof:
            body()
        events = must(lambda: prof.function_events, "reading the profile's events")
    window = (time.perf_counter() - start) * 1e6
    return prof, window, logged[0], events


def device_work(dt: str):
    x = torch.randn(1024, 1024).to(dt)
    w = torch.randn(1024, 1024).to(dt).requires_grad_()

    def body():
        for _ in range(3):
            y = torch.mm(x, w)
        y.sum().backward()  # autograd's engine threads run the backward
        torch.randn(64, 64).add_(1)  # a CPU operator too
        with torch.autograd.profiler.record_function("user scope"):
            y.add_(1)
        torch.accelerator.synchronize()
    return body


# decides PR-DEV-001.1
@contract("PR-DEV-001")
def test_profiling_logs_no_callback_errors(dt):
    _, _, logged, events = profile(dt, device_work(dt))
    found = [marker for marker in CALLBACK_ERRORS if marker in logged]
    check("PR-DEV-001.1", not found,
          lambda: f"profiling with use_device={dt!r} logged errors from the profiler's callbacks ({found}): the "
                  "backend's PrivateUse1 ProfilerStubs are missing or throw. The log begins:\n" + logged[:1500])
    check("PR-DEV-001.1", any(e.name == "aten::mm" for e in events), "the profile holds no aten::mm event")


# decides PR-DEV-001.2
@contract("PR-DEV-001")
def test_event_times_lie_in_the_window(dt):
    _, window, _, events = profile(dt, device_work(dt))
    bad = [f"{e.name}: [{e.time_range.start}, {e.time_range.end}] us" for e in events
           if not 0 <= e.time_range.start <= e.time_range.end <= window]
    check("PR-DEV-001.2", not bad, lambda: f"events whose time range is not inside the profiled window of "
                                           f"{window:.0f} us:\n  " + "\n  ".join(bad[:20]))
    negative = [f"{e.name}: {e.self_device_time_total}" for e in events if e.self_device_time_total < 0]
    check("PR-DEV-001.2", not negative, lambda: "events with a negative self device time: " + ", ".join(negative[:20]))


# decides PR-DEV-001.3
@contract("PR-DEV-001")
def test_device_operators_get_device_time(dt):
    x = torch.randn(1024, 1024).to(dt)
    around: list[tuple[torch.Event, torch.Event]] = []

    def body():
        for _ in range(3):
            start, end = torch.Event(device=dt, enable_timing=True), torch.Event(device=dt, enable_timing=True)
            start.record()
            torch.mm(x, x)
            end.record()
            around.append((start, end))
        torch.accelerator.synchronize()

    _, window, _, events = profile(dt, body)
    mms = [e for e in events if e.name == "aten::mm" and e.cpu_parent is None]
    check("PR-DEV-001.3", len(mms) == 3, f"the profile holds {len(mms)} top-level aten::mm events, not 3")
    for k, (event, (start, end)) in enumerate(zip(mms, around)):
        outer_us = must(lambda: start.elapsed_time(end), "torch.Event.elapsed_time around the operator") * 1000
        check("PR-DEV-001.3", event.device_time_total > 0,
              f"aten::mm #{k} (1024 x 1024 on the device) got device time {event.device_time_total} us: the "
              "profiler's elapsed() gives no positive time")
        # The profiler's events are recorded on the same stream between the two
        # torch.Events: its time cannot exceed theirs.
        check("PR-DEV-001.3", event.device_time_total <= outer_us * 1.01 + 2,
              f"aten::mm #{k} got device time {event.device_time_total} us, more than the {outer_us:.0f} us "
              "torch.Event measures around it on the same stream (elapsed() must return microseconds)")


# decides PR-DEV-001.3
@contract("PR-DEV-001")
@pytest.mark.parametrize("current", ["default-stream", "new-stream"])
def test_device_time_is_in_microseconds(dt, backend, current):
    """A scope whose stream was held gets at least the held time, with the
    default stream current and with a new stream current: the profiler's
    events are recorded on the current stream, whichever it is."""
    block = backend.instrument("block_stream")
    if block is None:
        inconclusive("the unit of device time is observed with the instrumentation's gate (block_stream), "
                     "which the backend does not offer")
    torch.zeros(1, device=dt)  # the device is in use before the scope starts
    torch.accelerator.synchronize()
    stream = new_stream(dt, 0) if current == "new-stream" else torch.accelerator.current_stream()

    def body():
        # The scope ends on the host at once, behind the closed gate; the host
        # waits outside it. Its end on the device comes at the release: at
        # least HELD_SECONDS after its start, though the host spent almost
        # nothing inside the scope (events recorded on an idle stream would
        # measure that nothing).
        with stream:
            with torch.autograd.profiler.record_function("held scope"):
                release = must(lambda: block(torch.accelerator.current_stream()), "block_stream(current stream)")
            time.sleep(HELD_SECONDS)
            release()
        torch.accelerator.synchronize()

    _, window, _, events = profile(dt, body)
    scopes = [e for e in events if e.name == "held scope"]
    check("PR-DEV-001.3", len(scopes) == 1, f"the profile holds {len(scopes)} 'held scope' events, not 1")
    got = scopes[0].device_time_total
    # The scope's end is recorded behind the gate, which stayed closed at least
    # HELD_SECONDS after the scope's start: a lower bound whatever the
    # machine's load.
    check("PR-DEV-001.3", HELD_SECONDS * 1e6 * 0.99 <= got <= window,
          f"a record_function scope whose stream ({current.replace('-', ' ')} current) was held for "
          f"{HELD_SECONDS * 1e6:.0f} us got device time {got} "
          f"us (expected between that and the {window:.0f} us window): the profiler's events must be recorded on the "
          "current stream, and elapsed() must return microseconds")
