"""Device management: device_count, current_device, set_device,
exchange_device, maybe_exchange_device, and how the device module,
torch.accelerator, the hooks and the guard agree on them."""

from __future__ import annotations

import pytest
import torch

from ._helpers import in_thread, must, must_raise

contract = pytest.mark.contract


def current_everywhere(mod, cxx) -> dict[str, int]:
    """The current device as each layer reports it."""
    return {
        "module current_device()": must(mod.current_device, "the module's current_device()"),
        "torch.accelerator.current_device_index()": must(
            torch.accelerator.current_device_index, "torch.accelerator.current_device_index()"),
        "hooks getCurrentDevice()": must(cxx.hooks_get_current_device, "the hooks' getCurrentDevice()"),
        "guard getDevice()": must(cxx.guard_get_device, "the guard's getDevice()")[1],
    }


def assert_current(mod, cxx, expected: int, after: str) -> None:
    seen = current_everywhere(mod, cxx)
    wrong = {k: v for k, v in seen.items() if v != expected}
    assert not wrong, f"after {after}, the current device should be {expected} everywhere, but {wrong}"


@contract("DM-NAME-001")
@pytest.mark.zero_devices_ok
def test_backend_name_is_the_device_type(dt, n):
    name = torch._C._get_privateuse1_backend_name()
    assert name != "privateuseone", "PrivateUse1 was never renamed (torch.utils.rename_privateuse1_backend)"
    assert name == dt
    assert torch.device(f"{dt}:0").type == dt
    assert torch.device(dt).type == dt and torch.device(dt).index is None
    if n:  # a tensor needs a device
        assert torch.empty(0, device=f"{dt}:0").device.type == dt, "a tensor on the device reports another type"


@contract("DM-NAME-002")
@pytest.mark.zero_devices_ok
def test_rename_is_once(dt):
    must(lambda: torch.utils.rename_privateuse1_backend(dt), f"renaming PrivateUse1 again to {dt!r}")
    must_raise(lambda: torch.utils.rename_privateuse1_backend(dt + "x"),
               f"renaming PrivateUse1 from {dt!r} to {dt + 'x'!r}")
    assert torch._C._get_privateuse1_backend_name() == dt


@contract("DM-MOD-001")
@pytest.mark.zero_devices_ok
def test_device_module_is_registered_once(dt, mod):
    assert torch.get_device_module(dt) is mod
    assert getattr(torch, dt) is mod
    must_raise(lambda: torch._register_device_module(dt, object()),
               "registering a second device module for the backend's name")
    assert torch.get_device_module(dt) is mod, "a failed second registration replaced the module"


@contract("DM-ACC-001")
@pytest.mark.zero_devices_ok
def test_current_accelerator_does_not_initialize(dt, mod, n, cxx):
    accelerator = torch.accelerator.current_accelerator()
    assert accelerator is not None, "torch.accelerator.current_accelerator() is None"
    assert accelerator.type == dt and accelerator.index is None, accelerator
    assert hasattr(mod, "is_initialized"), "the device module has no is_initialized()"
    assert not mod.is_initialized(), "current_accelerator() initialized the backend"
    contexts = [i for i in range(n) if cxx.hooks_has_primary_context(i)]
    assert not contexts, f"current_accelerator() created a context on device(s) {contexts}"


@contract("DM-COUNT-001")
@pytest.mark.zero_devices_ok
def test_device_counts_agree(mod, cxx):
    counts = {
        "torch.accelerator.device_count()": torch.accelerator.device_count(),
        "module device_count()": must(mod.device_count, "the module's device_count()"),
        "hooks deviceCount()": must(cxx.hooks_device_count, "the hooks' deviceCount()"),
        "guard deviceCount()": cxx.guard_device_count(),
    }
    assert len(set(counts.values())) == 1, f"device counts disagree: {counts}"


@contract("DM-COUNT-002")
@pytest.mark.zero_devices_ok
def test_availability_agrees_with_count(mod, cxx):
    count = mod.device_count()
    answers = {
        "torch.accelerator.is_available()": torch.accelerator.is_available(),
        "module is_available()": must(mod.is_available, "the module's is_available()"),
        "hooks isAvailable()": must(cxx.hooks_is_available, "the hooks' isAvailable()"),
    }
    wrong = {k: v for k, v in answers.items() if v != (count > 0)}
    assert not wrong, f"with {count} device(s), availability should be {count > 0}: {wrong}"


@contract("DM-COUNT-003")
@pytest.mark.zero_devices_ok
def test_queries_neither_raise_nor_initialize(mod, n, cxx):
    for name in ("device_count", "is_available", "is_initialized"):
        assert callable(getattr(mod, name, None)), f"the device module has no {name}()"
        for _ in range(3):
            must(getattr(mod, name), f"the module's {name}()")
    must(torch.accelerator.device_count, "torch.accelerator.device_count()")
    must(torch.accelerator.is_available, "torch.accelerator.is_available()")
    assert not mod.is_initialized(), "device_count()/is_available()/is_initialized() initialized the backend"
    contexts = [i for i in range(n) if cxx.hooks_has_primary_context(i)]
    assert not contexts, f"the queries created a context on device(s) {contexts}"


