"""Device management: names, counts, current device, set/exchange/maybe-exchange,
context managers, threads and placement (contracts DM-*).

Entry points covered: ``torch.openreg`` (Python module), ``openreg._C`` (the
C++ bindings), ``torch.accelerator`` and the PrivateUse1 hooks / guard reached
through the kit's backend-agnostic probe ``_cxx``.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import openreg
from _support import N, _cxx, assert_range_error, error_text, run_json

# ------------------------------------------------------------------ helpers


def current_everywhere() -> dict[str, int]:
    """The current device as every entry point reports it."""
    return {
        "torch.openreg.current_device": torch.openreg.current_device(),
        "openreg._C._current_device": openreg._C._current_device(),
        "torch.accelerator.current_device_index": torch.accelerator.current_device_index(),
        "hooks.getCurrentDevice": _cxx.hooks_get_current_device(),
        "guard.getDevice": _cxx.guard_get_device()[1],
    }


def assert_current(expected: int, what: str = "") -> None:
    seen = current_everywhere()
    wrong = {k: v for k, v in seen.items() if v != expected}
    assert not wrong, f"{what}: expected current device {expected}, but {wrong}"


# Indices that are invalid for N devices, for the Python entry points
# (Python ints, including ones that overflow int8/int32).
def invalid_indices(count: int = N) -> list[int]:
    return sorted({count, count + 1, count + 1000, -2, -3, -128, -129, 127, 128, 300,
                   2**31, -(2**31)} - set(range(-1, count)))


# Invalid indices that fit c10::DeviceIndex (int8), for the C++ probe.
def invalid_int8_indices(count: int = N) -> list[int]:
    return sorted({count, count + 1, 127, -2, -3, -128} - set(range(-1, count)))


# ------------------------------------------------------------ name / counts


def test_backend_name_and_device_module():
    """DM-NAME-001 / DM-MOD-001: PrivateUse1 is named openreg and the module is registered."""
    assert torch._C._get_privateuse1_backend_name() == "openreg"
    assert torch.device("openreg:0").type == "openreg"
    assert torch.get_device_module("openreg") is openreg, (
        "torch.get_device_module('openreg') is not the openreg module")
    assert torch.openreg is openreg


def test_rename_again_to_same_name_is_accepted_and_to_another_rejected():
    """DM-NAME-002: renaming PrivateUse1 again to 'openreg' is fine; to another name fails."""
    torch.utils.rename_privateuse1_backend("openreg")
    with pytest.raises(RuntimeError):
        torch.utils.rename_privateuse1_backend("somethingelse")
    assert torch._C._get_privateuse1_backend_name() == "openreg"


def test_registering_a_second_device_module_is_rejected():
    """DM-MOD-001: the openreg device module cannot be replaced."""
    import types

    with pytest.raises(RuntimeError):
        torch._register_device_module("openreg", types.ModuleType("impostor"))
    assert torch.get_device_module("openreg") is openreg


def test_counts_agree_across_entry_points(n_devices):
    """DM-COUNT-001: accelerator, module, hooks and guard report the same count."""
    counts = {
        "torch.accelerator.device_count": torch.accelerator.device_count(),
        "torch.openreg.device_count": torch.openreg.device_count(),
        "openreg._C._device_count": openreg._C._device_count(),
        "hooks.deviceCount": _cxx.hooks_device_count(),
        "guard.deviceCount": _cxx.guard_device_count(),
    }
    assert set(counts.values()) == {n_devices}, f"device counts disagree: {counts}"


def test_availability_agrees_with_count(n_devices):
    """DM-COUNT-002: accelerator.is_available == module.is_available == hooks.isAvailable == (N > 0)."""
    expected = n_devices > 0
    seen = {
        "torch.accelerator.is_available": torch.accelerator.is_available(),
        "torch.openreg.is_available": torch.openreg.is_available(),
        "hooks.isAvailable": _cxx.hooks_is_available(),
    }
    assert set(seen.values()) == {expected}, f"availability disagrees with N={n_devices}: {seen}"


def test_current_accelerator_is_openreg_without_index():
    """DM-ACC-001: current_accelerator() is an 'openreg' device without index."""
    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type == "openreg", f"current_accelerator() = {acc!r}"
    assert acc.index is None, f"current_accelerator() has index {acc.index}, expected None"


def test_fresh_process_queries_never_initialize():
    """DM-COUNT-003 / DM-ACC-001 / DM-GET-001: counts, availability, is_initialized and
    current_accelerator neither raise nor initialize; a fresh process (and each new
    thread) starts on device 0; reading the current device initializes no device."""
    result = run_json("""
        import threading
        C = openreg._C
        n = torch.openreg.device_count()
        def state():
            return {
                "hooks_init_calls": C._runtime_counters()["hooks_init_calls"],
                "is_initialized": torch.openreg.is_initialized(),
                "device_initialized": [C._is_device_initialized(i) for i in range(n)],
                "primary_context": [_cxx.hooks_has_primary_context(i) for i in range(n)],
            }
        before = state()
        answers = {
            "device_count": [torch.openreg.device_count() for _ in range(3)],
            "is_available": torch.openreg.is_available(),
            "is_initialized": torch.openreg.is_initialized(),
            "acc_device_count": torch.accelerator.device_count(),
            "acc_is_available": torch.accelerator.is_available(),
            "acc_type": torch.accelerator.current_accelerator().type,
            "acc_checked_type": torch.accelerator.current_accelerator(check_available=True).type,
            "hooks_is_available": _cxx.hooks_is_available(),
            "hooks_is_built": _cxx.hooks_is_built(),
            "hooks_device_count": _cxx.hooks_device_count(),
            "guard_device_count": _cxx.guard_device_count(),
        }
        after_queries = state()
        start_device = torch.openreg.current_device()
        after_current = state()
        torch.openreg.set_device(1)
        seen = []
        t = threading.Thread(target=lambda: seen.append(
            (torch.openreg.current_device(), torch.accelerator.current_device_index())))
        t.start(); t.join()
        emit({"n": n, "before": before, "answers": answers, "after_queries": after_queries,
              "start_device": start_device, "after_current": after_current,
              "thread_start": seen[0], "after_set": state()})
    """)
    n = result["n"]
    assert n == 2, f"default device count is {n}, expected 2"
    untouched = {"hooks_init_calls": 0, "is_initialized": False,
                 "device_initialized": [False] * n, "primary_context": [False] * n}
    assert result["before"] == untouched, f"importing openreg initialized something: {result['before']}"
    answers = result["answers"]
    assert answers["device_count"] == [n] * 3
    assert answers["is_available"] is True and answers["acc_is_available"] is True
    assert answers["is_initialized"] is False
    assert answers["acc_device_count"] == n and answers["hooks_device_count"] == n
    assert answers["guard_device_count"] == n
    assert answers["acc_type"] == answers["acc_checked_type"] == "openreg"
    assert answers["hooks_is_available"] is True and answers["hooks_is_built"] is True
    assert result["after_queries"] == untouched, (
        f"device_count/is_available/is_initialized/current_accelerator/isAvailable "
        f"initialized something: {result['after_queries']}")
    assert result["start_device"] == 0, f"a fresh process starts on device {result['start_device']}"
    assert result["after_current"]["is_initialized"] is True, (
        "current_device() did not lazily initialize the module")
    assert result["after_current"]["device_initialized"] == [False] * n, (
        "reading the current device initialized a device (created a primary context)")
    assert result["thread_start"] == [0, 0], (
        f"a new thread did not start on device 0: {result['thread_start']}")
    assert result["after_set"]["primary_context"] == [False] * n, (
        "set_device initialized a device (hasPrimaryContext became true)")


# --------------------------------------------------------------- set_device


def test_set_device_every_index_through_every_entry_point(n_devices):
    """DM-SET-001: set_device(i) makes i current for module, accelerator, hooks and guard."""
    for i in range(n_devices):
        torch.openreg.set_device(i)
        assert_current(i, f"after torch.openreg.set_device({i})")
    for i in reversed(range(n_devices)):
        torch.openreg.set_device(f"openreg:{i}")
        assert_current(i, f"after torch.openreg.set_device('openreg:{i}')")
        torch.openreg.set_device(torch.device("openreg", i))
        assert_current(i, f"after torch.openreg.set_device(torch.device('openreg', {i}))")
    for i in range(n_devices):
        torch.accelerator.set_device_index(i)
        assert_current(i, f"after torch.accelerator.set_device_index({i})")
        _cxx.hooks_set_current_device((i + 1) % n_devices)
        assert_current((i + 1) % n_devices, f"after hooks.setCurrentDevice({(i + 1) % n_devices})")
        _cxx.guard_set_device(i)
        assert_current(i, f"after guard.setDevice({i})")


@pytest.mark.parametrize("index", invalid_indices())
def test_set_device_out_of_range_raises_and_keeps_device(two_devices, index):
    """DM-SET-002 / ER-MSG-001: invalid indices raise RuntimeError naming the index and
    [0, N); the current device is unchanged (also for ints that overflow int8)."""
    torch.openreg.set_device(1)
    with pytest.raises(RuntimeError) as excinfo:
        torch.openreg.set_device(index)
    assert_range_error(excinfo, index, N)
    assert_current(1, f"after the failed set_device({index})")


@pytest.mark.parametrize("index", [N, N + 5, 127])
def test_set_device_out_of_range_device_string_raises(two_devices, index):
    """DM-SET-002: 'openreg:K' / torch.device('openreg', K) with K out of range is rejected
    like the int K, naming K and the range."""
    torch.openreg.set_device(1)
    for spec in (f"openreg:{index}", torch.device("openreg", index)):
        with pytest.raises(RuntimeError) as excinfo:
            torch.openreg.set_device(spec)
        assert_range_error(excinfo, index, N)
        assert_current(1, f"after the failed set_device({spec!r})")


@pytest.mark.parametrize("index", [2**63, 2**70, -(2**70)])
def test_set_device_beyond_int64_is_a_range_error(two_devices, index):
    """DM-SET-002: Python ints wider than int64 are out of range like any other."""
    torch.openreg.set_device(1)
    with pytest.raises(RuntimeError) as excinfo:
        torch.openreg.set_device(index)
    assert_range_error(excinfo, index, N)
    assert_current(1, f"after the failed set_device({index})")


def test_set_device_minus_one_is_a_noop_and_indexless_device_is_rejected(two_devices):
    """DM-SET-003: set_device(-1) changes nothing; a device without an index
    is a ValueError (as torch.accelerator.set_device_index), state unchanged."""
    torch.openreg.set_device(1)
    torch.openreg.set_device(-1)
    assert_current(1, "after torch.openreg.set_device(-1)")
    for indexless in (torch.device("openreg"), "openreg"):
        with pytest.raises(ValueError, match="with an index"):
            torch.openreg.set_device(indexless)
        assert_current(1, f"after the rejected torch.openreg.set_device({indexless!r})")


@pytest.mark.parametrize("device", ["cpu:0", "cpu", torch.device("cpu", 0), torch.device("meta")])
def test_set_device_of_another_type_raises_value_error(two_devices, device):
    """DM-SET-004: a device of another type raises ValueError naming it; state unchanged."""
    torch.openreg.set_device(1)
    with pytest.raises(ValueError) as excinfo:
        torch.openreg.set_device(device)
    assert torch.device(device).type in error_text(excinfo), (
        f"the error does not name the wrong device type: {error_text(excinfo)!r}")
    assert_current(1, f"after the failed set_device({device!r})")


@pytest.mark.parametrize("value", [1.0, 0.5, [0], (1,), object(), b"0"])
def test_set_device_non_int_raises_type_error(two_devices, value):
    """ER-MSG-001: non-int, non-device arguments raise TypeError; state unchanged."""
    torch.openreg.set_device(1)
    with pytest.raises(TypeError):
        torch.openreg.set_device(value)
    assert_current(1, f"after the failed set_device({value!r})")


def test_accelerator_set_device_index_negative_is_noop_and_too_large_raises(two_devices):
    """DM-SET-003: torch.accelerator.set_device_index(negative) is a documented no-op;
    an index >= N raises naming the range."""
    torch.accelerator.set_device_index(1)
    for negative in (-1, -2, -5, -128):
        torch.accelerator.set_device_index(negative)
        assert_current(1, f"after torch.accelerator.set_device_index({negative})")
    for bad in (N, N + 1, 127):
        with pytest.raises(RuntimeError) as excinfo:
            torch.accelerator.set_device_index(bad)
        assert_range_error(excinfo, bad, N)
        assert_current(1, f"after the failed torch.accelerator.set_device_index({bad})")


def test_cxx_binding_set_device_validates_like_the_module(two_devices):
    """ER-MSG-001: the C++ binding rejects bad indices with the same message shape."""
    for bad in (N, -2, 300):
        with pytest.raises(RuntimeError) as excinfo:
            openreg._C._set_device(bad)
        assert_range_error(excinfo, bad, N)
    assert_current(0, "after failed openreg._C._set_device calls")


# ------------------------------------------------------------------ exchange


def test_exchange_device_returns_previous(two_devices):
    """DM-XCHG-001: exchange_device(j) returns the previous device and leaves j current."""
    for exchange in (openreg._exchange_device, openreg._C._exchange_device,
                     torch._C._accelerator_exchangeDevice, _cxx.hooks_exchange_device):
        torch.openreg.set_device(0)
        assert exchange(1) == 0, f"{exchange.__name__}(1) from device 0 did not return 0"
        assert_current(1, f"after {exchange.__name__}(1)")
        assert exchange(1) == 1, f"{exchange.__name__}(1) on device 1 did not return 1"
        assert_current(1, f"after {exchange.__name__}(1) again")
        assert exchange(0) == 1, f"{exchange.__name__}(0) from device 1 did not return 1"
        assert_current(0, f"after {exchange.__name__}(0)")
    torch.openreg.set_device(0)
    assert _cxx.guard_exchange_device(1) == ("openreg", 0)
    assert_current(1, "after guard.exchangeDevice(1)")


def test_exchange_device_invalid_raises_and_keeps_device(two_devices):
    """DM-XCHG-002: an invalid index raises naming index and range; nothing changes."""
    python_level = [openreg._exchange_device, openreg._C._exchange_device]
    cxx_level = [torch._C._accelerator_exchangeDevice, _cxx.hooks_exchange_device,
                 _cxx.guard_exchange_device]
    torch.openreg.set_device(1)
    for exchange in python_level:
        for bad in invalid_indices():
            with pytest.raises(RuntimeError) as excinfo:
                exchange(bad)
            assert_range_error(excinfo, bad, N)
            assert_current(1, f"after the failed {exchange.__name__}({bad})")
    for exchange in cxx_level:
        for bad in invalid_int8_indices():
            with pytest.raises(RuntimeError) as excinfo:
                exchange(bad)
            assert_range_error(excinfo, bad, N)
            assert_current(1, f"after the failed {exchange.__name__}({bad})")


def test_python_exchange_device_minus_one_is_noop(two_devices):
    """DM-XCHG-001: openreg._exchange_device(-1) changes nothing and returns -1."""
    torch.openreg.set_device(1)
    assert openreg._exchange_device(-1) == -1
    assert_current(1, "after openreg._exchange_device(-1)")


def test_cxx_exchange_device_minus_one_is_rejected_like_the_guard(two_devices):
    """HK-DEV-001: at the C++ level -1 is not a device; hooks and guard agree on rejecting it."""
    torch.openreg.set_device(1)
    for exchange in (openreg._C._exchange_device, _cxx.hooks_exchange_device,
                     _cxx.guard_exchange_device):
        with pytest.raises(RuntimeError) as excinfo:
            exchange(-1)
        assert_range_error(excinfo, -1, N)
        assert_current(1, f"after the failed {exchange.__name__}(-1)")


def test_maybe_exchange_device_minus_one(two_devices):
    """DM-MXCHG-001: Python-level maybe_exchange_device(-1) is a no-op returning -1;
    the C++ level (bindings, hooks) is a no-op returning the current device."""
    torch.openreg.set_device(1)
    assert openreg._maybe_exchange_device(-1) == -1
    assert_current(1, "after openreg._maybe_exchange_device(-1)")
    for maybe in (openreg._C._maybe_exchange_device, _cxx.hooks_maybe_exchange_device,
                  torch._C._accelerator_maybeExchangeDevice):
        assert maybe(-1) == 1, f"{maybe.__name__}(-1) on device 1 did not return 1"
        assert_current(1, f"after {maybe.__name__}(-1)")


def test_maybe_exchange_device_valid_behaves_like_exchange(two_devices):
    """DM-MXCHG-002: maybe_exchange_device(j) returns the previous device and makes j current
    (torch._C._accelerator_maybeExchangeDevice returns the device after the set)."""
    for maybe in (openreg._maybe_exchange_device, openreg._C._maybe_exchange_device,
                  _cxx.hooks_maybe_exchange_device):
        torch.openreg.set_device(0)
        assert maybe(1) == 0, f"{maybe.__name__}(1) from device 0 did not return 0"
        assert_current(1, f"after {maybe.__name__}(1)")
        assert maybe(0) == 1, f"{maybe.__name__}(0) from device 1 did not return 1"
        assert_current(0, f"after {maybe.__name__}(0)")
    torch.openreg.set_device(0)
    assert torch._C._accelerator_maybeExchangeDevice(1) == 1
    assert_current(1, "after torch._C._accelerator_maybeExchangeDevice(1)")


def test_maybe_exchange_device_invalid_never_raises_and_changes_nothing(two_devices):
    """DM-MXCHG-002: an invalid index changes nothing and returns the current device."""
    torch.openreg.set_device(1)
    for maybe in (openreg._maybe_exchange_device, openreg._C._maybe_exchange_device):
        for bad in invalid_indices() + [2**63, -(2**70)]:
            assert maybe(bad) == 1, f"{maybe.__name__}({bad}) did not return the current device 1"
            assert_current(1, f"after {maybe.__name__}({bad})")
    for maybe in (_cxx.hooks_maybe_exchange_device, torch._C._accelerator_maybeExchangeDevice):
        for bad in invalid_int8_indices():
            assert maybe(bad) == 1, f"{maybe.__name__}({bad}) did not return the current device 1"
            assert_current(1, f"after {maybe.__name__}({bad})")


# ----------------------------------------------------------------- contexts

CONTEXTS = {
    "torch.openreg.device": torch.openreg.device,
    "torch.accelerator.device_index": torch.accelerator.device_index,
}


@pytest.mark.parametrize("name", CONTEXTS)
def test_context_switches_and_restores(two_devices, name):
    """DM-CTX-001: the context makes j current and restores the previous device on exit."""
    ctx = CONTEXTS[name]
    torch.openreg.set_device(0)
    with ctx(1):
        assert_current(1, f"inside {name}(1)")
        torch.openreg.set_device(0)  # the body may move; exit still restores
    assert_current(0, f"after leaving {name}(1)")
    torch.openreg.set_device(1)
    with ctx(0):
        assert_current(0, f"inside {name}(0)")
    assert_current(1, f"after leaving {name}(0)")


@pytest.mark.parametrize("name", CONTEXTS)
def test_context_restores_on_exception(two_devices, name):
    """DM-CTX-001: the previous device is restored when an exception escapes."""
    ctx = CONTEXTS[name]

    class Boom(Exception):
        pass

    torch.openreg.set_device(0)
    with pytest.raises(Boom):
        with ctx(1):
            assert_current(1, f"inside {name}(1)")
            raise Boom()
    assert_current(0, f"after an exception escaped {name}(1)")


@pytest.mark.parametrize("name", CONTEXTS)
def test_nested_contexts_restore_lifo(two_devices, name):
    """DM-CTX-001: nested contexts restore in LIFO order."""
    ctx = CONTEXTS[name]
    torch.openreg.set_device(0)
    with ctx(1):
        with ctx(0):
            with ctx(1):
                assert_current(1, "innermost")
            assert_current(0, "after leaving the innermost context")
        assert_current(1, "after leaving the middle context")
    assert_current(0, "after leaving all contexts")


@pytest.mark.parametrize("name", CONTEXTS)
def test_context_none_is_noop(two_devices, name):
    """DM-CTX-001: a None device does nothing, on entry or exit."""
    ctx = CONTEXTS[name]
    torch.openreg.set_device(1)
    with ctx(None):
        assert_current(1, f"inside {name}(None)")
        torch.openreg.set_device(0)
    assert_current(0, f"{name}(None) restored a device on exit")


def test_module_context_accepts_devices_and_minus_one(two_devices):
    """DM-CTX-001: torch.openreg.device takes str / torch.device; -1 is a no-op."""
    for spec in ("openreg:1", torch.device("openreg", 1)):
        with torch.openreg.device(spec):
            assert_current(1, f"inside torch.openreg.device({spec!r})")
        assert_current(0, f"after torch.openreg.device({spec!r})")
    torch.openreg.set_device(1)
    with torch.openreg.device(-1):
        assert_current(1, "inside torch.openreg.device(-1)")
        torch.openreg.set_device(0)
    assert_current(0, "torch.openreg.device(-1) restored a device on exit")


@pytest.mark.parametrize("name", CONTEXTS)
def test_context_invalid_index_raises_and_changes_nothing(two_devices, name):
    """DM-CTX-001 / DM-SET-002: entering with an invalid index raises; device unchanged."""
    ctx = CONTEXTS[name]
    torch.openreg.set_device(1)
    for bad in (N, 127, -2):
        with pytest.raises(RuntimeError) as excinfo:
            with ctx(bad):
                pytest.fail(f"{name}({bad}) entered")
        assert_range_error(excinfo, bad, N)
        assert_current(1, f"after the failed {name}({bad})")


def test_module_context_rejects_other_device_types(two_devices):
    with pytest.raises(ValueError):
        torch.openreg.device("cpu")
    assert_current(0, "after torch.openreg.device('cpu')")


# ------------------------------------------------------------------ threads


def test_new_threads_start_on_device_zero(two_devices):
    """DM-GET-001: every new thread starts on device 0, whatever the creator's device."""
    torch.openreg.set_device(1)
    seen: list[dict] = []
    errors: list[BaseException] = []

    def probe():
        try:
            seen.append(current_everywhere())
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=probe) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"probing the device in a thread raised {errors[0]!r}"
    for s in seen:
        assert set(s.values()) == {0}, f"a new thread did not start on device 0: {s}"
    assert_current(1, "in the main thread after the threads ran")


