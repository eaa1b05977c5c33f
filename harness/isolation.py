"""Running one pytest item in a forked child, so that a crash or a hang of
the backend costs one test and not the run.

Why not pytest-forked: it has no time limit (a hung backend stalls the run
forever), it reports a crash only as a generic failure, and it loses the
reports of phases that completed before the crash. This module forks from
the warm parent (torch and the backend imported, no device initialized),
streams each phase's report back as it is produced, kills the child's whole
process group when the time limit passes, and turns a signal or abnormal
exit into a crash report that keeps the child's last output.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import select
import signal
import struct
import sys
import tempfile
import time
import traceback

import pytest
from _pytest.runner import call_and_report

# Attached to synthesized reports so the plugin can tell them apart.
CRASH = "crash"
HANG = "hang"
OUTPUT_TAIL = 8000  # characters of the child's output kept for crash reports
# faulthandler ends its dump with every loaded extension module, a line that
# grows with the environment (numpy, scipy, ...) and would push the traceback
# out of the kept tail; it says nothing about the crash, so it is shortened.
_EXTENSION_LIST = re.compile(r"^(Extension modules: ).*?(\(total: \d+\))?$", re.MULTILINE)


def _send(fd: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    view = memoryview(struct.pack("!I", len(data)) + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _run_child(item: pytest.Item, fd: int) -> None:
    """Child side: run setup/call/teardown and stream each report."""
    config = item.config
    try:
        # Same order as _pytest.runner.runtestprotocol.
        if hasattr(item, "_request") and not item._request:
            item._initrequest()
        setup = call_and_report(item, "setup", log=False)
        _send(fd, config.hook.pytest_report_to_serializable(config=config, report=setup))
        if setup.passed and not item.config.getoption("setuponly", False):
            call = call_and_report(item, "call", log=False)
            _send(fd, config.hook.pytest_report_to_serializable(config=config, report=call))
        teardown = call_and_report(item, "teardown", log=False, nextitem=None)
        _send(fd, config.hook.pytest_report_to_serializable(config=config, report=teardown))
    except BaseException:  # noqa: BLE001 - anything here is a harness bug; say so
        _send(fd, {"$harness_error": traceback.format_exc()})


def _redirect_output(config: pytest.Config, path: str, timeout: float) -> None:
    """Child side: send all output to `path`, uncaptured, so that the parent
    can show what a crashed or hung test printed last (pytest's own capture
    would lose it with the process)."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.stop_global_capturing()
    log = os.open(path, os.O_WRONLY)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    if capman is not None:
        capman._method = "no"  # keep the capture plugin's hooks working, capturing nothing
        capman.start_global_capturing()
    # Python's crash traceback goes to the log too (pytest pointed it at the
    # parent's terminal).
    faulthandler.enable(file=sys.__stderr__, all_threads=True)
    # Just before the parent kills a hung test, say where every thread is.
    faulthandler.dump_traceback_later(timeout * 0.9, file=sys.__stderr__)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * OUTPUT_TAIL))  # room for a shortened module list
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    text = _EXTENSION_LIST.sub(lambda m: m.group(1) + "[list omitted] " + (m.group(2) or ""), text)
    return text[-OUTPUT_TAIL:]


def _synthesize(item: pytest.Item, when: str, kind: str, message: str, duration: float) -> pytest.TestReport:
    return pytest.TestReport(
        nodeid=item.nodeid,
        location=item.location,
        keywords={k: 1 for k in item.keywords},
        outcome="failed",
        longrepr=message,
        when=when,
        sections=[],
        duration=duration,
        start=time.time() - duration,
        stop=time.time(),
        user_properties=[("verdict", kind)],
    )


