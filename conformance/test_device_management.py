"""Device management: device_count, current_device, set_device,
exchange_device, maybe_exchange_device, and how the device module,
torch.accelerator and the guard agree on them (the hooks' device functions
are HK-DEV-001's, in test_hooks.py).

Each check names the clause of the statement it decides (DM-SET-001.2 is
clause 2 of DM-SET-001; conformance/contracts.toml lists them)."""

from __future__ import annotations

import threading

import pytest
import torch

from ._helpers import (answer_in_new_interpreter, check, expect_current, in_thread, inconclusive, initialized_by, must,
                       must_raise, names_number, names_range, rejects_index, scope)

contract = pytest.mark.contract

# Wrong types a device-management function may reject with any of these.
TYPE_ERRORS = (TypeError, ValueError, RuntimeError)
# The errors an index out of range may raise.
INDEX_ERRORS = (RuntimeError, ValueError, IndexError)


@contract("DM-NAME-001")
@pytest.mark.zero_devices_ok
def test_backend_name_is_the_device_type(dt):
    name = torch._C._get_privateuse1_backend_name()
    check("DM-NAME-001.1", name == dt and name != "privateuseone",
          f"PrivateUse1 is called {name!r}: torch.utils.rename_privateuse1_backend was never called")
    indexed, bare = torch.device(f"{dt}:0"), torch.device(dt)
    check("DM-NAME-001.2", (indexed.type, indexed.index) == (dt, 0),
          f"torch.device('{dt}:0') is {indexed!r}")
    check("DM-NAME-001.2", (bare.type, bare.index) == (dt, None), f"torch.device({dt!r}) is {bare!r}")


@contract("DM-NAME-002")
@pytest.mark.zero_devices_ok
def test_rename_is_once(dt):
    with scope("DM-NAME-002.1", decides=True):
        must(lambda: torch.utils.rename_privateuse1_backend(dt), f"renaming PrivateUse1 again to {dt!r}")
    with scope("DM-NAME-002.2"):
        must_raise(lambda: torch.utils.rename_privateuse1_backend(dt + "x"),
                   f"renaming PrivateUse1 from {dt!r} to {dt + 'x'!r}")
    check("DM-NAME-002.2", torch._C._get_privateuse1_backend_name() == dt,
          "a refused rename changed the backend's name")


@contract("DM-MOD-001")
@pytest.mark.zero_devices_ok
def test_device_module_is_registered_once(dt, mod):
    check("DM-MOD-001.1", torch.get_device_module(dt) is mod and getattr(torch, dt) is mod,
          f"torch.get_device_module({dt!r}) is not torch.{dt}")
    with scope("DM-MOD-001.2"):
        must_raise(lambda: torch._register_device_module(dt, object()),
                   "registering a second device module for the backend's name")
    check("DM-MOD-001.2", torch.get_device_module(dt) is mod, "a refused second registration replaced the module")


@contract("DM-ACC-001")
@pytest.mark.zero_devices_ok
def test_current_accelerator_does_not_initialize(dt, mod, n, cxx):
    accelerator = initialized_by("DM-ACC-001.2", torch.accelerator.current_accelerator,
                                 "torch.accelerator.current_accelerator()", mod, cxx, n)
    check("DM-ACC-001.1", accelerator is not None and (accelerator.type, accelerator.index) == (dt, None),
          f"torch.accelerator.current_accelerator() is {accelerator!r}, not torch.device({dt!r})")


def _counts(mod, cxx) -> dict[str, int]:
    return {
        "torch.accelerator.device_count()": must(torch.accelerator.device_count, "torch.accelerator.device_count()"),
        "module device_count()": must(mod.device_count, "the module's device_count()"),
        "guard deviceCount()": must(cxx.guard_device_count, "the guard's deviceCount()"),
    }


@contract("DM-COUNT-001")
@pytest.mark.zero_devices_ok
def test_device_counts_agree(mod, cxx, dt, n):
    for when in ("before any device use", "after a device was used"):
        if when.startswith("after"):
            if n == 0:
                break
            must(lambda: torch.ones(2, device=f"{dt}:{n - 1}"), "creating a tensor on the last device")
        with scope("DM-COUNT-001.1"):
            counts = _counts(mod, cxx)
        reference = counts["torch.accelerator.device_count()"]
        check("DM-COUNT-001.1", counts["module device_count()"] == reference == counts["guard deviceCount()"],
              f"{when}, the module, torch.accelerator and the guard disagree on the device count: {counts}")