def test_current_device_is_per_thread(two_devices):
    """DM-THREAD-001: a set in thread A is invisible in thread B and the main thread."""
    barrier = threading.Barrier(N + 1)
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def worker(i: int):
        try:
            torch.openreg.set_device(i)
            barrier.wait(timeout=30)  # everyone has set its device
            observed = [torch.openreg.current_device()]
            barrier.wait(timeout=30)  # main thread moved meanwhile
            observed.append(_cxx.hooks_get_current_device())
            observed.append(torch.accelerator.current_device_index())
            results[i] = observed
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(N)]
    for t in threads:
        t.start()
    barrier.wait(timeout=30)
    torch.openreg.set_device(N - 1)
    barrier.wait(timeout=30)
    for t in threads:
        t.join()
    assert not errors, f"a worker thread failed: {errors[0]!r}"
    for i in range(N):
        assert results[i] == [i, i, i], (
            f"thread that set device {i} observed {results[i]} (another thread's set leaked in)")
    assert_current(N - 1, "main thread after the workers")


# ---------------------------------------------------------------- placement


def test_tensors_without_index_land_on_current_device(two_devices):
    """DM-PLACE-001: 'openreg' without an index means the current device."""
    for i in (1, 0):
        torch.openreg.set_device(i)
        made = {
            "ones": torch.ones(2, device="openreg"),
            "empty": torch.empty(2, device=torch.device("openreg")),
            "tensor": torch.tensor([1, 2], device="openreg"),
            "to": torch.ones(2).to("openreg"),
            "zeros_like": torch.zeros_like(torch.ones(2), device="openreg"),
        }
        wrong = {k: str(v.device) for k, v in made.items() if v.device != torch.device("openreg", i)}
        assert not wrong, f"with current device {i}, tensors landed on {wrong}"
    with torch.openreg.device(1):
        t = torch.arange(3, device="openreg")
    assert t.device == torch.device("openreg", 1), f"inside device(1) a tensor landed on {t.device}"


