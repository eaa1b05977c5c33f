"""Events: recording on the current stream, completion, waiting on
unrecorded events, timing, device checks and resource leaks.

Work is held behind a gate where the backend offers one, else kept busy by
long work (see _async.py): a correct backend always passes, a synchronous one
too, and one that reports completion early, records on the wrong stream or
times the host instead of the device fails, deterministically with a gate.
"""

from __future__ import annotations

import time

import pytest
import torch

from ._async import SCALES, Load, default_streams, hold, new_stream, poll, unobserved, waited
from ._helpers import check, must, must_raise, scope

contract = pytest.mark.contract

TIMING_ERRORS = (RuntimeError, ValueError)


def new_event(dt: str, **kwargs) -> torch.Event:
    return must(lambda: torch.Event(device=dt, **kwargs),
                f"torch.Event(device={dt!r}{''.join(f', {k}={v}' for k, v in kwargs.items())})")


# ------------------------------------------------------------------ recording


RECORDERS = {
    "Event.record() with the stream current": ("EV-REC-001.1", lambda e, s: _record_current(e, s)),
    "Event.record(stream)": ("EV-REC-001.2", lambda e, s: e.record(s)),
    "Stream.record_event()": ("EV-REC-001.2", None),
}


def _record_current(event, stream) -> None:
    with stream:
        event.record()


@contract("EV-REC-001")
@pytest.mark.parametrize("how", list(RECORDERS))
@pytest.mark.exclusive
def test_event_completes_only_after_the_work_before_it(dt, n, backend, how):
    """On a stream of the last device (device 0 current): the event must stay
    incomplete while the work recorded before it is held, complete once that
    work is done, and synchronize() must wait for it."""
    clause, record = RECORDERS[how]
    j = n - 1
    load = Load(dt, j)
    s = new_stream(dt, j)
    torch.accelerator.set_device_index(0)
    for scale in SCALES:
        target = load.target()
        with hold(backend, s, load, scale) as held:
            with s:
                load.write(target)
            with scope(clause):
                if record is None:
                    event = must(s.record_event, how)
                    check(clause, isinstance(event, torch.Event), f"Stream.record_event() returned "
                                                                  f"{type(event).__name__}")
                else:
                    event = new_event(dt)
                    must(lambda: record(event, s), how)
            done = must(event.query, "Event.query()")
            pending = held.pending()  # (after the answer: the work was pending while query() answered)
            if pending:
                check(clause, done is False,
                      f"after {how}, the event reported query() == True while the work recorded before it was held or "
                      "pending: it was not recorded on that stream, or completion is reported early")
            with scope("EV-REC-001.4"):
                _, early = waited(lambda: must(event.synchronize, "Event.synchronize()"), held)
        observed = early is not None
        check("EV-REC-001.4", early is not True, "Event.synchronize() returned while the work before the event was "
                                                 "still held or pending", observed=observed)
        check("EV-REC-001.4", must(event.query, "Event.query()") is True,
              "Event.query() is False right after Event.synchronize()", observed=observed)
        check("EV-REC-001.4", load.is_final(target),
              "after Event.synchronize(), the work recorded before the event is incomplete when read from another stream",
              observed=observed)
        check(clause, event.device == torch.device(dt, j), f"an event recorded on a stream of {dt}:{j} reports "
                                                           f"{event.device}", observed=pending)
        if pending and observed:
            break
    else:
        unobserved(backend, [clause, "EV-REC-001.4"], f"{how} and Event.synchronize() behind work in flight")


@contract("EV-REC-001")
@pytest.mark.exclusive
def test_query_true_means_the_work_is_done(dt, n, backend):
    """query() polled until True: the work before the event must be done then
    (a long last task makes an early answer visible)."""
    load = Load(dt, 0, elements=1 << 22)
    s = new_stream(dt, 0)
    for scale in SCALES:
        target = load.queue_and_write(s, scale)
        event = must(s.record_event, "Stream.record_event()")
        in_flight = not load.seen_final(target)
        poll(event.query)  # an event that never completes is a hang (no progress) of this contract
        check("EV-REC-001.3", load.is_final(target),
              "Event.query() returned True while the work recorded before the event was incomplete: completion "
              "reported early", observed=in_flight)
        if in_flight:
            break
    else:
        unobserved(backend, "EV-REC-001.3", "Event.query() polled while the work before the event was in flight")