@contract("DM-COUNT-002")
@pytest.mark.zero_devices_ok
def test_availability_agrees_with_count(mod, cxx, dt, n):
    expected = n > 0
    for clause, name, ask in (("DM-COUNT-002.1", "torch.accelerator.is_available()", torch.accelerator.is_available),
                              ("DM-COUNT-002.1", "the module's is_available()", mod.is_available)):
        with scope(clause):
            answer = must(ask, name)
        check(clause, answer is expected or answer == expected,
              f"with {n} device(s), {name} returned {answer!r}, not {expected}")


@contract("DM-COUNT-003")
@pytest.mark.zero_devices_ok
def test_queries_neither_raise_nor_initialize(mod, n, cxx):
    queries = []
    for name in ("device_count", "is_available", "is_initialized"):
        function = getattr(mod, name, None)
        check("DM-COUNT-003.1", callable(function), f"the device module has no {name}()")
        queries.append((f"the module's {name}()", function))
    queries += [("torch.accelerator.device_count()", torch.accelerator.device_count),
                ("torch.accelerator.is_available()", torch.accelerator.is_available)]

    def ask_all() -> None:
        for _ in range(3):
            for what, function in queries:
                with scope("DM-COUNT-003.1"):
                    must(function, what)

    initialized_by("DM-COUNT-003.2", ask_all, "device_count()/is_available()/is_initialized()", mod, cxx, n)


# A fresh interpreter: the backend's import and first queries, with no fork in
# between (a forked child may not see what the parent's import did).
_FRESH_PROCESS = """
import importlib, json, sys
import torch
importlib.import_module(sys.argv[1])
from privateuse1_conformance.conformance import _cxx
mod = getattr(torch, torch._C._get_privateuse1_backend_name())
n = int(mod.device_count())
# The baseline: what hasPrimaryContext says right after the import, before
# the queries below (device_count() above is needed to know which indices).
imported = [i for i in range(n) if _cxx.hooks_has_primary_context(i)]
mod.is_available()
torch.accelerator.device_count()
torch.accelerator.is_available()
answer = {"count": n, "imported": imported, "contexts": [i for i in range(n) if _cxx.hooks_has_primary_context(i)]}
if callable(getattr(mod, "is_initialized", None)):
    answer["initialized"] = bool(mod.is_initialized())
print("ANSWER " + json.dumps(answer))
"""


@contract("DM-COUNT-003")
@pytest.mark.zero_devices_ok
def test_import_and_queries_create_no_context_in_a_new_interpreter(backend):
    """Observed in a newly started interpreter, not a forked child: a backend
    that creates device contexts while it loads or counts devices must be seen
    doing so (a forked child of an initialized parent may report otherwise)."""
    with scope("DM-COUNT-003.3"):
        answer = answer_in_new_interpreter("DM-COUNT-003.3", _FRESH_PROCESS, backend.module_name,
                                           "importing the backend and calling device_count()/is_available()")
    imported, count = answer["imported"], answer["count"]
    if imported and len(imported) == count:
        # True for every device right after the import: a hook that answers
        # True regardless (HK-CTX-001's deviation) looks exactly the same.
        # (One that answers True for some devices and False for others
        # discriminates, so its True is taken at its word below.)
        inconclusive(f"in a new interpreter, hasPrimaryContext is already True for every device ({imported}) right "
                     "after importing the backend and one device_count(): whether the import created the contexts "
                     "or the hook answers True regardless (an HK-CTX-001 deviation) cannot be told from here")
    check("DM-COUNT-003.3", not answer["contexts"],
          f"in a new interpreter, importing the backend and calling device_count()/is_available() created a "
          f"primary context on device(s) {answer['contexts']} (hasPrimaryContext is True)")
    check("DM-COUNT-003.3", not answer.get("initialized"),
          "in a new interpreter, importing the backend and calling device_count()/is_available() left the module "
          "reporting is_initialized() True")


@contract("DM-GET-001")
def test_fresh_process_starts_on_device_0(mod, cxx):
    expect_current("DM-GET-001.1", mod, cxx, 0, "process start")


