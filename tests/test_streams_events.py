"""Streams and events of OpenReg, observed: work really runs asynchronously on
stream workers, and every synchronization point waits for what it should.

Asynchrony is observed with gates (``_support.Gate``): a kernel that blocks a
stream until the test opens it, so work queued behind it is provably still in
flight. A call that must *not* wait runs in a background thread and must
return while the gate is closed; a call that *must* wait must still be
blocked after a while (``still_blocked``: a correct backend never returns
early, so that check cannot fail spuriously).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

import openreg
from _support import Background, Gate, N, still_blocked

pytestmark = pytest.mark.timeout(90)

Stream = torch.openreg.Stream
Event = torch.openreg.Event
SIZE = 1 << 16


def on(stream: torch.Stream, fn):
    """Runs fn() in a background thread with `stream` current there."""
    def body():
        with torch.openreg.stream(stream):
            return fn()
    return Background(body)


@pytest.fixture
def default_streams_after():
    """Restores every device's default stream as current in this thread."""
    yield
    for i in range(N):
        torch.openreg.set_stream(torch.openreg.default_stream(i))
    torch.openreg.set_device(0)


# ----------------------------------------------------------- asynchrony


def test_non_blocking_h2d_copy_from_pinned_memory_is_in_flight_after_it_returns():
    src = torch.arange(SIZE, dtype=torch.float32).pin_memory()
    dst = torch.zeros(SIZE, device="openreg")
    s = Stream()
    with Gate(s) as gate:
        on(s, lambda: dst.copy_(src, non_blocking=True)).value(timeout=10)  # returned at once
        assert not s.query(), "the stream reports idle while its copy is held behind the gate"
        # The default stream does not wait for s: it still sees the old bytes.
        assert torch.count_nonzero(dst.cpu()).item() == 0, "the copy ran before the gate opened"
        gate.open()
        s.synchronize()
    assert torch.equal(dst.cpu(), src), "the copy's data is wrong after synchronize"


def test_non_blocking_d2h_copy_into_pinned_memory_lands_only_after_synchronize():
    expected = torch.arange(SIZE, dtype=torch.float32)
    src = expected.to("openreg")
    host = torch.full((SIZE,), -1.0).pin_memory()
    s = Stream()
    with Gate(s) as gate:
        on(s, lambda: host.copy_(src, non_blocking=True)).value(timeout=10)
        assert not s.query()
        # Pinned memory is host memory: read it directly while the copy waits.
        assert bool((host == -1).all()), "the pinned destination changed before the copy ran"
        gate.open()
        s.synchronize()
    assert torch.equal(host, expected)


def test_to_cpu_non_blocking_returns_pinned_memory_filled_after_synchronize():
    """PyTorch's _to_copy pins the result of x.to("cpu", non_blocking=True) for
    PrivateUse1 sources (as for CUDA), which makes the copy asynchronous."""
    expected = torch.arange(SIZE, dtype=torch.float32)
    x = expected.to("openreg")
    s = Stream()
    with Gate(s) as gate:
        host = on(s, lambda: x.to("cpu", non_blocking=True)).value(timeout=10)
        assert host.is_pinned(), "x.to('cpu', non_blocking=True) did not give pinned memory"
        assert not s.query()
        gate.open()
        s.synchronize()
    assert torch.equal(host, expected)


LAUNCHES = {
    "transpose kernel": (lambda: torch.arange(64.0).view(8, 8), lambda x: x.t()),
    "dtype conversion kernel": (lambda: torch.arange(64.0), lambda x: x.double()),
    "device memcpy": (lambda: torch.arange(64.0), lambda x: x),
}


@pytest.mark.parametrize("case", list(LAUNCHES))
def test_device_work_is_in_flight_after_the_call_returns(case):
    make, expect = LAUNCHES[case]
    cpu = make()
    x = cpu.to("openreg")
    y = torch.zeros_like(expect(cpu), device="openreg")
    source = x.t() if case == "transpose kernel" else x
    s = Stream()
    with Gate(s) as gate:
        on(s, lambda: y.copy_(source)).value(timeout=10)
        assert not s.query(), f"{case}: the stream is idle although its work is gated"
        assert torch.count_nonzero(y.cpu()).item() == 0, f"{case}: the work ran before the gate opened"
        gate.open()
        s.synchronize()
    assert torch.equal(y.cpu(), expect(cpu))


