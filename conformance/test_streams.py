"""Streams: creation, the current stream, ordering and synchronization,
record_stream, priorities, device synchronization, and the Python stream
context (torch.Stream as a context manager).

Ordering is observed while work is certainly in flight where the backend
offers a gate (instrumentation block_stream), else while long work probably
still is (see _async.py): a fast correct backend always passes, a
synchronous one too (nothing is ever pending on it), and a backend that runs
work out of order, reports completion early or ignores a dependency fails,
deterministically with a gate.
"""

from __future__ import annotations

import time

import pytest
import torch

from ._async import (SCALES, Load, check_producer_consumer, current_streams, default_streams, hold, new_stream, poll,
                     running_task, unobserved, waited)
from privateuse1_conformance.harness.evidence import not_applicable

from ._helpers import check, in_thread, must, scope

contract = pytest.mark.contract


# ------------------------------------------------------------------ creation


@contract("ST-NEW-001")
def test_new_streams_are_distinct_and_compare_by_id_and_device(dt, n):
    defaults = default_streams(n)
    for i in range(n):
        with scope("ST-NEW-001.1"):
            a, b = new_stream(dt, i), new_stream(dt, i)
        for s in (a, b):
            check("ST-NEW-001.2", s.device == torch.device(dt, i) and s.device_index == i,
                  f"torch.Stream(device='{dt}:{i}') belongs to {s.device} (device_index {s.device_index})")
        check("ST-NEW-001.1", a.stream_id != b.stream_id,
              f"two new streams on {dt}:{i} have the same id {a.stream_id}: getNewStream must hand out distinct streams")
        check("ST-NEW-001.1", defaults[i] not in (a, b) and defaults[i].stream_id not in (a.stream_id, b.stream_id),
              f"a new stream of {dt}:{i} is its default stream (id {defaults[i].stream_id})")
        check("ST-NEW-001.4", a != b and len({a, b}) == 2, f"two new streams on {dt}:{i} compare equal or hash alike")
        copy = torch.Stream(stream_id=a.stream_id, device_index=a.device_index, device_type=a.device_type)
        check("ST-NEW-001.4", copy == a and hash(copy) == hash(a) and copy in {a} and copy.device == a.device,
              "a torch.Stream rebuilt from (stream_id, device_index, device_type) is not equal to the original")
        if n > 1:
            other = torch.Stream(stream_id=a.stream_id, device_index=(i + 1) % n, device_type=a.device_type)
            check("ST-NEW-001.4", other != a, "streams with the same id on different devices compare equal")
    for j in [n - 1, 0]:
        torch.accelerator.set_device_index(j)
        with scope("ST-NEW-001.5"):
            s = must(lambda: torch.Stream(device=dt), f"torch.Stream(device={dt!r})")
        check("ST-NEW-001.5", s.device_index == j, f"with device {j} current, torch.Stream(device={dt!r}) is on {s.device}")


@contract("ST-NEW-001")
def test_a_stream_of_another_device_works_when_first_used_from_elsewhere(dt, n):
    """A stream of device j created, first queried and used while another
    device is current: it belongs to j and runs work there."""
    for j in reversed(range(n)):
        other = (j + 1) % n
        torch.accelerator.set_device_index(other)
        with scope("ST-NEW-001.2"):
            s = new_stream(dt, j)
            first = must(s.query, f"Stream.query() as the first use of a stream of {dt}:{j}, device {other} current")
            check("ST-NEW-001.2", first is True, f"a new, unused stream of {dt}:{j} reports query() == {first!r}")
            must(s.synchronize, f"Stream.synchronize() of a stream of {dt}:{j}, device {other} current")
            target = torch.zeros(1 << 16, device=torch.device(dt, j))
            source = torch.full((1 << 16,), 3.0, dtype=torch.float64, device=torch.device(dt, j))
            torch.accelerator.synchronize(j)
            with s:
                must(lambda: target.copy_(source), f"a copy on {dt}:{j} with a stream of {dt}:{j} current")
            must(s.synchronize, f"Stream.synchronize() after work on a stream of {dt}:{j}")
        check("ST-NEW-001.2", torch.accelerator.current_device_index() == other,
              f"using a stream of {dt}:{j} left device {torch.accelerator.current_device_index()} current")
        check("ST-NEW-001.2", bool((target.cpu() == 3.0).all()),
              f"work queued on a stream of {dt}:{j} (first used with device {other} current) did not happen")


