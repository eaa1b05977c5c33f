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

Only the kit declares evidence: a tag or an Inconclusive counts when the
kit's code made it (see "whose evidence" below).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from privateuse1_conformance.reports.text import one_line

SCOPE_MESSAGE = "$scope"
REASON_LIMIT = 400  # characters of a clause's n/a or undecided reason (one line: the report's schema)
PROGRESS_MESSAGE = "$progress"
REFERENCE_MESSAGE = "$reference"


# ------------------------------------------------------- whose evidence

# Evidence belongs to the kit: only the kit's own code (its packages, and the
# test modules the run collected) may declare a test inconclusive or name the
# contract and clause a failure is charged to. Anything the backend raises is
# the backend's error, whatever its class or attributes: an exception of the
# kit's Inconclusive class, or one carrying attributes that look like the
# kit's tags, raised by the backend counts for nothing of the kind. The
# kit's own declarations live in this module's registries (keyed by the
# exception object, which they keep alive), never on the exception, so an
# attribute set on an exception changes nothing. (A backend that rewrites the
# kit's memory inside its own process can lie anyway: docs/reports.md says
# what verify can and cannot prove.)

_issued: dict[int, BaseException] = {}          # Inconclusive raised by the kit, by id()
_tags: dict[int, tuple[BaseException, dict]] = {}  # contract / clause / step the kit charged an error to
_trusted_files: set[str] = set()                # the run's collected test modules


@functools.lru_cache(maxsize=None)
def _kit_dirs() -> tuple[str, ...]:
    """The folders of the kit's packages (installed or in a checkout)."""
    here = Path(__file__).resolve().parent
    dirs = {str(here)}
    for name in ("conformance", "reports"):
        spec = importlib.util.find_spec(f"privateuse1_conformance.{name}")
        for location in (spec.submodule_search_locations or []) if spec else []:
            dirs.add(str(Path(location).resolve()))
    return tuple(sorted(d + os.sep for d in dirs))


def trust(paths) -> None:
    """The test modules of this run (the plugin names those it collected):
    their code may declare evidence, like the kit's packages."""
    _trusted_files.update(str(Path(p).resolve()) for p in paths)
    _is_trusted_file.cache_clear()


@functools.lru_cache(maxsize=4096)
def _is_trusted_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    path = str(Path(filename).resolve())
    return path in _trusted_files or path.startswith(_kit_dirs())


def trusted_caller(depth: int = 1) -> bool:
    """Whether the function `depth` frames above the caller of this one is
    the kit's code (depth 1: the caller's caller)."""
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return False
    return _is_trusted_file(frame.f_code.co_filename)


def raised_by_kit(error: BaseException) -> bool:
    """Whether the kit's code raised `error`: an Inconclusive only when the
    kit issued it (inconclusive()); any other exception when the innermost
    frame of its traceback (for pytest's skip/fail/xfail functions, their
    caller) is the kit's."""
    if isinstance(error, Inconclusive):
        return _issued.get(id(error)) is error
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    while frames and _is_pytest_outcomes(frames[-1]):
        frames.pop()
    # (pytest's own code raises skips for the suite's markers and empty parameter sets)
    return bool(frames) and (_is_trusted_file(frames[-1]) or frames[-1].startswith(_PYTEST_DIR))


_PYTEST_DIR = str(Path(pytest.__file__).resolve().parent.parent / "_pytest") + os.sep


def _is_pytest_outcomes(filename: str) -> bool:
    return filename.startswith(_PYTEST_DIR) and Path(filename).name == "outcomes.py"


def forget() -> None:
    """Drop the registries (a new test process starts with none)."""
    _issued.clear()
    _tags.clear()
    _clauses.clear()
    _not_applicable_errors.clear()


# What this test process found about each clause it checked (ID.k ->
# DECIDED, or "n/a: <why>", or "undecided: <why>"): a check() that held or
# failed decides its clause (a scope does not: it only says whom a failure
# inside is charged to); a check that could not observe what its clause is
# about decides nothing, and says why. A contract is satisfied only when every clause it
# requires was decided by some test, or does not apply to the backend
# (reports/model.py).
DECIDED = "decided"
_clauses: dict[str, str] = {}


