"""Parallel runs of the suite (pytest-xdist, the CLI's default): tests that
observe timing or the device as a whole run alone (harness/turns.py), and
the CLI's -j says what it does."""

from __future__ import annotations

import argparse
import ast
import fcntl
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from privateuse1_conformance.harness import cli, turns

from kit_support import REPO

SUITE = REPO / "conformance"
# What makes a test's observation depend on what else the machine does: long
# work held on a stream and calibrated on the machine as it is
# (conformance/_async.py), and the device's memory as a whole (its free
# memory, filling it until it is out of memory).
MACHINE_WIDE = {"Load", "hold", "running_task", "mem_get_info", "get_memory_info", "OutOfMemoryError"}


def _reached_names(tree: ast.Module) -> dict[str, tuple[set[str], bool]]:
    """test function -> (the MACHINE_WIDE names it reaches through the module's
    own helpers, whether it carries the exclusive marker)."""
    tops = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    uses = {name: {x.id if isinstance(x, ast.Name) else x.attr for x in ast.walk(node)
                   if isinstance(x, (ast.Name, ast.Attribute))} for name, node in tops.items()}

    def reach(name: str, seen: set[str]) -> set[str]:
        if name in seen:
            return set()
        seen.add(name)
        found = uses.get(name, set()) & MACHINE_WIDE
        for used in uses.get(name, set()) & set(tops):
            found |= reach(used, seen)
        return found

    out = {}
    for name, node in tops.items():
        if name.startswith("test_"):
            marked = any(isinstance(d, ast.Attribute) and d.attr == turns.MARKER for d in node.decorator_list)
            out[name] = (reach(name, set()), marked)
    return out


def test_tests_that_observe_timing_or_the_whole_device_are_exclusive():
    """A test is marked exclusive exactly when it reaches long work or the
    device's memory as a whole: unmarked, a neighbour could change its
    verdict; marked without need, it costs the run its parallelism."""
    wrong = []
    for path in sorted(SUITE.glob("test_*.py")):
        for test, (names, marked) in _reached_names(ast.parse(path.read_text())).items():
            if bool(names) != marked:
                wrong.append(f"{path.name}::{test} reaches {sorted(names) or 'nothing machine-wide'} but is "
                             f"{'' if marked else 'not '}marked {turns.MARKER}")
    assert not wrong, "\n".join(wrong)


def _holder(folder: str, exclusive: bool, name: str, log: str, release: str | None) -> None:
    """Take a turn, note it in `log`, hold it until the file `release` exists."""
    with turns.Turns(folder).turn(exclusive):
        with open(log, "a") as f:
            f.write(f"{name} in\n")
        while release is not None and not os.path.exists(release):
            time.sleep(0.01)
        with open(log, "a") as f:
            f.write(f"{name} out\n")


