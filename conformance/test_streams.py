"""Streams: creation, the current stream, ordering and synchronization,
record_stream, priorities, device synchronization, and the Python stream
context (torch.Stream as a context manager).

Ordering checks are built so that a fast correct backend always passes and
a backend that runs work out of order, reports completion early or ignores
a dependency fails: work big enough to still be in flight is queued with
copies (asynchronous on every accelerator), and each check either looks at
values ("the consumer sees the producer's complete result") or compares two
observations in an order that makes them conclusive ("the stream was still
busy *after* the other answer was given").
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from ._helpers import in_thread, must, must_raise

contract = pytest.mark.contract

# Elements of the background load's buffers (2 MiB of float32 per copy).
LOAD_ELEMENTS = 1 << 19
# Device time one load aims at: long enough to still be running when the host
# asks, short enough to keep the suite fast.
LOAD_SECONDS = 0.03
LOAD_MAX_UNITS = 256
# A check whose observation was inconclusive (the work had already finished
# when the host looked) is repeated with this many times more work.
SCALES = (1, 4, 16)
POLL_SECONDS = 10.0


class Load:
    """Asynchronous device work on device `index`, queued on whatever stream
    is current for that device when `queue`/`write` are called.

    The work is a run of device-to-device copies (asynchronous on every
    accelerator). `write(target)` fills a float32 target with `value` by a
    converting copy, so a target read too early still holds zeros.
    """

    def __init__(self, dt: str, index: int = 0, value: float = 7.0, elements: int = LOAD_ELEMENTS):
        self.device = torch.device(dt, index)
        self.value = value
        self.elements = elements
        self.src = must(lambda: torch.full((elements,), value, dtype=torch.float64, device=self.device),
                        f"torch.full(..., dtype=float64, device={self.device})")
        self.copy_src = must(lambda: torch.full((elements,), 1.0, device=self.device),
                             f"torch.full(..., device={self.device})")
        self.scratch = must(lambda: torch.empty(elements, device=self.device),
                            f"torch.empty(..., device={self.device})")
        self.units = self._calibrate()

    def unit(self) -> None:
        self.scratch.copy_(self.copy_src)

    def _calibrate(self) -> int:
        """Units for LOAD_SECONDS of work at the fastest observed rate (a
        slow outlier must not shrink the load below what keeps it in flight)."""
        index = self.device.index
        self.unit()  # first touch of the memory may be slower
        must(lambda: torch.accelerator.synchronize(index), f"torch.accelerator.synchronize({index})")
        fastest = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            self.queue(4)
            torch.accelerator.synchronize(index)
            fastest = min(fastest, (time.perf_counter() - start) / 4)
        return max(4, min(LOAD_MAX_UNITS, math.ceil(LOAD_SECONDS / max(fastest, 1e-7))))

    def queue(self, units: int | None = None) -> None:
        for _ in range(self.units if units is None else units):
            self.unit()

    def target(self) -> torch.Tensor:
        """A zero-filled float32 target; synchronizes so that the zeros are final."""
        t = torch.zeros(self.elements, dtype=torch.float32, device=self.device)
        torch.accelerator.synchronize(self.device.index)
        return t

    def write(self, target: torch.Tensor) -> None:
        target.copy_(self.src)

    def queue_and_write(self, stream, scale: int = 1) -> torch.Tensor:
        """On `stream`: `scale` times the calibrated work, then the write of
        a fresh target, which is returned (zeros until the write has run)."""
        target = self.target()
        with stream:
            self.queue(self.units * scale)
            self.write(target)
        return target

    def is_final(self, target: torch.Tensor) -> bool:
        """Whether `target` holds the written value everywhere (read on the
        current stream of its device, which synchronizes only that stream)."""
        return bool((target.cpu() == self.value).all())


def poll(condition, seconds: float = POLL_SECONDS) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)


def default_streams(n: int) -> list[torch.Stream]:
    """Each device's default stream: the current stream of a fresh thread."""
    return in_thread(lambda: [torch.accelerator.current_stream(i) for i in range(n)])


def current_streams(n: int) -> list[torch.Stream]:
    return [torch.accelerator.current_stream(i) for i in range(n)]


def new_stream(dt: str, index: int = 0, **kwargs) -> torch.Stream:
    return must(lambda: torch.Stream(device=torch.device(dt, index), **kwargs),
                f"torch.Stream(device='{dt}:{index}'{', ' if kwargs else ''}"
                f"{', '.join(f'{k}={v}' for k, v in kwargs.items())})")