@contract("DM-GET-001")
def test_new_threads_start_on_device_0(mod, cxx, n):
    mod.set_device(n - 1)  # the creating thread's device must not be inherited
    for name, ask in (("the module's current_device()", mod.current_device),
                      ("torch.accelerator.current_device_index()", torch.accelerator.current_device_index),
                      ("the guard's getDevice()", lambda: cxx.guard_get_device()[1])):
        with scope("DM-GET-001.2"):
            seen = in_thread(lambda: must(ask, f"{name} in a new thread"))
        check("DM-GET-001.2", seen == 0,
              f"with device {n - 1} current in the creating thread, {name} in a new thread is {seen}, not 0")


SETTERS = (
    ("DM-SET-001.1", "the module's set_device", lambda mod, cxx: mod.set_device),
    ("DM-SET-001.2", "torch.accelerator.set_device_index", lambda mod, cxx: torch.accelerator.set_device_index),
)


@contract("DM-SET-001")
@pytest.mark.parametrize("clause,name,setter", SETTERS, ids=[s[1] for s in SETTERS])
def test_set_device_reaches_every_layer(clause, name, setter, mod, cxx, n):
    """From every device to every device (the same one included), in the
    test's thread and in another thread."""
    set_device = setter(mod, cxx)

    def switch_all() -> None:
        for i in range(n):
            for j in range(n):
                with scope(clause):
                    must(lambda: mod.set_device(i), f"the module's set_device({i})")
                    must(lambda: set_device(j), f"{name}({j}) with device {i} current")
                expect_current(clause, mod, cxx, j, f"{name}({j}) with device {i} current")

    switch_all()
    in_thread(switch_all)


@contract("DM-SET-002")
def test_set_device_rejects_out_of_range(mod, n, cxx):
    start = n - 1
    mod.set_device(start)
    for bad in (n, n + 1, n + 100):
        rejects_index("DM-SET-002.1", lambda: mod.set_device(bad), f"the module's set_device({bad}) with {n} device(s)",
                      bad, n)
        expect_current("DM-SET-002.3", mod, cxx, start, f"the rejected set_device({bad})")
    # Below -1: rejected like an index past the end, or ignored as
    # torch.cuda.set_device ignores every negative index; never a switch.
    for bad in (-2, -100):
        what = f"the module's set_device({bad}) with {n} device(s)"
        with scope("DM-SET-002.4"):
            try:
                mod.set_device(bad)
            except INDEX_ERRORS as error:
                message = str(error)
                check("DM-SET-002.4", names_number(message, bad) and names_range(message, n),
                      lambda: f"{what} raised {type(error).__name__}, but its message does not name both the index "
                              f"{bad} and the device count {n} or the valid range [0, {n}): {message!r} (ignoring "
                              "the negative index, as torch.cuda.set_device does, would also pass)")
            except Exception as error:  # noqa: BLE001
                check("DM-SET-002.4", False,
                      f"{what} raised {type(error).__name__}: {error}; it must either raise RuntimeError, "
                      "ValueError or IndexError naming the index and the range, or do nothing")
        expect_current("DM-SET-002.4", mod, cxx, start, what)
    for bad in (n, n + 100):
        rejects_index("DM-SET-002.2", lambda: torch.accelerator.set_device_index(bad),
                      f"torch.accelerator.set_device_index({bad}) with {n} device(s)", bad, n)
        expect_current("DM-SET-002.3", mod, cxx, start, f"the rejected torch.accelerator.set_device_index({bad})")


@contract("DM-SET-003")
def test_minus_one_is_a_no_op(mod, n, cxx):
    mod.set_device(n - 1)
    with scope("DM-SET-003.1"):
        must(lambda: torch.accelerator.set_device_index(-1), "torch.accelerator.set_device_index(-1)")
    expect_current("DM-SET-003.1", mod, cxx, n - 1, "torch.accelerator.set_device_index(-1)")
    with scope("DM-SET-003.2"):
        must(lambda: mod.set_device(-1), "the module's set_device(-1)")
    expect_current("DM-SET-003.2", mod, cxx, n - 1, "the module's set_device(-1)")


@contract("DM-SET-004")
def test_set_device_rejects_other_device_types(mod, n, cxx):
    mod.set_device(n - 1)
    for other in ("cpu:0", torch.device("cpu", 0), "meta:0"):
        with scope("DM-SET-004.1"):
            must_raise(lambda: mod.set_device(other), f"the module's set_device({other!r})", TYPE_ERRORS)
        expect_current("DM-SET-004.1", mod, cxx, n - 1, f"the rejected set_device({other!r})")
        with scope("DM-SET-004.2"):
            must_raise(lambda: torch.accelerator.set_device_index(other),
                       f"torch.accelerator.set_device_index({other!r})", TYPE_ERRORS)
        expect_current("DM-SET-004.2", mod, cxx, n - 1, f"the rejected torch.accelerator.set_device_index({other!r})")