@contract("ST-NEW-001")
@pytest.mark.exclusive
def test_new_streams_are_independent_queues(dt, backend):
    """While work is held on one new stream, another new stream and the
    default stream are idle."""
    load = Load(dt, 0)
    busy, idle = new_stream(dt, 0), new_stream(dt, 0)
    default = default_streams(1)[0]
    for scale in SCALES:
        with hold(backend, busy, load, scale) as held:
            idle_done = must(idle.query, "Stream.query() of an idle new stream")
            default_done = must(default.query, "Stream.query() of the idle default stream")
            conclusive = held.pending()
        busy.synchronize()
        if conclusive:  # still busy after the other answers: they are conclusive
            check("ST-NEW-001.3", idle_done, "while work was in flight on one new stream, another new stream reported "
                                             "query() == False: the two streams share one queue")
            check("ST-NEW-001.3", default_done, "while work was in flight on a new stream, the default stream reported "
                                                "query() == False: new streams must not alias the default stream")
            break
    else:
        unobserved(backend, "ST-NEW-001.3", "the other streams' query() while one new stream had work in flight")


@contract("ST-PRIO-001")
@pytest.mark.exclusive
def test_stream_priorities(dt):
    load = Load(dt, 0, value=3.0, elements=1 << 12)
    for priority in (0, -1):
        with scope("ST-PRIO-001.1"):
            s = new_stream(dt, 0, priority=priority)
            target = load.queue_and_write(s, 0)
            must(s.synchronize, f"Stream.synchronize() of a priority {priority} stream")
        check("ST-PRIO-001.1", s.device == torch.device(dt, 0) and load.is_final(target),
              f"work on a priority {priority} stream of {dt}:0 did not happen (stream on {s.device})")
    for priority in (-1000, 1000):
        try:
            s = torch.Stream(device=torch.device(dt, 0), priority=priority)
        except (RuntimeError, ValueError) as e:
            check("ST-PRIO-001.2", str(e).strip(), f"torch.Stream(priority={priority}) raised {type(e).__name__} "
                                                   "without a message")
            continue
        except Exception as e:  # noqa: BLE001
            check("ST-PRIO-001.2", False, f"torch.Stream(priority={priority}) must clamp the priority or raise "
                                          f"RuntimeError/ValueError, but raised {type(e).__name__}: {e}")
        with scope("ST-PRIO-001.2"):
            target = load.queue_and_write(s, 0)
            must(s.synchronize, f"Stream.synchronize() of a stream created with priority {priority}")
        check("ST-PRIO-001.2", load.is_final(target), f"a stream created with (clamped) priority {priority} does not "
                                                      "run work")