def test_peer_copy_between_devices_is_in_flight_after_the_call_returns(two_devices):
    x0 = torch.arange(SIZE, dtype=torch.float32, device="openreg:0")
    y1 = torch.zeros(SIZE, device="openreg:1")
    s1 = Stream(1)
    with Gate(s1) as gate:
        on(s1, lambda: y1.copy_(x0)).value(timeout=10)
        assert not s1.query()
        assert torch.count_nonzero(y1.cpu()).item() == 0
        gate.open()
        s1.synchronize()
    assert torch.equal(y1.cpu(), x0.cpu())


@pytest.mark.parametrize("direction", ["device to pageable host", "pageable host to device"])
def test_copies_with_pageable_host_memory_wait_for_the_stream(direction):
    """As on CUDA, a copy to or from pageable (not pinned) host memory returns
    only when the data is there, non_blocking or not."""
    expected = torch.arange(SIZE, dtype=torch.float32)
    device_tensor = (expected.to("openreg") if direction.startswith("device")
                     else torch.zeros(SIZE, device="openreg"))
    host = torch.zeros(SIZE) if direction.startswith("device") else expected.clone()
    assert not host.is_pinned()
    s = Stream()
    with Gate(s) as gate:
        if direction.startswith("device"):
            copy = on(s, lambda: host.copy_(device_tensor, non_blocking=True))
        else:
            copy = on(s, lambda: device_tensor.copy_(host, non_blocking=True))
        assert still_blocked(copy), f"{direction}: the copy returned while its stream was gated"
        gate.open()
        copy.value()
        # Right when the call returned, the data is in place.
        result = host if direction.startswith("device") else device_tensor.cpu()
    assert torch.equal(result, expected)


# ------------------------------------------------------------- the pool


@pytest.mark.parametrize("priority, base", [(0, 32), (-1, 64)])
def test_pool_has_32_streams_per_priority_handed_out_round_robin(n_devices, priority, base):
    for device in range(n_devices):
        ids = [Stream(device, priority=priority).stream_id for _ in range(33)]
        assert sorted(ids[:32]) == list(range(base, base + 32)), (
            f"32 consecutive priority-{priority} streams of openreg:{device}: ids {ids[:32]}")
        assert ids[32] == ids[0], "the 33rd stream is not the first one again (round robin)"
        assert all((b - base) == (a - base + 1) % 32 for a, b in zip(ids, ids[1:])), ids
        # torch.Stream takes from the same pool.
        nxt = torch.Stream(device=f"openreg:{device}", priority=priority)
        assert nxt.stream_id == base + (ids[-1] - base + 1) % 32 and nxt.device_index == device
        default = torch.openreg.default_stream(device)
        assert default.stream_id == 0 and default.stream_id not in ids, "a pool stream aliases the default"


def test_streams_are_distinct_and_run_independently():
    a, b = Stream(), Stream()
    assert a != b and a.stream_id != b.stream_id and hash(a) != hash(b)
    x = torch.arange(SIZE, dtype=torch.float32, device="openreg")
    y = torch.zeros(SIZE, device="openreg")
    torch.openreg.synchronize()  # the inputs' kernels (on the default stream) are done
    with Gate(a):
        on(b, lambda: y.copy_(x)).value(timeout=10)
        Background(b.synchronize).value(timeout=30)  # b does not wait for the gated a
        assert torch.equal(y.cpu(), x.cpu())
        assert not a.query()


@pytest.mark.parametrize("requested, reported", [(0, 0), (-1, -1), (1, 0), (7, 0), (-2, -1), (-100, -1)])
def test_priorities_are_reported_and_clamped_to_the_range(requested, reported):
    assert Stream.priority_range() == (0, -1)
    assert Stream(priority=requested).priority == reported
    generic = torch.Stream(device="openreg", priority=requested)
    assert openreg._C._stream_priority(generic) == reported, "torch.Stream clamps differently"
    assert torch.openreg.default_stream().priority == 0


# --------------------------------------------------------- current stream


