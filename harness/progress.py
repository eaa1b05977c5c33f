"""Telling a hung test from a slow one.

A test that runs past its time limit is not hung if it is still making
progress: on a machine loaded by other processes everything takes longer.
So the limit (``--contract-timeout``) only starts the watch; the verdict
hang needs evidence that the test stopped advancing:

* **blocked**: over the last window (a quarter of the time limit) the
  test's processes (its process group: the test process, its threads and any
  processes it started) used less than 1 % of one CPU. A deadlock, a wait for
  an event that never comes, or a sleep that never ends.

A test that uses the CPU is given another window, and another, up to
``HARD_LIMIT`` times its time limit (or, for a test that measures its work,
such as an operator entry, its limit plus ``REFERENCE_FACTOR`` times the
time the CPU took for that work: ``hard_limit``), after which it is a hang
whatever it does: a busy loop inside a backend call, an endless loop, or a
test so slow that it is indistinguishable from one.

Why CPU time and not the stacks: a busy loop inside one backend call and a
legitimate loop that spends most of its time on one line (a thousand calls
of the same operator) give the same stack samples, so stacks cannot tell a
spin from progress without failing correct backends. They are sampled all the
same, once, when the verdict is given (faulthandler, on a signal, writes
them to a file of its own) because they say where a hung test was stuck. CPU times come
from ``/proc/<pid>/stat``. Neither costs anything while a test is within its
limit.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from dataclasses import dataclass

WINDOWS_PER_LIMIT = 4        # the progress window: a quarter of the time limit
HARD_LIMIT = 4               # a test that keeps advancing is stopped at 4x its limit
REFERENCE_FACTOR = 4         # ... or at its limit plus 4x the reference work it measured, if longer
CPU_FLOOR = 0.01             # below 1 % of one CPU over a window: no progress
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def window(timeout: float) -> float:
    return timeout / WINDOWS_PER_LIMIT


def hard_limit(timeout: float, reference: float = 0.0) -> float:
    """Seconds after which a test that keeps advancing is a hang all the same.

    `reference`: the seconds the test says it spent on reference work so far
    (evidence.reference_work: an operator entry's CPU computing what the
    device's results are compared with, in the same process, on the same
    machine). The device does the same work, so a test whose work is large
    is given time in proportion to it: a backend as fast as the CPU, or up to
    three times slower, is never a hang however long the entry, on a loaded
    machine too (both sides slow down alike)."""
    return max(HARD_LIMIT * timeout, timeout + REFERENCE_FACTOR * reference)


def hard_limit_reason(timeout: float, reference: float) -> str:
    """What the hard limit was, for the hang's message."""
    limit = hard_limit(timeout, reference)
    if limit > HARD_LIMIT * timeout:
        return (f"still running after {limit:g} s, its time limit plus {REFERENCE_FACTOR} times the {reference:.1f} s "
                "the CPU took for the same work, although it kept using the CPU (a backend more than "
                f"{REFERENCE_FACTOR - 1} times slower than the CPU on this work, or a busy loop)")
    return (f"still running after {HARD_LIMIT} times the time limit ({limit:g} s), although it kept using the CPU "
            "(a busy loop, or a test too slow to tell from one)")


DUMP_SIGNAL = signal.SIGUSR1  # asks a test process for its threads' stacks
DUMP_WAIT = 2.0              # seconds the parent waits for them before it kills the process
_dump_file = None  # open for the life of the test process: faulthandler writes to its descriptor


def enable_stack_dump(path: str) -> None:
    """Test process side: on DUMP_SIGNAL, write every thread's stack to
    `path`. The parent sends it once, when it has judged the test hung and
    is about to kill it, never while a test may still pass: faulthandler
    reads the other threads' frames without the GIL, and a dump taken while
    those threads run can crash the process (periodic dumps once turned slow
    but correct tests into crashes)."""
    global _dump_file
    _dump_file = open(path, "w")
    faulthandler.register(DUMP_SIGNAL, file=_dump_file, all_threads=True, chain=False)


def request_stack_dump(pid: int, path: str, wait: float = DUMP_WAIT) -> str:
    """Parent side: ask the test process `pid` (judged hung) for its
    threads' stacks and return them, or "" if none came within `wait`
    seconds (a process that cannot run its signal handler). The verdict is
    already given; this only says where the threads were."""
    try:
        os.kill(pid, DUMP_SIGNAL)
    except ProcessLookupError:
        return ""
    deadline = time.monotonic() + wait
    size, text = -1, ""
    while time.monotonic() < deadline:
        time.sleep(0.05)
        text = _read(path)
        # Done when something was written and nothing more came for a while.
        if text and len(text) == size:
            break
        size = len(text)
    return text.strip()


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    # Fields after the command name, which is in parentheses and may hold anything.
    return text[text.rfind(")") + 2:].split()


def _cpu_seconds(fields: list[str]) -> float:
    # utime, stime, cutime, cstime: fields 14 to 17 of proc(5), 12 to 15 here.
    return sum(int(f) for f in fields[11:15]) / _TICKS


def group_cpu(pgid: int) -> float:
    """CPU seconds used by the processes of process group `pgid` (and the
    children they reaped)."""
    total = 0.0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0.0
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields and int(fields[2]) == pgid:  # pgrp is field 5 of proc(5)
            total += _cpu_seconds(fields)
    return total


@dataclass
class Sample:
    time: float          # monotonic seconds
    group_cpu: float     # CPU seconds of the test's process group


def sample(pid: int, now: float) -> Sample:
    return Sample(now, group_cpu(pid))


def stalled(before: Sample, after: Sample) -> str | None:
    """Why the test made no progress between two samples, or None if it did."""
    span = after.time - before.time
    if span <= 0:
        return None
    used = after.group_cpu - before.group_cpu
    if used < CPU_FLOOR * span:
        return (f"blocked: its processes used {used:.2f} s of CPU in the last {span:.0f} s "
                "(waiting for something that does not happen)")
    return None