# ------------------------------------------------------------------ creation


@contract("ST-NEW-001")
def test_new_streams_are_distinct_and_compare_by_id_and_device(dt, n):
    for i in range(n):
        a, b = new_stream(dt, i), new_stream(dt, i)
        for s in (a, b):
            assert s.device == torch.device(dt, i) and s.device_index == i, \
                f"torch.Stream(device='{dt}:{i}') belongs to {s.device} (device_index {s.device_index})"
        assert a.stream_id != b.stream_id, \
            f"two new streams on {dt}:{i} have the same id {a.stream_id}: getNewStream must hand out distinct streams"
        assert a != b and len({a, b}) == 2, f"two new streams on {dt}:{i} compare equal or hash to one set entry"
        copy = torch.Stream(stream_id=a.stream_id, device_index=a.device_index, device_type=a.device_type)
        assert copy == a and hash(copy) == hash(a) and copy in {a}, \
            "a torch.Stream rebuilt from (stream_id, device_index, device_type) is not equal to the original"
        assert copy.device == a.device
    # Without an index, a new stream belongs to the current device.
    torch.accelerator.set_device_index(n - 1)
    s = must(lambda: torch.Stream(device=dt), f"torch.Stream(device={dt!r})")
    assert s.device_index == n - 1, f"with device {n - 1} current, torch.Stream(device={dt!r}) is on {s.device}"
    torch.accelerator.set_device_index(0)
    defaults = default_streams(n)
    fresh = new_stream(dt, 0)
    assert fresh != defaults[0] and fresh.stream_id != defaults[0].stream_id, \
        f"a new stream is the default stream of {dt}:0 (id {fresh.stream_id}): the default stream must not be handed out"
    if n > 1:
        other = torch.Stream(stream_id=fresh.stream_id, device_index=1, device_type=fresh.device_type)
        assert other != fresh, "streams with the same id on different devices compare equal"


@contract("ST-NEW-001")
def test_new_streams_are_independent_queues(dt, n):
    """Two new streams (and the default stream) must not share one queue:
    while work is in flight on one, the others are idle."""
    load = Load(dt, 0)
    busy, idle = new_stream(dt, 0), new_stream(dt, 0)
    default = default_streams(1)[0]
    for scale in SCALES:
        with busy:
            load.queue(load.units * scale)
        idle_done = must(idle.query, "Stream.query() of an idle new stream")
        default_done = must(default.query, "Stream.query() of the idle default stream")
        busy_done = must(busy.query, "Stream.query()")
        busy.synchronize()
        assert type(busy_done) is bool and type(idle_done) is bool, "Stream.query() must return a bool"
        if not busy_done:  # still busy after the other answers: they are conclusive
            assert idle_done, ("while work was in flight on one new stream, another new stream reported "
                               "query() == False: the two streams share one queue")
            assert default_done, ("while work was in flight on a new stream, the default stream reported "
                                  "query() == False: new streams must not alias the default stream")
            break


@contract("ST-PRIO-001")
def test_stream_priorities(dt):
    load = Load(dt, 0, value=3.0, elements=1 << 12)
    for priority in (0, -1):
        s = new_stream(dt, 0, priority=priority)
        assert s.device == torch.device(dt, 0), f"a priority {priority} stream is on {s.device}"
        target = load.queue_and_write(s, 0)
        must(s.synchronize, f"Stream.synchronize() of a priority {priority} stream")
        assert load.is_final(target), f"work on a priority {priority} stream did not happen"
    for priority in (-1000, 1000):
        try:
            s = torch.Stream(device=torch.device(dt, 0), priority=priority)
        except (RuntimeError, ValueError) as e:
            assert str(e).strip(), f"torch.Stream(priority={priority}) raised {type(e).__name__} without a message"
            continue
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"torch.Stream(priority={priority}) must clamp the priority or raise RuntimeError/"
                        f"ValueError, but raised {type(e).__name__}: {e}", pytrace=False)
        target = load.queue_and_write(s, 0)
        must(s.synchronize, f"Stream.synchronize() of a stream created with priority {priority}")
        assert load.is_final(target), f"a stream created with (clamped) priority {priority} does not run work"


# ------------------------------------------------------------ current stream


