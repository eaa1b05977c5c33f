"""Events: recording on the current stream, completion, waiting on
unrecorded events, timing, device checks and resource leaks.

The background load and its conclusive-observation rules are shared with
test_streams.py: a fast correct backend always passes, a backend that
reports completion early, records on the wrong stream or times the host
instead of the device fails.
"""

from __future__ import annotations

import time

import pytest
import torch

from ._helpers import must, must_raise
from .test_streams import POLL_SECONDS, SCALES, Load, default_streams, new_stream, poll

contract = pytest.mark.contract

TIMING_ERRORS = (RuntimeError, ValueError)


def new_event(dt: str, **kwargs) -> torch.Event:
    return must(lambda: torch.Event(device=dt, **kwargs),
                f"torch.Event(device={dt!r}{''.join(f', {k}={v}' for k, v in kwargs.items())})")


# ------------------------------------------------------------------ recording


@contract("EV-REC-001")
def test_event_records_on_the_current_stream(dt):
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    for scale in SCALES:
        target = load.target()
        event = new_event(dt)
        with s:
            load.queue(load.units * scale)
            load.write(target)
            must(event.record, "Event.record() with a new stream current")
        event_done = must(event.query, "Event.query()")
        stream_done = s.query()
        assert not (event_done and not stream_done), (
            "Event.record() with stream s current completed while s was still running the work queued before "
            "it: record() must record on the current stream")
        must(event.synchronize, "Event.synchronize()")
        assert must(event.query, "Event.query()") is True, \
            "Event.query() is False right after Event.synchronize(): synchronize returned before the event completed"
        assert s.query() is True, ("after Event.synchronize() of the last thing recorded on s, s still has work: "
                                   "the event was not recorded on the current stream, or completed early")
        assert load.is_final(target), \
            "after Event.synchronize(), the work recorded before the event is incomplete when read from another stream"
        assert event.device == torch.device(dt, 0), f"an event recorded on a stream of {dt}:0 reports {event.device}"
        if not stream_done:
            break


@contract("EV-REC-001")
@pytest.mark.parametrize("how", ["Event.record(stream)", "Stream.record_event()"])
def test_event_query_true_means_the_work_is_done(dt, how):
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    for scale in SCALES:
        target = load.queue_and_write(s, scale)
        if how == "Event.record(stream)":
            event = new_event(dt)
            must(lambda: event.record(s), how)
        else:
            event = must(s.record_event, how)
            assert isinstance(event, torch.Event), f"Stream.record_event() returned {type(event).__name__}"
        in_flight = not s.query()
        assert poll(event.query), f"Event.query() stayed False for {POLL_SECONDS} s after {how}"
        assert load.is_final(target), (f"Event.query() returned True after {how}, but the work before the event "
                                       "was incomplete: completion reported early")
        if in_flight:
            break


@contract("EV-REC-001")
def test_event_can_be_recorded_again(dt):
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    event = new_event(dt)
    for round_ in range(3):
        target = load.target()
        with s:
            load.queue()
            load.write(target)
            must(event.record, f"Event.record() (round {round_ + 1})")
        must(event.synchronize, "Event.synchronize()")
        assert event.query() is True
        assert load.is_final(target), f"re-recording an event (round {round_ + 1}) made it complete too early"


# ---------------------------------------------------------------- unrecorded


def pytest_generate_tests(metafunc):
    """event_kind: torch.Event, and the device module's own Event class
    (torch.<name>.Event, like torch.cuda.Event) if it has one (a backend
    without one gets no such test, rather than a skip)."""
    if "event_kind" not in metafunc.fixturenames:
        return
    session = metafunc.config.pluginmanager.get_plugin("privateuse1-conformance-session")
    module = session.backend.device_module if session else None
    kinds = ["torch.Event"] + (["module Event"] if callable(getattr(module, "Event", None)) else [])
    metafunc.parametrize("event_kind", kinds)


