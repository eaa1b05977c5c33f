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
import gc
import json
import os
import re
import select
import signal
import struct
import sys
import tempfile
import threading
import time
import traceback

import pytest
from _pytest.runner import call_and_report

from . import evidence, progress

# Attached to synthesized reports so the plugin can tell them apart.
CRASH = "crash"
HANG = "hang"
OUTPUT_TAIL = 8000  # characters of the child's output kept for crash reports
# faulthandler ends its dump with every loaded extension module, a line that
# grows with the environment (numpy, scipy, ...) and would push the traceback
# out of the kept tail; it says nothing about the crash, so it is shortened.
_EXTENSION_LIST = re.compile(r"^(Extension modules: ).*?(\(total: \d+\))?$", re.MULTILINE)


_SEND_LOCK = threading.Lock()  # reports (main thread) and scope messages (any thread) share the pipe


def _send(fd: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    view = memoryview(struct.pack("!I", len(data)) + data)
    with _SEND_LOCK:
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


def _redirect_output(config: pytest.Config, path: str, stacks: str) -> None:
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
    # Where every thread is, when the parent judges the test hung (the
    # account of a hang; harness/progress.py).
    progress.enable_stack_dump(stacks)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read_end(path: str, size: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


_FATAL_ERROR = re.compile(r"^Fatal Python error: [^\n]*$", re.MULTILINE)


def _tail(path: str) -> str:
    text = _read_end(path, 64 * OUTPUT_TAIL)  # room for a shortened module list
    text = _EXTENSION_LIST.sub(lambda m: m.group(1) + "[list omitted] " + (m.group(2) or ""), text)
    tail = text[-OUTPUT_TAIL:]
    # A crash dump of many threads can be longer than the tail: keep its
    # first line (what the signal was), which says what happened.
    fatal = list(_FATAL_ERROR.finditer(text))
    if fatal and fatal[-1].start() < len(text) - len(tail):
        omitted = len(text) - len(tail) - fatal[-1].end()
        tail = f"{fatal[-1].group(0)}\n[... {omitted} characters of the crash dump omitted ...]\n{tail}"
    return tail


_THREAD_BLOCK = re.compile(r"^Current thread (0x[0-9a-f]+)[^\n]*\n((?:  .*\n?)*)", re.MULTILINE)


def _crashing_thread(path: str) -> tuple[int | None, str]:
    """The thread faulthandler says crashed, and its stack, from the test
    process's output (with many threads, the kept tail may not reach it)."""
    matches = list(_THREAD_BLOCK.finditer(_read_end(path, 1 << 20)))
    if not matches:
        return None, ""
    last = matches[-1]
    return int(last.group(1), 16), last.group(0).rstrip()


_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+ in (\S+)', re.MULTILINE)
# An abort's own message, most specific first: a C++ exception's what(), a
# failed assert(), std::terminate's line.
_ABORTS = (re.compile(r"what\(\):\s*(.+)"), re.compile(r"(Assertion .+ failed.*)"),
           re.compile(r"(terminate called .+)"))
_NOT_THE_BACKEND = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # the kit
                    os.path.dirname(pytest.__file__), os.path.dirname(os.path.dirname(pytest.__file__)) + "/_pytest",
                    os.path.dirname(os.path.dirname(pytest.__file__)) + "/pluggy")


# Frames of the machinery that runs a test (pytest, pluggy, the kit's
# harness, runpy): a crash dump lists them under every test, and they say
# nothing about the backend.
_MACHINERY = (os.path.dirname(os.path.abspath(__file__)) + os.sep, *(p + os.sep for p in _NOT_THE_BACKEND[1:]),
              "<frozen runpy>")
_FRAME_LINE = re.compile(r'^\s*File "([^"]+)", line \d+ in \S+\n?', re.MULTILINE)


def quiet_frames(dump: str) -> str:
    """A faulthandler dump with each run of the test machinery's frames
    folded into one line, so that what is left is the test's steps and the
    backend's Python frames."""
    def fold(run: re.Match) -> str:
        lines = run.group(0).splitlines(keepends=True)
        kept, folded = [], 0
        for line in lines:
            frame = _FRAME_LINE.match(line)
            if frame and frame.group(1).startswith(_MACHINERY):
                folded += 1
                continue
            if folded:
                kept.append(f"  [{folded} frames of pytest and the kit's harness]\n")
                folded = 0
            kept.append(line)
        if folded:
            kept.append(f"  [{folded} frames of pytest and the kit's harness]\n")
        return "".join(kept)
    return re.sub(r'(?:^\s*File "[^"]+", line \d+ in \S+\n?)+', fold, dump, flags=re.MULTILINE)


def crash_cause(cause: str, scope: list | None, crash_stack: str, tail: str) -> str:
    """The root cause a crash is grouped by (reports' shared root causes):
    the signal, then what tells one crash from another: the contract whose
    scope was open, the innermost frame of the crashing thread (the first
    one outside the kit, else the kit's call site), and an abort's message.
    Two crashes by one signal in different places are two causes."""
    text = f"crash: the test process {cause}"
    if scope:
        text += f" in {scope[0]}"
    frames = _FRAME.findall(crash_stack)  # (faulthandler lists the most recent call first)
    outside = [f for f in frames if not f[0].startswith(_NOT_THE_BACKEND)]
    if frames:
        file, function = (outside or frames)[0]
        text += f", at {function} ({os.path.basename(file)})"
    for pattern in _ABORTS:
        abort = pattern.search(tail)
        if abort:
            text += f": {re.sub(r'0x[0-9a-fA-F]{6,}', '0x…', abort.group(1).strip())[:200]}"
            break
    return text


def synthesize(item: pytest.Item, when: str, kind: str, message: str, duration: float,
                scope: list | None = None, cause: str = "", progressed: dict | None = None) -> pytest.TestReport:
    properties = [("verdict", kind)]
    if scope:
        properties.append(("scope", scope))
    if cause:
        properties.append(("cause", cause))
    properties += list((progressed or {}).items())  # how far the test got (evidence.progress)
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
        user_properties=properties,
    )