@pytest.mark.parametrize("spec", ["openreg:-2", "openreg:abc", "openreg:1:2", "openreg:"])
def test_malformed_device_strings_fail_at_parse_time(spec):
    """DM-PARSE-001."""
    with pytest.raises(RuntimeError):
        torch.device(spec)


# --------------------------------------------------------- property-based

# Indices the generated programs use: valid, -1 and invalid ones in int8.
_INDEX = st.sampled_from(sorted(set(range(-1, N)) | {N, N + 1, -2, -128, 127}))
_OPS = st.one_of(
    st.tuples(st.sampled_from(["set", "exchange", "maybe_exchange", "cxx_maybe_exchange",
                               "hooks_set", "hooks_exchange", "hooks_maybe_exchange",
                               "guard_unchecked_set", "acc_set", "acc_maybe_exchange",
                               "enter_module_ctx", "enter_acc_ctx"]), _INDEX),
    st.tuples(st.just("enter_module_ctx"), st.none()),
    st.tuples(st.just("enter_acc_ctx"), st.none()),
    st.tuples(st.just("exit_ctx"), st.none()),
    st.tuples(st.just("exit_ctx_with_exception"), st.none()),
)


class _Boom(Exception):
    pass


@pytest.mark.skipif(N < 2, reason="needs at least 2 devices")
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_OPS, max_size=40))
def test_random_device_operations_match_model(ops):
    """DM-SET/XCHG/MXCHG/CTX + HK-DEV-001 + GD-DEV-005: random sequences of set / exchange /
    maybe-exchange / context operations (with invalid indices) keep the current device
    equal to a simple model, through every entry point."""
    torch.openreg.set_device(0)
    model = 0
    valid = range(N)
    # (context, model when entered, whether entering switched the device)
    contexts: list[tuple[contextlib.AbstractContextManager, int, bool]] = []

    def expect_raise(fn, *args):
        with pytest.raises((RuntimeError, ValueError)):
            fn(*args)

    try:
        for step, (op, i) in enumerate(ops):
            where = f"step {step}: {op}({i}) in {ops[:step + 1]}"
            if op == "set":
                if i == -1:
                    torch.openreg.set_device(i)
                elif i in valid:
                    torch.openreg.set_device(i)
                    model = i
                else:
                    expect_raise(torch.openreg.set_device, i)
            elif op == "exchange":
                if i == -1:
                    assert openreg._exchange_device(i) == -1, where
                elif i in valid:
                    assert openreg._exchange_device(i) == model, where
                    model = i
                else:
                    expect_raise(openreg._exchange_device, i)
            elif op == "maybe_exchange":
                if i == -1:
                    assert openreg._maybe_exchange_device(i) == -1, where
                else:
                    assert openreg._maybe_exchange_device(i) == model, where
                    if i in valid:
                        model = i
            elif op in ("cxx_maybe_exchange", "hooks_maybe_exchange"):
                fn = (openreg._C._maybe_exchange_device if op == "cxx_maybe_exchange"
                      else _cxx.hooks_maybe_exchange_device)
                assert fn(i) == model, where
                if i in valid:
                    model = i
            elif op == "hooks_set":
                if i in valid:
                    _cxx.hooks_set_current_device(i)
                    model = i
                else:
                    expect_raise(_cxx.hooks_set_current_device, i)
            elif op == "hooks_exchange":
                if i in valid:
                    assert _cxx.hooks_exchange_device(i) == model, where
                    model = i
                else:
                    expect_raise(_cxx.hooks_exchange_device, i)
            elif op == "guard_unchecked_set":
                _cxx.guard_unchecked_set_device(i)
                if i in valid:
                    model = i
            elif op == "acc_set":
                if i < 0:
                    torch.accelerator.set_device_index(i)
                elif i in valid:
                    torch.accelerator.set_device_index(i)
                    model = i
                else:
                    expect_raise(torch.accelerator.set_device_index, i)
            elif op == "acc_maybe_exchange":
                if i in valid:
                    model = i
                assert torch._C._accelerator_maybeExchangeDevice(i) == model, where
            elif op in ("enter_module_ctx", "enter_acc_ctx"):
                if op == "enter_acc_ctx" and i == -1:
                    continue  # -1 is not a device for torch.accelerator.device_index
                ctx = (torch.openreg.device(i) if op == "enter_module_ctx"
                       else torch.accelerator.device_index(i))
                if i is None or i == -1 or i in valid:
                    ctx.__enter__()
                    switched = i is not None and i != -1
                    contexts.append((ctx, model, switched))
                    if switched:
                        model = i
                else:
                    with pytest.raises(RuntimeError):
                        ctx.__enter__()
            elif op in ("exit_ctx", "exit_ctx_with_exception"):
                if not contexts:
                    continue
                ctx, saved, switched = contexts.pop()
                if op == "exit_ctx":
                    ctx.__exit__(None, None, None)
                else:
                    try:
                        raise _Boom()
                    except _Boom as e:
                        assert not ctx.__exit__(type(e), e, e.__traceback__), (
                            f"{where}: the context swallowed the exception")
                # On exit the device that was current on entry is restored,
                # unless the context was a no-op (None / -1).
                if switched:
                    model = saved
            seen = current_everywhere()
            assert set(seen.values()) == {model}, f"{where}: model says {model}, backend says {seen}"
    finally:
        while contexts:
            contexts.pop()[0].__exit__(None, None, None)
        torch.openreg.set_device(0)


@pytest.mark.parametrize("name", ["_exchange_device", "_maybe_exchange_device"])
@pytest.mark.parametrize("value", [True, False])
def test_exchange_functions_reject_bools_like_set_device(two_devices, name, value):
    """bool is an int subclass, but no device index: set_device rejects it, and
    so do the exchange functions (PyTorch's own bindings reject bool too)."""
    torch.openreg.set_device(1)
    with pytest.raises(TypeError) as excinfo:
        getattr(torch.openreg, name)(value)
    assert "bool" in error_text(excinfo) and str(value) in error_text(excinfo)
    assert torch.openreg.current_device() == 1
    with pytest.raises(TypeError):
        torch.openreg.set_device(value)
    torch.openreg.set_device(0)