@contract("EV-UNREC-001")
@pytest.mark.parametrize("enable_timing", [False, True], ids=["plain", "timing"])
def test_unrecorded_event_is_complete_and_waits_for_nothing(dt, mod, event_kind, enable_timing):
    if event_kind == "torch.Event":
        event = new_event(dt, enable_timing=enable_timing)
    else:  # the module's own class, on the current device
        event = must(lambda: mod.Event(enable_timing=enable_timing),
                     f"torch.{dt}.Event(enable_timing={enable_timing})")
    assert must(event.query, "Event.query() of an unrecorded event") is True, \
        "an event that was never recorded must report query() == True"
    must(event.synchronize, "Event.synchronize() of an unrecorded event")
    s = new_stream(dt, 0)
    current = torch.accelerator.current_stream(0)
    must(event.wait, "Event.wait() of an unrecorded event (current stream)")
    must(lambda: event.wait(s), "Event.wait(stream) of an unrecorded event")
    must(lambda: s.wait_event(event), "Stream.wait_event(unrecorded event)")
    target = torch.zeros(16, device=torch.device(dt, 0))
    source = torch.full((16,), 5.0, dtype=torch.float64, device=torch.device(dt, 0))
    torch.accelerator.synchronize(0)
    for stream in (s, current):
        with stream:
            target.copy_(source)
        assert poll(stream.query, 5.0), (
            f"{stream} never finished a small copy queued after it waited on an unrecorded event: "
            "waiting on an unrecorded event must be a no-op")
    assert bool((target.cpu() == 5.0).all())
    assert event.query() is True


# -------------------------------------------------------------------- timing


def _timed(load: Load, units: int, stream: torch.Stream) -> tuple[float, float]:
    """(elapsed_time in ms, wall-clock ms from before the start record to after
    the end synchronize) for `units` of work between two timing events."""
    start, end = torch.Event(device=load.device.type, enable_timing=True), \
        torch.Event(device=load.device.type, enable_timing=True)
    stream.synchronize()
    t0 = time.perf_counter()
    with stream:
        start.record()
        load.queue(units)
        end.record()
    end.synchronize()
    wall = (time.perf_counter() - t0) * 1000.0
    elapsed = must(lambda: start.elapsed_time(end), "Event.elapsed_time(end) of two completed timing events")
    return elapsed, wall


@contract("EV-TIME-001")
def test_elapsed_time_measures_the_work(dt):
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    big = max(16, load.units)
    small = [_timed(load, 1, s) for _ in range(3)]
    large = [_timed(load, big, s) for _ in range(2)]
    for elapsed, wall in small + large:
        assert isinstance(elapsed, float), f"Event.elapsed_time returned {type(elapsed).__name__}, not float"
        assert elapsed >= 0.0, f"Event.elapsed_time returned a negative time {elapsed}"
        assert elapsed <= wall * 1.1 + 1.0, (
            f"Event.elapsed_time returned {elapsed:.3f} ms, more than the {wall:.3f} ms of wall-clock time around "
            "the events: it must be in milliseconds")
    small_ms = min(e for e, _ in small)
    large_ms = min(e for e, _ in large)
    assert large_ms > small_ms, (
        f"Event.elapsed_time does not grow with the work between the events: {small_ms:.3f} ms for 1 unit of "
        f"work, {large_ms:.3f} ms for {big} units")
    best_elapsed = max(e for e, _ in large)
    shortest_wall = min(w for _, w in large)
    assert best_elapsed >= 0.1 * shortest_wall, (
        f"Event.elapsed_time measured {best_elapsed:.3f} ms for work that kept the host waiting {shortest_wall:.3f} "
        "ms: events must be timestamped when the device reaches them, not when they are recorded by the host")


@contract("EV-TIME-001")
def test_elapsed_time_ignores_host_time_between_records(dt):
    """Two events recorded back to back on a busy stream while the host pauses
    between the two record() calls: nothing runs between them on the device,
    so their elapsed time is about 0, however long the host paused. A backend
    that timestamps record() calls on the host reports the pause instead.
    Conclusive only when the stream was still busy after the second record."""
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    pause_ms = 20.0
    for scale in SCALES[1:]:
        start, end = new_event(dt, enable_timing=True), new_event(dt, enable_timing=True)
        with s:
            load.queue(load.units * scale)
            start.record()
            time.sleep(pause_ms / 1000.0)
            end.record()
        busy = not s.query()
        must(end.synchronize, "Event.synchronize()")
        elapsed = must(lambda: start.elapsed_time(end), "Event.elapsed_time(end) of two completed timing events")
        if busy:
            assert elapsed < pause_ms / 2, (
                f"two events recorded back to back on a busy stream, with the host pausing {pause_ms:.0f} ms "
                f"between the record() calls, are {elapsed:.3f} ms apart: elapsed_time must measure device "
                "time (nothing ran between them), not the host time between the record() calls")
            break