@contract("EV-REC-001")
@pytest.mark.exclusive
def test_event_can_be_recorded_again(dt, backend):
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    event = new_event(dt)
    seen = False
    for round_, scale in enumerate((*SCALES, SCALES[-1])):
        target = load.target()
        with hold(backend, s, load, scale) as held:
            with s:
                load.write(target)
                with scope("EV-REC-001.5"):
                    must(event.record, f"Event.record() (round {round_ + 1})")
            done = event.query()
            pending = held.pending()  # (after the answer)
            if pending:
                check("EV-REC-001.5", done is False,
                      f"an event recorded again (round {round_ + 1}) reported completion before its new work ran")
        seen |= pending
        must(event.synchronize, "Event.synchronize()")
        check("EV-REC-001.5", event.query() is True and load.is_final(target),
              f"re-recording an event (round {round_ + 1}) made it complete too early", observed=pending)
    if not seen:
        unobserved(backend, "EV-REC-001.5", "an event recorded again behind work in flight")


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
        event = must(lambda: mod.Event(enable_timing=enable_timing), f"torch.{dt}.Event(enable_timing={enable_timing})")
    with scope("EV-UNREC-001.1"):
        answer = must(event.query, "Event.query() of an unrecorded event")
    check("EV-UNREC-001.1", answer is True, "an event that was never recorded must report query() == True")
    with scope("EV-UNREC-001.2", decides=True):
        must(event.synchronize, "Event.synchronize() of an unrecorded event")
    s = new_stream(dt, 0)
    current = torch.accelerator.current_stream(0)
    with scope("EV-UNREC-001.3"):
        must(event.wait, "Event.wait() of an unrecorded event (current stream)")
        must(lambda: event.wait(s), "Event.wait(stream) of an unrecorded event")
        must(lambda: s.wait_event(event), "Stream.wait_event(unrecorded event)")
    target = torch.zeros(16, device=torch.device(dt, 0))
    source = torch.full((16,), 5.0, dtype=torch.float64, device=torch.device(dt, 0))
    torch.accelerator.synchronize(0)
    for stream in (s, current):
        with stream:
            target.copy_(source)
        poll(stream.query)  # blocked behind an unrecorded event: no progress, a hang of this contract
    check("EV-UNREC-001.3", bool((target.cpu() == 5.0).all()), "work queued after waiting on an unrecorded event "
                                                               "did not run")
    check("EV-UNREC-001.1", event.query() is True, "an unrecorded event stopped reporting query() == True")


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


# Rounds of timings before EV-TIME-001.2 is decided: each round times 1 unit
# of work three times and many units twice, and growth is judged on the
# fastest timing of each size over all rounds so far. A preempted timing only
# ever adds time, so the minima converge to the true times: on a busy machine
# a correct backend shows growth within a few rounds, while one whose
# elapsed_time does not follow the work never does.
GROWTH_ROUNDS = 6


@contract("EV-TIME-001")
@pytest.mark.exclusive
def test_elapsed_time_measures_the_work(dt):
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    big = max(16, load.units)
    small: list[tuple[float, float]] = []
    large: list[tuple[float, float]] = []
    for _ in range(GROWTH_ROUNDS):
        with scope("EV-TIME-001.1"):
            for units, into in ((1, small), (big, large), (1, small), (big, large), (1, small)):
                into.append(_timed(load, units, s))
        if min(e for e, _ in large) > min(e for e, _ in small):
            break
    for elapsed, wall in small + large:
        check("EV-TIME-001.1", isinstance(elapsed, float), f"Event.elapsed_time returned {type(elapsed).__name__}, "
                                                           "not float")
        check("EV-TIME-001.1", elapsed >= 0.0, f"Event.elapsed_time returned a negative time {elapsed}")
        check("EV-TIME-001.1", elapsed <= wall * 1.1 + 1.0,
              f"Event.elapsed_time returned {elapsed:.3f} ms, more than the {wall:.3f} ms of wall-clock time around the "
              "events: it must be in milliseconds")
    small_ms = min(e for e, _ in small)
    large_ms = min(e for e, _ in large)
    check("EV-TIME-001.2", large_ms > small_ms,
          f"Event.elapsed_time does not grow with the work between the events: at best {small_ms:.3f} ms for 1 unit "
          f"of work and {large_ms:.3f} ms for {big} units, over {len(small)} and {len(large)} timings")
    best_elapsed = max(e for e, _ in large)
    shortest_wall = min(w for _, w in large)
    check("EV-TIME-001.3", best_elapsed >= 0.1 * shortest_wall,
          f"Event.elapsed_time measured {best_elapsed:.3f} ms for work that kept the host waiting {shortest_wall:.3f} "
          "ms: events must be timestamped when the device reaches them, not when they are recorded by the host")


@contract("EV-TIME-001")
@pytest.mark.exclusive
def test_elapsed_time_ignores_host_time_between_records(dt, backend):
    """Two events recorded back to back on a held stream while the host pauses
    between the two record() calls: nothing runs between them on the device,
    so their elapsed time is about 0, however long the host paused. Without a
    gate, conclusive only when the work queued before them was seen pending
    after the second record (on a synchronous backend, whose device did
    idle between the records, the rule does not apply)."""
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    pause_ms = 20.0
    for scale in SCALES[1:]:
        start, end = new_event(dt, enable_timing=True), new_event(dt, enable_timing=True)
        marker = new_event(dt)
        with hold(backend, s, load, scale) as held:
            with s:
                marker.record()
                start.record()
                time.sleep(pause_ms / 1000.0)
                end.record()
            conclusive = held.pending()
        must(end.synchronize, "Event.synchronize()")
        with scope("EV-TIME-001.3"):
            elapsed = must(lambda: start.elapsed_time(end), "Event.elapsed_time(end) of two completed timing events")
        if conclusive:
            check("EV-TIME-001.3", elapsed < pause_ms / 2,
                  f"two events recorded back to back on a held stream, with the host pausing {pause_ms:.0f} ms between "
                  f"the record() calls, are {elapsed:.3f} ms apart: elapsed_time must measure device time (nothing "
                  "ran between them), not the host time between the record() calls")
            break
    else:
        unobserved(backend, "EV-TIME-001.3", "two events recorded back to back behind work in flight")