@contract("DM-GET-001")
def test_fresh_process_and_new_threads_start_on_device_0(mod, n, cxx):
    assert_current(mod, cxx, 0, "process start")
    if n > 1:
        mod.set_device(n - 1)
    assert in_thread(mod.current_device) == 0, "a new thread does not start on device 0"
    assert in_thread(torch.accelerator.current_device_index) == 0, \
        "a new thread does not start on device 0 (torch.accelerator)"
    assert in_thread(cxx.hooks_get_current_device) == 0, "a new thread does not start on device 0 (hooks)"


@contract("DM-SET-001")
def test_set_device_reaches_every_layer(mod, dt, n, cxx):
    for i in list(range(n)) + list(reversed(range(n))):
        must(lambda: mod.set_device(i), f"set_device({i})")
        assert_current(mod, cxx, i, f"module set_device({i})")
    for i in reversed(range(n)):
        must(lambda: torch.accelerator.set_device_index(i), f"torch.accelerator.set_device_index({i})")
        assert_current(mod, cxx, i, f"torch.accelerator.set_device_index({i})")
    for i in range(n):
        must(lambda: cxx.hooks_set_current_device(i), f"hooks setCurrentDevice({i})")
        assert_current(mod, cxx, i, f"hooks setCurrentDevice({i})")
    must(lambda: mod.set_device(torch.device(dt, n - 1)), f"set_device(torch.device({dt!r}, {n - 1}))")
    assert_current(mod, cxx, n - 1, f"set_device(torch.device({dt!r}, {n - 1}))")


@contract("DM-SET-002", "ER-MSG-001")
def test_set_device_rejects_out_of_range(mod, n, cxx):
    start = n - 1
    mod.set_device(start)
    for bad in (n, n + 1, n + 1000, -2):
        must_raise(lambda: mod.set_device(bad), f"set_device({bad}) with {n} device(s)",
                   RuntimeError, mentions=(str(bad), str(n)))
        assert_current(mod, cxx, start, f"the rejected set_device({bad})")
    for bad in (n, n + 100):
        must_raise(lambda: torch.accelerator.set_device_index(bad),
                   f"torch.accelerator.set_device_index({bad}) with {n} device(s)", RuntimeError,
                   mentions=(str(bad),))
        assert_current(mod, cxx, start, f"the rejected torch.accelerator.set_device_index({bad})")
    for bad in (n, -2):
        must_raise(lambda: cxx.hooks_set_current_device(bad), f"hooks setCurrentDevice({bad})",
                   RuntimeError, mentions=(str(bad),))
        assert_current(mod, cxx, start, f"the rejected hooks setCurrentDevice({bad})")


@contract("DM-SET-003")
def test_minus_one_is_a_no_op(mod, n, cxx):
    mod.set_device(n - 1)
    must(lambda: torch.accelerator.set_device_index(-1), "torch.accelerator.set_device_index(-1)")
    assert_current(mod, cxx, n - 1, "torch.accelerator.set_device_index(-1)")
    must(lambda: mod.set_device(-1), "the module's set_device(-1)")
    assert_current(mod, cxx, n - 1, "the module's set_device(-1)")


@contract("DM-SET-004", "ER-MSG-001")
def test_set_device_rejects_other_device_types(mod, n, cxx):
    mod.set_device(n - 1)
    for other in ("cpu:0", torch.device("cpu", 0), "meta:0"):
        must_raise(lambda: mod.set_device(other), f"set_device({other!r})", (ValueError, RuntimeError))
        assert_current(mod, cxx, n - 1, f"the rejected set_device({other!r})")
        must_raise(lambda: torch.accelerator.set_device_index(other),
                   f"torch.accelerator.set_device_index({other!r})", (ValueError, RuntimeError))
    must_raise(lambda: cxx.guard_set_device_of_type("cpu", 0), "guard setDevice(cpu:0)",
               RuntimeError, mentions=("cpu",))
    assert_current(mod, cxx, n - 1, "the rejected guard setDevice(cpu:0)")


@contract("DM-XCHG-001")
def test_exchange_device_returns_previous(mod, n, cxx):
    for j in list(range(n)) + [0]:
        before = mod.current_device()
        previous = must(lambda: torch._C._accelerator_exchangeDevice(j), f"torch.accelerator exchangeDevice({j})")
        assert previous == before, f"exchangeDevice({j}) returned {previous}, but the previous device was {before}"
        assert_current(mod, cxx, j, f"exchangeDevice({j})")
    for j in list(reversed(range(n))):
        before = mod.current_device()
        previous = must(lambda: cxx.hooks_exchange_device(j), f"hooks exchangeDevice({j})")
        assert previous == before, f"hooks exchangeDevice({j}) returned {previous}, not the previous {before}"
        assert_current(mod, cxx, j, f"hooks exchangeDevice({j})")


