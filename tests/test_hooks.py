"""PrivateUse1 hooks (contracts HK-*), called directly through the kit's
backend-agnostic probe ``_cxx`` and through the PyTorch APIs that reach them
(torch.Generator, pin_memory, is_pinned, UntypedStorage.resize_)."""

from __future__ import annotations

import pytest
import torch

from _support import N, _cxx, assert_range_error, error_text, run_json


def test_hooks_registered_built_and_available(n_devices):
    """HK-REG-001 / HK-BUILT-001 / HK-AVAIL-001."""
    assert _cxx.hooks_registered() is True, "PrivateUse1 hooks are not registered"
    assert _cxx.hooks_is_built() is True, "hooks.isBuilt() is not True"
    assert _cxx.hooks_is_available() is (n_devices > 0), (
        f"hooks.isAvailable() is {_cxx.hooks_is_available()} with {n_devices} devices")


def test_fresh_process_lazy_init_primary_context_and_init_once():
    """HK-AVAIL-001 / HK-CTX-001 / HK-INIT-001 / HK-PIN-002 in a fresh process:
    isAvailable never initializes; hasPrimaryContext is false until a device is used,
    then true for that device only, false for invalid indices; init() runs exactly once
    across many generator / pinned-memory / pointer calls from several threads."""
    result = run_json("""
        import threading
        C = openreg._C
        n = torch.openreg.device_count()
        counts = lambda: C._runtime_counters()["hooks_init_calls"]
        hpc = lambda: [_cxx.hooks_has_primary_context(i) for i in range(n)]
        r = {"n": n}
        r["start"] = {"init": counts(), "hpc": hpc()}
        for _ in range(5):
            _cxx.hooks_is_available(); _cxx.hooks_is_built()
        r["after_is_available"] = {"init": counts(), "hpc": hpc()}
        pageable = torch.ones(8)
        r["is_pinned_before_init"] = [pageable.is_pinned(),
                                      _cxx.context_is_pinned_ptr(pageable.data_ptr()),
                                      _cxx.hooks_is_pinned_ptr(pageable.data_ptr())]
        r["after_is_pinned"] = {"init": counts(), "hpc": hpc()}
        x = torch.ones(4, device="openreg:1")
        r["after_alloc_on_1"] = {"init": counts(), "hpc": hpc()}
        r["hpc_invalid"] = [_cxx.hooks_has_primary_context(i) for i in (-1, -2, n, 127, -128)]
        errors = []
        def hammer():
            try:
                for _ in range(5):
                    g = torch.Generator(device="openreg:0"); g.manual_seed(1)
                    torch.randn(2, device="openreg:0", generator=g)
                    torch.randn(2, device="openreg:1")
                    p = torch.ones(16).pin_memory(); p.is_pinned()
                    torch.empty(4, pin_memory=True)
                    _cxx.context_is_pinned_ptr(p.data_ptr())
                    _cxx.context_get_device_from_ptr(x.data_ptr())
                    _cxx.context_lazy_init()
                    torch.openreg.current_device()
            except BaseException as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        hammer()
        r["errors"] = errors
        r["final"] = {"init": counts(), "hpc": hpc()}
        emit(r)
    """)
    n = result["n"]
    assert result["start"] == {"init": 0, "hpc": [False] * n}, (
        f"importing openreg initialized the backend: {result['start']}")
    assert result["after_is_available"] == {"init": 0, "hpc": [False] * n}, (
        f"isAvailable/isBuilt initialized the backend: {result['after_is_available']}")
    assert result["is_pinned_before_init"] == [False, False, False], (
        f"pageable memory reported pinned before init: {result['is_pinned_before_init']}")
    assert result["after_is_pinned"] == {"init": 0, "hpc": [False] * n}, (
        f"is_pinned() before init initialized the backend: {result['after_is_pinned']}")
    assert result["after_alloc_on_1"]["hpc"] == [False, True], (
        f"after allocating on device 1 only, hasPrimaryContext is {result['after_alloc_on_1']['hpc']}")
    assert result["hpc_invalid"] == [False] * 5, (
        f"hasPrimaryContext of invalid indices (-1, -2, N, 127, -128): {result['hpc_invalid']}")
    assert not result["errors"], f"hooks calls failed in threads: {result['errors']}"
    assert result["final"]["init"] == 1, (
        f"hooks.init() ran {result['final']['init']} times, expected exactly once")
    assert result["final"]["hpc"] == [True, True]