def _wait_for(condition, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"not within {limit:g} s: {what}"
        time.sleep(0.01)


def _door_taken(folder: str) -> bool:
    fd = os.open(os.path.join(folder, "door"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_an_exclusive_turn_waits_for_running_tests_and_goes_before_later_ones(tmp_path):
    """A runs (shared); B asks to run alone and waits for A; C, asking after
    B, waits for B although A's kind of turn could share: B is not starved."""
    folder, log = str(tmp_path), str(tmp_path / "log")
    context = multiprocessing.get_context("fork")
    a = context.Process(target=_holder, args=(folder, False, "A", log, str(tmp_path / "release-a")))
    a.start()
    _wait_for(lambda: os.path.exists(log) and "A in" in Path(log).read_text(), "A's turn")
    b = context.Process(target=_holder, args=(folder, True, "B", log, str(tmp_path / "release-b")))
    b.start()
    _wait_for(lambda: _door_taken(folder), "B waiting at the door")
    c = context.Process(target=_holder, args=(folder, False, "C", log, None))
    c.start()
    (tmp_path / "release-a").touch()
    _wait_for(lambda: "B in" in Path(log).read_text(), "B's turn after A's")
    (tmp_path / "release-b").touch()
    for process in (a, b, c):
        process.join(60)
        assert process.exitcode == 0
    assert Path(log).read_text().split("\n")[:-1] == ["A in", "A out", "B in", "B out", "C in", "C out"]


def test_shared_turns_run_together(tmp_path):
    folder, log = str(tmp_path), str(tmp_path / "log")
    context = multiprocessing.get_context("fork")
    first = context.Process(target=_holder, args=(folder, False, "A", log, str(tmp_path / "release")))
    first.start()
    _wait_for(lambda: os.path.exists(log) and "A in" in Path(log).read_text(), "A's turn")
    second = context.Process(target=_holder, args=(folder, False, "B", log, None))
    second.start()
    second.join(60)  # B ran while A still held its turn
    assert second.exitcode == 0 and "B out" in Path(log).read_text() and "A out" not in Path(log).read_text()
    (tmp_path / "release").touch()
    first.join(60)
    assert first.exitcode == 0


def _blocked_on(path: str) -> bool:
    """Whether a process waits for a flock on `path` (/proc/locks lists waiters with "->")."""
    inode = os.stat(path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and len(fields) > 6 and fields[-3].split(":")[-1] == str(inode):
            return True
    return False


def _two_exclusive_turns(folder: str, log: str, release: str) -> None:
    """Run two exclusive tests in a row, the first keeping the turn for the
    second; note each, and wait for `release` between them."""
    worker = turns.Turns(folder)
    with worker.turn(True, keep=True):
        with open(log, "a") as f:
            f.write("X1 in\n")
    while not os.path.exists(release):
        time.sleep(0.01)
    with worker.turn(True):
        with open(log, "a") as f:
            f.write("X2 in\n")
    worker.close()


def test_an_exclusive_turn_kept_for_the_next_exclusive_test_lets_no_test_in_between(tmp_path):
    """A worker whose next test also runs alone keeps its turn: a neighbour
    that asks in between waits until both ran (it would otherwise start a
    test, and the second exclusive one would wait for the room to empty
    again); a turn kept for a test that takes none is given back."""
    folder, log = str(tmp_path), str(tmp_path / "log")
    context = multiprocessing.get_context("fork")
    x = context.Process(target=_two_exclusive_turns, args=(folder, log, str(tmp_path / "release")), daemon=True)
    x.start()
    try:
        _wait_for(lambda: os.path.exists(log) and "X1 in" in Path(log).read_text(), "the first exclusive test")
        n = context.Process(target=_holder, args=(folder, False, "N", log, None), daemon=True)
        n.start()
        # N either runs (the turn was given back) or blocks on the door's lock.
        _wait_for(lambda: "N in" in Path(log).read_text() or _blocked_on(os.path.join(folder, "door")),
                  "N running or waiting for its turn")
        assert "N in" not in Path(log).read_text()
    finally:
        (tmp_path / "release").touch()  # (a failure above leaves no process waiting)
    for process in (x, n):
        process.join(60)
        assert process.exitcode == 0
    assert Path(log).read_text().split("\n")[:-1] == ["X1 in", "X2 in", "N in", "N out"]
    kept = turns.Turns(folder)
    with kept.turn(True, keep=True):
        pass
    assert _door_taken(folder)
    kept.give_back_kept()
    assert not _door_taken(folder)


@pytest.mark.parametrize("value", ["0", "-2", "two", ""])
def test_jobs_must_be_a_positive_number_or_auto(value):
    with pytest.raises(argparse.ArgumentTypeError, match="positive number of workers or auto"):
        cli._jobs(value)


def test_jobs_default_is_one_worker_per_usable_core():
    args = cli.build_parser().parse_args(["run", "--backend", "x"])
    assert args.jobs == len(os.sched_getaffinity(0))
    assert cli.build_parser().parse_args(["run", "--backend", "x", "-j", "1"]).jobs == 1