@contract("DM-XCHG-002", "ER-MSG-001")
def test_exchange_device_rejects_bad_indices(mod, n, cxx):
    mod.set_device(n - 1)
    for bad in (n, n + 7):
        must_raise(lambda: torch._C._accelerator_exchangeDevice(bad),
                   f"torch.accelerator exchangeDevice({bad})", RuntimeError, mentions=(str(bad),))
        assert_current(mod, cxx, n - 1, f"the rejected exchangeDevice({bad})")
        must_raise(lambda: cxx.hooks_exchange_device(bad), f"hooks exchangeDevice({bad})",
                   RuntimeError, mentions=(str(bad),))
        assert_current(mod, cxx, n - 1, f"the rejected hooks exchangeDevice({bad})")


@contract("DM-MXCHG-001")
def test_maybe_exchange_minus_one_is_a_no_op(mod, n, cxx):
    mod.set_device(n - 1)
    result = must(lambda: torch._C._accelerator_maybeExchangeDevice(-1),
                  "torch.accelerator maybeExchangeDevice(-1)")
    assert result == n - 1, f"maybeExchangeDevice(-1) returned {result}; the device is {n - 1}"
    assert_current(mod, cxx, n - 1, "maybeExchangeDevice(-1)")
    must(lambda: cxx.hooks_maybe_exchange_device(-1), "hooks maybeExchangeDevice(-1)")
    assert_current(mod, cxx, n - 1, "hooks maybeExchangeDevice(-1)")


@contract("DM-MXCHG-002")
def test_maybe_exchange_switches_valid_and_ignores_invalid(mod, n, cxx):
    for j in reversed(range(n)):
        result = must(lambda: torch._C._accelerator_maybeExchangeDevice(j),
                      f"torch.accelerator maybeExchangeDevice({j})")
        assert result == j, f"maybeExchangeDevice({j}) left device {result} current"
        assert_current(mod, cxx, j, f"maybeExchangeDevice({j})")
    for j in range(n):
        before = mod.current_device()
        previous = must(lambda: cxx.hooks_maybe_exchange_device(j), f"hooks maybeExchangeDevice({j})")
        assert previous == before, f"hooks maybeExchangeDevice({j}) returned {previous}, not {before}"
        assert_current(mod, cxx, j, f"hooks maybeExchangeDevice({j})")
    mod.set_device(n - 1)
    # An invalid index may raise a clear error, but must not switch or crash.
    for call, name in ((torch._C._accelerator_maybeExchangeDevice, "torch.accelerator maybeExchangeDevice"),
                       (cxx.hooks_maybe_exchange_device, "hooks maybeExchangeDevice")):
        try:
            call(n)
        except RuntimeError:
            pass
        assert_current(mod, cxx, n - 1, f"{name}({n}) with {n} device(s)")


@contract("DM-CTX-001")
def test_device_contexts_restore(mod, n, cxx):
    assert hasattr(mod, "device"), "the device module has no device(index) context manager"
    last = n - 1
    for make, name in ((mod.device, "module device()"), (torch.accelerator.device_index, "device_index()")):
        mod.set_device(0)
        with make(last):
            assert_current(mod, cxx, last, f"entering {name}({last})")
            with make(0):
                assert_current(mod, cxx, 0, f"entering nested {name}(0)")
            assert_current(mod, cxx, last, f"leaving nested {name}(0)")
        assert_current(mod, cxx, 0, f"leaving {name}({last})")
        with pytest.raises(KeyError):
            with make(last):
                raise KeyError("escapes")
        assert_current(mod, cxx, 0, f"an exception escaping {name}({last})")
        mod.set_device(last)
        with make(None):
            assert_current(mod, cxx, last, f"{name}(None)")
        assert_current(mod, cxx, last, f"leaving {name}(None)")


@contract("DM-THREAD-001")
def test_current_device_is_per_thread(mod, n, cxx):
    def set_and_report():
        mod.set_device(1)
        return mod.current_device()

    assert in_thread(set_and_report) == 1
    assert_current(mod, cxx, 0, "another thread set device 1")
    mod.set_device(1)
    assert in_thread(mod.current_device) == 0, "a new thread sees the main thread's device"
    assert in_thread(cxx.hooks_get_current_device) == 0, "a new thread sees the main thread's device (hooks)"


@contract("DM-PLACE-001")
def test_tensors_land_on_the_current_device(mod, dt, n):
    for i in (1, 0, n - 1):
        mod.set_device(i)
        for make in (lambda: torch.empty(3, device=dt), lambda: torch.ones(3, device=torch.device(dt)),
                     lambda: torch.zeros(2, 2, device=dt)):
            t = must(make, f"creating a tensor on {dt!r} with device {i} current")
            assert t.device == torch.device(dt, i), f"with device {i} current, a new tensor landed on {t.device}"


@contract("DM-PARSE-001", "ER-MSG-001")
@pytest.mark.zero_devices_ok
def test_bad_device_strings_are_rejected(dt):
    for text in (f"{dt}:-2", f"{dt}:abc", f"{dt}:1:2", f"{dt}:"):
        must_raise(lambda: torch.device(text), f"torch.device({text!r})", (RuntimeError, ValueError))