@contract("DM-XCHG-001")
def test_exchange_device_returns_previous(mod, n, cxx):
    clause, name, exchange = "DM-XCHG-001.1", "torch.accelerator exchangeDevice", torch._C._accelerator_exchangeDevice
    for i in range(n):
        for j in range(n):
            mod.set_device(i)
            with scope(clause):
                previous = must(lambda: exchange(j), f"{name}({j}) with device {i} current")
            check(clause, previous == i, f"{name}({j}) with device {i} current returned {previous}, not {i}")
            expect_current(clause, mod, cxx, j, f"{name}({j}) with device {i} current")


@contract("DM-XCHG-002")
def test_exchange_device_rejects_bad_indices(mod, n, cxx):
    clause, name, exchange = "DM-XCHG-002.1", "torch.accelerator exchangeDevice", torch._C._accelerator_exchangeDevice
    mod.set_device(n - 1)
    for bad in (n, n + 7):
        with scope(clause):
            must_raise(lambda: exchange(bad), f"{name}({bad}) with {n} device(s)", (RuntimeError, ValueError, IndexError))
        expect_current(clause, mod, cxx, n - 1, f"the rejected {name}({bad})")


@contract("DM-MXCHG-001")
def test_maybe_exchange_minus_one_is_a_no_op(mod, n, cxx):
    for start in sorted({0, n - 1}):
        mod.set_device(start)
        with scope("DM-MXCHG-001.1"):
            result = must(lambda: torch._C._accelerator_maybeExchangeDevice(-1),
                          "torch.accelerator maybeExchangeDevice(-1)")
        check("DM-MXCHG-001.1", result in (start, -1),
              f"with device {start} current, maybeExchangeDevice(-1) returned {result}")
        expect_current("DM-MXCHG-001.1", mod, cxx, start, "torch.accelerator maybeExchangeDevice(-1)")


@contract("DM-MXCHG-002")
def test_maybe_exchange_switches_to_a_valid_index(mod, n, cxx):
    for i in range(n):
        for j in range(n):
            mod.set_device(i)
            with scope("DM-MXCHG-002.1"):
                result = must(lambda: torch._C._accelerator_maybeExchangeDevice(j),
                              f"torch.accelerator maybeExchangeDevice({j})")
            check("DM-MXCHG-002.1", result == j,
                  f"torch.accelerator maybeExchangeDevice({j}) with device {i} current returned {result}, not {j} "
                  "(PyTorch's binding returns the device current afterwards)")
            expect_current("DM-MXCHG-002.1", mod, cxx, j, f"maybeExchangeDevice({j}) with device {i} current")


@contract("DM-MXCHG-002")
def test_maybe_exchange_ignores_an_invalid_index(mod, n, cxx):
    """An invalid index may be refused with an error or ignored; either way
    the current device stays (the call is made for its no-raise use)."""
    mod.set_device(n - 1)
    for bad in (n, n + 3):
        try:
            torch._C._accelerator_maybeExchangeDevice(bad)
        except (RuntimeError, ValueError, IndexError):
            pass
        expect_current("DM-MXCHG-002.2", mod, cxx, n - 1, f"torch.accelerator maybeExchangeDevice({bad}) with {n} "
                                                        "device(s)")


CONTEXTS = (
    ("DM-CTX-001.1", "the module's device", lambda mod: mod.device),
    ("DM-CTX-001.2", "torch.accelerator.device_index", lambda mod: torch.accelerator.device_index),
)