def read_pipe(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to the pipe `fd` until its writers closed it or the
    monotonic `deadline` passed: (the bytes, whether the deadline passed)."""
    chunks: list[bytes] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], None if remaining == float("inf") else remaining)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # every writer closed it: the child exited (or crashed)
            return b"".join(chunks), False
        chunks.append(chunk)


# Children that reported everything and were still exiting: pid -> test.
_EXITING: dict[int, str] = {}


EXIT_LIMIT = 30.0  # seconds the end of a run waits for test processes that are still exiting


def reap_exited(block: bool = False) -> None:
    """Collect children that finished reporting (blocking: wait for all, at
    most EXIT_LIMIT seconds, then kill what is left: a backend whose exit
    hangs must not hang the run). One killed by a signal after reporting (a
    backend thread crashing during exit) is noted on stderr: its test's
    verdict was already given."""
    deadline = time.monotonic() + EXIT_LIMIT
    while _EXITING:
        for pid, nodeid in list(_EXITING.items()):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if not done:
                continue
            del _EXITING[pid]
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGKILL:
                print(f"conformance harness: the process of {nodeid} was killed by "
                      f"{_signal_name(os.WTERMSIG(status))} while exiting, after it had reported",
                      file=sys.__stderr__)
        if not block or not _EXITING:
            return
        if time.monotonic() > deadline:
            for pid, nodeid in list(_EXITING.items()):
                print(f"conformance harness: the process of {nodeid} had reported but did not exit within "
                      f"{EXIT_LIMIT:g} s; killed", file=sys.__stderr__)
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = float("inf")  # SIGKILL: the next rounds reap them
        time.sleep(0.01)


def _scope_of(scopes: dict[int, list], crashed_thread: int | None, crashed: bool, main: int) -> list | None:
    """The evidence scope a crash or hang happened in: for a crash, the one
    the crashing thread had open (faulthandler names the thread); for a hang,
    the one most threads were stuck in (each is inside a call of that
    contract), the main thread's on a tie."""
    if crashed:
        return scopes.get(crashed_thread if crashed_thread is not None else main)
    if not scopes:
        return None
    counts: dict[str, int] = {}
    for open_scope in scopes.values():
        counts[open_scope[0]] = counts.get(open_scope[0], 0) + 1
    most = max(counts.values())
    leaders = [c for c, k in counts.items() if k == most]
    if len(leaders) == 1:
        return next(s for s in scopes.values() if s[0] == leaders[0])
    return scopes.get(main) if scopes.get(main) and scopes[main][0] in leaders else \
        next(s for s in scopes.values() if s[0] in leaders)


class Frames:
    """The child's messages, parsed as they arrive, in one pass (a test may
    send hundreds of thousands of progress messages), keeping only what the
    parent needs: the phases' reports, each thread's innermost open scope,
    the latest progress per property, the reference work measured so far,
    and a harness error. A frame cut short by a crash is left unparsed."""

    def __init__(self) -> None:
        self._pending = bytearray()
        self.reports: list[dict] = []     # serialized TestReports, in order
        self.scopes: dict[int, list] = {}  # thread -> its innermost evidence scope, as the child last said
        self.progressed: dict = {}        # user property -> the test's latest progress (evidence.progress)
        self.reference = 0.0              # seconds of reference work (evidence.reference_work)
        self.harness_error: str | None = None

    def feed(self, data: bytes) -> None:
        pending = self._pending
        pending += data
        offset, end = 0, len(pending)
        while end - offset >= 4:
            (size,) = struct.unpack_from("!I", pending, offset)
            if end - offset < 4 + size:
                break
            self._take(json.loads(pending[offset + 4 : offset + 4 + size]))
            offset += 4 + size
        del pending[:offset]

    def _take(self, payload: dict) -> None:
        if "$harness_error" in payload:
            self.harness_error = payload["$harness_error"]
        elif evidence.PROGRESS_MESSAGE in payload:
            name, value = payload[evidence.PROGRESS_MESSAGE]
            self.progressed[name] = value
        elif evidence.REFERENCE_MESSAGE in payload:
            self.reference = float(payload[evidence.REFERENCE_MESSAGE])
        elif evidence.SCOPE_MESSAGE in payload:
            message = payload[evidence.SCOPE_MESSAGE]
            if message["scope"]:
                self.scopes[message["thread"]] = message["scope"]
            else:
                self.scopes.pop(message["thread"], None)
        else:
            self.reports.append(payload)


def _watch(pid: int, read_fd: int, started: float, timeout: float, frames: Frames) -> str | None:
    """Parent side: read the child's messages into `frames` until it closes
    the pipe. Past the time limit, keep waiting while the child makes
    progress (see progress.py), up to the hard limit, which grows with the
    reference work the child reports; return why it counts as hung, or None."""
    step = progress.window(timeout)
    checkpoint = started + timeout - step  # the first sample: one window before the limit
    previous = None
    while True:
        hard_limit = started + progress.hard_limit(timeout, frames.reference)
        data, waiting = read_pipe(read_fd, min(checkpoint, hard_limit))
        frames.feed(data)
        if not waiting:
            return None
        now = time.monotonic()
        current = progress.sample(pid, now)
        if now >= started + progress.hard_limit(timeout, frames.reference):
            return progress.hard_limit_reason(timeout, frames.reference)
        if previous is not None and now >= started + timeout:
            why = progress.stalled(previous, current)
            if why:
                return why
        previous = current
        checkpoint = now + step


def run_forked(item: pytest.Item, timeout: float) -> list[pytest.TestReport]:
    """Run `item` in a forked child; return its reports (synthesized on crash/hang)."""
    config = item.config
    read_fd, write_fd = os.pipe()
    output = tempfile.NamedTemporaryFile(prefix="conformance-child-", suffix=".log", delete=False)
    output.close()
    stacks = output.name[: -len(".log")] + ".stacks"
    reap_exited()
    started = time.monotonic()
    pid_thread = threading.get_ident()  # the test's main thread, in the child too
    pid = os.fork()
    if pid == 0:  # ------------------------------------------------ child
        # What the parent made stays out of the child's garbage collections:
        # a collection would touch every inherited object and copy its page
        # (copy-on-write), a cost each test would pay. Only the list heads
        # are written here; the test's own garbage is collected as usual.
        gc.freeze()
        try:
            os.close(read_fd)
            os.setpgid(0, 0)  # a hang kill takes the child's own children too
            evidence.set_channel(lambda message: _send(write_fd, message))  # open scopes, for crash verdicts
            _redirect_output(config, output.name, stacks)
            _run_child(item, write_fd)
            # Everything is reported: flush what the test printed and say so
            # by closing the pipe now. The parent goes on while this process
            # exits, which costs as much as the fork (its whole address
            # space is torn down before its files are closed).
            faulthandler.cancel_dump_traceback_later()
            sys.stdout.flush()
            sys.stderr.flush()
            os.close(write_fd)
        finally:
            os._exit(0)
    # ----------------------------------------------------------- parent
    os.close(write_fd)
    last_stacks = ""
    frames = Frames()
    try:
        hung = _watch(pid, read_fd, started, timeout, frames)
        if hung is not None:  # the verdict is given: where were its threads?
            last_stacks = progress.request_stack_dump(pid, stacks)
    finally:
        os.close(read_fd)
    timed_out = hung is not None
    if timed_out:  # killed at once (its messages were read as they came)
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reports: list[pytest.TestReport] = []
    for payload in frames.reports:
        report = config.hook.pytest_report_from_serializable(config=config, data=payload)
        if isinstance(report.longrepr, list):  # a skip's (path, line, reason) went through JSON
            report.longrepr = tuple(report.longrepr)
        reports.append(report)
    harness_error, scopes, progressed = frames.harness_error, frames.scopes, frames.progressed
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
    crashed_thread, crash_stack = _crashing_thread(output.name)
    for path in (output.name, stacks):
        try:
            os.unlink(path)
        except OSError:
            pass

    when = "setup" if "setup" not in phases_done else ("call" if "call" not in phases_done else "teardown")
    if harness_error:
        raise RuntimeError(f"conformance harness failed in the test child:\n{harness_error}")
    scope = _scope_of(scopes, crashed_thread, crashed=not timed_out, main=pid_thread)
    where = f" in {scope[0]}" + (f" ({scope[1]})" if scope[1] else "") if scope else ""
    if timed_out:
        message = (f"HANG: the test did not finish within {timeout:g} s (during {when}{where}): {hung}; "
                   f"it was killed after {duration:.0f} s")
        if last_stacks:
            message += f"\n--- where its threads were when it was judged hung ---\n{quiet_frames(last_stacks)}"
        if tail:
            message += f"\n--- last output of the test process ---\n{quiet_frames(tail)}"
        reports.append(synthesize(item, when, HANG, message, duration, scope, "hang: no result within the time limit",
                                  progressed))
    elif os.WIFSIGNALED(status) or os.WEXITSTATUS(status) != 0 or "teardown" not in phases_done:
        if os.WIFSIGNALED(status):
            cause = f"was killed by {_signal_name(os.WTERMSIG(status))}"
        elif os.WEXITSTATUS(status) != 0:
            cause = f"exited with status {os.WEXITSTATUS(status)}"
        else:
            cause = "exited before finishing"
        message = f"CRASH: the test process {cause} (during {when}{where})"
        if crash_stack and crash_stack not in tail:
            message += f"\n--- the thread that crashed ---\n{quiet_frames(crash_stack)}"
        if tail:
            message += f"\n--- last output of the test process ---\n{quiet_frames(tail)}"
        reports.append(synthesize(item, when, CRASH, message, duration, scope,
                                  crash_cause(cause, scope, crash_stack, tail), progressed))
    elif tail and any(r.failed for r in reports):
        for report in reports:
            if report.failed:
                report.sections.append(("Output of the test process", tail))
    return reports
