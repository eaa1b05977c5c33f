"""A multi-threaded stress run of OpenReg through PyTorch, with every result
checked against the same computation on the CPU.

Shared by ``tests/test_openreg_stress.py`` (short runs, each in a subprocess)
and ``benchmarks/stress.py`` (long runs). Not a test module itself (pytest
does not collect it).

What runs (:func:`run_stress`):

* ``threads`` worker threads per device, for ``devices`` devices. Each worker
  owns ``streams`` pool streams on its device and one on a peer device, and
  repeats an *iteration*: a list of steps (see :data:`WORKLOADS`) that
  allocate tensors of varied sizes (1 element to 3 MiB, several at least
  1 MiB), fill them with values that depend on the worker and the
  iteration, copy host to device (pageable, and ``non_blocking`` from pinned
  memory), device to host (pageable, and ``non_blocking`` into pinned
  memory), device to device on one device and across devices, run on-device
  operators (add, mul, sum, clone, ``_foreach_add``, dtype conversions,
  transposed and strided copies), and order streams with events,
  ``wait_stream`` and ``record_stream``. Every result is read back and
  compared with the expected tensor computed on the CPU (``torch.equal``).
  Results of the previous iteration are kept and checked again one
  iteration later, after more allocation churn.
* One more thread loops ``torch.openreg.empty_cache()`` until the workers
  are done, so that blocks go back to the runtime (and come back from it)
  while other threads allocate and copy.

The run ends for each worker at ``max_iterations``, or at the soft time limit
``seconds`` once it has done ``min_iterations`` (so a slow machine still
does the minimum work, and a fast one stops at the cap). Nothing waits
without a bound: at ``seconds + hang_timeout`` every thread is told to stop;
a thread still alive ``stop_grace`` seconds later (default 10) is reported
as hung (with its step, iteration and stack) and left behind (threads are
daemons; a caller in a subprocess should leave with ``os._exit``, as
:func:`leave` does). Exceptions of any thread are collected with their
tracebacks, never swallowed. One hang this cannot report: a device that
never finishes its work while ``empty_cache`` waits for it, because
``empty_cache`` waits holding the GIL and so stops every Python thread, the
one that joins included; run it in a subprocess with a timeout (as the
tests do).

The summary (:class:`Summary`, a dict via ``as_dict()``) has iterations,
checks, wrong results (the first few described: thread, device, iteration,
step, dtype, shape, how many elements differ, the first difference, how many
of the wrong elements are zero), exceptions, hangs, and per-thread progress.

Command line (prints the summary; ``--json`` prints it as one JSON line)::

    python tests/stress_openreg.py --devices 2 --threads 2 --seconds 10 --json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

MiB = 1 << 20
# Stop requested -> threads must have stopped within this many seconds (default).
STOP_GRACE = 10.0
# Wrong results described in full (all are counted).
MAX_DESCRIBED = 10
# A switch interval far below CPython's 5 ms: the GIL changes hands more
# often, so threads interleave more finely (empty_cache holds the GIL while
# it frees; allocations and copies run without it).
DEFAULT_SWITCH_INTERVAL = 5e-5


# --------------------------------------------------------------- summary


@dataclass
class Summary:
    devices: int
    threads_per_device: int
    streams_per_thread: int
    workload: str
    seconds_limit: float
    max_iterations: int
    min_iterations: int
    wall_s: float = 0.0
    iterations: int = 0
    checks: int = 0
    wrong: int = 0
    wrong_described: list[dict] = field(default_factory=list)
    exceptions: list[dict] = field(default_factory=list)
    hangs: list[dict] = field(default_factory=list)
    per_thread: list[dict] = field(default_factory=list)
    empty_cache_calls: int = 0
    pinned: bool = True
    allocated_before: list[int] = field(default_factory=list)
    allocated_after: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.wrong or self.exceptions or self.hangs)

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["ok"] = self.ok
        d["checks_per_s"] = round(self.checks / self.wall_s, 1) if self.wall_s else 0.0
        return d

    def text(self) -> str:
        lines = [
            f"workload {self.workload}: {self.devices} device(s) x {self.threads_per_device} "
            f"thread(s) x {self.streams_per_thread} stream(s), limit {self.seconds_limit:g} s / "
            f"{self.max_iterations} iterations per thread (at least {self.min_iterations})",
            f"wall {self.wall_s:.1f} s, {self.iterations} iterations, {self.checks} checks "
            f"({self.as_dict()['checks_per_s']} checks/s), empty_cache called "
            f"{self.empty_cache_calls} times",
            f"wrong results: {self.wrong}, exceptions: {len(self.exceptions)}, "
            f"hung threads: {len(self.hangs)}",
        ]
        per = ", ".join(f"{t['thread']}={t['iterations']}" for t in self.per_thread)
        lines.append(f"iterations per thread: {per}")
        for note in self.notes:
            lines.append(f"note: {note}")
        for w in self.wrong_described:
            lines.append("WRONG " + describe_wrong(w))
        for e in self.exceptions:
            lines.append(f"EXCEPTION in {e['thread']} (step {e['step']}, iteration "
                         f"{e['iteration']}):\n{e['traceback']}")
        for h in self.hangs:
            lines.append(f"HANG {h['thread']}: step {h['step']}, iteration {h['iteration']}, "
                         f"no progress for {h['seconds_since_progress']} s\n{h['stack']}")
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


def describe_wrong(w: dict) -> str:
    return (f"{w['thread']} (openreg:{w['device']}) iteration {w['iteration']} step {w['step']}: "
            f"{w['what']} {w['dtype']}{w['shape']}: {w['mismatched']} of {w['numel']} elements "
            f"differ ({w['mismatched_zero']} of them read 0); first at index {w['first_index']}: "
            f"expected {w['expected']}, got {w['actual']}")


# --------------------------------------------------------------- workers


class Worker:
    """One worker thread's state. Only its own thread writes to it (the
    main thread reads the counters and `step` for the report)."""

    def __init__(self, run: "_Run", index: int, device: int, peer: int) -> None:
        self.run = run
        self.index = index
        self.device = device
        self.peer = peer
        self.name = f"worker{index}@openreg:{device}"
        self.iterations = 0
        self.checks = 0
        self.step = "start"
        self.last_progress = time.monotonic()
        self.thread: threading.Thread | None = None
        self.streams: list = []
        self.peer_stream = None
        self.keep: dict[str, Any] = {}   # tensors kept across steps and iterations

    def progress(self, step: str) -> None:
        self.step = step
        self.last_progress = time.monotonic()

    def value(self, i: int, salt: int = 0) -> int:
        """A small nonzero value specific to this worker, iteration and use
        (exact in every dtype used; never 0, so a lost write shows)."""
        return (self.index * 31 + i * 7 + salt * 13) % 120 + 1

    def check(self, i: int, what: str, actual, expected) -> None:
        """Compares a CPU tensor (or a Python number) with the expected one."""
        torch = self.run.torch
        self.checks += 1
        self.last_progress = time.monotonic()
        if isinstance(expected, torch.Tensor):
            if not isinstance(actual, torch.Tensor):
                return self.run.wrong(self, i, what, actual=repr(actual), expected="a tensor")
            if actual.device.type != "cpu":
                return self.run.wrong(self, i, what, actual=f"a tensor on {actual.device}",
                                      expected="a CPU tensor")
            if actual.dtype != expected.dtype or actual.shape != expected.shape:
                return self.run.wrong(self, i, what, actual=f"{actual.dtype}{list(actual.shape)}",
                                      expected=f"{expected.dtype}{list(expected.shape)}")
            if not torch.equal(actual, expected):
                self.run.wrong_tensor(self, i, what, actual, expected)
        elif actual != expected:
            self.run.wrong(self, i, what, actual=repr(actual), expected=repr(expected))


def _pattern(torch, n: int, v: int, dtype):
    """(arange(n) % 251) + v: distinct neighbours, exact in float32."""
    return (torch.arange(n, dtype=torch.int64) % 251 + v).to(dtype)


# Sizes in elements of float32 (4 bytes): from 4 B to 3 MiB, several >= 1 MiB,
# odd sizes that are no multiple of a page or of the allocator's classes.
MIXED_SIZES = [1, 17, 1000, 4099, 65537, 262144, 300_007, 524_288 + 3, 786_432]
FILL_BYTES = 2 * MiB      # the audit's tensors
FOREACH_K = 8             # 2 MiB results of one _foreach_add


def step_fill_2mib(w: Worker, i: int) -> None:
    """2 MiB uint8 tensors filled three ways and read back: fill_ on an empty
    tensor, torch.full, and _foreach_add over zeros (eight results of one
    call: the fallback allocates and writes them one after another once its
    kernel is done, without the GIL, while empty_cache may be giving blocks
    back). The previous iteration's results are freed right before the
    _foreach_add, so that the empty_cache thread, which waits for the device
    before it frees, frees them while the results are being allocated."""
    torch, dev = w.run.torch, f"openreg:{w.device}"
    zeros = w.keep.get("zeros")
    if zeros is None:
        zeros = w.keep["zeros"] = [torch.zeros(FILL_BYTES, dtype=torch.uint8, device=dev)
                                   for _ in range(FOREACH_K)]
    v = w.value(i, 1)
    w.keep.pop("fill", None)
    w.progress("fill_2mib: fill_")
    a = torch.empty(FILL_BYTES, dtype=torch.uint8, device=dev)
    a.fill_(v)
    w.progress("fill_2mib: full")
    b = torch.full((FILL_BYTES,), v + 1, dtype=torch.uint8, device=dev)
    w.keep.pop("foreach", None)
    w.progress("fill_2mib: _foreach_add")
    outs = torch._foreach_add(zeros, v + 2)
    w.progress("fill_2mib: read back")
    w.check(i, "fill_ 2 MiB", a.cpu(), torch.full((FILL_BYTES,), v, dtype=torch.uint8))
    w.check(i, "torch.full 2 MiB", b.cpu(), torch.full((FILL_BYTES,), v + 1, dtype=torch.uint8))
    expected = torch.full((FILL_BYTES,), v + 2, dtype=torch.uint8)
    for k, o in enumerate(outs):
        w.check(i, f"_foreach_add 2 MiB result {k}", o.cpu(), expected)
    w.keep["fill"] = (a, b)
    w.keep["foreach"] = outs


def step_mixed(w: Worker, i: int) -> None:
    """One pass over copies, operators and stream ordering at one size."""
    run = w.run
    torch, openreg = run.torch, run.openreg
    dev = f"openreg:{w.device}"
    s0, s1, s2 = (w.streams * 3)[:3]
    n = MIXED_SIZES[(i + w.index) % len(MIXED_SIZES)]
    f32 = torch.float32
    v = w.value(i)

    # The previous iteration's result, checked again after a whole iteration
    # of allocation churn and empty_cache calls.
    kept = w.keep.pop("mixed", None)
    if kept is not None:
        w.progress("mixed: recheck kept")
        tensor, expected, what = kept
        with openreg.stream(s0):
            w.check(i, f"kept from iteration {i - 1}: {what}", tensor.cpu(), expected)
        del tensor

    src = _pattern(torch, n, v, f32)

    # Fill on s0.
    w.progress("mixed: fill_")
    with openreg.stream(s0):
        x = torch.empty(n, dtype=f32, device=dev)
        x.fill_(v)
    # Pageable host-to-device copy on s1 (waits for the copy).
    w.progress("mixed: h2d pageable")
    with openreg.stream(s1):
        a = src.to(dev)
    # Asynchronous host-to-device copy from pinned memory on s1; the pinned
    # source is dropped at once (the pinned allocator keeps it until the copy ran).
    w.progress("mixed: h2d pinned non_blocking")
    with openreg.stream(s1):
        b = torch.empty(n, dtype=f32, device=dev)
        if run.pinned:
            pinned = (src * 2).pin_memory()
            b.copy_(pinned, non_blocking=True)
            del pinned
        else:
            b.copy_(src * 2)
        ready = s1.record_event()
    s0.wait_event(ready)

    # Operators on s0 (after s1's copies through the event).
    w.progress("mixed: operators")
    with openreg.stream(s0):
        c = b.add(a).mul(3)                     # 9 * src
        d = c.clone()
        d.add_(x)                               # 9 * src + v
        ints = d.to(torch.int32)                # conversion kernel (asynchronous)
        total = ints.sum()                      # int64, exact
        e = d.to(torch.float64)
    exp_c = src * 9
    exp_d = exp_c + v
    with openreg.stream(s0):
        w.check(i, "add/mul", c.cpu(), exp_c)
        w.check(i, "clone + add_", d.cpu(), exp_d)
        w.check(i, "to(float64)", e.cpu(), exp_d.double())
        w.check(i, "int32 sum", total.item(), int(exp_d.to(torch.int32).sum()))

    # Non-contiguous copies on s0: a transpose, a strided slice, a strided
    # destination.
    w.progress("mixed: non-contiguous copies")
    rows = next(r for r in (7, 5, 3, 2, 1) if n % r == 0)
    with openreg.stream(s0):
        t = torch.empty(n // rows, rows, dtype=f32, device=dev)
        t.copy_(d.view(rows, n // rows).t())
        sl = d[::3].clone()
        z = torch.zeros(2 * n, dtype=f32, device=dev)
        z[1::2].copy_(d)
        w.check(i, "transposed copy", t.cpu(), exp_d.view(rows, n // rows).t().contiguous())
        w.check(i, "strided slice clone", sl.cpu(), exp_d[::3].contiguous())
        exp_z = torch.zeros(2 * n, dtype=f32)
        exp_z[1::2] = exp_d
        w.check(i, "strided destination copy", z.cpu(), exp_z)

    # Device-to-host into pinned memory, asynchronously on s2 after s0.
    w.progress("mixed: d2h pinned non_blocking")
    s2.wait_stream(s0)
    with openreg.stream(s2):
        if run.pinned:
            host = torch.empty(n, dtype=f32, pin_memory=True)
            host.copy_(d, non_blocking=True)
            other = d.to("cpu", non_blocking=True)   # pinned result, filled later
            done = s2.record_event()
            done.synchronize()
        else:
            host = d.cpu()
            other = d.cpu()
    w.check(i, "d2h into pinned memory (non_blocking)", host, exp_d)
    w.check(i, "to('cpu', non_blocking=True)", other, exp_d)

    # record_stream: q is allocated on s1 and read by an asynchronous copy on
    # s2, then freed while that copy may still be queued. A tensor allocated
    # on s1 right after must not get q's block before s2 is done with it.
    w.progress("mixed: record_stream")
    s1.wait_stream(s0)
    with openreg.stream(s1):
        q = d.mul(2)                            # 18 * src + 2v, allocated on s1
    s2.wait_stream(s1)
    with openreg.stream(s2):
        r = torch.empty_like(q)                 # allocated on s2
        r.copy_(q)                              # asynchronous device copy on s2
    q.record_stream(s2)
    del q
    with openreg.stream(s1):
        clobber = torch.empty(n, dtype=f32, device=dev)
        clobber.fill_(-7.0)
    with openreg.stream(s2):
        w.check(i, "copy of a record_stream'ed tensor", r.cpu(), exp_d * 2)
    with openreg.stream(s1):
        w.check(i, "fill_ after record_stream free", clobber.cpu(), torch.full((n,), -7.0))

    # Between devices: plain and non_blocking copies to the peer, an
    # operator there, and back.
    if w.peer != w.device:
        w.progress("mixed: peer copies")
        peer = f"openreg:{w.peer}"
        # s0 stays current on the own device, so that the copies order
        # themselves after it (the source's current stream).
        with openreg.stream(s0):
            y = d.to(peer)                      # on the peer's current (default) stream
            with openreg.stream(w.peer_stream):
                y2 = torch.empty(n, dtype=f32, device=peer)
                y2.copy_(d, non_blocking=True)  # staged on s0, landed on the peer stream
                y3 = y2.add(1)                  # an operator on the peer
                back = torch.empty(n, dtype=f32, device=dev)
                back.copy_(y3, non_blocking=True)   # to the own device, on s0 after the peer stream
            back2 = back.sub(1)
        w.check(i, "copy to peer", y.cpu(), exp_d)
        with openreg.stream(w.peer_stream):
            w.check(i, "non_blocking copy to peer", y2.cpu(), exp_d)
            w.check(i, "add on peer", y3.cpu(), exp_d + 1)
        with openreg.stream(s0):
            w.check(i, "copy back from peer", back2.cpu(), exp_d)
        w.keep["mixed"] = (y3, exp_d + 1, "add on peer")
    else:
        w.keep["mixed"] = (d, exp_d, "clone + add_")


_NEVER = threading.Event()   # never set: what a hung thread waits for in the self-test


def step_selftest(w: Worker, i: int) -> None:
    """Checks the checker (``--workload selftest``, with at least 4 threads):
    at iteration 1, worker 0 raises, worker 1 gets a wrong result and
    worker 2 blocks for good; the others run small fills. The run must
    report exactly these (test_openreg_stress.py checks that it does)."""
    torch = w.run.torch
    if i == 1 and w.index == 0:
        raise RuntimeError("selftest: raised on purpose")
    if i == 1 and w.index == 1:
        w.check(i, "selftest: wrong on purpose", torch.zeros(4), torch.ones(4))
    if i == 1 and w.index == 2:
        w.progress("selftest: blocked on purpose")
        _NEVER.wait()
    v = w.value(i)
    x = torch.full((1000,), v, dtype=torch.int32, device=f"openreg:{w.device}")
    w.check(i, "selftest: fill", x.cpu(), torch.full((1000,), v, dtype=torch.int32))


WORKLOADS: dict[str, list[Callable[[Worker, int], None]]] = {
    # Everything, the 2 MiB fills included.
    "mixed": [step_mixed, step_fill_2mib],
    # The audit's scenario only: 2 MiB fills read back while empty_cache loops.
    "fill": [step_fill_2mib],
    # The checker's own check: a raise, a wrong result and a hang, on purpose.
    "selftest": [step_selftest],
}


# ------------------------------------------------------------------- run


class _Run:
    def __init__(self, torch, openreg, summary: Summary) -> None:
        self.torch = torch
        self.openreg = openreg
        self.summary = summary
        self.lock = threading.Lock()
        self.stop = threading.Event()          # stop now (hard limit, or enough wrong results)
        self.pinned = True
        self.stop_after_wrong: int | None = None

    def wrong(self, w: Worker, i: int, what: str, actual: str, expected: str,
              **extra: Any) -> None:
        entry = {"thread": w.name, "device": w.device, "iteration": i, "step": w.step,
                 "what": what, "dtype": "", "shape": [], "numel": 0, "mismatched": 0,
                 "mismatched_zero": 0, "first_index": None, "expected": expected,
                 "actual": actual}
        entry.update(extra)
        with self.lock:
            self.summary.wrong += 1
            if len(self.summary.wrong_described) < MAX_DESCRIBED:
                self.summary.wrong_described.append(entry)
            if self.stop_after_wrong and self.summary.wrong >= self.stop_after_wrong:
                self.stop.set()

    def wrong_tensor(self, w: Worker, i: int, what: str, actual, expected) -> None:
        torch = self.torch
        a, e = actual.reshape(-1), expected.reshape(-1)
        diff = (a != e) & ~(torch.isnan(a) & torch.isnan(e)) if a.is_floating_point() else a != e
        idx = diff.nonzero().reshape(-1)
        first = int(idx[0]) if idx.numel() else None
        self.wrong(w, i, what,
                   actual=repr(a[first].item()) if first is not None else "?",
                   expected=repr(e[first].item()) if first is not None else "?",
                   dtype=str(expected.dtype).replace("torch.", ""), shape=list(expected.shape),
                   numel=expected.numel(), mismatched=int(idx.numel()),
                   mismatched_zero=int((a[idx] == 0).sum()) if idx.numel() else 0,
                   first_index=first)

    def exception(self, name: str, step: str, iteration: int, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        with self.lock:
            self.summary.exceptions.append({"thread": name, "step": step, "iteration": iteration,
                                            "type": type(exc).__name__,
                                            "message": str(exc).split("\n")[0][:500],
                                            "traceback": tb[-4000:]})


def _worker_main(w: Worker, steps, soft_deadline: float, max_iterations: int,
                 min_iterations: int) -> None:
    run = w.run
    torch, openreg = run.torch, run.openreg
    try:
        w.progress("setup")
        openreg.set_device(w.device)
        w.streams = [openreg.Stream(device=w.device) for _ in range(run.summary.streams_per_thread)]
        w.peer_stream = openreg.Stream(device=w.peer)
        while not run.stop.is_set() and w.iterations < max_iterations:
            if w.iterations >= min_iterations and time.monotonic() >= soft_deadline:
                break
            for step in steps:
                if run.stop.is_set():
                    break
                w.progress(step.__name__)
                step(w, w.iterations)
            w.iterations += 1
        w.progress("done")
    except BaseException as exc:  # noqa: BLE001 - reported, never swallowed
        run.exception(w.name, w.step, w.iterations, exc)
    finally:
        w.keep.clear()
        try:
            torch.openreg.synchronize(w.device)
        except BaseException as exc:  # noqa: BLE001
            run.exception(w.name, "final synchronize", w.iterations, exc)


def _emptier_main(run: _Run, workers_done: threading.Event, counter: list[int],
                  state: dict) -> None:
    try:
        while not workers_done.is_set() and not run.stop.is_set():
            run.openreg.empty_cache()
            counter[0] += 1
            state["last_progress"] = time.monotonic()
    except BaseException as exc:  # noqa: BLE001
        run.exception("empty_cache", "empty_cache", counter[0], exc)


def _stack_of(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(no Python frame)"


def run_stress(devices: int = 2, threads: int = 2, streams: int = 3, seconds: float = 10.0,
               max_iterations: int = 1000, min_iterations: int = 3,
               hang_timeout: float = 120.0, workload: str = "mixed",
               empty_cache: bool = True, switch_interval: float | None = DEFAULT_SWITCH_INTERVAL,
               stop_after_wrong: int | None = None, stop_grace: float = STOP_GRACE) -> Summary:
    """Runs the stress workload (see the module docstring) and returns its
    summary. `devices` must not exceed the process's OpenReg device count
    (``OPENREG_DEVICE_COUNT``, read when ``openreg`` is first imported).

    Each worker stops after `max_iterations`, or after `seconds` once it has
    done `min_iterations`. At ``seconds + hang_timeout`` all threads are
    stopped; one that is still running `stop_grace` seconds later is
    reported as hung. `stop_after_wrong`: stop everything after that many
    wrong results (None: never)."""
    import torch
    import openreg

    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}: one of {sorted(WORKLOADS)}")
    available = torch.openreg.device_count()
    if devices < 1 or devices > available:
        raise ValueError(f"{devices} devices requested, this process has {available} "
                         "(set OPENREG_DEVICE_COUNT before importing openreg)")
    summary = Summary(devices=devices, threads_per_device=threads, streams_per_thread=streams,
                      workload=workload, seconds_limit=seconds, max_iterations=max_iterations,
                      min_iterations=min_iterations)
    run = _Run(torch, openreg, summary)
    run.stop_after_wrong = stop_after_wrong
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError as exc:
        run.pinned = summary.pinned = False
        summary.notes.append(f"pinned memory unavailable, pageable copies instead: {exc}")

    gc.collect()
    summary.allocated_before = [torch.openreg.memory_allocated(d) for d in range(devices)]
    old_interval = sys.getswitchinterval()
    if switch_interval:
        sys.setswitchinterval(switch_interval)
    start = time.monotonic()
    soft_deadline = start + seconds
    hard_deadline = soft_deadline + hang_timeout
    workers = [Worker(run, k * devices + d, d, (d + 1) % devices)
               for k in range(threads) for d in range(devices)]
    workers_done = threading.Event()
    counter = [0]
    emptier_state = {"last_progress": start}
    steps = WORKLOADS[workload]
    try:
        for w in workers:
            w.thread = threading.Thread(target=_worker_main, name=w.name, daemon=True,
                                        args=(w, steps, soft_deadline, max_iterations,
                                              min_iterations))
        emptier = threading.Thread(target=_emptier_main, name="empty_cache", daemon=True,
                                   args=(run, workers_done, counter, emptier_state))
        for w in workers:
            w.thread.start()
        if empty_cache:
            emptier.start()

        # Bounded waits only: join in slices until the hard deadline.
        while any(w.thread.is_alive() for w in workers) and time.monotonic() < hard_deadline:
            for w in workers:
                w.thread.join(timeout=max(0.0, min(0.5, hard_deadline - time.monotonic())))
        workers_done.set()
        run.stop.set()
        grace_end = time.monotonic() + stop_grace
        others = [w.thread for w in workers] + ([emptier] if empty_cache else [])
        for t in others:
            t.join(timeout=max(0.0, grace_end - time.monotonic()))
        now = time.monotonic()
        for w in workers:
            if w.thread.is_alive():
                summary.hangs.append({"thread": w.name, "step": w.step, "iteration": w.iterations,
                                      "seconds_since_progress": round(now - w.last_progress, 1),
                                      "stack": _stack_of(w.thread)})
        if empty_cache and emptier.is_alive():
            summary.hangs.append({"thread": "empty_cache", "step": "empty_cache",
                                  "iteration": counter[0],
                                  "seconds_since_progress":
                                      round(now - emptier_state["last_progress"], 1),
                                  "stack": _stack_of(emptier)})
    finally:
        sys.setswitchinterval(old_interval)
    summary.wall_s = round(time.monotonic() - start, 2)
    summary.empty_cache_calls = counter[0]
    summary.iterations = sum(w.iterations for w in workers)
    summary.checks = sum(w.checks for w in workers)
    if not summary.hangs:
        # Every worker dropped its tensors: the bytes allocated are back where they were.
        gc.collect()
        for d in range(devices):
            torch.openreg.synchronize(d)
        summary.allocated_after = [torch.openreg.memory_allocated(d) for d in range(devices)]
        if summary.allocated_after != summary.allocated_before:
            summary.notes.append(f"memory_allocated per device was {summary.allocated_before} "
                                 f"before the run and is {summary.allocated_after} after it")
    summary.per_thread = [{"thread": w.name, "iterations": w.iterations, "checks": w.checks,
                           "step": w.step} for w in workers]
    return summary


# ---------------------------------------------------------- command line


def add_arguments(parser: argparse.ArgumentParser, seconds: float) -> None:
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="worker threads per device")
    parser.add_argument("--streams", type=int, default=3, help="streams per worker thread")
    parser.add_argument("--seconds", type=float, default=seconds,
                        help="soft time limit (each thread still does --min-iterations)")
    parser.add_argument("--max-iterations", type=int, default=1_000_000,
                        help="iterations per thread at most")
    parser.add_argument("--min-iterations", type=int, default=3,
                        help="iterations per thread at least (unless it hangs or fails)")
    parser.add_argument("--hang-timeout", type=float, default=120.0,
                        help="seconds after --seconds at which running threads count as hung")
    parser.add_argument("--stop-grace", type=float, default=STOP_GRACE,
                        help="seconds stopped threads get to finish before they count as hung")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="mixed")
    parser.add_argument("--no-empty-cache", action="store_true",
                        help="no thread looping torch.openreg.empty_cache()")
    parser.add_argument("--switch-interval", type=float, default=DEFAULT_SWITCH_INTERVAL,
                        help="sys.setswitchinterval during the run (0: leave it)")
    parser.add_argument("--stop-after-wrong", type=int, default=None,
                        help="stop all threads after this many wrong results")


def run_from_args(args: argparse.Namespace) -> Summary:
    """Sets the device count for OpenReg (before it is imported) and runs."""
    if "openreg" not in sys.modules:
        os.environ["OPENREG_DEVICE_COUNT"] = str(max(args.devices, 1))
    return run_stress(devices=args.devices, threads=args.threads, streams=args.streams,
                      seconds=args.seconds, max_iterations=args.max_iterations,
                      min_iterations=args.min_iterations, hang_timeout=args.hang_timeout,
                      workload=args.workload, empty_cache=not args.no_empty_cache,
                      switch_interval=args.switch_interval or None,
                      stop_after_wrong=args.stop_after_wrong, stop_grace=args.stop_grace)


def leave(code: int, hung: bool) -> None:
    """Exits; with hung threads without waiting for them (a thread stuck in
    the backend could keep interpreter shutdown from finishing)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if hung:
        os._exit(code)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser, seconds=10.0)
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    args = parser.parse_args(argv)
    summary = run_from_args(args)
    print(json.dumps(summary.as_dict()) if args.json else summary.text(), flush=True)
    leave(0 if summary.ok else 1, bool(summary.hangs))


if __name__ == "__main__":
    main()
