"""Assertions that explain to a vendor what their backend did wrong.

A conformance failure must say which contract broke and what to implement,
not just show a traceback: these helpers turn exceptions raised by the
backend where the contract requires success into failures with messages.

Attribution (harness/evidence.py): a failure is charged to the contract
its check names (``check(contract, ...)``, or a ``scope(contract)`` around
it), else to the test's primary contract, the first one it declares.
Tests of one contract need neither.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from privateuse1_conformance.harness.evidence import (Inconclusive, Violation, carry, decided, inconclusive,  # noqa: F401
                                                      raised_by_kit, scope, scoped_clause)


def check(contract: str, condition: Any, message: str | Callable[[], str], observed: bool = True) -> None:
    """Fail the check of `contract` (an ID, or ID.clause such as DM-SET-001.2)
    unless `condition` holds. `message` may be a callable, built only on failure.

    `observed` False: the check could not observe what its clause is about
    this time (no gate held the work, none was seen in flight), so a
    condition that holds decides nothing; one that fails still fails."""
    __tracebackhide__ = True
    if "." in contract and (observed or not condition):
        decided(contract)
    if not condition:
        contract_id, _, clause = contract.partition(".")
        text = message() if callable(message) else message
        raise Violation(text, contract_id, contract if clause else None)


_OUTCOMES = (pytest.skip.Exception, pytest.fail.Exception, pytest.xfail.Exception, pytest.exit.Exception)


def _kit_outcome(error: BaseException) -> bool:
    """Whether `error` must pass through a check untouched: an outcome
    (inconclusive, skip, fail) that the kit's own code raised, or control
    flow that is no exception of the call's (an interrupt, hypothesis'
    stopping a test case). Anything else the call raised, pytest's outcome
    exceptions and the kit's Inconclusive included, is the backend's
    (harness/evidence.py)."""
    if isinstance(error, Exception):
        return False
    if isinstance(error, _OUTCOMES):
        return raised_by_kit(error)
    return True


def must(call: Callable[[], Any], what: str) -> Any:
    """Run `call`, which the contract requires to succeed."""
    __tracebackhide__ = True
    try:
        return call()
    except BaseException as e:  # noqa: BLE001 - any exception is the backend's failure
        if _kit_outcome(e):
            raise
        raise Violation(f"{what} raised {type(e).__name__}: {e}") from e


def must_raise(
    call: Callable[[], Any],
    what: str,
    exceptions: type[BaseException] | tuple[type[BaseException], ...] = (RuntimeError,),
    mentions: tuple[str, ...] = (),
) -> BaseException:
    """Run `call`, which the contract requires to raise one of `exceptions`
    with a message mentioning each of `mentions` (case-insensitive)."""
    __tracebackhide__ = True
    try:
        result = call()
    except exceptions as e:
        message = str(e)
        missing = [m for m in mentions if m.lower() not in message.lower()]
        if missing:
            raise Violation(f"{what} raised {type(e).__name__} as required, but its message does not "
                            f"mention {missing}: {message!r}") from None
        clause = scoped_clause()  # (a check of the clause of the scope it runs in)
        if clause:
            decided(clause)
        return e
    except BaseException as e:  # noqa: BLE001
        if _kit_outcome(e):
            raise
        names = exceptions.__name__ if isinstance(exceptions, type) else "/".join(x.__name__ for x in exceptions)
        raise Violation(f"{what} must raise {names}, but raised {type(e).__name__}: {e}") from e
    raise Violation(f"{what} must raise, but returned {result!r}")


def range_mentions(index: int, count: int) -> tuple[str, ...]:
    """What an out-of-range message must name: the index and the count."""
    return (str(index), str(count))


def in_thread(call: Callable[[], Any]) -> Any:
    """Run `call` in a new thread and return its result (or re-raise), inside
    the caller's open scope (a crash there is charged as if it had happened
    here). No time limit here: a thread that never finishes leaves the test
    without progress, which the harness reports as a hang (harness/progress.py)."""
    box: dict[str, Any] = {}
    call = carry(call)

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def message_names_range(message: str, count: int) -> bool:
    """Whether `message` names the valid range of device indices."""
    return bool(re.search(rf"\[\s*0\s*,\s*{count}\s*\)|0\s*(\.\.|to|-)\s*{count - 1}\b|{count}\b", message))


def require_allocator(cxx) -> None:
    """Fail (rather than crash) when the backend registered no allocator:
    PyTorch then dereferences a null allocator for device storages."""
    if not cxx.allocator_registered():
        raise Violation("no allocator is registered for PrivateUse1 (c10::SetAllocator or REGISTER_ALLOCATOR): "
                        "torch.UntypedStorage(n, device=...) would dereference a null allocator and crash")


# ---------------------------------------------------------------- messages


def names_number(message: str, number: int) -> bool:
    """Whether `message` names the integer `number` (not as part of another number)."""
    return bool(re.search(rf"(?<![\d.]){re.escape(str(number))}(?!\d)", message))


def names_range(message: str, count: int) -> bool:
    """Whether `message` names the device count or the valid range of indices:
    '2', '[0, 2)', '0..1', '0 to 1', '0-1'."""
    return bool(re.search(rf"(?<![\d.-]){count}(?!\d)", message)
                or re.search(rf"0\s*(\.\.|to|-)\s*{count - 1}(?!\d)", message))


def rejects_index(contract: str, call: Callable[[], Any], what: str, index: int, count: int,
                  exceptions: tuple[type[BaseException], ...] = (RuntimeError, ValueError, IndexError)) -> None:
    """`call` must reject device index `index` (of `count` devices) with one of
    `exceptions`, in a message naming the index and the count or valid range."""
    __tracebackhide__ = True
    with scope(contract):
        error = must_raise(call, what, exceptions)
    message = str(error)
    check(contract, names_number(message, index),
          lambda: f"{what} raised {type(error).__name__} as required, but its message does not name the "
                  f"index {index}: {message!r}")
    check(contract, names_range(message, count),
          lambda: f"{what} raised {type(error).__name__} as required, but its message names neither the device "
                  f"count {count} nor the valid range [0, {count}): {message!r}")


# ------------------------------------------------------------- observations


def current_devices(mod, cxx) -> dict[str, int]:
    """The current device as the module, torch.accelerator and the guard report
    it. (The hooks' getCurrentDevice is compared with these by HK-DEV-001 only,
    so that a hooks bug is charged there and nowhere else.)"""
    return {
        "module current_device()": must(mod.current_device, "the module's current_device()"),
        "torch.accelerator.current_device_index()": must(
            torch.accelerator.current_device_index, "torch.accelerator.current_device_index()"),
        "guard getDevice()": must(cxx.guard_get_device, "the guard's getDevice()")[1],
    }


def expect_current(contract: str, mod, cxx, expected: int, after: str) -> None:
    """Every layer reports `expected` as the current device (charged to `contract`)."""
    __tracebackhide__ = True
    with scope(contract):
        seen = current_devices(mod, cxx)
    wrong = {k: v for k, v in seen.items() if v != expected}
    check(contract, not wrong, lambda: f"after {after}, the current device should be {expected} everywhere, "
                                       f"but {wrong}")


class InitState:
    """What can be seen from outside of whether the backend was initialized:
    the module's is_initialized() (if it has one) and, per device, the hooks'
    hasPrimaryContext. A layer that cannot answer is left out (that is
    another contract's business); with no layer answering, nothing can be
    concluded (the check is inconclusive rather than failed)."""

    def __init__(self, mod, cxx, n: int) -> None:
        self.initialized: bool | None = None
        is_initialized = getattr(mod, "is_initialized", None)
        if callable(is_initialized):
            try:
                self.initialized = bool(is_initialized())
            except Exception:  # noqa: BLE001 - DM-COUNT-003 decides whether it may raise
                self.initialized = None
        self.contexts: list[int] | None = []
        for i in range(n):
            try:
                if cxx.hooks_has_primary_context(i):
                    self.contexts.append(i)
            except Exception:  # noqa: BLE001 - HK-CTX-001 decides
                self.contexts = None
                break

    def __str__(self) -> str:
        parts = []
        if self.initialized is not None:
            parts.append(f"is_initialized() {self.initialized}")
        if self.contexts is not None:
            parts.append(f"primary contexts on {self.contexts or 'no device'}")
        return ", ".join(parts) or "nothing observable"

    def observable(self) -> bool:
        return self.initialized is not None or self.contexts is not None


def initialized_by(contract: str, call: Callable[[], Any], what: str, mod, cxx, n: int) -> Any:
    """Run `call` and check, against a baseline taken just before it, that it
    initialized nothing: is_initialized() did not turn True and no device got
    a primary context it did not have. Returns what `call` returned."""
    __tracebackhide__ = True
    before = InitState(mod, cxx, n)
    result = call()
    after = InitState(mod, cxx, n)
    if not (before.observable() and after.observable()):
        inconclusive(f"whether {what} initializes the backend cannot be observed: the module has no working "
                     "is_initialized() and the hooks' hasPrimaryContext does not answer")
    became = after.initialized and before.initialized is False
    new = sorted(set(after.contexts or ()) - set(before.contexts or ())) if after.contexts is not None \
        and before.contexts is not None else []
    check(contract, not became and not new,
          lambda: f"{what} initialized the backend: before the call {before}; after it {after}")
    return result


# A new interpreter that imports torch and the backend takes seconds; one
# that has not answered after this long hangs.
NEW_INTERPRETER_TIMEOUT_S = 300


def answer_in_new_interpreter(clause: str, script: str, module_name: str, what: str) -> dict:
    """Run `script` (which gets the backend's module name as sys.argv[1]) in
    a new interpreter and return the JSON it printed last on a line starting
    with "ANSWER ". A failure, a hang or no answer violates `clause`, with
    `what` the script's work and the interpreter's stderr. Runs in an empty
    folder: the working directory may hold the backend's source tree, which
    `-c` would import instead of the installed package."""
    __tracebackhide__ = True
    with tempfile.TemporaryDirectory() as folder:
        try:
            result = subprocess.run([sys.executable, "-c", script, module_name], capture_output=True, text=True,
                                    cwd=folder, timeout=NEW_INTERPRETER_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            check(clause, False, f"in a new interpreter, {what} did not finish within {NEW_INTERPRETER_TIMEOUT_S} s: "
                                 f"{stderr[-1500:]}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("ANSWER ")]
    check(clause, result.returncode == 0 and lines,
          lambda: f"in a new interpreter, {what} failed (exit status {result.returncode}): {result.stderr[-1500:]}")
    return json.loads(lines[-1][len("ANSWER "):])


def spellings(dt: str, index: int) -> tuple:
    """The ways a device argument names device `index`: the index, the string
    and the torch.device (PyTorch's _device_t)."""
    return (index, f"{dt}:{index}", torch.device(dt, index))