@contract("EV-TIME-001")
def test_elapsed_time_needs_timing_events(dt):
    plain_a, plain_b = new_event(dt), new_event(dt)
    timing_a, timing_b = new_event(dt, enable_timing=True), new_event(dt, enable_timing=True)
    must_raise(lambda: timing_a.elapsed_time(timing_b), "Event.elapsed_time of two unrecorded timing events",
               TIMING_ERRORS)
    for event in (plain_a, plain_b, timing_a, timing_b):
        event.record()
    for event in (plain_a, plain_b, timing_a, timing_b):
        event.synchronize()
    must_raise(lambda: plain_a.elapsed_time(plain_b),
               "Event.elapsed_time of events created without enable_timing=True", TIMING_ERRORS)
    must_raise(lambda: timing_a.elapsed_time(plain_b),
               "Event.elapsed_time to an event created without enable_timing=True", TIMING_ERRORS)
    elapsed = must(lambda: timing_a.elapsed_time(timing_b), "Event.elapsed_time of two recorded timing events")
    assert isinstance(elapsed, float) and elapsed >= 0.0, f"Event.elapsed_time returned {elapsed!r}"


# -------------------------------------------------------------------- devices


@contract("EV-DEV-001")
def test_event_cannot_move_to_another_device(dt, n):
    s0, s1 = new_stream(dt, 0), new_stream(dt, 1)
    event = new_event(dt)
    must(lambda: event.record(s0), f"Event.record(stream of {dt}:0)")
    must_raise(lambda: event.record(s1),
               f"recording an event of {dt}:0 on a stream of {dt}:1", (RuntimeError, ValueError))

    def record_current():
        with torch.accelerator.device_index(1):
            event.record()

    must_raise(record_current, f"recording an event of {dt}:0 on the current stream of {dt}:1",
               (RuntimeError, ValueError))
    assert torch.accelerator.current_device_index() == 0
    assert event.device == torch.device(dt, 0), f"a rejected record moved the event to {event.device}"
    must(lambda: event.record(s0), f"recording the event on {dt}:0 again after the rejected record")
    must(event.synchronize, "Event.synchronize()")
    assert event.query() is True
    for wrong in (s1, default_streams(2)[1]):
        fresh = s0.record_event()
        must_raise(lambda: wrong.record_event(fresh), f"Stream.record_event(event of {dt}:0) on {wrong}",
                   (RuntimeError, ValueError))


# ----------------------------------------------------------------------- leaks


def _os_threads() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@contract("EV-LEAK-001")
def test_many_events_leak_nothing(dt, backend):
    count = 5000
    stats = "memory-stats" not in backend.manifest.unclaimed
    s = new_stream(dt, 0)
    warm = new_event(dt, enable_timing=True)
    warm.record(s)
    warm.synchronize()
    torch.accelerator.synchronize(0)
    allocated = torch.accelerator.memory_allocated(0) if stats else 0
    threads = _os_threads()
    live_events = backend.instrument("live_event_count")  # optional: events invisible to PyTorch
    events_before = live_events() if live_events else 0
    for i in range(count):
        event = torch.Event(device=dt, enable_timing=i % 2 == 0)
        event.record(s if i % 3 else None)
        if i % 500 == 0:
            event.synchronize()
        del event
        extra = s.record_event()
        del extra
    torch.accelerator.synchronize(0)
    if stats:
        assert torch.accelerator.memory_allocated(0) == allocated, (
            f"creating, recording and destroying {2 * count} events changed memory_allocated() from {allocated} "
            f"to {torch.accelerator.memory_allocated(0)}: events leak device memory")
    if threads is not None:
        assert _os_threads() <= threads + 2, \
            f"creating and destroying {2 * count} events left {_os_threads() - threads} more OS threads running"
    if live_events:
        kept = live_events() - events_before
        assert kept < count // 10, (
            f"after creating and destroying {2 * count} events, the backend's runtime holds {kept} more events "
            "(instrumentation live_event_count()): destroyEvent does not release them")
    start, end = new_event(dt, enable_timing=True), new_event(dt, enable_timing=True)
    must(lambda: start.record(s), "Event.record() after thousands of events")
    must(lambda: end.record(s), "Event.record() after thousands of events")
    must(end.synchronize, "Event.synchronize() after thousands of events")
    assert start.query() and end.query()
    assert must(lambda: start.elapsed_time(end), "Event.elapsed_time after thousands of events") >= 0.0