def test_has_primary_context_never_raises_for_invalid_indices():
    """HK-CTX-001: invalid indices give False, not an exception."""
    for i in (-1, -2, N, N + 1, 127, -128):
        assert _cxx.hooks_has_primary_context(i) is False, f"hasPrimaryContext({i}) is not False"


# --------------------------------------------------------------- generators


def test_default_generator_is_one_object_per_device(n_devices):
    """HK-GEN-001: the same generator every time; a different one per device."""
    addresses = [_cxx.hooks_default_generator_address(i) for i in range(n_devices)]
    again = [_cxx.hooks_default_generator_address(i) for i in range(n_devices)]
    assert addresses == again, "getDefaultGenerator(i) returned different generators on two calls"
    assert len(set(addresses)) == n_devices, f"devices share default generators: {addresses}"
    for i in range(n_devices):
        g = _cxx.hooks_default_generator(i)
        assert g.device == torch.device("openreg", i), f"default generator {i} is on {g.device}"


def test_default_generator_minus_one_is_current_device(two_devices):
    """HK-GEN-001: index -1 means the current device."""
    for i in (1, 0):
        torch.openreg.set_device(i)
        assert (_cxx.hooks_default_generator_address(-1)
                == _cxx.hooks_default_generator_address(i)), (
            f"getDefaultGenerator(-1) on device {i} is not device {i}'s generator")


def test_default_generator_is_the_one_torch_uses(two_devices):
    """HK-GEN-001: the hooks' default generator is the module's and random ops'."""
    torch.openreg.default_generators[1].manual_seed(4321)
    assert _cxx.hooks_default_generator(1).initial_seed() == 4321, (
        "seeding torch.openreg.default_generators[1] did not reach hooks.getDefaultGenerator(1)")
    _cxx.hooks_default_generator(1).manual_seed(99)
    first = torch.randn(6, device="openreg:1").cpu()
    _cxx.hooks_default_generator(1).manual_seed(99)
    second = torch.randn(6, device="openreg:1").cpu()
    assert torch.equal(first, second), "random ops on openreg:1 do not use hooks.getDefaultGenerator(1)"


@pytest.mark.parametrize("index", [N, N + 1, 127, -2, -128])
def test_default_and_new_generator_reject_bad_index(index):
    """HK-GEN-001 / HK-GEN-002: bad indices raise RuntimeError naming index and range."""
    for fn in (_cxx.hooks_default_generator_address, _cxx.hooks_new_generator):
        with pytest.raises(RuntimeError) as excinfo:
            fn(index)
        assert_range_error(excinfo, index, N)


def test_new_generator_is_fresh_and_independent(two_devices):
    """HK-GEN-002: getNewGenerator(i) is a new generator on device i, independent of the
    default generator and of other new generators."""
    default_seed = 777
    torch.openreg.default_generators[1].manual_seed(default_seed)
    g1 = _cxx.hooks_new_generator(1)
    g2 = _cxx.hooks_new_generator(1)
    assert g1.device == g2.device == torch.device("openreg", 1)
    assert g1 is not g2
    g1.manual_seed(1)
    g2.manual_seed(2)
    assert g1.initial_seed() == 1 and g2.initial_seed() == 2, "two new generators share state"
    assert torch.openreg.default_generators[1].initial_seed() == default_seed, (
        "seeding a new generator changed the default generator")
    a = torch.randn(8, device="openreg:1", generator=g1).cpu()
    g1.manual_seed(1)
    b = torch.randn(8, device="openreg:1", generator=g1).cpu()
    assert torch.equal(a, b), "a new generator is not reproducible after manual_seed"
    torch.openreg.default_generators[1].manual_seed(1)
    c = torch.randn(8, device="openreg:1").cpu()
    assert torch.equal(a, c), "a new generator seeded 1 and the default seeded 1 disagree"
    assert _cxx.hooks_new_generator(-1).device == torch.device("openreg", 0)


