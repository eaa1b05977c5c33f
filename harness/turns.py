"""Whose turn it is to run, when a run's tests run in parallel (pytest-xdist).

Most tests of the suite may share the machine: each runs in its own process
and compares results, not speeds. A few cannot, because what they observe
depends on what else the machine does at the same time:

* timing: a check that holds a stream with long work (conformance/_async.py)
  calibrates that work on the machine as it is, and a neighbour that starts
  or stops while the work is in flight changes how long it really runs; a
  check of ``Event.elapsed_time`` compares device time with wall-clock time;
* the device as a whole: a check that fills the device's memory (out of
  memory) or reads its free memory (``mem_get_info``) sees the other
  workers' allocations on a real device, where processes share the memory.

Those tests carry the ``exclusive`` marker, and run while no other test of
the run runs: every worker takes a turn before it forks a test, shared for
an ordinary test and exclusive for a marked one. The turns are two lock
files (flock) in a folder the xdist controller creates for the run: a
waiting exclusive turn holds the first ("the door") so that ordinary tests
queue behind it instead of starving it, then waits on the second until the
tests already running end. A verdict therefore does not depend on -j.

Without xdist there is one worker and no turns are taken.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator

MARKER = "exclusive"
MARKER_HELP = (f"{MARKER}: the test observes timing or the device as a whole (long work, elapsed time, the "
               "device's memory): in a parallel run it runs while no other test of the run runs")
# The workerinput key the controller passes the turns' folder in.
WORKER_INPUT = "privateuse1_turns"


def create_folder() -> str:
    """A fresh folder for one run's lock files (the controller's)."""
    return tempfile.mkdtemp(prefix="conformance-turns-")


def remove_folder(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


class Turns:
    """One worker's side of the run's turns (see the module's doc)."""

    def __init__(self, folder: str) -> None:
        # O_CLOEXEC (Python's default): a program a test executes does not
        # inherit the locks; a forked test process shares them with its
        # worker, which releases them when the test has reported.
        self._door = os.open(os.path.join(folder, "door"), os.O_RDWR | os.O_CREAT, 0o600)
        self._room = os.open(os.path.join(folder, "room"), os.O_RDWR | os.O_CREAT, 0o600)
        self._kept = False  # an exclusive turn kept for this worker's next test (turn's keep)

    @contextlib.contextmanager
    def turn(self, exclusive: bool, keep: bool = False) -> Iterator[None]:
        """Hold a turn while the body runs: exclusive (no other test runs) or
        shared. `keep` (exclusive only): this worker's next test runs alone
        too, so the turn is kept for it; given back and taken again, a
        neighbour's test could start in between, and the next exclusive test
        would wait for the room to empty once more."""
        if exclusive:
            if not self._kept:
                self._take_exclusive()
            self._kept = False
            try:
                yield
            finally:
                if keep:
                    self._kept = True
                else:
                    self._give_back_exclusive()
        else:
            self.give_back_kept()
            fcntl.flock(self._door, fcntl.LOCK_EX)  # (through the door: none is waiting to run alone)
            fcntl.flock(self._room, fcntl.LOCK_SH)
            fcntl.flock(self._door, fcntl.LOCK_UN)
            try:
                yield
            finally:
                fcntl.flock(self._room, fcntl.LOCK_UN)

    def _take_exclusive(self) -> None:
        fcntl.flock(self._door, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX)
        except BaseException:
            fcntl.flock(self._door, fcntl.LOCK_UN)
            raise

    def _give_back_exclusive(self) -> None:
        fcntl.flock(self._room, fcntl.LOCK_UN)
        fcntl.flock(self._door, fcntl.LOCK_UN)

    def give_back_kept(self) -> None:
        """Give back an exclusive turn kept for a test that did not take it."""
        if self._kept:
            self._kept = False
            self._give_back_exclusive()

    def close(self) -> None:
        self.give_back_kept()
        for fd in (self._door, self._room):
            with contextlib.suppress(OSError):
                os.close(fd)