def read_pipe(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to the pipe `fd` until its writers closed it or the
    monotonic `deadline` passed: (the bytes, whether the deadline passed)."""
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # every writer closed it: the child exited (or crashed)
            return b"".join(chunks), False
        chunks.append(chunk)


# Children that reported everything and were still exiting: pid -> test.
_EXITING: dict[int, str] = {}


def reap_exited(block: bool = False) -> None:
    """Collect children that finished reporting (blocking: wait for all).
    One killed by a signal after reporting (a backend thread crashing
    during exit) is noted on stderr: its test's verdict was already given."""
    for pid, nodeid in list(_EXITING.items()):
        try:
            done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if not done:
            continue
        del _EXITING[pid]
        if os.WIFSIGNALED(status):
            print(f"conformance harness: the process of {nodeid} was killed by "
                  f"{_signal_name(os.WTERMSIG(status))} while exiting, after it had reported",
                  file=sys.__stderr__)


def run_forked(item: pytest.Item, timeout: float) -> list[pytest.TestReport]:
    """Run `item` in a forked child; return its reports (synthesized on crash/hang)."""
    config = item.config
    read_fd, write_fd = os.pipe()
    output = tempfile.NamedTemporaryFile(prefix="conformance-child-", suffix=".log", delete=False)
    output.close()
    reap_exited()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # ------------------------------------------------ child
        try:
            os.close(read_fd)
            os.setpgid(0, 0)  # a hang kill takes the child's own children too
            _redirect_output(config, output.name, timeout)
            _run_child(item, write_fd)
            # Everything is reported: flush what the test printed and say so
            # by closing the pipe now. The parent goes on while this process
            # exits, which costs as much as the fork (its whole address
            # space is torn down before its files are closed).
            sys.stdout.flush()
            sys.stderr.flush()
            os.close(write_fd)
        finally:
            os._exit(0)
    # ----------------------------------------------------------- parent
    os.close(write_fd)
    try:
        buffer, timed_out = read_pipe(read_fd, started + timeout)
    finally:
        os.close(read_fd)
    reports: list[pytest.TestReport] = []
    harness_error = None
    while len(buffer) >= 4:  # complete frames only: a crash may cut the last one
        (size,) = struct.unpack("!I", buffer[:4])
        if len(buffer) < 4 + size:
            break
        payload = json.loads(buffer[4 : 4 + size])
        buffer = buffer[4 + size :]
        if "$harness_error" in payload:
            harness_error = payload["$harness_error"]
        else:
            report = config.hook.pytest_report_from_serializable(config=config, data=payload)
            if isinstance(report.longrepr, list):  # a skip's (path, line, reason) went through JSON
                report.longrepr = tuple(report.longrepr)
            reports.append(report)
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    phases_done = {r.when for r in reports}
    if not timed_out and harness_error is None and "teardown" in phases_done:
        # The child reported all three phases and closed the pipe: nothing
        # but its exit is left. Reap it later rather than wait for it.
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            _EXITING[pid] = item.nodeid
            status = 0
    else:
        _, status = os.waitpid(pid, 0)
    duration = time.monotonic() - started
    tail = _tail(output.name)
    os.unlink(output.name)

    when = "setup" if "setup" not in phases_done else ("call" if "call" not in phases_done else "teardown")
    if harness_error:
        raise RuntimeError(f"conformance harness failed in the test child:\n{harness_error}")
    if timed_out:
        message = f"HANG: the test did not finish within {timeout:g} s and was killed (during {when})"
        if tail:
            message += f"\n--- last output of the test process ---\n{tail}"
        reports.append(_synthesize(item, when, HANG, message, duration))
    elif os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0 or "teardown" not in phases_done:
        if os.WIFSIGNALED(status):
            cause = f"was killed by {_signal_name(os.WTERMSIG(status))}"
        elif os.WEXITSTATUS(status) != 0:
            cause = f"exited with status {os.WEXITSTATUS(status)}"
        else:
            cause = "exited before finishing"
        message = f"CRASH: the test process {cause} (during {when})"
        if tail:
            message += f"\n--- last output of the test process ---\n{tail}"
        reports.append(_synthesize(item, when, CRASH, message, duration))
    elif tail and any(r.failed for r in reports):
        for report in reports:
            if report.failed:
                report.sections.append(("Output of the test process", tail))
    return reports