def test_torch_generator_on_device(two_devices):
    """HK-GEN-002: torch.Generator(device='openreg:1') works and drives device draws."""
    g = torch.Generator(device="openreg:1")
    assert g.device == torch.device("openreg", 1)
    g.manual_seed(31)
    a = torch.rand(5, device="openreg:1", generator=g).cpu()
    g.manual_seed(31)
    b = torch.rand(5, device="openreg:1", generator=g).cpu()
    assert torch.equal(a, b), "torch.Generator(device='openreg:1') is not reproducible"
    with pytest.raises(RuntimeError) as excinfo:
        torch.Generator(device=f"openreg:{N}")
    assert_range_error(excinfo, N, N)
    torch.openreg.set_device(1)
    assert torch.Generator(device="openreg").device == torch.device("openreg", 1), (
        "torch.Generator(device='openreg') is not on the current device 1")


# ----------------------------------------------------------------- pointers


def test_device_from_ptr_of_device_memory(n_devices):
    """HK-PTR-001: device pointers (also interior ones) map to their device."""
    for i in range(n_devices):
        t = torch.zeros(1000, device=f"openreg:{i}")
        ptr = t.data_ptr()
        for p in (ptr, ptr + 1, ptr + 1234, ptr + t.nbytes - 1):
            assert _cxx.hooks_get_device_from_ptr(p) == ("openreg", i), (
                f"getDeviceFromPtr({p:#x}) (offset {p - ptr} of a tensor on openreg:{i})")
            assert _cxx.context_get_device_from_ptr(p) == ("openreg", i)


def test_device_from_ptr_of_host_memory_raises():
    """HK-PTR-001: host pointers (pageable or pinned) are not device memory."""
    pageable = torch.ones(16)
    pinned = torch.ones(16).pin_memory()
    for what, ptr in (("pageable", pageable.data_ptr()), ("pinned", pinned.data_ptr())):
        with pytest.raises(RuntimeError) as excinfo:
            _cxx.hooks_get_device_from_ptr(ptr)
        assert "not" in error_text(excinfo) and "device memory" in error_text(excinfo), (
            f"unclear error for a {what} host pointer: {error_text(excinfo)!r}")


def test_is_pinned_ptr(n_devices):
    """HK-PIN-002: false for pageable host memory and device memory, true for pinned
    memory including interior pointers."""
    pageable = torch.ones(256)
    pinned = torch.ones(256).pin_memory()
    device = torch.ones(256, device="openreg")
    cases = {
        "pageable": (pageable.data_ptr(), False),
        "pageable interior": (pageable.data_ptr() + 100, False),
        "device": (device.data_ptr(), False),
        "device interior": (device.data_ptr() + 100, False),
        "pinned": (pinned.data_ptr(), True),
        "pinned interior": (pinned.data_ptr() + 100, True),
        "pinned last byte": (pinned.data_ptr() + pinned.nbytes - 1, True),
    }
    for what, (ptr, expected) in cases.items():
        assert _cxx.hooks_is_pinned_ptr(ptr) is expected, f"hooks.isPinnedPtr({what}) != {expected}"
        assert _cxx.context_is_pinned_ptr(ptr) is expected, (
            f"at::globalContext().isPinnedPtr({what}) != {expected}")


def test_pinned_memory_allocator_gives_pinned_memory():
    """HK-PIN-001: getPinnedMemoryAllocator's memory is host memory that isPinnedPtr
    recognizes (base and interior)."""
    for nbytes in (1, 64, 4096, 1 << 20):
        base, interior, device_type = _cxx.hooks_pinned_roundtrip(nbytes)
        assert device_type == "cpu", f"pinned allocator returned {device_type} memory"
        assert base and interior, f"pinned allocator block of {nbytes} bytes not reported pinned"


# ---------------------------------------------------------- device functions


def test_hooks_device_functions_agree_with_module_and_guard(two_devices):
    """HK-DEV-001: hooks set/get/exchange/maybeExchange agree with the module and guard."""
    assert _cxx.hooks_device_count() == torch.openreg.device_count() == _cxx.guard_device_count()
    for i in range(N):
        _cxx.hooks_set_current_device(i)
        assert (torch.openreg.current_device(), _cxx.guard_get_device()[1],
                _cxx.hooks_get_current_device()) == (i, i, i), f"after hooks.setCurrentDevice({i})"
        torch.openreg.set_device((i + 1) % N)
        assert _cxx.hooks_get_current_device() == (i + 1) % N, (
            "hooks.getCurrentDevice does not see torch.openreg.set_device")
    torch.openreg.set_device(0)
    assert _cxx.hooks_exchange_device(1) == 0 and torch.openreg.current_device() == 1
    assert _cxx.hooks_maybe_exchange_device(0) == 1 and torch.openreg.current_device() == 0


