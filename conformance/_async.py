"""Deterministic observation of asynchronous work, for the stream, event,
copy and allocator checks.

Ordering rules ("query() is False while work is pending", "synchronize waits
for the work", "the consumer runs after the producer", "memory is not reused
while a stream still uses it") can only be seen while work is in flight. The
kit forces that window instead of hoping for it:

* **A gate** (certain): if the backend's instrumentation offers
  ``block_stream(stream) -> release``, the kit holds the stream at a point of
  its queue, makes its observation, and releases it. Everything queued
  behind the gate is then certainly pending, whatever the machine's load.
  While a stream is held, a check queues only the work under test (copies
  between device tensors): any other operator may be synchronous on some
  backend and would wait for the hold.
  A call that must wait for held work is given a release from another thread
  after RELEASE_DELAY: it must not return before the release (a correct
  backend cannot; one that does not wait returns at once). A held stream is
  always released after GATE_LIMIT seconds, so the kit never leaves a stream
  blocked (a backend that legitimately waits on it only takes longer).
* **Long work** (probable): without a gate, the kit queues device work long
  enough to still be running when it looks (device-to-device copies,
  calibrated per device), ending with a marker: a 4-byte copy of a value
  used once. Whether the work is still pending is *seen*, not asked of the
  API under test: the marker is read on a stream of its own (``peek``),
  which no other stream's work orders. Work seen pending before a call that
  must wait for it, and seen done when the call returns, is evidence; work
  seen pending after such a call returned is a failure. When the work is
  seen done before the call, nothing is learnt: the check escalates the
  amount of work (SCALES), and if no scale shows work in flight, its clause
  is undecided (``unobserved``): a check that could not observe never
  passes. On a backend that computes synchronously (it does not claim the
  async-operators feature) the clause is not applicable instead: nothing is
  ever in flight there, so no ordering rule can be broken.

Which of the two a check used is recorded in its result (Hold.certain).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from privateuse1_conformance.harness.evidence import not_applicable, undecided

from ._helpers import check, in_thread, must, scope

# Elements of the background load's buffers (2 MiB of float32 per copy).
LOAD_ELEMENTS = 1 << 19
# Device time one load aims at: long enough to still be running when the host
# asks, short enough to keep the suite fast.
LOAD_SECONDS = 0.03
LOAD_MAX_UNITS = 256
# A check whose observation was inconclusive (the work had already finished
# when the host looked) is repeated with this many times more work.
SCALES = (1, 4, 16)
GATE_LIMIT = 5.0       # seconds after which a held stream is released whatever happens
RELEASE_DELAY = 0.3    # seconds a call that must wait for a held stream is given to return early
MARKERS = 256          # markers of one Load: each hold of long work uses one, once
SAMPLES, SAMPLE_SIZE = 16, 16  # pieces (and their elements) an unordered read of a long write's target looks at


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
        # The markers that end held long work (see the module's doc): slot k
        # is written with k + 1 by the k-th hold, once.
        self.markers = must(lambda: torch.zeros(MARKERS).to(self.device), f"Tensor.to({self.device})")
        self.marks = must(lambda: torch.arange(1, MARKERS + 1, dtype=torch.float32).to(self.device),
                          f"Tensor.to({self.device})")
        self.used_markers = 0
        self._side: torch.Stream | None = None
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

    def target(self, scale: int = 1) -> torch.Tensor:
        """A zero-filled float32 target (of `scale` times the elements);
        synchronizes so that the zeros are final."""
        t = torch.zeros(self.elements * scale, dtype=torch.float32, device=self.device)
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

    def mark(self, stream) -> int:
        """Queue on `stream` the write of a fresh marker; returns its slot."""
        slot = self.used_markers
        if slot >= MARKERS:
            raise RuntimeError("suite bug: a Load's markers are used up (make a new Load)")
        self.used_markers += 1
        with stream:
            self.markers[slot:slot + 1].copy_(self.marks[slot:slot + 1])
        return slot

    def _unordered(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` read to the host on a stream of its own: the read waits
        for no other stream, so it shows how far the device got."""
        if self._side is None:
            self._side = new_stream(self.device.type, self.device.index)
        with self._side:
            return tensor.to("cpu")

    def peek(self, slot: int) -> bool:
        """Whether marker `slot` was written (an unordered read)."""
        return float(self._unordered(self.markers[slot])) == slot + 1

    def progress(self, target: torch.Tensor) -> tuple[bool, bool]:
        """(begun, finished) of the write of `target`, read without waiting
        for it (see peek): SAMPLES short contiguous pieces spread over it (a
        strided view would need a device kernel to gather, which a backend
        may order after all work), so that the read is short beside the
        write. A write seen unfinished certainly was; one seen finished
        probably was (the pieces written early)."""
        count = target.numel()
        starts = sorted({min(count - SAMPLE_SIZE, k * count // SAMPLES) for k in range(SAMPLES)} | {count - SAMPLE_SIZE})
        written = [bool((self._unordered(target[start:start + SAMPLE_SIZE]) == self.value).all()) for start in starts]
        return any(written), all(written)

    def seen_final(self, target: torch.Tensor) -> bool:
        """Whether `target` already holds the written value (see progress)."""
        return self.progress(target)[1]


class Hold:
    """A stream kept from running what is queued on it after this point, until
    `release()` (see the module's doc). `certain` is True for a gate of the
    backend's instrumentation, False for long work that is probably still
    running."""

    def __init__(self, stream, release: Callable[[], None], certain: bool,
                 unfinished: Callable[[], bool] | None = None,
                 progress: Callable[[], tuple[bool, bool]] | None = None) -> None:
        self.stream = stream
        self.certain = certain
        self._release = release
        self._lock = threading.Lock()
        self._held = True
        self._unfinished = unfinished   # long work: whether it is seen unfinished (an unordered read)
        self._progress = progress       # one long task: (begun, finished), seen likewise
        self.overlapped = False   # whether the work was ever seen pending
        self._timer: threading.Timer | None = None
        if certain:
            self._timer = threading.Timer(GATE_LIMIT, self.release)
            self._timer.daemon = True
            self._timer.start()

    @property
    def held(self) -> bool:
        """Whether the gate is still closed (always False for long work, which
        the kit cannot know to be running)."""
        return self.certain and self._held

    def pending(self) -> bool:
        """Whether the held work is still pending now: the gate is closed, or
        the long work is seen unfinished by a read on another stream."""
        pending = self.held if self.certain else self._unfinished()
        self.overlapped |= pending
        return pending

    def running(self) -> bool:
        """Wait until the held task is seen running: a gate holds it running
        already; one long task, until its write is seen begun. False when it
        was seen finished first (it ran too fast to catch), or not seen begun
        within GATE_LIMIT (a backend may start queued work late, say when the
        host waits: nothing was observed then, which decides nothing)."""
        if self.certain or self._progress is None:
            return self.pending()
        deadline = time.monotonic() + GATE_LIMIT
        pause = 0.0002
        while time.monotonic() < deadline:
            begun, finished = self._progress()
            if finished:
                return False
            if begun:
                self.overlapped = True
                return True
            time.sleep(pause)
            pause = min(pause * 2, 0.005)
        return False

    def release(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False  # first: a call that returns after the release must never see it held
        self._release()
        if self._timer is not None:
            self._timer.cancel()

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def hold(backend, stream, load: Load | None = None, scale: int = 1, gate: bool = True) -> Hold:
    """Hold `stream`: with the backend's gate if it has one, else by queuing
    `scale` times `load`'s calibrated work on it (needs `load`). `gate`
    False: long work even where a gate exists, for a call that may wait for
    the device while holding the interpreter's lock (the gate's release,
    Python code on another thread, could then never run)."""
    block = backend.instrument("block_stream") if gate else None
    if block is not None:
        release = must(lambda: block(stream), "the instrumentation's block_stream(stream)")
        return Hold(stream, release, certain=True)
    if load is None:
        raise ValueError("suite bug: hold() without a gate needs a Load")
    with stream:
        load.queue(load.units * scale)
    marker = load.mark(stream)
    return Hold(stream, lambda: None, certain=False, unfinished=lambda: not load.peek(marker))


def running_task(backend, stream, load: Load, scale: int = 1) -> Hold:
    """The stream's only task running, nothing queued behind it: the state in
    which a backend may wrongly treat the stream as idle because its queue
    is empty. With the gate, a hold (block_stream returns once the hold
    runs); without, one long task: a converting write of `scale` times
    `load`'s elements (one kernel, from a broadcast source), seen running
    while an unordered read of its target finds it unfinished."""
    block = backend.instrument("block_stream")
    if block is not None:
        return hold(backend, stream)
    target = load.target(scale)
    with stream:
        target.view(scale, -1).copy_(load.src.expand(scale, -1))
    return Hold(stream, lambda: None, certain=False, unfinished=lambda: not load.seen_final(target),
                progress=lambda: load.progress(target))


def waited(call: Callable[[], Any], held: Hold, keep: bool = False) -> tuple[Any, bool | None]:
    """Run `call`, which may wait for work behind `held`: another thread
    releases a gate after RELEASE_DELAY. Returns (its result, whether it
    returned while the work was still held or pending); None when the work
    was not seen pending before the call (nothing to wait for: no evidence).
    `keep`: a gate that the call returned under stays closed (until the hold
    ends), so that what the check does next happens while the work is held."""
    if not held.certain:
        before = held.pending()
        result = call()
        return result, (held.pending() if before else None)
    releaser = threading.Timer(RELEASE_DELAY, held.release)
    releaser.daemon = True
    releaser.start()
    early = False
    try:
        result = call()
        early = held.held
    finally:
        if keep and early:
            releaser.cancel()
        else:
            held.release()
            releaser.cancel()
    return result, early


def unobserved(backend, clauses, what: str) -> None:
    """No scale showed work in flight for the checks of `clauses` (see the
    module's doc): on a backend that computes synchronously the clauses do
    not apply; on any other they are undecided, never passed."""
    for clause in [clauses] if isinstance(clauses, str) else clauses:
        if "async-operators" in backend.manifest.unclaimed:
            not_applicable(clause, f"{what}: the work was always complete before the host looked, and the backend "
                                   "computes synchronously (it does not claim async-operators): nothing is ever in "
                                   "flight for this rule to order")
        else:
            undecided(clause, f"{what}: no work was seen in flight when it mattered, at any scale (long work up "
                              f"to {SCALES[-1]}x the calibrated amount, or the instrumentation's block_stream gate), "
                              "so the rule could not be observed")


def poll(condition: Callable[[], bool], until: Callable[[], bool] | None = None) -> bool:
    """Wait for `condition()`; with `until`, give up (False) once `until()`
    has become true and `condition()` still is not. Backs off, so that a
    test that waits uses almost no CPU (see harness/progress.py)."""
    pause = 0.0002
    while True:
        if condition():
            return True
        if until is not None and until():
            return bool(condition())
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def default_streams(n: int) -> list[torch.Stream]:
    """Each device's default stream: the current stream of a fresh thread."""
    return in_thread(lambda: [torch.accelerator.current_stream(i) for i in range(n)])


def current_streams(n: int) -> list[torch.Stream]:
    return [torch.accelerator.current_stream(i) for i in range(n)]


def new_stream(dt: str, index: int = 0, **kwargs) -> torch.Stream:
    return must(lambda: torch.Stream(device=torch.device(dt, index), **kwargs),
                f"torch.Stream(device='{dt}:{index}'{', ' if kwargs else ''}"
                f"{', '.join(f'{k}={v}' for k, v in kwargs.items())})")


# ------------------------------------------------------------ cross-stream order


# How long a consumer may take to (wrongly) finish while its producer is held.
CONSUMER_GRACE_S = 1.0


def check_producer_consumer(dt, backend, make_consumer_wait, consumer_is_current: bool, clause: str, what: str,
                            consume: Callable[..., None] | None = None) -> None:
    """The producer writes a target behind held work; the consumer waits (by
    `make_consumer_wait`) and copies it. While the producer is held the
    consumer must not have finished; once all is done it holds the result.

    `consume(producer, consumer, consumed, produced)`, when given, replaces
    the wait and the copy: it must make the consumer stream wait for the
    producer and then copy `produced` on the consumer, into `consumed` or
    into a new tensor that it returns (for example a compiled function
    called with the consumer current). It runs once before the observation,
    unheld, so that one-time work (tracing, compiling) is not mistaken for
    the wait."""
    load = Load(dt, 0)
    producer = new_stream(dt, 0)
    consumer = torch.accelerator.current_stream(0) if consumer_is_current else new_stream(dt, 0)
    if consume is None:
        def consume(producer, consumer, consumed, produced):
            make_consumer_wait(producer, consumer)
            with consumer:
                consumed.copy_(produced)
    else:
        with scope(clause):
            consume(producer, consumer, load.target(), load.target())
        consumer.synchronize()
    for scale in SCALES:
        consumed = load.target()  # first: target() synchronizes the device
        produced = load.target()
        with hold(backend, producer, load, scale) as held:
            with producer:
                load.write(produced)
            with scope(clause):
                copied = consume(producer, consumer, consumed, produced)
            if copied is not None:
                consumed = copied
            consumer_done = consumer.query()
            if held.held:
                # The producer is certainly held: give a consumer that does not
                # wait the time to finish (its worker may not have run yet on a
                # busy machine), so that a missing wait shows here, not only
                # in a race after the hold ends. Bounded: a correct consumer
                # never finishes while the producer is held.
                deadline = time.monotonic() + CONSUMER_GRACE_S
                while not consumer_done and time.monotonic() < deadline:
                    time.sleep(0.005)
                    consumer_done = consumer.query()
            # (after the consumer's answer: the producer was pending while it answered)
            conclusive = held.pending()
        if conclusive:
            check(clause, not consumer_done,
                  f"after {what}, the consumer stream finished while the producer was still held or pending: the wait "
                  "did not order the streams")
        consumer.synchronize()
        check(clause, load.is_final(consumed), f"after {what}, the consumer stream read the producer's result before "
                                               "the producer finished: the wait did not order the streams",
              observed=conclusive)
        producer.synchronize()
        if conclusive:
            break
    else:
        unobserved(backend, clause, f"the consumer after {what} while the producer had work in flight")
