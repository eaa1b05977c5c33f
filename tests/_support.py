"""Helpers shared by the project's own tests of the OpenReg backend.

The test process itself imports ``openreg`` with the default configuration
(unless the caller exported ``OPENREG_DEVICE_COUNT`` / ``OPENREG_DEVICE_MEMORY``;
the in-process tests adapt to the device count they find). Everything that
needs another configuration or a *fresh* process (lazy initialization,
``hasPrimaryContext`` before first use, init-once counting, crashes) runs in a
subprocess through :func:`run_python`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import openreg  # (claims PrivateUse1 as "openreg")
from privateuse1_conformance.conformance import _cxx

# Environment variables that configure the backend: removed from the
# environment of every subprocess unless the test sets them explicitly.
_CONFIG_VARS = ("OPENREG_DEVICE_COUNT", "OPENREG_DEVICE_MEMORY", "OPENREG_ASYNC_OPERATORS",
                "OPENREG_EXECUTOR", "OPENREG_EXECUTOR_PATH")

# Prepended to every subprocess script.
_PRELUDE = """\
import json, sys
import torch
import openreg
from privateuse1_conformance.conformance import _cxx
"""

SUBPROCESS_TIMEOUT = 120

N = torch.openreg.device_count()


def run_python(code: str, env: dict[str, str] | None = None,
               timeout: float = SUBPROCESS_TIMEOUT, prelude: bool = True
               ) -> tuple[int, str, str]:
    """Run ``python -c CODE`` in a fresh interpreter.

    ``env`` entries are added to a copy of this process's environment from
    which the OpenReg configuration variables were removed (so the default
    configuration applies unless the test sets one). Returns
    ``(returncode, stdout, stderr)``; a negative return code is the signal
    that killed the child (e.g. -11 for SIGSEGV).
    """
    child_env = {k: v for k, v in os.environ.items()
                 if k not in _CONFIG_VARS and k != "PYTHONFAULTHANDLER"}
    child_env.update(env or {})
    script = (_PRELUDE if prelude else "") + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", script], env=child_env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def run_json(code: str, env: dict[str, str] | None = None,
             timeout: float = SUBPROCESS_TIMEOUT) -> dict:
    """Run CODE in a fresh interpreter; it must print one JSON object as the
    last line of stdout (``emit(obj)`` is predefined). Returns that object,
    failing the test with the child's output if it did not exit cleanly."""
    helper = "def emit(obj):\n    print(json.dumps(obj), flush=True)\n"
    rc, out, err = run_python(helper + textwrap.dedent(code), env=env, timeout=timeout)
    assert rc == 0, f"subprocess failed with returncode {rc}\nstdout:\n{out}\nstderr:\n{err}"
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines, f"subprocess printed nothing\nstderr:\n{err}"
    return json.loads(lines[-1])


def error_text(excinfo: pytest.ExceptionInfo) -> str:
    """The exception's message without C++ backtraces."""
    return str(excinfo.value).split("\nException raised from")[0]


def assert_range_error(excinfo: pytest.ExceptionInfo, index: int, count: int) -> None:
    """The message names the given index and the valid range [0, count)."""
    message = error_text(excinfo)
    assert f"[0, {count})" in message, (
        f"error message does not name the valid range [0, {count}): {message!r}")
    # The index must appear on its own, not only as part of the range.
    rest = message.replace(f"[0, {count})", "")
    assert re.search(rf"(?<![\d-]){index}(?!\d)", rest), (
        f"error message does not name the given index {index}: {message!r}")


class Gate:
    """Blocks `stream` at this point of its queue until opened (a kernel that
    waits: ``openreg._C._testing_block_stream``), so that tests can observe work
    still queued behind it without sleeping on guesses. Use it as a context
    manager: the gate is always opened on exit, also when an assertion fails,
    so that no stream stays blocked for the next test. While a stream is
    gated, only asynchronous work may be launched on it from this thread
    (synchronous operators would wait for the gate forever)."""

    def __init__(self, stream: torch.Stream) -> None:
        self._id = openreg._C._testing_block_stream(stream)
        self.is_open = False

    def open(self) -> None:
        if not self.is_open:
            self.is_open = True
            openreg._C._testing_open_gate(self._id)

    def __enter__(self) -> "Gate":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.open()


def still_blocked(thread, seconds: float = 0.3) -> bool:
    """Whether `thread` is still running after `seconds`. Used to check that a
    call waits for gated work: a correct backend never finishes while the gate
    is closed (so this never fails spuriously); a backend that does not wait
    finishes long before."""
    thread.join(seconds)
    return thread.is_alive()


class Background(threading.Thread):
    """Runs `fn` in a daemon thread (so a hang cannot keep the process alive)
    and keeps its result or exception. Started on construction."""

    def __init__(self, fn) -> None:
        super().__init__(daemon=True)
        self._fn = fn
        self.result = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.result = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def value(self, timeout: float = 30):
        """Join and return the result (re-raising the thread's exception)."""
        self.join(timeout)
        assert not self.is_alive(), f"the background call did not finish within {timeout} s"
        if self.error is not None:
            raise self.error
        return self.result
