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

import pytest
import torch

import openreg  # noqa: F401  (claims PrivateUse1 as "openreg")
from privateuse1_conformance.conformance import _cxx

# Environment variables that configure the backend: removed from the
# environment of every subprocess unless the test sets them explicitly.
_CONFIG_VARS = ("OPENREG_DEVICE_COUNT", "OPENREG_DEVICE_MEMORY")

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
