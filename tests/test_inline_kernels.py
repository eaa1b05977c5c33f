"""Calls the host waits for run on the calling thread when the stream is idle
(orLaunchKernelSync, orMemcpySync: docs/reference-backend/runtime.md). The
CPU kernels they run must behave as on the stream's worker thread: the
caller's thread-local state (autocast, inference mode) must not reach them,
and the order of work on the stream must not change."""
from __future__ import annotations

import threading

import pytest
import torch

import openreg
from _support import Gate, still_blocked


@pytest.fixture(params=[True, False], ids=["async-operators", "synchronous-operators"])
def mode(request):
    before = openreg._C._async_operators()
    openreg._C._set_async_operators(request.param)
    yield request.param
    torch.openreg.synchronize()
    openreg._C._set_async_operators(before)


def test_callers_cpu_autocast_does_not_reach_the_fallbacks_cpu_kernels(mode):
    # Values whose product bfloat16 would round: a CPU kernel run under the
    # caller's autocast("cpu") would compute in bfloat16.
    a_cpu = torch.full((8, 8), 1.0 + 2.0**-12)
    b_cpu = torch.full((8, 8), 1.0 - 2.0**-12)
    expected = a_cpu @ b_cpu
    a, b = a_cpu.to("openreg"), b_cpu.to("openreg")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(2):  # a first (synchronous) call and a later one
            result = a @ b
            assert result.dtype == torch.float32
            assert torch.equal(result.cpu(), expected)


def test_inference_mode_of_the_caller_is_the_callers_alone(mode):
    x = torch.arange(6.0, device="openreg")
    with torch.inference_mode():
        y = torch.nonzero(x)  # synchronous: the size depends on the data
    assert y.is_inference()
    assert y.cpu().flatten().tolist() == [1, 2, 3, 4, 5]
    z = torch.nonzero(x)
    assert not z.is_inference()
    assert torch.equal(z.cpu(), y.cpu())


def test_a_blocking_read_waits_for_the_running_task_of_its_stream(mode):
    # The stream's only task is held and nothing is queued behind it (the
    # queue is empty): reads on the stream must still wait for that task.
    stream = torch.openreg.Stream()
    x = torch.zeros(4, device="openreg")  # queued on the current stream
    stream.wait_stream(torch.openreg.current_stream())  # so the fill comes after it
    with torch.openreg.stream(stream):
        x.fill_(3.0)
    torch.openreg.synchronize()
    reads = []

    def read_on_stream():
        with torch.openreg.stream(stream):
            reads.append((x.cpu(), torch.nonzero(x).cpu()))

    with Gate(stream):
        reader = threading.Thread(target=read_on_stream, daemon=True)
        reader.start()
        assert still_blocked(reader), "a read returned while its stream's only task was still running"
    reader.join(timeout=60)
    assert not reader.is_alive()
    values, nonzero = reads[0]
    assert values.tolist() == [3.0] * 4
    assert nonzero.flatten().tolist() == [0, 1, 2, 3]