def test_current_stream_is_per_device(two_devices, default_streams_after):
    s0, s1 = Stream(0), Stream(1)
    torch.openreg.set_stream(s1)
    assert torch.openreg.current_device() == 1, "set_stream makes the stream's device current"
    assert torch.openreg.current_stream(1) == s1
    assert torch.openreg.current_stream(0) == torch.openreg.default_stream(0), (
        "setting device 1's stream changed device 0's")
    torch.openreg.set_stream(s0)
    assert torch.openreg.current_stream() == s0 and torch.openreg.current_stream(1) == s1
    assert torch.accelerator.current_stream(1) == s1


def test_current_stream_is_per_thread(two_devices, default_streams_after):
    s1 = Stream(1)
    torch.openreg.set_stream(s1)
    seen = {}
    other = Stream(1)

    def thread():
        seen["initial"] = [torch.openreg.current_stream(i).stream_id for i in range(N)]
        torch.openreg.set_stream(other)
        seen["own"] = torch.openreg.current_stream(1)

    t = threading.Thread(target=thread)
    t.start()
    t.join()
    assert seen["initial"] == [0] * N, f"a new thread starts with non-default streams: {seen['initial']}"
    assert seen["own"] == other
    assert torch.openreg.current_stream(1) == s1, "another thread's set_stream changed this thread's"


def test_kernels_run_on_the_current_stream(default_streams_after):
    """Work goes where the current stream is: gating it holds exactly that work."""
    x = torch.arange(64.0, device="openreg").view(8, 8)
    y = torch.zeros(8, 8, device="openreg")
    torch.openreg.synchronize()  # the inputs' kernels (on the default stream) are done
    s = Stream()
    torch.openreg.set_stream(s)
    with Gate(s) as gate:
        y.copy_(x.t())
        assert not s.query()
        assert torch.openreg.default_stream().query(), "the work went to the default stream"
        gate.open()
        s.synchronize()
    assert torch.equal(y.cpu(), x.t().cpu())


# ---------------------------------------------------------------- events


@pytest.mark.parametrize("kind", ["new", "openreg.Event", "torch.Event"])
def test_record_event_query_and_synchronize_follow_the_work(kind):
    s = Stream()
    with Gate(s) as gate:
        given = {"new": None, "openreg.Event": Event(), "torch.Event": torch.Event(device="openreg")}[kind]
        e = s.record_event(given)
        assert isinstance(e, torch.Event) and (given is None or e is given)
        if given is None:
            assert isinstance(e, Event), "Stream.record_event() makes a torch.openreg.Event"
        assert not s.query() and not e.query(), "query is True while the recorded work is gated"
        stream_sync = Background(s.synchronize)
        event_sync = Background(e.synchronize)
        assert still_blocked(stream_sync) and still_blocked(event_sync, 0)
        gate.open()
        stream_sync.value()
        event_sync.value()
    assert s.query() and e.query()


def test_event_records_on_the_current_stream_of_its_own_device(two_devices, default_streams_after):
    s1 = Stream(1)
    torch.openreg.set_stream(s1)
    torch.openreg.set_device(0)
    e = Event(1)
    with Gate(s1) as gate:
        e.record()  # current device 0; the event's device is 1
        assert e.device == torch.device("openreg", 1)
        assert not e.query(), "the event was not recorded behind device 1's current (gated) stream"
        gate.open()
        e.synchronize()
    assert e.query()


def test_event_keeps_its_device_and_refuses_streams_of_other_devices(two_devices):
    e = Event(1)
    assert e.device == torch.device("openreg", 1), "the event's device is unknown before its first record"
    with pytest.raises(RuntimeError, match="event of device 1 cannot be recorded on a stream of device 0"):
        e.record(Stream(0))
    e.record(Stream(1))
    e.synchronize()
    assert e.device == torch.device("openreg", 1)


def _wait_stream(producer, consumer):
    consumer.wait_stream(producer)


def _wait_event(producer, consumer):
    consumer.wait_event(producer.record_event())


def _event_wait_on_stream(producer, consumer):
    producer.record_event().wait(consumer)


def _event_wait_current(producer, consumer):
    # Event.wait() without a stream: the current stream of the current device.
    e = Event(producer.device_index)
    e.record(producer)
    with torch.openreg.stream(consumer):
        e.wait()