@contract("ST-CUR-001")
def test_current_stream_is_per_device_and_per_thread(dt, n):
    defaults = default_streams(n)
    start = current_streams(n)
    assert start == defaults, f"the current streams at process start {start} are not the default streams {defaults}"
    for i, s in enumerate(defaults):
        assert s.device == torch.device(dt, i), f"the default stream of device {i} is on {s.device}"
    assert torch.accelerator.current_stream() == defaults[0]

    mine = new_stream(dt, 0)
    must(lambda: torch.accelerator.set_stream(mine), "torch.accelerator.set_stream(new stream)")
    assert torch.accelerator.current_stream(0) == mine, "set_stream(s) did not make s current on its device"
    assert torch.accelerator.current_stream() == mine
    assert current_streams(n)[1:] == defaults[1:], "set_stream on device 0 changed another device's current stream"
    assert in_thread(lambda: torch.accelerator.current_stream(0)) == defaults[0], \
        "set_stream in one thread changed the current stream seen by another thread"

    theirs = new_stream(dt, 0)

    def set_in_thread():
        torch.accelerator.set_stream(theirs)
        return torch.accelerator.current_stream(0)

    assert in_thread(set_in_thread) == theirs, "set_stream in a new thread did not take effect there"
    assert torch.accelerator.current_stream(0) == mine, "set_stream in another thread changed this thread's stream"

    torch.accelerator.set_stream(defaults[0])
    assert torch.accelerator.current_stream(0) == defaults[0], "set_stream(default stream) did not restore it"
    if n > 1:
        last = new_stream(dt, n - 1)
        torch.accelerator.set_stream(last)
        assert torch.accelerator.current_device_index() == n - 1, \
            "torch.accelerator.set_stream(s) must make s's device current"
        assert torch.accelerator.current_stream(n - 1) == last
        assert torch.accelerator.current_stream(0) == defaults[0], \
            f"set_stream on device {n - 1} changed device 0's current stream"


@contract("ST-CUR-001")
def test_work_goes_to_the_current_stream(dt):
    load = Load(dt, 0)
    default = default_streams(1)[0]
    s = new_stream(dt, 0)
    for scale in SCALES:
        torch.accelerator.set_stream(s)
        load.queue(load.units * scale)
        default_done = default.query()
        s_done = s.query()
        s.synchronize()
        torch.accelerator.set_stream(default)
        assert s_done or default_done, ("with a new stream current, queued work kept the default stream busy: "
                                        "operators must run on the current stream")
        if not s_done:
            break


# ------------------------------------------------------------ synchronization


@contract("ST-SYNC-001")
def test_synchronize_waits_for_the_work(dt):
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    for scale in SCALES:
        target = load.queue_and_write(s, scale)
        in_flight = not s.query()
        must(s.synchronize, "Stream.synchronize()")
        assert must(s.query, "Stream.query()") is True, \
            "Stream.query() is False right after Stream.synchronize(): synchronize returned before the work finished"
        assert load.is_final(target), \
            "after Stream.synchronize(), the stream's result is incomplete when read from another stream"
        if in_flight:
            break


@contract("ST-SYNC-001")
def test_query_true_means_the_work_is_done(dt):
    load = Load(dt, 0)
    s = new_stream(dt, 0)
    for scale in SCALES:
        target = load.queue_and_write(s, scale)
        in_flight = not s.query()
        assert poll(s.query), f"Stream.query() stayed False for {POLL_SECONDS} s after the work was queued"
        assert load.is_final(target), \
            "Stream.query() returned True, but the stream's result was still incomplete: completion reported early"
        if in_flight:
            break


@contract("ST-SYNC-001")
def test_work_on_one_stream_runs_in_order(dt):
    elements = 1 << 19
    steps = 8
    device = torch.device(dt, 0)
    values = [torch.full((elements,), float(k + 1), dtype=torch.float64, device=device) for k in range(steps)]
    a = torch.zeros(elements, dtype=torch.float32, device=device)
    b = torch.zeros(elements, dtype=torch.float32, device=device)
    torch.accelerator.synchronize(0)
    s = new_stream(dt, 0)
    with s:
        for k in range(steps):
            a.copy_(values[k])   # converting copy: a kernel
            b.copy_(a)           # plain copy: depends on the previous kernel
    s.synchronize()
    a_host, b_host = a.cpu(), b.cpu()
    assert bool((a_host == steps).all()), \
        f"after {steps} ordered writes on one stream, the tensor holds {sorted(set(a_host.unique().tolist()))}, not {steps}"
    assert bool((b_host == steps).all()), \
        "a copy queued after a write on the same stream read another value: work on one stream ran out of order"


