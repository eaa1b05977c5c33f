"""Which contract a piece of evidence is evidence about.

A test may check several contracts (a state machine, a stress run, an
entry point that is both a device-management rule and a bad-input rule).
Its failure must be charged to the contract whose statement the backend
broke, never to every contract the test lists. Three mechanisms do that:

* ``Violation``: the exception a check raises (conformance/_helpers.py's
  ``check``); it names its contract and the clause of the statement.
* ``scope(contract, step)``: everything that happens inside is evidence
  about ``contract``. An exception leaving the scope is tagged with it, and
  in a forked test the parent is told which scope is open (``announce``),
  so that a crash or a hang inside it is charged to that contract only.
* Anything untagged is charged to the test's *primary* contract: the first
  one its ``@pytest.mark.contract(...)`` names.

``Inconclusive`` is the outcome of a test that is no evidence about a
contract: it needs a feature the backend does not have (two devices), or
what it would observe does not exist on this backend. It never counts for or
against the contract; a contract whose tests are all inconclusive is not
satisfied.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

CONTRACT_TAG = "_pu1_contract"
CLAUSE_TAG = "_pu1_clause"
STEP_TAG = "_pu1_step"
SCOPE_MESSAGE = "$scope"
PROGRESS_MESSAGE = "$progress"


class Violation(AssertionError):
    """A check found the backend breaking `contract` (clause `clause`)."""

    def __init__(self, message: str, contract: str | None = None, clause: str | None = None) -> None:
        super().__init__(message)
        if contract:
            setattr(self, CONTRACT_TAG, contract)
        if clause:
            setattr(self, CLAUSE_TAG, clause)


class Inconclusive(pytest.skip.Exception):
    """The test is no evidence about its contract(s) here (the reason says why)."""


def inconclusive(reason: str) -> None:
    """End the test as no evidence (see Inconclusive)."""
    __tracebackhide__ = True
    raise Inconclusive(reason, allow_module_level=False)


def contract_of(error: BaseException) -> str | None:
    return getattr(error, CONTRACT_TAG, None)


def clause_of(error: BaseException) -> str | None:
    return getattr(error, CLAUSE_TAG, None)


def step_of(error: BaseException) -> str | None:
    return getattr(error, STEP_TAG, None)


def tag(error: BaseException, contract: str, clause: str | None = None, step: str | None = None) -> None:
    """Charge `error` to `contract` unless an inner scope or check already did."""
    try:
        if contract_of(error) is None:
            setattr(error, CONTRACT_TAG, contract)
            if clause:
                setattr(error, CLAUSE_TAG, clause)
        if step and step_of(error) is None:
            setattr(error, STEP_TAG, step)
    except (AttributeError, TypeError):  # an exception type without a __dict__: stays untagged
        pass


# ------------------------------------------------------------ open scopes

# Scopes open in this process, per thread (threading.get_ident()), innermost
# last. The parent of a forked test keeps the same map from the scope
# messages, and charges a crash to the innermost scope of the thread that
# crashed (faulthandler names it), a hang to the scope the blocked threads
# agree on.
_scopes: dict[int, list[tuple[str, str | None]]] = {}
_lock = threading.Lock()
_channel: Callable[[dict], None] | None = None   # sends a message to the parent of a forked test
_channel_pid = 0   # the process the channel belongs to (a test's own forked children stay quiet)


def set_channel(send: Callable[[dict], None] | None) -> None:
    """In a forked test process: how to tell the parent which scope is open."""
    global _channel, _channel_pid
    _channel, _channel_pid = send, os.getpid()
    _scopes.clear()


def _announce(thread: int) -> None:
    if _channel is not None and os.getpid() == _channel_pid:
        stack = _scopes.get(thread)
        innermost = list(stack[-1]) if stack else None
        _channel({SCOPE_MESSAGE: {"thread": thread, "scope": innermost}})


@contextmanager
def scope(contract: str, step: str | None = None) -> Iterator[None]:
    """Everything inside is evidence about `contract`: a contract ID, or a
    clause of one (DM-SET-001.2). See the module's doc."""
    contract, _, number = contract.partition(".")
    clause = f"{contract}.{number}" if number else None
    thread = threading.get_ident()
    with _lock:
        _scopes.setdefault(thread, []).append((contract, step))
        _announce(thread)
    try:
        yield
    except BaseException as error:
        tag(error, contract, clause, step)
        raise
    finally:
        with _lock:
            _scopes[thread].pop()
            if not _scopes[thread]:
                del _scopes[thread]
            _announce(thread)


def progress(name: str, value) -> None:
    """In a forked test process: tell the parent how far the test got, as a
    user property `name` (JSON-serializable `value`, the latest wins) that
    the parent attaches to the report of a crash or a hang, which would
    otherwise lose it with the process. A test that finishes reports its
    properties itself; its progress is then dropped."""
    if _channel is not None and os.getpid() == _channel_pid:
        _channel({PROGRESS_MESSAGE: [name, value]})


# ------------------------------------------------------------ resumption

# What earlier processes of the test about to be forked found before one of
# them crashed (user property -> its last progress, with the crash recorded):
# set by the parent before it forks the test again, inherited by the child.
_resumed: dict = {}


def resume_with(found: dict | None) -> None:
    """In the parent: the next forked test process goes on from `found`
    (None: it starts afresh)."""
    _resumed.clear()
    _resumed.update(found or {})


def resumed(name: str):
    """In a test process: the progress `name` that an earlier process of this
    test reached before it crashed (the crash included), for the test to go
    on after it; None when the test starts afresh."""
    return _resumed.get(name)