@contract("DM-CTX-001")
@pytest.mark.parametrize("clause,name,maker", CONTEXTS, ids=[c[1] for c in CONTEXTS])
def test_device_contexts_restore(clause, name, maker, mod, n, cxx):
    if clause == "DM-CTX-001.1":
        check(clause, callable(getattr(mod, "device", None)), "the device module has no device(index) context manager")
    make = maker(mod)
    last = n - 1
    for start, target in sorted({(0, last), (last, 0), (last, last)}):
        mod.set_device(start)
        with scope(clause):
            manager = must(lambda: make(target), f"{name}({target})")
            with manager:
                expect_current(clause, mod, cxx, target, f"entering {name}({target}) from device {start}")
                with make(start):
                    expect_current(clause, mod, cxx, start, f"entering a nested {name}({start})")
                expect_current(clause, mod, cxx, target, f"leaving the nested {name}({start})")
        expect_current(clause, mod, cxx, start, f"leaving {name}({target}) entered from device {start}")
        with pytest.raises(KeyError):
            with make(target):
                raise KeyError("escapes")
        expect_current(clause, mod, cxx, start, f"an exception escaping {name}({target}) entered from {start}")
    mod.set_device(last)
    with scope("DM-CTX-001.3"):
        with must(lambda: make(None), f"{name}(None)"):
            expect_current("DM-CTX-001.3", mod, cxx, last, f"entering {name}(None)")
    expect_current("DM-CTX-001.3", mod, cxx, last, f"leaving {name}(None)")


@contract("DM-THREAD-001")
def test_current_device_is_per_thread(mod, n, cxx):
    """Two threads that both exist while the other switches: neither sees the
    other's device (not only new threads, which DM-GET-001 covers)."""
    step = threading.Barrier(2, timeout=None)
    seen: dict[str, object] = {}

    def other() -> None:
        try:
            step.wait()                      # 1: the main thread switched to n - 1
            seen["other before"] = mod.current_device()
            mod.set_device(n - 1)
            step.wait()                      # 2: this thread switched too
            step.wait()                      # 3: the main thread switched back to 0
            seen["other after"] = {"module": mod.current_device(),
                                   "torch.accelerator": torch.accelerator.current_device_index(),
                                   "guard": cxx.guard_get_device()[1]}
        except BaseException as e:  # noqa: BLE001 - reported below
            seen["error"] = e
            step.abort()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        mod.set_device(0)
        with scope("DM-THREAD-001.1"):
            must(lambda: mod.set_device(n - 1), f"set_device({n - 1})")
        step.wait()
        step.wait()
        with scope("DM-THREAD-001.1"):
            must(lambda: mod.set_device(0), "set_device(0)")
        step.wait()
    except BaseException:
        step.abort()  # let the other thread go; its own error, if any, is raised below
        if "error" not in seen:
            raise
    finally:
        thread.join()
    if "error" in seen:
        raise seen["error"]
    check("DM-THREAD-001.1", seen["other before"] == 0,
          f"another thread's set_device({n - 1}) changed this thread's device to {seen['other before']}")
    wrong = {k: v for k, v in seen["other after"].items() if v != n - 1}
    check("DM-THREAD-001.1", not wrong,
          f"after this thread set device {n - 1} and another thread set device 0, this thread's device reads {wrong}")
    expect_current("DM-THREAD-001.1", mod, cxx, 0, f"another thread set device {n - 1}")


FACTORIES = (
    ("torch.empty", lambda d: torch.empty(3, device=d)),
    ("torch.ones", lambda d: torch.ones(3, device=d)),
    ("torch.zeros", lambda d: torch.zeros(2, 2, device=d)),
    ("torch.full", lambda d: torch.full((2,), 1.5, device=d)),
    ("torch.arange", lambda d: torch.arange(4, device=d)),
    ("torch.tensor", lambda d: torch.tensor([1.0, 2.0], device=d)),
    ("Tensor.to", lambda d: torch.ones(3).to(d)),
    ("torch.empty_like", lambda d: torch.empty_like(torch.ones(3), device=d)),
    ("Tensor.new_zeros", lambda d: torch.ones(3).new_zeros(2, device=d)),
)


@contract("DM-PLACE-001")
def test_tensors_land_on_the_current_device(mod, dt, n):
    for i in [*range(n), 0]:
        mod.set_device(i)
        for spelling in (dt, torch.device(dt)):
            for name, make in FACTORIES:
                with scope("DM-PLACE-001.1"):
                    t = must(lambda: make(spelling), f"{name}(..., device={spelling!r}) with device {i} current")
                check("DM-PLACE-001.1", t.device == torch.device(dt, i),
                      f"with device {i} current, {name}(..., device={spelling!r}) landed on {t.device}")


@contract("DM-PARSE-001")
@pytest.mark.zero_devices_ok
def test_bad_device_strings_are_rejected(dt):
    for text in (f"{dt}:-2", f"{dt}:abc", f"{dt}:1:2", f"{dt}:"):
        with scope("DM-PARSE-001.1"):
            must_raise(lambda: torch.device(text), f"torch.device({text!r})", (RuntimeError, ValueError))