@contract("ST-SYNC-001")
def test_device_synchronize_waits_for_every_stream(dt):
    load = Load(dt, 0)
    # Long work on two new streams, a short write on the current one: waiting
    # for the current stream alone returns while the others still run.
    streams = [new_stream(dt, 0), new_stream(dt, 0), default_streams(1)[0]]
    for scale in SCALES:
        targets = [load.target() for _ in streams]
        for k, (s, target) in enumerate(zip(streams, targets)):
            with s:
                load.queue(load.units * scale if k < 2 else 0)
                load.write(target)
        in_flight = not streams[0].query() or not streams[1].query()
        must(torch.accelerator.synchronize, "torch.accelerator.synchronize()")
        busy = [str(s) for s in streams if not s.query()]
        assert not busy, f"after torch.accelerator.synchronize(), streams still report pending work: {busy}"
        for s, target in zip(streams, targets):
            assert load.is_final(target), f"after torch.accelerator.synchronize(), the work of {s} is incomplete"
        if in_flight:
            break


@contract("ST-DEVSYNC-001")
def test_synchronize_names_the_device(dt, n, cxx):
    last = n - 1
    load = Load(dt, last)
    pool = new_stream(dt, last)
    default = torch.accelerator.current_stream(last)
    for how, sync in (("torch.accelerator.synchronize", torch.accelerator.synchronize),
                      ("torch.accelerator.synchronize(torch.device)", lambda i: torch.accelerator.synchronize(
                          torch.device(dt, i))),
                      ("the guard's synchronizeDevice", cxx.guard_synchronize_device)):
        for scale in SCALES:
            targets = [load.target(), load.target()]
            torch.accelerator.set_device_index(0)
            # A short write on device `last`'s current stream (device 0 stays
            # current), long work on another stream of device `last`.
            load.write(targets[0])
            with pool:
                load.queue(load.units * scale)
                load.write(targets[1])
            assert torch.accelerator.current_device_index() == 0
            in_flight = not pool.query()
            must(lambda: sync(last), f"{how}({last}) with device 0 current")
            assert torch.accelerator.current_device_index() == 0, f"{how}({last}) changed the current device"
            busy = [str(s) for s in (default, pool) if not s.query()]
            assert not busy, (f"{how}({last}) with device 0 current returned while streams of device {last} "
                              f"still had work: {busy} (it must wait for every stream of the device it names)")
            assert all(load.is_final(t) for t in targets)
            if in_flight:
                break


# ------------------------------------------------------------ cross-stream order


def check_producer_consumer(dt, make_consumer_wait, consumer_is_current: bool, what: str) -> None:
    """The producer writes a target after long work; the consumer waits (by
    `make_consumer_wait`) and copies it. Conclusive when the producer was
    still busy after the consumer's copy was queued."""
    load = Load(dt, 0)
    producer = new_stream(dt, 0)
    consumer = torch.accelerator.current_stream(0) if consumer_is_current else new_stream(dt, 0)
    for scale in SCALES:
        consumed = load.target()  # first: target() synchronizes the device
        produced = load.queue_and_write(producer, scale)
        make_consumer_wait(producer, consumer)
        with consumer:
            consumed.copy_(produced)
        in_flight = not producer.query()
        consumer.synchronize()
        assert load.is_final(consumed), (f"after {what}, the consumer stream read the producer's result before "
                                         "the producer finished: the wait did not order the streams")
        producer.synchronize()
        if in_flight:
            break


@contract("ST-WAIT-001")
@pytest.mark.parametrize("consumer_is_current", [False, True], ids=["new-consumer", "current-consumer"])
def test_wait_stream_orders_consumer_after_producer(dt, consumer_is_current):
    check_producer_consumer(
        dt, lambda p, c: must(lambda: c.wait_stream(p), "Stream.wait_stream(producer)"), consumer_is_current,
        "consumer.wait_stream(producer)")


