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
    """The backend did not answer a question of the parent (hang, crash or exception)."""


def ask(question: Callable[[], Any], what: str, limit: float = DEFAULT_LIMIT) -> Any:
    """The JSON-serializable answer of `question()` computed in a forked
    process; raises BackendProbeError saying what happened otherwise."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the probe process
        try:
            os.close(read_fd)
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
    try:
        data, timed_out = read_pipe(read_fd, time.monotonic() + limit)
    finally:
        os.close(read_fd)
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    if timed_out:
        raise BackendProbeError(f"{what} did not return within {limit:g} s (asked in a probe process)")
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name if os.WTERMSIG(status) in signal.Signals._value2member_map_ \
            else f"signal {os.WTERMSIG(status)}"
        raise BackendProbeError(f"{what} crashed the probe process ({name})")
    try:
        answer = json.loads(data)
    except ValueError:
        raise BackendProbeError(f"{what} ended the probe process without an answer "
                                f"(exit status {os.WEXITSTATUS(status)})") from None
    if "error" in answer:
        raise BackendProbeError(f"{what} raised {answer['error']}")
    return answer["value"]
