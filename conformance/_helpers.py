"""Assertions that explain to a vendor what their backend did wrong.

A conformance failure must say which contract broke and what to implement,
not just show a traceback: these helpers turn exceptions raised by the
backend where the contract requires success into failures with messages.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import pytest


def must(call: Callable[[], Any], what: str) -> Any:
    """Run `call`, which the contract requires to succeed."""
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - any exception is the backend's failure
        pytest.fail(f"{what} raised {type(e).__name__}: {e}", pytrace=False)


def must_raise(
    call: Callable[[], Any],
    what: str,
    exceptions: type[BaseException] | tuple[type[BaseException], ...] = (RuntimeError,),
    mentions: tuple[str, ...] = (),
) -> BaseException:
    """Run `call`, which the contract requires to raise one of `exceptions`
    with a message mentioning each of `mentions` (case-insensitive)."""
    try:
        result = call()
    except exceptions as e:
        message = str(e)
        missing = [m for m in mentions if m.lower() not in message.lower()]
        if missing:
            pytest.fail(
                f"{what} raised {type(e).__name__} as required, but its message does not "
                f"mention {missing}: {message!r}",
                pytrace=False,
            )
        return e
    except Exception as e:  # noqa: BLE001
        names = exceptions.__name__ if isinstance(exceptions, type) else "/".join(x.__name__ for x in exceptions)
        pytest.fail(f"{what} must raise {names}, but raised {type(e).__name__}: {e}", pytrace=False)
    pytest.fail(f"{what} must raise, but returned {result!r}", pytrace=False)


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
        pytest.fail(
            "no allocator is registered for PrivateUse1 (c10::SetAllocator or REGISTER_ALLOCATOR): "
            "torch.UntypedStorage(n, device=...) would dereference a null allocator and crash",
            pytrace=False,
        )
