"""Calls the parent process makes into the backend, each with a time limit.

The parent of a run (the warm process every test is forked from) needs a
few answers from the backend before any test runs: how many devices it has,
whether importing it initialized it. A backend whose ``device_count()``
hangs or crashes must not hang or kill the run, so the parent never asks
itself: it forks a probe process, asks there, and waits at most a time
limit. The probe process is a copy of the parent (backend imported, nothing
initialized), so its answers are the parent's.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

from .isolation import read_pipe

DEFAULT_LIMIT = 60.0


class BackendProbeError(RuntimeError):
    """The backend did not answer a question of the parent (hang, crash or
    exception); `details`: the traceback of an exception, else empty."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details


def ask(question: Callable[[], Any], what: str, limit: float = DEFAULT_LIMIT) -> Any:
    """The JSON-serializable answer of `question()` computed in a forked
    process; raises BackendProbeError saying what happened otherwise."""
    return start(question, what, limit).result()


class Pending:
    """A question asked in a probe process that is still answering: the
    parent goes on with other work (collecting the suite) and takes the
    answer later; the time limit counts from the question."""

    def __init__(self, question: Callable[[], Any], what: str, limit: float) -> None:
        self.what, self.limit = what, limit
        self.deadline = time.monotonic() + limit
        self._read_fd, write_fd = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:  # the probe process
            try:
                os.close(self._read_fd)
                os.setpgid(0, 0)
                try:
                    answer = {"value": question()}
                except BaseException as e:  # noqa: BLE001 - reported to the parent
                    answer = {"error": f"{type(e).__name__}: {e}",
                              "traceback": traceback.format_exc(limit=-8)}
                data = json.dumps(answer, default=repr).encode()
                while data:
                    data = data[os.write(write_fd, data):]
            finally:
                os._exit(0)
        os.close(write_fd)
        self._outcome: tuple[str, Any] | None = None

    def result(self) -> Any:
        """The answer (waiting for it, at most until the limit), or
        BackendProbeError saying what happened."""
        if self._outcome is None:
            self._outcome = self._wait()
        kind, value = self._outcome
        if kind == "error":
            raise value
        return value

    def cancel(self) -> None:
        """Stop the probe process if it is still answering (its answer is no longer needed)."""
        if self._outcome is not None:
            return
        try:
            os.killpg(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._outcome = ("error", BackendProbeError(f"{self.what}: not waited for"))
        os.close(self._read_fd)
        os.waitpid(self._pid, 0)

    def _wait(self) -> tuple[str, Any]:
        pid, what = self._pid, self.what
        try:
            data, timed_out = read_pipe(self._read_fd, self.deadline)
        finally:
            os.close(self._read_fd)
        if timed_out:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)
        if timed_out:
            return "error", BackendProbeError(f"{what} did not return within {self.limit:g} s (asked in a probe process)")
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else f"signal {number}"
            return "error", BackendProbeError(f"{what} crashed the probe process (killed by signal {number}, {name})")
        try:
            answer = json.loads(data)
        except ValueError:
            return "error", BackendProbeError(f"{what} ended the probe process without an answer "
                                              f"(exit status {os.WEXITSTATUS(status)})")
        if "error" in answer:
            return "error", BackendProbeError(f"{what} raised {answer['error']}", answer.get("traceback", ""))
        return "value", answer["value"]


def start(question: Callable[[], Any], what: str, limit: float = DEFAULT_LIMIT) -> Pending:
    """Ask `question()` in a forked process now; take the answer with .result()."""
    return Pending(question, what, limit)