@contract("ST-WAIT-001")
@pytest.mark.parametrize("how", ["Stream.wait_event", "Event.wait"])
def test_wait_event_orders_consumer_after_producer(dt, how):
    def wait(producer, consumer):
        if how == "Stream.wait_event":
            event = must(producer.record_event, "Stream.record_event()")
            must(lambda: consumer.wait_event(event), "Stream.wait_event(event)")
        else:
            event = torch.Event(device=dt)
            must(lambda: event.record(producer), "Event.record(producer)")
            must(lambda: event.wait(consumer), "Event.wait(consumer)")

    check_producer_consumer(dt, wait, False, how)


# ------------------------------------------------------------ record_stream


@contract("ST-REC-001")
def test_record_stream_keeps_memory_until_the_stream_is_done(dt, backend):
    elements = LOAD_ELEMENTS
    device = torch.device(dt, 0)
    load = Load(dt, 0)
    side = new_stream(dt, 0)
    stats = "memory-stats" not in backend.manifest.unclaimed
    for scale in SCALES:
        baseline = torch.accelerator.memory_allocated(0) if stats else 0
        out = load.target()
        x = torch.full((elements,), 3.0, dtype=torch.float32, device=device)
        torch.accelerator.synchronize(0)
        x_start = x.data_ptr()
        x_end = x_start + x.untyped_storage().nbytes()
        with side:
            load.queue(load.units * scale)   # the side stream is busy ...
            out.copy_(x)                     # ... and reads x only afterwards
        must(lambda: x.record_stream(side), "Tensor.record_stream(stream)")
        del x
        # The current stream reuses memory of the same size at once and overwrites it.
        z = torch.empty(elements, dtype=torch.float32, device=device)
        z.fill_(-1.0)
        z_start = z.data_ptr()
        side_busy = not side.query()
        side.synchronize()
        overlaps = z_start < x_end and x_start < z_start + z.untyped_storage().nbytes()
        if side_busy:
            assert not overlaps, ("memory freed after record_stream(s) was handed to a new allocation while s "
                                  "still had work queued: the allocator must wait for s (recordDataPtrOnStream)")
        assert bool((out.cpu() == 3.0).all()), (
            "a stream read a tensor after record_stream(stream) and del, and saw it overwritten by a later "
            "allocation: memory was reused before the stream's work completed")
        del z
        if stats:
            torch.accelerator.synchronize(0)
            again = torch.empty(elements, dtype=torch.float32, device=device)
            del again
            del out
            now = torch.accelerator.memory_allocated(0)
            assert now == baseline, (
                "after record_stream, del and synchronize, memory_allocated() did not return to its previous "
                f"value ({now} != {baseline}): the recorded block was never released")
        if side_busy:
            break


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
    assert before[1][last] == previous

    s = new_stream(dt, last)
    with s:
        assert torch.accelerator.current_device_index() == last, \
            f"inside 'with torch.Stream(device={dt}:{last})', device {torch.accelerator.current_device_index()} is current"
        assert torch.accelerator.current_stream(last) == s and torch.accelerator.current_stream() == s, \
            "inside 'with stream', the stream is not current"
        inner = new_stream(dt, 0)
        with inner:
            assert torch.accelerator.current_device_index() == 0
            assert torch.accelerator.current_stream(0) == inner
            if last != 0:
                assert torch.accelerator.current_stream(last) == s, "a nested stream context changed another device's stream"
        assert torch.accelerator.current_device_index() == last, "leaving a nested stream context did not restore the device"
        assert torch.accelerator.current_stream(last) == s, "leaving a nested stream context did not restore the stream"
        if last != 0:
            assert torch.accelerator.current_stream(0) == before[1][0]
    assert _state(n) == before, f"leaving 'with stream' left {_state(n)}, not {before}"

    with pytest.raises(KeyError):
        with s:
            raise KeyError("escapes")
    assert _state(n) == before, f"an exception escaping 'with stream' left {_state(n)}, not {before}"

    # device_index switches the device only: each device keeps its current stream.
    for exc in (False, True):
        try:
            with torch.accelerator.device_index(last):
                assert torch.accelerator.current_stream() == previous, \
                    "inside torch.accelerator.device_index(i), the current stream is not device i's current stream"
                if exc:
                    raise KeyError("escapes")
        except KeyError:
            pass
        assert _state(n) == before, \
            f"leaving torch.accelerator.device_index({last}){' by an exception' if exc else ''} left {_state(n)}, not {before}"
    with torch.accelerator.device_index(None):
        assert _state(n) == before
    assert _state(n) == before