@pytest.mark.parametrize("index", [-1, -2, -128, N, 127])
def test_hooks_set_and_exchange_validate_like_the_module(two_devices, index):
    """HK-DEV-001: same validation as the module (setCurrentDevice(-1) raises too);
    maybeExchangeDevice never raises."""
    torch.openreg.set_device(1)
    for fn in (_cxx.hooks_set_current_device, _cxx.hooks_exchange_device, _cxx.guard_set_device):
        with pytest.raises(RuntimeError) as excinfo:
            fn(index)
        assert_range_error(excinfo, index, N)
        assert torch.openreg.current_device() == 1, f"failed {fn.__name__}({index}) moved the device"
    assert _cxx.hooks_maybe_exchange_device(index) == 1
    assert torch.openreg.current_device() == 1, f"hooks.maybeExchangeDevice({index}) moved the device"


# ------------------------------------------------------------------- resize


def _filled_storage(nbytes: int, device: str) -> torch.UntypedStorage:
    s = torch.UntypedStorage(nbytes, device=device)
    s.copy_(torch.arange(nbytes, dtype=torch.uint8).untyped_storage())
    return s


def _bytes(storage: torch.UntypedStorage, limit: int = 4096) -> list[int]:
    """The first `limit` bytes of a device storage, read through a copy to the host."""
    host = torch.empty(0, dtype=torch.uint8).set_(storage.cpu())
    return host[:limit].tolist()


def test_resize_storage_grows_shrinks_and_keeps_prefix(two_devices):
    """HK-RESIZE-001: UntypedStorage.resize_ (hooks.resizePrivateUse1Bytes) grows and
    shrinks on the storage's device, keeps the common prefix; resize to 0 works."""
    torch.openreg.set_device(0)
    s = _filled_storage(100, "openreg:1")
    expected = list(range(100))
    s.resize_(5000)
    assert s.nbytes() == 5000
    assert s.device == torch.device("openreg", 1)
    assert _cxx.hooks_get_device_from_ptr(s.data_ptr()) == ("openreg", 1), (
        "grown storage memory is not on device 1")
    assert _bytes(s)[:100] == expected, "growing lost the prefix"
    assert torch.openreg.current_device() == 0, "resize_ changed the current device"
    s.resize_(40)
    assert s.nbytes() == 40 and _bytes(s) == expected[:40], "shrinking lost the prefix"
    s.resize_(0)
    assert s.nbytes() == 0 and _bytes(s) == [], "resize to 0 failed"
    s.resize_(16)
    assert s.nbytes() == 16 and s.device == torch.device("openreg", 1), "growing from 0 failed"
    assert torch.openreg.current_device() == 0


def test_resize_through_hooks_directly(two_devices):
    """HK-RESIZE-001: the hook itself (resizePrivateUse1Bytes) keeps the common prefix."""
    s = _filled_storage(64, "openreg:1")
    _cxx.hooks_resize_bytes(s, 2 << 20)
    assert s.nbytes() == 2 << 20
    assert _bytes(s)[:64] == list(range(64))
    _cxx.hooks_resize_bytes(s, 10)
    assert _bytes(s) == list(range(10))
    _cxx.hooks_resize_bytes(s, 0)
    assert s.nbytes() == 0


def test_tensor_resize_keeps_values(n_devices):
    """HK-RESIZE-001: Tensor.resize_ grows device storage and keeps existing elements."""
    t = torch.arange(10, dtype=torch.float32, device="openreg")
    t.resize_(1000)
    assert t.shape == (1000,)
    assert torch.equal(t[:10].cpu(), torch.arange(10, dtype=torch.float32))
    t.resize_(3)
    assert torch.equal(t.cpu(), torch.arange(3, dtype=torch.float32))