@contract("EV-TIME-001")
def test_elapsed_time_needs_timing_events(dt):
    plain_a, plain_b = new_event(dt), new_event(dt)
    timing_a, timing_b = new_event(dt, enable_timing=True), new_event(dt, enable_timing=True)
    with scope("EV-TIME-001.4"):
        must_raise(lambda: timing_a.elapsed_time(timing_b), "Event.elapsed_time of two unrecorded timing events",
                   TIMING_ERRORS)
    for event in (plain_a, plain_b, timing_a, timing_b):
        event.record()
    for event in (plain_a, plain_b, timing_a, timing_b):
        event.synchronize()
    with scope("EV-TIME-001.4"):
        must_raise(lambda: plain_a.elapsed_time(plain_b), "Event.elapsed_time of events created without "
                   "enable_timing=True", TIMING_ERRORS)
        must_raise(lambda: timing_a.elapsed_time(plain_b), "Event.elapsed_time to an event created without "
                   "enable_timing=True", TIMING_ERRORS)
    with scope("EV-TIME-001.1"):
        elapsed = must(lambda: timing_a.elapsed_time(timing_b), "Event.elapsed_time of two recorded timing events")
    check("EV-TIME-001.1", isinstance(elapsed, float) and elapsed >= 0.0, f"Event.elapsed_time returned {elapsed!r}")


# -------------------------------------------------------------------- devices


@contract("EV-DEV-001")
def test_event_cannot_move_to_another_device(dt, n):
    s0, s1 = new_stream(dt, 0), new_stream(dt, 1)
    event = new_event(dt)
    must(lambda: event.record(s0), f"Event.record(stream of {dt}:0)")
    with scope("EV-DEV-001.1"):
        must_raise(lambda: event.record(s1), f"recording an event of {dt}:0 on a stream of {dt}:1",
                   (RuntimeError, ValueError))

        def record_current():
            with torch.accelerator.device_index(1):
                event.record()

        must_raise(record_current, f"recording an event of {dt}:0 on the current stream of {dt}:1",
                   (RuntimeError, ValueError))
        for wrong in (s1, default_streams(2)[1]):
            fresh = s0.record_event()
            must_raise(lambda: wrong.record_event(fresh), f"Stream.record_event(event of {dt}:0) on {wrong}",
                       (RuntimeError, ValueError))
    check("EV-DEV-001.2", torch.accelerator.current_device_index() == 0, "a rejected record changed the current device")
    check("EV-DEV-001.2", event.device == torch.device(dt, 0), f"a rejected record moved the event to {event.device}")
    with scope("EV-DEV-001.2"):
        must(lambda: event.record(s0), f"recording the event on {dt}:0 again after the rejected record")
        must(event.synchronize, "Event.synchronize()")
    check("EV-DEV-001.2", event.query() is True, "the event is not usable on its device after a rejected record")


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
def test_many_events_leak_nothing(dt, backend, unclaimed):
    count = 5000
    stats = "memory-stats" not in unclaimed
    s = new_stream(dt, 0)
    warm = new_event(dt, enable_timing=True)
    warm.record(s)
    warm.synchronize()
    torch.accelerator.synchronize(0)
    allocated = torch.accelerator.memory_allocated(0) if stats else 0
    threads = _os_threads()
    live_events = backend.instrument("live_event_count")  # optional: events invisible to PyTorch
    events_before = live_events() if live_events else 0
    with scope("EV-LEAK-001.2"):
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
        check("EV-LEAK-001.1", torch.accelerator.memory_allocated(0) == allocated,
              f"creating, recording and destroying {2 * count} events changed memory_allocated() from {allocated} to "
              f"{torch.accelerator.memory_allocated(0)}: events leak device memory")
    if threads is not None:
        check("EV-LEAK-001.1", _os_threads() <= threads + 2,
              f"creating and destroying {2 * count} events left {_os_threads() - threads} more OS threads running")
    if live_events:
        kept = live_events() - events_before
        check("EV-LEAK-001.1", kept < count // 10,
              f"after creating and destroying {2 * count} events, the backend's runtime holds {kept} more events "
              "(instrumentation live_event_count()): destroyEvent does not release them")
    start, end = new_event(dt, enable_timing=True), new_event(dt, enable_timing=True)
    with scope("EV-LEAK-001.2"):
        must(lambda: start.record(s), "Event.record() after thousands of events")
        must(lambda: end.record(s), "Event.record() after thousands of events")
        must(end.synchronize, "Event.synchronize() after thousands of events")
        check("EV-LEAK-001.2", start.query() and end.query(), "events recorded after thousands of others never complete")
        check("EV-LEAK-001.2", must(lambda: start.elapsed_time(end), "Event.elapsed_time after thousands of events")
              >= 0.0, "elapsed_time after thousands of events is negative")