# decides ST-PRIO-001.3
@contract("ST-PRIO-001")
def test_stream_priorities_read_back(mod, dt):
    """Where the device module's Stream class reports priorities, as
    torch.cuda.Stream does (`priority`, `priority_range()`), they are read
    back: priority_range() is (least, greatest) with greatest <= least (lower
    numbers are higher priorities), a stream created with a priority in the
    range reports it, and one created with a priority outside it reports a
    priority inside it (or was refused)."""
    clause = "ST-PRIO-001.3"
    stream_class = getattr(mod, "Stream", None)
    if stream_class is None or not hasattr(stream_class, "priority_range") or not hasattr(stream_class, "priority"):
        not_applicable(clause, "the device module's Stream class does not report priorities (no Stream.priority and "
                               "Stream.priority_range(), as torch.cuda.Stream has): nothing to read back")
        return
    bounds = must(stream_class.priority_range, "the module's Stream.priority_range()")
    check(clause, isinstance(bounds, tuple) and len(bounds) == 2 and all(isinstance(b, int) for b in bounds)
          and bounds[1] <= bounds[0],
          f"Stream.priority_range() returned {bounds!r}: it must be (least, greatest) priority, two ints with "
          "greatest <= least (lower numbers are higher priorities, as CUDA's (0, -5))")
    least, greatest = bounds
    for priority in sorted({least, greatest, (least + greatest) // 2}):
        with scope(clause):
            s = must(lambda: stream_class(device=torch.device(dt, 0), priority=priority),
                     f"the module's Stream(priority={priority})")
        got = must(lambda: s.priority, f"Stream(priority={priority}).priority")
        check(clause, got == priority, f"a stream created with priority {priority} (in priority_range() {bounds}) "
                                       f"reports priority {got}")
    for priority in (greatest - 100, least + 100):
        try:
            s = stream_class(device=torch.device(dt, 0), priority=priority)
        except (RuntimeError, ValueError):
            continue  # refused: ST-PRIO-001.2's choice
        got = must(lambda: s.priority, f"Stream(priority={priority}).priority")
        check(clause, isinstance(got, int) and greatest <= got <= least,
              f"a stream created with priority {priority}, outside priority_range() {bounds}, reports priority {got}: "
              "a priority outside the range is clamped into it")


# ------------------------------------------------------------ current stream


@contract("ST-CUR-001")
def test_current_stream_starts_as_the_default_and_is_per_device_and_thread(dt, n, cxx):
    defaults = default_streams(n)
    start = current_streams(n)
    check("ST-CUR-001.1", start == defaults,
          f"the current streams at process start {start} are not the default streams {defaults}")
    for i, s in enumerate(start):
        # The default stream as the guard names it (getDefaultStream), not
        # only what a new thread starts with: both must be it.
        default_id, index = must(lambda i=i: cxx.guard_default_stream(i), f"the guard's getDefaultStream({dt}:{i})")
        check("ST-CUR-001.1", (s.stream_id, s.device_index) == (default_id, index),
              f"the current stream of {dt}:{i} at process start (and in a new thread) is stream {s.stream_id}, not the "
              f"device's default stream {default_id} (the guard's getDefaultStream)")
    for i, s in enumerate(defaults):
        check("ST-CUR-001.1", s.device == torch.device(dt, i), f"the default stream of device {i} is on {s.device}")
    check("ST-CUR-001.1", torch.accelerator.current_stream() == defaults[0],
          "torch.accelerator.current_stream() is not device 0's default stream in a fresh process")

    for j in reversed(range(n)):
        other = (j + 1) % n
        torch.accelerator.set_device_index(other)
        mine = new_stream(dt, j)
        with scope("ST-CUR-001.2"):
            must(lambda: torch.accelerator.set_stream(mine), f"torch.accelerator.set_stream(new stream of {dt}:{j})")
        check("ST-CUR-001.2", torch.accelerator.current_stream(j) == mine and torch.accelerator.current_stream() == mine,
              f"set_stream(s) did not make s current on its device {j}")
        check("ST-CUR-001.2", torch.accelerator.current_device_index() == j,
              f"torch.accelerator.set_stream(s) must make s's device ({j}) current")
        others = [k for k in range(n) if k != j]
        check("ST-CUR-001.2", all(torch.accelerator.current_stream(k) == defaults[k] for k in others),
              f"set_stream on device {j} changed another device's current stream")
        with scope("ST-CUR-001.3"):
            seen = in_thread(lambda: torch.accelerator.current_stream(j))
        check("ST-CUR-001.3", seen == defaults[j],
              "set_stream in one thread changed the current stream seen by another (new) thread")
        theirs = new_stream(dt, j)

        def set_in_thread(theirs=theirs, j=j):
            torch.accelerator.set_stream(theirs)
            return torch.accelerator.current_stream(j)

        with scope("ST-CUR-001.3"):
            seen = in_thread(set_in_thread)
        check("ST-CUR-001.3", seen == theirs, "set_stream in a new thread did not take effect there")
        check("ST-CUR-001.3", torch.accelerator.current_stream(j) == mine,
              "set_stream in another thread changed this thread's stream")
        torch.accelerator.set_stream(defaults[j])
        check("ST-CUR-001.2", torch.accelerator.current_stream(j) == defaults[j],
              "set_stream(default stream) did not restore it")


@contract("ST-CUR-001")
@pytest.mark.exclusive
def test_work_goes_to_the_current_stream(dt, n, backend):
    """Operators (a kernel, a copy between devices' memory and the host) run
    on the current stream of their device, on every device, whoever's device
    is current."""
    for j in reversed(range(n)):
        load = Load(dt, j)
        default = default_streams(n)[j]
        s = new_stream(dt, j)
        for scale in SCALES:
            torch.accelerator.set_stream(s)
            torch.accelerator.set_device_index((j + 1) % n)  # s stays device j's current stream
            target = load.target()
            with hold(backend, s, load, scale) as held:
                load.write(target)  # on device j's current stream: s
                default_done = must(default.query, f"Stream.query() of {dt}:{j}'s default stream")
                conclusive = held.pending()
                # The write may also have gone to the default stream and
                # finished there before query() looked: after the default
                # stream is synchronized, work that went there has certainly
                # run, while work on s is still held. (waited: a backend
                # whose default stream waits for the others is released.)
                waited(lambda: must(default.synchronize, f"Stream.synchronize() of {dt}:{j}'s default stream"),
                       held, keep=True)
                begun = load.progress(target)[0]  # an unordered read
                still_held = held.pending()
            s.synchronize()
            torch.accelerator.set_stream(default)
            if still_held:
                check("ST-CUR-001.4", not begun,
                      f"with a new stream current on {dt}:{j}, work queued on it ran while that stream was held (it "
                      "had run once the default stream was synchronized): operators must run on the current stream")
            if conclusive:
                check("ST-CUR-001.4", default_done,
                      f"with a new stream current on {dt}:{j}, queued work kept the default stream busy: operators "
                      "must run on the current stream")
                break
        else:
            unobserved(backend, "ST-CUR-001.4", f"the default stream of {dt}:{j} while work was in flight on the "
                                                "current one")
        check("ST-CUR-001.4", load.is_final(target), f"work queued with a new stream current on {dt}:{j} did not happen",
              observed=conclusive)


@contract("ST-CUR-001")
@pytest.mark.exclusive
def test_copies_to_the_host_wait_for_the_current_stream(dt, n, backend):
    """Tensor.cpu() and item() of a tensor written by queued work on a
    non-default current stream return the written values: the copy to the
    host is ordered on the current stream, not on the default one."""
    load = Load(dt, n - 1)
    s = new_stream(dt, n - 1)
    torch.accelerator.set_stream(s)
    for scale in SCALES:
        target = load.target()
        with hold(backend, s, load, scale) as held:
            load.write(target)
            with scope("ST-CUR-001.5"):
                host, early = waited(lambda: target.cpu(), held)
        observed = early is not None
        check("ST-CUR-001.5", early is not True,
              "Tensor.cpu() of a tensor written by work queued on the current stream returned while that stream was "
              "still held: the copy to the host does not wait for the current stream", observed=observed)
        check("ST-CUR-001.5", bool((host == load.value).all()),
              "Tensor.cpu() of a tensor written by work queued on the current (non-default) stream returned other "
              "values: the copy to the host was not ordered after the work", observed=observed)
        item_target = load.target()
        with hold(backend, s, load, scale) as held:
            load.write(item_target)
            with scope("ST-CUR-001.5"):
                value, item_early = waited(lambda: item_target[-1].item(), held)
        check("ST-CUR-001.5", item_early is not True and value == load.value,
              f"item() of an element written by work queued on the current stream gave {value} "
              f"{'before the stream was released' if item_early else ''}: it must wait for the current stream",
              observed=item_early is not None)
        if observed and item_early is not None:
            break
    else:
        unobserved(backend, "ST-CUR-001.5", "Tensor.cpu() and item() behind work in flight on the current stream")


# ------------------------------------------------------------ synchronization


@contract("ST-SYNC-001")
@pytest.mark.exclusive
def test_synchronize_waits_for_the_work(dt, backend):
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    for scale in SCALES:
        target = load.target()
        with hold(backend, s, load, scale) as held:
            with s:
                load.write(target)
            with scope("ST-SYNC-001.1"):
                _, early = waited(lambda: must(s.synchronize, "Stream.synchronize()"), held)
        observed = early is not None  # the work was in flight when synchronize() was called
        check("ST-SYNC-001.1", early is not True,
              "Stream.synchronize() returned while the stream's work was still held or pending: it must wait for the "
              "stream's work", observed=observed)
        check("ST-SYNC-001.1", must(s.query, "Stream.query()") is True,
              "Stream.query() is False right after Stream.synchronize(): synchronize returned before the work finished",
              observed=observed)
        check("ST-SYNC-001.1", load.is_final(target),
              "after Stream.synchronize(), the stream's result is incomplete when read from another stream",
              observed=observed)
        if observed:
            break
    else:
        unobserved(backend, "ST-SYNC-001.1", "Stream.synchronize() behind work in flight")


@contract("ST-SYNC-001")
@pytest.mark.exclusive
def test_query_is_false_while_work_is_pending_and_true_only_when_done(dt, backend):
    """The last task queued on the stream is still running (held, or a long
    write): query() must say so, and True must mean the result is final."""
    load = Load(dt, 0, elements=1 << 22)  # a long last task: a 16 MiB converting write
    s = new_stream(dt, 0)
    for scale in SCALES:
        # The stream's only task is running (a held gate, or one long write):
        # nothing queued behind it, so an empty queue must not read as done.
        with running_task(backend, s, load, scale) as held:
            running = held.running()
            answer = must(s.query, "Stream.query() while the stream's only task runs")
            # (after the answer: the task was running while query() answered)
            still_pending = running and held.pending()
        check("ST-SYNC-001.2", answer is False or not still_pending,
              "Stream.query() returned True while the stream's work was still held or pending (its last task still "
              "running): query() must report work that has not finished", observed=still_pending)
        s.synchronize()
        target = load.target()
        with s:
            load.queue(load.units * scale)
            load.write(target)  # the last task: long, and the one whose result is read
        in_flight = not load.seen_final(target)
        poll(s.query)  # a query() that never turns True is a hang (no progress) of this contract
        check("ST-SYNC-001.2", load.is_final(target),
              "Stream.query() returned True while the stream's last task was still writing its result: completion "
              "reported early", observed=in_flight)
        if still_pending and in_flight:
            break
    else:
        unobserved(backend, "ST-SYNC-001.2", "Stream.query() while work was in flight")


@contract("ST-SYNC-001")
@pytest.mark.exclusive
def test_work_on_one_stream_runs_in_order(dt, backend):
    elements = 1 << 19
    steps = 8
    device = torch.device(dt, 0)
    values = [torch.full((elements,), float(k + 1), dtype=torch.float64, device=device) for k in range(steps)]
    a = torch.zeros(elements, dtype=torch.float32, device=device)
    b = torch.zeros(elements, dtype=torch.float32, device=device)
    torch.accelerator.synchronize(0)
    s = new_stream(dt, 0)
    load = Load(dt, 0)
    for scale in SCALES:
        a.zero_()
        b.zero_()
        torch.accelerator.synchronize(0)
        with hold(backend, s, load, scale) as held:  # everything below is queued before any of it runs
            with s:
                for k in range(steps):
                    a.copy_(values[k])   # converting copy: a kernel
                    b.copy_(a)           # plain copy: depends on the previous kernel
            queued = held.pending()      # (still pending after the last was queued: all were queued together)
        s.synchronize()
        a_host, b_host = a.cpu(), b.cpu()
        check("ST-SYNC-001.3", bool((a_host == steps).all()),
              f"after {steps} ordered writes on one stream, the tensor holds {sorted(set(a_host.unique().tolist()))}, "
              f"not {steps}", observed=queued)
        check("ST-SYNC-001.3", bool((b_host == steps).all()),
              "a copy queued after a write on the same stream read another value: work on one stream ran out of order",
              observed=queued)
        if queued:
            break
    else:
        unobserved(backend, "ST-SYNC-001.3", f"{steps * 2} tasks queued together behind work in flight")


@contract("ST-SYNC-001")
@pytest.mark.exclusive
def test_calls_the_host_waits_for_run_after_the_running_task(dt, backend):
    """The stream's only task is running (held by the gate, or one long task
    without it; nothing queued behind it). A copy to the host and an
    operator whose result's size depends on the data are work on that stream
    too: they must run after the task, not beside it on the calling thread
    because the queue is empty."""
    device = torch.device(dt, 0)
    x = torch.tensor([0.0, 1.0, 0.0, 2.0], device=device)
    torch.accelerator.synchronize(0)
    load = Load(dt, 0, elements=1 << 21)  # without a gate, the running task is one write of 8 MiB and more
    s = new_stream(dt, 0)
    # Only when they return is evidence here: their values are the operators'
    # and copies' own contracts.
    calls = (("Tensor.cpu()", lambda: x.cpu()), ("torch.nonzero()", lambda: torch.nonzero(x)))
    for name, call in calls:
        for scale in SCALES:
            with running_task(backend, s, load, scale) as held:
                held.running()  # (no queue left behind it: the case a backend may get wrong)
                with s:
                    _, early = waited(lambda: must(call, name), held)
            s.synchronize()
            check("ST-SYNC-001.3", early is not True,
                  f"{name} on a stream whose last task was still running (held or pending) returned before that task "
                  "finished: work on one stream ran out of order", observed=early is not None)
            if early is not None:
                break
        else:
            unobserved(backend, "ST-SYNC-001.3", f"{name} on a stream whose last task was in flight")


@contract("ST-SYNC-001")
@pytest.mark.exclusive
def test_device_synchronize_waits_for_every_stream(dt, backend):
    """Two new streams held (or busy), a short write on the current one:
    torch.accelerator.synchronize() must wait for all three."""
    load = Load(dt, 0)
    streams = [new_stream(dt, 0), new_stream(dt, 0), default_streams(1)[0]]
    for scale in SCALES:
        targets = [load.target() for _ in streams]
        holds = [hold(backend, s, load, scale) for s in streams[:2]]
        for s, target in zip(streams, targets):
            with s:
                load.write(target)

        def sync_all() -> None:
            must(torch.accelerator.synchronize, "torch.accelerator.synchronize()")

        with scope("ST-SYNC-001.4"):
            # The second hold is released first, the first after the delay:
            # returning early means not waiting for the first stream.
            holds[1].release()
            _, early = waited(sync_all, holds[0])
        for h in holds:
            h.release()
        observed = early is not None  # the first stream's work was in flight at the call
        check("ST-SYNC-001.4", early is not True,
              "torch.accelerator.synchronize() returned while a stream of the device was still held or had work "
              "pending", observed=observed)
        busy = [str(s) for s in streams if not s.query()]
        check("ST-SYNC-001.4", not busy, f"after torch.accelerator.synchronize(), streams still report pending work: "
                                         f"{busy}", observed=observed)
        for s, target in zip(streams, targets):
            check("ST-SYNC-001.4", load.is_final(target), f"after torch.accelerator.synchronize(), the work of {s} is "
                                                          "incomplete", observed=observed)
        if observed:
            break
    else:
        unobserved(backend, "ST-SYNC-001.4", "torch.accelerator.synchronize() behind work in flight on two streams")


@contract("ST-DEVSYNC-001")
@pytest.mark.parametrize("how", ["torch.accelerator.synchronize(i)", "torch.accelerator.synchronize(torch.device)",
                                 "the guard's synchronizeDevice(i)"])
@pytest.mark.exclusive
def test_synchronize_names_the_device(how, dt, n, cxx, backend):
    last = n - 1
    clause = {"torch.accelerator.synchronize(i)": "ST-DEVSYNC-001.1",
              "torch.accelerator.synchronize(torch.device)": "ST-DEVSYNC-001.2",
              "the guard's synchronizeDevice(i)": "ST-DEVSYNC-001.3"}[how]
    sync = {"torch.accelerator.synchronize(i)": torch.accelerator.synchronize,
            "torch.accelerator.synchronize(torch.device)": lambda i: torch.accelerator.synchronize(torch.device(dt, i)),
            "the guard's synchronizeDevice(i)": cxx.guard_synchronize_device}[how]
    load = Load(dt, last)
    pool = new_stream(dt, last)
    default = torch.accelerator.current_stream(last)
    for scale in SCALES:
        targets = [load.target(), load.target()]
        torch.accelerator.set_device_index(0)
        # A short write on device `last`'s current stream (device 0 stays
        # current), held or long work on another stream of device `last`.
        load.write(targets[0])
        with hold(backend, pool, load, scale) as held:
            with pool:
                load.write(targets[1])
            with scope(clause):
                _, early = waited(lambda: must(lambda: sync(last), f"{how} with device 0 current"), held)
        observed = early is not None
        check(clause, early is not True, f"{how}({last}) with device 0 current returned while a stream of device "
                                         f"{last} was still held or had work pending: it must wait for every stream of "
                                         "the device it names", observed=observed)
        check("ST-DEVSYNC-001.4", torch.accelerator.current_device_index() == 0, f"{how}({last}) changed the current "
                                                                                  "device")
        busy = [str(s) for s in (default, pool) if not s.query()]
        check(clause, not busy, f"{how}({last}) with device 0 current returned while streams of device {last} still "
                                f"had work: {busy}", observed=observed)
        check(clause, all(load.is_final(t) for t in targets), f"after {how}({last}), the device's work is incomplete",
              observed=observed)
        if observed:
            break
    else:
        unobserved(backend, clause, f"{how}({last}) behind work in flight on a stream of device {last}")


# ------------------------------------------------------------ cross-stream order


@contract("ST-WAIT-001")
@pytest.mark.parametrize("consumer_is_current", [False, True], ids=["new-consumer", "current-consumer"])
def test_wait_stream_orders_consumer_after_producer(dt, backend, consumer_is_current):
    check_producer_consumer(dt, backend, lambda p, c: must(lambda: c.wait_stream(p), "Stream.wait_stream(producer)"),
                            consumer_is_current, "ST-WAIT-001.1", "consumer.wait_stream(producer)")


@contract("ST-WAIT-001")
@pytest.mark.parametrize("how", ["Stream.wait_event", "Event.wait"])
def test_wait_event_orders_consumer_after_producer(dt, backend, how):
    def wait(producer, consumer):
        if how == "Stream.wait_event":
            event = must(producer.record_event, "Stream.record_event()")
            must(lambda: consumer.wait_event(event), "Stream.wait_event(event)")
        else:
            event = torch.Event(device=dt)
            must(lambda: event.record(producer), "Event.record(producer)")
            must(lambda: event.wait(consumer), "Event.wait(consumer)")

    check_producer_consumer(dt, backend, wait, False,
                            "ST-WAIT-001.2" if how == "Stream.wait_event" else "ST-WAIT-001.3", how)


# ------------------------------------------------------------ record_stream


@contract("ST-REC-001")
@pytest.mark.exclusive
def test_record_stream_keeps_memory_until_the_stream_is_done(dt, backend, unclaimed):
    elements = 1 << 19
    device = torch.device(dt, 0)
    load = Load(dt, 0)
    side = new_stream(dt, 0)
    stats = "memory-stats" not in unclaimed
    for scale in SCALES:
        baseline = torch.accelerator.memory_allocated(0) if stats else 0
        out = load.target()
        x = torch.full((elements,), 3.0, dtype=torch.float32, device=device)
        torch.accelerator.synchronize(0)
        x_start = x.data_ptr()
        x_end = x_start + x.untyped_storage().nbytes()
        with hold(backend, side, load, scale) as held:  # the side stream is busy ...
            with side:
                out.copy_(x)                             # ... and reads x only afterwards
            with scope("ST-REC-001.1", decides=True):
                must(lambda: x.record_stream(side), "Tensor.record_stream(stream)")
            del x
            # The current stream reuses memory of the same size at once and overwrites it.
            z = torch.empty(elements, dtype=torch.float32, device=device)
            z.fill_(-1.0)
            z_start = z.data_ptr()
            side_busy = held.pending()
        side.synchronize()
        overlaps = z_start < x_end and x_start < z_start + z.untyped_storage().nbytes()
        if side_busy:
            check("ST-REC-001.2", not overlaps,
                  "memory freed after record_stream(s) was handed to a new allocation while s still had work queued: "
                  "the allocator must wait for s (recordDataPtrOnStream)")
        check("ST-REC-001.2", bool((out.cpu() == 3.0).all()),
              "a stream read a tensor after record_stream(stream) and del, and saw it overwritten by a later "
              "allocation: memory was reused before the stream's work completed", observed=side_busy)
        del z
        if stats:
            torch.accelerator.synchronize(0)
            again = torch.empty(elements, dtype=torch.float32, device=device)
            del again
            del out
            now = torch.accelerator.memory_allocated(0)
            check("ST-REC-001.3", now == baseline,
                  "after record_stream, del and synchronize, memory_allocated() did not return to its previous value "
                  f"({now} != {baseline}): the recorded block was never released")
        if side_busy:
            break
    else:
        unobserved(backend, "ST-REC-001.2", "an allocation after record_stream(s) and del while s had work in flight")


# ------------------------------------------------------------ Python guard


def _state(n: int) -> tuple[int, list[torch.Stream]]:
    return torch.accelerator.current_device_index(), current_streams(n)


@contract("GD-PY-001")
def test_stream_context_restores_device_and_stream(dt, n):
    last = n - 1
    # Make the state non-trivial: device `last` has a non-default current stream.
    previous = new_stream(dt, last)
    torch.accelerator.set_stream(previous)
    torch.accelerator.set_device_index(0)
    before = _state(n)
    check("GD-PY-001.1", before[1][last] == previous, "set_stream did not take effect (ST-CUR-001's business)")

    s = new_stream(dt, last)
    with s:
        check("GD-PY-001.1", torch.accelerator.current_device_index() == last,
              f"inside 'with torch.Stream(device={dt}:{last})', device {torch.accelerator.current_device_index()} "
              "is current")
        check("GD-PY-001.1", torch.accelerator.current_stream(last) == s and torch.accelerator.current_stream() == s,
              "inside 'with stream', the stream is not current")
        inner = new_stream(dt, 0)
        with inner:
            check("GD-PY-001.1", torch.accelerator.current_device_index() == 0
                  and torch.accelerator.current_stream(0) == inner, "a nested 'with stream' did not switch")
            if last != 0:
                check("GD-PY-001.1", torch.accelerator.current_stream(last) == s,
                      "a nested stream context changed another device's stream")
        check("GD-PY-001.1", torch.accelerator.current_device_index() == last
              and torch.accelerator.current_stream(last) == s, "leaving a nested stream context did not restore")
        if last != 0:
            check("GD-PY-001.1", torch.accelerator.current_stream(0) == before[1][0],
                  "leaving a nested stream context did not restore device 0's stream")
    check("GD-PY-001.1", _state(n) == before, f"leaving 'with stream' left {_state(n)}, not {before}")

    with pytest.raises(KeyError):
        with s:
            raise KeyError("escapes")
    check("GD-PY-001.2", _state(n) == before, f"an exception escaping 'with stream' left {_state(n)}, not {before}")

    # device_index switches the device only: each device keeps its current stream.
    for exc in (False, True):
        try:
            with torch.accelerator.device_index(last):
                check("GD-PY-001.3", torch.accelerator.current_stream() == previous,
                      "inside torch.accelerator.device_index(i), the current stream is not device i's current stream")
                if exc:
                    raise KeyError("escapes")
        except KeyError:
            pass
        check("GD-PY-001.3", _state(n) == before,
              f"leaving torch.accelerator.device_index({last}){' by an exception' if exc else ''} left {_state(n)}, "
              f"not {before}")
    with torch.accelerator.device_index(None):
        check("GD-PY-001.3", _state(n) == before, "torch.accelerator.device_index(None) changed the state")
    check("GD-PY-001.3", _state(n) == before, "leaving torch.accelerator.device_index(None) changed the state")
