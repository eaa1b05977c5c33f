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

import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

from privateuse1_conformance.harness.evidence import Inconclusive, Violation, inconclusive, scope  # noqa: F401


def check(contract: str, condition: Any, message: str | Callable[[], str]) -> None:
    """Fail the check of `contract` (an ID, or ID.clause such as DM-SET-001.2)
    unless `condition` holds. `message` may be a callable, built only on failure."""
    __tracebackhide__ = True
    if not condition:
        contract_id, _, clause = contract.partition(".")
        text = message() if callable(message) else message
        raise Violation(text, contract_id, contract if clause else None)


def must(call: Callable[[], Any], what: str) -> Any:
    """Run `call`, which the contract requires to succeed."""
    __tracebackhide__ = True
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - any exception is the backend's failure
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
        return e
    except Exception as e:  # noqa: BLE001
        names = exceptions.__name__ if isinstance(exceptions, type) else "/".join(x.__name__ for x in exceptions)
        raise Violation(f"{what} must raise {names}, but raised {type(e).__name__}: {e}") from e
    raise Violation(f"{what} must raise, but returned {result!r}")


def range_mentions(index: int, count: int) -> tuple[str, ...]:
    """What an out-of-range message must name: the index and the count."""
    return (str(index), str(count))


def in_thread(call: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Run `call` in a new thread and return its result (or re-raise)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"a thread running {call!r} did not finish within {timeout} s", pytrace=False)
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