def decided(clause: str) -> None:
    """A check of `clause` (ID.k) ran (unless another check of it in this
    test could not observe: part of the clause is then still open)."""
    if "." in clause and not _clauses.get(clause, "").startswith("undecided"):
        _clauses[clause] = DECIDED


def not_applicable(clause: str, reason: str) -> None:
    """`clause` cannot apply to this backend (it lacks what the clause is
    about: a second device, instrumentation a check needs, work in flight
    on a backend that runs everything synchronously)."""
    if "." in clause and clause not in _clauses and trusted_caller():
        _clauses[clause] = f"n/a: {one_line(reason, REASON_LIMIT)}"


def undecided(clause: str, reason: str) -> None:
    """A check of `clause` could not observe what it is about (no gate, no
    work seen in flight): no evidence, and the reason why. It wins over
    other checks of the clause in the test, which decided only part of it."""
    if "." in clause and not _clauses.get(clause, "").startswith("undecided"):
        _clauses[clause] = f"undecided: {one_line(reason, REASON_LIMIT)}"


def clause_outcomes() -> dict[str, str]:
    return dict(sorted(_clauses.items()))


class Violation(AssertionError):
    """A check found the backend breaking `contract` (clause `clause`).
    The contract and clause count only when the kit's code raised it."""

    def __init__(self, message: str, contract: str | None = None, clause: str | None = None) -> None:
        super().__init__(message)
        if (contract or clause) and trusted_caller(_constructor_depth(self)):
            _set_tags(self, contract, clause, None)


def _constructor_depth(error: BaseException) -> int:
    """How many __init__ frames (of subclasses calling up) lie between the
    caller of _constructor_depth's caller and the code that made `error`."""
    depth, frame = 1, sys._getframe(2)
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is error:
        depth += 1
        frame = frame.f_back
    return depth


class Inconclusive(pytest.skip.Exception):
    """The test is no evidence about its contract(s) here (the reason says
    why). Counts only when raised by inconclusive() from the kit's code."""


class UntrustedEvidence(RuntimeError):
    """Code outside the kit tried to declare evidence (see above)."""


def inconclusive(reason: str, applies: bool = True) -> None:
    """End the test as no evidence (see Inconclusive). `applies` False: what
    the test checks does not apply to this backend (it needs a second device,
    or something the backend legitimately lacks), so its clauses do not
    count against the contract; else they are undecided. Only the kit's
    code may call it: from anywhere else it raises UntrustedEvidence, an error."""
    __tracebackhide__ = True
    if not trusted_caller():
        caller = sys._getframe(1)
        raise UntrustedEvidence(
            f"inconclusive({reason!r}) was called from {caller.f_code.co_filename}:{caller.f_lineno}, outside the "
            "kit: only the kit's own checks may declare a test inconclusive")
    error = Inconclusive(reason, allow_module_level=False)
    _issued[id(error)] = error
    if not applies:
        _not_applicable_errors[id(error)] = error
    raise error


_not_applicable_errors: dict[int, BaseException] = {}


def declared_not_applicable(error: BaseException) -> bool:
    """Whether the kit ended the test with inconclusive(..., applies=False)."""
    return _not_applicable_errors.get(id(error)) is error


def _set_tags(error: BaseException, contract: str | None, clause: str | None, step: str | None) -> None:
    entry = _tags.get(id(error))
    tags = entry[1] if entry is not None and entry[0] is error else {}
    for key, value in (("contract", contract), ("clause", clause), ("step", step)):
        if value and key not in tags:
            tags[key] = value
    _tags[id(error)] = (error, tags)


def _tag(error: BaseException, key: str) -> str | None:
    entry = _tags.get(id(error))
    return entry[1].get(key) if entry is not None and entry[0] is error else None


def contract_of(error: BaseException) -> str | None:
    return _tag(error, "contract")


def clause_of(error: BaseException) -> str | None:
    return _tag(error, "clause")