WAITS = {"Stream.wait_stream": _wait_stream, "Stream.wait_event": _wait_event,
         "Event.wait(stream)": _event_wait_on_stream, "Event.wait()": _event_wait_current}


@pytest.mark.parametrize("wait", list(WAITS))
@pytest.mark.parametrize("devices", [(0, 0), (0, 1)], ids=["same device", "across devices"])
def test_waits_order_work_of_one_stream_after_another(wait, devices):
    if len(set(devices)) > N:
        pytest.skip("needs 2 devices")
    producer, consumer = Stream(devices[0]), Stream(devices[1])
    x = torch.arange(SIZE, dtype=torch.float32, device=f"openreg:{devices[1]}")
    y = torch.zeros(SIZE, device=f"openreg:{devices[1]}")
    with Gate(producer) as gate:
        WAITS[wait](producer, consumer)
        on(consumer, lambda: y.copy_(x)).value(timeout=10)  # the host does not wait
        consumer_sync = Background(consumer.synchronize)
        assert still_blocked(consumer_sync), f"{wait}: the consumer did not wait for the producer"
        assert torch.count_nonzero(y.cpu()).item() == 0
        gate.open()
        consumer_sync.value()
    assert torch.equal(y.cpu(), x.cpu())


def test_elapsed_time_measures_the_work_between_two_events():
    """The gate holds the stream for a measured host interval; elapsed_time
    lies between that interval and the whole observed span."""
    s = Stream()
    start, end = Event(enable_timing=True), Event(enable_timing=True)
    before = time.perf_counter()
    start.record(s)
    with Gate(s) as gate:
        end.record(s)
        start.synchronize()      # start's marker ran (it precedes the gate)...
        t0 = time.perf_counter()  # ...no later than now
        time.sleep(0.05)         # the length of the work, as the host measures it
        t1 = time.perf_counter()
        gate.open()              # end's marker runs after this
    end.synchronize()
    after = time.perf_counter()
    ms = start.elapsed_time(end)
    assert (t1 - t0) * 1e3 - 0.01 <= ms <= (after - before) * 1e3 + 0.01, (
        f"elapsed_time {ms:.3f} ms, gate held {(t1 - t0) * 1e3:.3f} ms, "
        f"whole span {(after - before) * 1e3:.3f} ms")
    generic = torch.Event(device="openreg", enable_timing=True)
    generic.record(s)
    generic.synchronize()
    # torch.openreg.Event.elapsed_time accepts any torch.Event as the end.
    assert start.elapsed_time(generic) >= ms


def test_elapsed_time_requires_timing_and_completion():
    s = Stream()
    a, b = Event(enable_timing=True), Event()
    a.record(s)
    b.record(s)
    s.synchronize()
    with pytest.raises((ValueError, RuntimeError), match="enable_timing"):
        a.elapsed_time(b)
    c = Event(enable_timing=True)
    with Gate(s):
        c.record(s)
        with pytest.raises((ValueError, RuntimeError), match="(?i)complete|synchronize"):
            a.elapsed_time(c)


# ------------------------------------------------------ device-wide waits


@pytest.mark.parametrize("api", ["torch.accelerator.synchronize", "torch.openreg.synchronize"])
def test_synchronize_waits_for_the_named_device_not_the_current_one(two_devices, api):
    sync = {"torch.accelerator.synchronize": torch.accelerator.synchronize,
            "torch.openreg.synchronize": torch.openreg.synchronize}[api]
    x1 = torch.arange(SIZE, dtype=torch.float32, device="openreg:1")
    y1 = torch.zeros(SIZE, device="openreg:1")
    torch.openreg.synchronize(1)  # the inputs' kernels (on the default stream) are done
    s1 = Stream(1)
    torch.openreg.set_device(0)
    with Gate(s1) as gate:
        on(s1, lambda: y1.copy_(x1)).value(timeout=10)
        waiter = Background(lambda: sync(1))  # a new thread: its current device is 0
        assert still_blocked(waiter), f"{api}(1) returned while device 1 had gated work"
        Background(lambda: sync(0)).value(timeout=30)  # device 0 does not wait for device 1
        gate.open()
        waiter.value()
        assert s1.query(), f"{api}(1) returned before device 1's stream was done"
    assert torch.openreg.current_device() == 0
    assert torch.equal(y1.cpu(), x1.cpu())