def step_of(error: BaseException) -> str | None:
    return _tag(error, "step")


def tag(error: BaseException, contract: str, clause: str | None = None, step: str | None = None) -> None:
    """Charge `error` to `contract` unless an inner scope or check already
    did (the kit's code only: a call from elsewhere changes nothing)."""
    if not trusted_caller():
        return
    _set_tags(error, None if contract_of(error) else contract, None if contract_of(error) else clause, step)


def copy_tags(source: BaseException, target: BaseException) -> None:
    """Charge `target` (an exception replacing `source`) as `source` is charged."""
    if trusted_caller():
        _set_tags(target, contract_of(source), clause_of(source), step_of(source))


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
    forget()


def _announce(thread: int) -> None:
    if _channel is not None and os.getpid() == _channel_pid:
        stack = _scopes.get(thread)
        innermost = list(stack[-1]) if stack else None
        _channel({SCOPE_MESSAGE: {"thread": thread, "scope": innermost}})


_clause_scopes = threading.local()   # the clauses of this thread's open scopes, innermost last


def scoped_clause() -> str | None:
    """The clause of the calling thread's innermost open scope, if it names one."""
    stack = getattr(_clause_scopes, "stack", None)
    return stack[-1] if stack else None


@contextmanager
def scope(contract: str, step: str | None = None, decides: bool = False) -> Iterator[None]:
    """Everything inside is evidence about `contract`: a contract ID, or a
    clause of one (DM-SET-001.2). See the module's doc. A scope is no check:
    a must_raise inside decides its clause, and `decides` makes leaving the
    scope without an exception decide it (the calls inside must succeed:
    that is the clause)."""
    contract, _, number = contract.partition(".")
    clause = f"{contract}.{number}" if number else None
    thread = threading.get_ident()
    with _lock:
        _scopes.setdefault(thread, []).append((contract, step))
        _announce(thread)
    stack = _clause_scopes.__dict__.setdefault("stack", [])
    stack.append(clause)
    try:
        yield
        if decides and clause:
            decided(clause)
    except BaseException as error:
        if contract_of(error) is None:
            _set_tags(error, contract, clause, step)
        else:
            _set_tags(error, None, None, step)
        raise
    finally:
        stack.pop()
        with _lock:
            _scopes[thread].pop()
            if not _scopes[thread]:
                del _scopes[thread]
            _announce(thread)


def carry(call: Callable[..., Any]) -> Callable[..., Any]:
    """`call`, to run on another thread, inside the scope open on this one
    (its innermost: contract or clause, and step). A crash on that thread is
    then charged to the scope that handed the work over, as it would be had
    the call run here (faulthandler names the thread that crashed, and the
    parent looks up that thread's scope). Without an open scope, `call`
    itself. The kit's own thread helpers (in_thread, the state machine's
    workers) hand their work over through it."""
    stack = _scopes.get(threading.get_ident())
    if not stack:
        return call
    contract, step = stack[-1]
    clause = scoped_clause()
    name = clause if clause and clause.startswith(contract + ".") else contract

    @functools.wraps(call)
    def carried(*args, **kwargs):
        with scope(name, step):
            return call(*args, **kwargs)

    return carried


def progress(name: str, value) -> None:
    """In a forked test process: tell the parent how far the test got, as a
    user property `name` (JSON-serializable `value`, the latest wins) that
    the parent attaches to the report of a crash or a hang, which would
    otherwise lose it with the process. A test that finishes reports its
    properties itself; its progress is then dropped."""
    if _channel is not None and os.getpid() == _channel_pid:
        _channel({PROGRESS_MESSAGE: [name, value]})


def reference_work(seconds: float) -> None:
    """In a forked test process: the seconds the test has spent so far on
    reference work, the CPU computing what the backend's results are
    compared with. The parent lets a test that keeps advancing run longer in
    proportion (progress.hard_limit), so a long operator entry on a backend
    as fast as the CPU is never judged hung."""
    if _channel is not None and os.getpid() == _channel_pid:
        _channel({REFERENCE_MESSAGE: float(seconds)})


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
