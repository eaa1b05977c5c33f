"""Hooks: the backend's PrivateUse1HooksInterface, directly (through the
kit's C++ probe) and the way PyTorch reaches it: at::Context (lazy init,
default generators, pointers, pinned memory), autograd, pin_memory(),
torch.Generator, at::from_blob and storage resizing.

Every test runs in a fresh process in which the backend was imported but
never initialized, so "before the first use" is the state each test starts
from."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from ._helpers import in_thread, must, must_raise, require_allocator

contract = pytest.mark.contract

# An invalid index may be refused with any of these.
INDEX_ERRORS = (RuntimeError, IndexError, ValueError)


def contexts(cxx, n: int) -> list[int]:
    """The devices for which the hooks report a primary context."""
    return [i for i in range(n) if must(lambda: cxx.hooks_has_primary_context(i),
                                        f"hooks hasPrimaryContext({i})")]


def optional_init_count(backend):
    """The backend's init_count instrumentation, or None (never skips)."""
    return backend.instrument("init_count")


def assert_untouched(mod, cxx, n: int, backend, after: str, *, module: bool = True) -> None:
    """Nothing was initialized: no primary context, hooks init() never ran,
    and (if `module`) the device module does not report itself initialized."""
    created = contexts(cxx, n)
    assert not created, f"{after} created a primary context on device(s) {created}"
    if module:
        assert not mod.is_initialized(), f"{after} initialized the backend (module.is_initialized() is True)"
    init_count = optional_init_count(backend)
    if init_count is not None:
        assert init_count() == 0, f"{after} ran the hooks' init() ({init_count()} time(s))"


def storage_bytes(storage) -> bytes:
    """The bytes of an UntypedStorage (any device), read through a CPU copy."""
    cpu = storage.cpu()
    return torch.empty(0, dtype=torch.uint8).set_(cpu).numpy().tobytes()


def cpu_storage(data: bytes):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).untyped_storage()


def pattern(size: int, salt: int) -> bytes:
    return bytes((k * 131 + salt * 17 + (k >> 8)) % 251 for k in range(size))


# ------------------------------------------------------------ registration


@contract("HK-REG-001")
@pytest.mark.zero_devices_ok
def test_hooks_are_registered_once(cxx, n):
    assert cxx.hooks_registered(), (
        "no PrivateUse1HooksInterface is registered: the backend must call "
        "at::RegisterPrivateUse1HooksInterface(new YourHooks()) when its library loads")
    before = cxx.hooks_address()
    count = must(cxx.hooks_device_count, "the registered hooks' deviceCount()")
    assert count == n, (
        f"the registered hooks report {count} device(s) but the module reports {n}: the "
        "registered object is not the backend's own hooks (deviceCount() not overridden?)")
    must_raise(cxx.hooks_register_second, "registering a second PrivateUse1 hooks object "
               "(at::RegisterPrivateUse1HooksInterface)", RuntimeError)
    assert cxx.hooks_registered()
    assert cxx.hooks_address() == before, "a second registration replaced the backend's hooks object"
    assert must(cxx.hooks_is_built, "isBuilt() after the refused second registration") is True


# ------------------------------------------------------ isBuilt / isAvailable


@contract("HK-BUILT-001")
@pytest.mark.zero_devices_ok
def test_is_built(cxx):
    answers = [must(cxx.hooks_is_built, "the hooks' isBuilt()") for _ in range(5)]
    answers.append(in_thread(lambda: must(cxx.hooks_is_built, "isBuilt() in a new thread")))
    wrong = [a for a in answers if a is not True]
    assert not wrong, f"isBuilt() must return True for a backend that is loaded, but returned {wrong}"


@contract("HK-AVAIL-001")
@pytest.mark.zero_devices_ok
def test_is_available_neither_raises_nor_initializes(cxx, mod, n, backend):
    answers = [must(cxx.hooks_is_available, "the hooks' isAvailable()") for _ in range(20)]
    answers.append(in_thread(lambda: must(cxx.hooks_is_available, "isAvailable() in a new thread")))
    wrong = [a for a in answers if a is not (n > 0)]
    assert not wrong, f"with {n} device(s), isAvailable() must return {n > 0}, but returned {wrong}"
    created = contexts(cxx, n)
    assert not created, f"isAvailable() created a primary context on device(s) {created}"
    if n == 0:
        return
    # Still right, and still without side effects, once a device is in use.
    last = n - 1
    torch.ones(4, device=f"{backend.device_type}:{last}")
    assert must(cxx.hooks_is_available, "isAvailable() after using a device") is True
    created = contexts(cxx, n)
    assert created == [last], (
        f"after using only device {last} and calling isAvailable(), the devices with a "
        f"primary context are {created}: isAvailable() must not initialize a device")


# ------------------------------------------------------------------- init


def _init_paths(dt: str, n: int, cxx) -> dict:
    """Calls that make PyTorch run the hooks' init() (at::Context::lazyInitDevice)
    or that use what init() prepares."""
    last = n - 1

    def device_pointer():
        t = torch.empty(16, device=f"{dt}:{last}")
        return cxx.context_get_device_from_ptr(t.data_ptr() + 4)

    return {
        "Tensor.pin_memory()": lambda: torch.ones(64).pin_memory(),
        "torch.empty(pin_memory=True)": lambda: torch.empty(64, pin_memory=True),
        "Context::getPinnedMemoryAllocator": lambda: cxx.context_pinned_roundtrip(256),
        "Context::defaultGenerator": lambda: cxx.context_default_generator(last),
        "a random op on the device": lambda: torch.rand(8, device=dt),
        "torch.Generator(device)": lambda: torch.Generator(device=f"{dt}:{last}"),
        "a device tensor": lambda: torch.empty(8, device=f"{dt}:{last}"),
        "Context::getDeviceFromPtr": device_pointer,
        "Tensor.is_pinned()": lambda: torch.ones(8).pin_memory().is_pinned(),
    }


FIRST_USES = [
    None,  # threads race for the very first use
    "Tensor.pin_memory()",
    "torch.empty(pin_memory=True)",
    "Context::getPinnedMemoryAllocator",
    "Context::defaultGenerator",
    "a random op on the device",
    "torch.Generator(device)",
    "a device tensor",
]


@contract("HK-INIT-001")
@pytest.mark.parametrize("first", FIRST_USES, ids=lambda f: "threads-race" if f is None else f)
def test_init_runs_exactly_once_lazily(first, dt, n, mod, cxx, instrument):
    init_count = instrument("init_count")
    assert init_count() == 0, (
        f"the hooks' init() already ran {init_count()} time(s) in a fresh process, before any "
        "device use: init must run lazily (at::Context::lazyInitDevice), not at import")
    # Queries that must not initialize.
    mod.device_count()
    mod.is_available()
    cxx.hooks_is_built()
    cxx.hooks_is_available()
    cxx.hooks_device_count()
    for i in range(n):
        cxx.hooks_has_primary_context(i)
    torch.ones(8).is_pinned()
    assert init_count() == 0, (
        "device_count/is_available/isBuilt/isAvailable/hasPrimaryContext/is_pinned ran the hooks' "
        f"init() ({init_count()} time(s)); init must wait for the first real use")

    paths = _init_paths(dt, n, cxx)
    if first is not None:
        must(paths[first], f"{first} as the first device use of a fresh process")
        assert init_count() <= 1, f"{first} ran the hooks' init() {init_count()} times"

    names = list(paths)
    workers = 8
    barrier = threading.Barrier(workers)
    errors: list[str] = []

    def work(k: int) -> None:
        try:
            barrier.wait(timeout=30)
        except threading.BrokenBarrierError:
            errors.append(f"thread {k}: barrier broken")
            return
        order = names[k % len(names):] + names[:k % len(names)]
        for _ in range(3):
            for name in order:
                try:
                    paths[name]()
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(f"{name} (thread {k}): {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "threads using the device concurrently did not finish in 60 s"
    assert not errors, "concurrent first uses of the backend failed:\n  " + "\n  ".join(errors[:10])
    for name in names:
        paths[name]()
    count = init_count()
    assert count == 1, (
        f"the hooks' init() ran {count} times across many generator, pinned-memory and pointer "
        "calls from several threads; it must run exactly once per process (PyTorch calls it "
        "through at::Context::lazyInitDevice; the backend must not call it again itself)")


# ------------------------------------------------------- hasPrimaryContext


@contract("HK-CTX-001")
def test_has_primary_context_tracks_device_use(dt, n, mod, cxx, backend):
    for _ in range(50):
        created = contexts(cxx, n)
        assert not created, f"hasPrimaryContext is True in a fresh process for device(s) {created}"
    assert_untouched(mod, cxx, n, backend, "calling hasPrimaryContext(i) repeatedly for every device")
    for bad in (n, n + 1, 127, -2):
        try:
            answer = cxx.hooks_has_primary_context(bad)
        except INDEX_ERRORS:
            continue
        assert answer is False, f"hasPrimaryContext({bad}) with {n} device(s) returned {answer!r}"
    # Use the devices one by one, last first, with device 0 current: exactly
    # the used ones must report a context.
    used: list[int] = []
    keep = []
    for j in reversed(range(n)):
        x = must(lambda: torch.ones(64, device=f"{dt}:{j}"), f"allocating a tensor on device {j}")
        x.add_(1)
        keep.append(x)
        used.append(j)
        expected = sorted(used)
        assert contexts(cxx, n) == expected, (
            f"after using device(s) {expected} (device 0 current), hasPrimaryContext is True for "
            f"{contexts(cxx, n)}: it must be True exactly for the devices that were used")
        seen = in_thread(lambda: contexts(cxx, n))
        assert seen == expected, (
            f"in another thread, hasPrimaryContext is True for {seen}, but the process has used "
            f"{expected}: contexts are per process, not per thread")


@contract("HK-CTX-002")
def test_backward_on_the_device(dt, n, cxx):
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(32, 8)
    target = torch.randn(32, 4)
    cpu_loss = torch.nn.functional.mse_loss(cpu_model(x), target)
    cpu_loss.backward()
    expected = {name: p.grad for name, p in cpu_model.named_parameters()}

    for j in sorted({n - 1, 0}):
        device = torch.device(dt, j)
        model = copy.deepcopy(cpu_model)
        model.zero_grad(set_to_none=True)
        model = must(lambda: model.to(device), f"moving a model to {device}")
        loss = torch.nn.functional.mse_loss(model(x.to(device)), target.to(device))
        must(loss.backward, f"loss.backward() on {device} (the autograd engine calls "
             "hasPrimaryContext(i) for every device index)")
        assert torch.allclose(loss.detach().cpu(), cpu_loss.detach(), rtol=1e-5, atol=1e-6), \
            f"the loss on {device} differs from CPU"
        for name, p in model.named_parameters():
            assert p.grad is not None, f"backward on {device} produced no gradient for {name}"
            assert p.grad.device == device, f"the gradient of {name} is on {p.grad.device}, not {device}"
            assert torch.allclose(p.grad.cpu(), expected[name], rtol=1e-4, atol=1e-6), \
                f"the gradient of {name} computed on {device} differs from CPU"

        # A leaf on the device, backward from another thread.
        a = torch.arange(6, dtype=torch.float32, device=device).requires_grad_()
        in_thread(lambda: (a * a).sum().backward())
        assert a.grad is not None and a.grad.device == device
        assert torch.equal(a.grad.cpu(), 2 * torch.arange(6, dtype=torch.float32)), \
            f"d(sum(a*a))/da on {device} is {a.grad.cpu()}"


# ------------------------------------------------------------- generators


@contract("HK-GEN-001")
def test_default_generator_is_one_per_device(dt, n, mod, cxx):
    addresses = [must(lambda: cxx.hooks_default_generator_address(i), f"getDefaultGenerator({i})")
                 for i in range(n)]
    again = [cxx.hooks_default_generator_address(i) for i in range(n)]
    assert again == addresses, "getDefaultGenerator(i) returned a different generator on a second call"
    other = in_thread(lambda: [cxx.hooks_default_generator_address(i) for i in range(n)])
    assert other == addresses, "getDefaultGenerator(i) returned a different generator in another thread"
    assert len(set(addresses)) == n, "devices share a default generator: there must be one per device"
    for i in range(n):
        g = cxx.hooks_default_generator(i)
        assert g.device == torch.device(dt, i), f"getDefaultGenerator({i}) is a generator of {g.device}"

    # The state lives in that one object: seed through one call, read through others.
    for i in range(n):
        cxx.hooks_default_generator(i).manual_seed(1000 + i)
    for i in range(n):
        seeds = (cxx.hooks_default_generator(i).initial_seed(), cxx.context_default_generator(i).initial_seed())
        assert seeds == (1000 + i, 1000 + i), (
            f"device {i}'s default generator was seeded with {1000 + i}, but getDefaultGenerator({i}) "
            f"and Context::defaultGenerator report {seeds}")

    # Random ops without generator= draw from it.
    for i in range(n):
        generator = cxx.hooks_default_generator(i)
        generator.manual_seed(7)
        a = torch.rand(64, device=f"{dt}:{i}").cpu()
        state = generator.get_state()
        generator.manual_seed(7)
        b = torch.rand(64, device=f"{dt}:{i}").cpu()
        assert torch.equal(a, b), (
            f"re-seeding getDefaultGenerator({i}) did not reproduce torch.rand on device {i}: random "
            "ops must draw from the hooks' default generator")
        generator.manual_seed(7)
        assert not torch.equal(generator.get_state(), state), \
            f"drawing on device {i} did not advance getDefaultGenerator({i})"

    # -1 means the current device.
    for j in reversed(range(n)):
        mod.set_device(j)
        got = must(lambda: cxx.hooks_default_generator_address(-1), "getDefaultGenerator(-1)")
        assert got == addresses[j], f"with device {j} current, getDefaultGenerator(-1) is not device {j}'s"
        assert cxx.context_default_generator(-1).device == torch.device(dt, j)
    mod.set_device(n - 1)
    assert in_thread(lambda: cxx.hooks_default_generator_address(-1)) == addresses[0], \
        "in a new thread (device 0 current), getDefaultGenerator(-1) is not device 0's"

    for bad in (n, n + 3, -2):
        must_raise(lambda: cxx.hooks_default_generator_address(bad),
                   f"getDefaultGenerator({bad}) with {n} device(s)", INDEX_ERRORS)


@contract("HK-GEN-002")
def test_new_generator_is_fresh_and_independent(dt, n, mod, cxx):
    for i in reversed(range(n)):
        device = torch.device(dt, i)
        g1 = must(lambda: cxx.hooks_new_generator(i), f"getNewGenerator({i})")
        g2 = must(lambda: cxx.hooks_new_generator(i), f"getNewGenerator({i})")
        g3 = must(lambda: torch.Generator(device=f"{dt}:{i}"), f"torch.Generator(device='{dt}:{i}')")
        g4 = must(lambda: torch.Generator(device=device), f"torch.Generator(device={device!r})")
        for name, g in (("getNewGenerator", g1), ("torch.Generator(str)", g3), ("torch.Generator(device)", g4)):
            assert g.device == device, f"{name} for device {i} made a generator of {g.device}"

        default = cxx.hooks_default_generator(i)
        default.manual_seed(99)
        before = default.get_state()
        g1.manual_seed(1)
        g2.manual_seed(2)
        assert (g1.initial_seed(), g2.initial_seed()) == (1, 2), \
            f"two getNewGenerator({i}) results share their state: they must be distinct generators"
        assert default.initial_seed() == 99 and torch.equal(default.get_state(), before), \
            f"seeding a new generator of device {i} changed the device's default generator"

        x1 = torch.rand(256, device=device, generator=g1)
        assert x1.device == device
        assert torch.equal(default.get_state(), before), \
            f"drawing from a new generator of device {i} advanced the default generator"
        for other in (g2, g3, g4):
            other.manual_seed(1)
            again = torch.rand(256, device=device, generator=other)
            assert torch.equal(again.cpu(), x1.cpu()), (
                f"two fresh generators of device {i} seeded alike gave different numbers: a new "
                "generator must honour manual_seed")
        g1.manual_seed(2)
        assert not torch.equal(torch.rand(256, device=device, generator=g1).cpu(), x1.cpu()), \
            f"a new generator of device {i} gives the same numbers for seeds 1 and 2"

    mod.set_device(n - 1)
    assert must(lambda: cxx.hooks_new_generator(-1), "getNewGenerator(-1)").device == torch.device(dt, n - 1), \
        "getNewGenerator(-1) is not on the current device"
    assert torch.Generator(device=dt).device == torch.device(dt, n - 1), \
        f"torch.Generator(device={dt!r}) is not on the current device"

    for bad in (n, n + 3, -2):
        must_raise(lambda: cxx.hooks_new_generator(bad), f"getNewGenerator({bad}) with {n} device(s)",
                   INDEX_ERRORS)
    must_raise(lambda: torch.Generator(device=f"{dt}:{n}"),
               f"torch.Generator(device='{dt}:{n}') with {n} device(s)", INDEX_ERRORS)


# --------------------------------------------------------------- pointers


@contract("HK-PTR-001")
def test_device_from_pointer(dt, n, cxx):
    lookups = (("hooks getDeviceFromPtr", cxx.hooks_get_device_from_ptr),
               ("Context::getDeviceFromPtr", cxx.context_get_device_from_ptr))
    tensors = {j: torch.arange(1024, dtype=torch.float32, device=f"{dt}:{j}") for j in reversed(range(n))}
    for j, t in tensors.items():  # device 0 stays current
        base = t.data_ptr()
        nbytes = t.untyped_storage().nbytes()
        pointers = {"the base pointer": base}
        for offset in (1, 4, nbytes // 2, nbytes - 1):
            pointers[f"the interior pointer base+{offset}"] = base + offset
        pointers["a view's data_ptr()"] = t[100:].data_ptr()
        for what, pointer in pointers.items():
            for name, lookup in lookups:
                got = must(lambda: lookup(pointer), f"{name}({what} of a tensor on device {j})")
                assert tuple(got) == (dt, j), f"{name}({what} of a tensor on {dt}:{j}) returned {got}"
        got = in_thread(lambda: cxx.hooks_get_device_from_ptr(base + 8))
        assert tuple(got) == (dt, j), f"getDeviceFromPtr in a new thread returned {got} for device {j} memory"

    host = torch.arange(1024, dtype=torch.float32)
    for name, lookup in lookups:
        for what, pointer in (("a host (CPU tensor) pointer", host.data_ptr()),
                              ("an interior host pointer", host.data_ptr() + 100)):
            must_raise(lambda: lookup(pointer), f"{name}({what})", (RuntimeError, ValueError))


@contract("HK-PTR-001")
def test_from_blob_finds_the_device(dt, n, cxx):
    for j in reversed(range(n)):
        source = torch.arange(64, dtype=torch.float32, device=f"{dt}:{j}")
        pointer = source.data_ptr() + 8 * 4
        t = must(lambda: cxx.from_blob_float(pointer, 16, -1),
                 f"at::from_blob on memory of device {j} with no device index")
        assert t.device == torch.device(dt, j), \
            f"at::from_blob on memory of {dt}:{j} made a tensor on {t.device} (getDeviceFromPtr)"
        assert torch.equal(t.cpu(), torch.arange(8, 24, dtype=torch.float32)), \
            "a tensor made by at::from_blob on device memory does not read that memory"
        t = must(lambda: cxx.from_blob_float(pointer, 16, j), f"at::from_blob with device index {j}")
        assert t.device == torch.device(dt, j)
        if n > 1:
            wrong = (j + 1) % n
            must_raise(lambda: cxx.from_blob_float(pointer, 16, wrong),
                       f"at::from_blob stating device {wrong} for memory of device {j}",
                       (ValueError, RuntimeError))
        del t
    host = torch.arange(16, dtype=torch.float32)
    must_raise(lambda: cxx.from_blob_float(host.data_ptr(), 16, -1),
               "at::from_blob with the backend's device type on host memory", (RuntimeError, ValueError))


# ---------------------------------------------------------- pinned memory


@contract("HK-PIN-002")
def test_is_pinned_is_false_without_initializing(mod, n, cxx, backend):
    pageable = torch.arange(256, dtype=torch.float32)
    for _ in range(10):
        assert must(pageable.is_pinned, "Tensor.is_pinned() before any device use") is False, \
            "a pageable CPU tensor reports is_pinned() True"
    assert must(lambda: cxx.context_is_pinned_ptr(pageable.data_ptr()),
                "Context::isPinnedPtr before any device use") is False
    assert not pageable[10:].is_pinned()
    assert_untouched(mod, cxx, n, backend, "Tensor.is_pinned() on a never-initialized backend")


@contract("HK-PIN-002")
def test_is_pinned_ptr_tells_pinned_from_pageable_and_device_memory(dt, n, cxx):
    pageable = torch.arange(4096, dtype=torch.uint8)
    pinned = must(pageable.pin_memory, "Tensor.pin_memory()")
    assert pinned.device.type == "cpu", f"pin_memory() returned a tensor on {pinned.device}"
    assert torch.equal(pinned, pageable), "pin_memory() did not keep the values"
    assert pinned.data_ptr() != pageable.data_ptr(), "pin_memory() of a pageable tensor did not copy it"
    allocated = must(lambda: torch.empty(1000, dtype=torch.float32, pin_memory=True),
                     "torch.empty(pin_memory=True)")
    tiny = must(lambda: torch.empty(1, dtype=torch.uint8, pin_memory=True), "a 1-byte pinned tensor")
    large = must(lambda: torch.empty((1 << 20) + 3, dtype=torch.uint8, pin_memory=True),
                 "a pinned tensor of 1 MiB + 3 bytes")

    def ends(t):
        base, nbytes = t.data_ptr(), t.untyped_storage().nbytes()
        return {"base": base, "base+1": base + 1, "middle": base + nbytes // 2, "last byte": base + nbytes - 1} \
            if nbytes > 1 else {"base": base}

    for name, t in (("pin_memory()", pinned), ("empty(pin_memory=True)", allocated),
                    ("a 1-byte pinned tensor", tiny), ("a 1 MiB pinned tensor", large)):
        assert t.is_pinned(), f"{name}.is_pinned() is False"
        for where, pointer in ends(t).items():
            assert cxx.hooks_is_pinned_ptr(pointer) is True, f"isPinnedPtr({where} of {name}) is False"
            assert cxx.context_is_pinned_ptr(pointer) is True, f"Context::isPinnedPtr({where} of {name}) is False"
    assert pinned[100:].is_pinned(), "a view into pinned memory (an interior pointer) is not pinned"

    for where, pointer in ends(pageable).items():
        assert cxx.hooks_is_pinned_ptr(pointer) is False, f"isPinnedPtr({where} of pageable memory) is True"
        assert cxx.context_is_pinned_ptr(pointer) is False
    assert not pageable.is_pinned(), "pageable memory reports is_pinned() True after pinning a copy of it"

    for j in reversed(range(n)):
        device = torch.arange(4096, dtype=torch.uint8, device=f"{dt}:{j}")
        for where, pointer in ends(device).items():
            assert cxx.hooks_is_pinned_ptr(pointer) is False, f"isPinnedPtr({where} of device {j} memory) is True"
            assert cxx.context_is_pinned_ptr(pointer) is False, \
                f"Context::isPinnedPtr({where} of device {j} memory) is True"
        assert not device.is_pinned(), f"a tensor on device {j} reports is_pinned() True"


@contract("HK-PIN-001")
def test_pinned_allocator_initializes_first(mod, n, cxx, instrument):
    init_count = instrument("init_count")
    assert init_count() == 0, f"the hooks' init() already ran {init_count()} time(s) in a fresh process"
    pinned = must(lambda: torch.arange(64, dtype=torch.float32).pin_memory(),
                  "Tensor.pin_memory() as the first use of the backend")
    assert init_count() == 1, (
        f"after the first pin_memory() the hooks' init() ran {init_count()} times: "
        "getPinnedMemoryAllocator must be reached only after init() ran once")
    assert pinned.is_pinned(), "the first pin_memory() of the process returned unpinned memory"
    base_pinned, last_pinned, device = must(
        lambda: cxx.hooks_pinned_roundtrip(4096), "allocating through the hooks' getPinnedMemoryAllocator()")
    assert device == "cpu", \
        f"the pinned allocator's memory claims device type {device!r}; pinned memory is host (cpu) memory"
    assert base_pinned and last_pinned, "isPinnedPtr does not recognize memory from getPinnedMemoryAllocator()"
    assert init_count() == 1


@contract("HK-PIN-001")
def test_context_pinned_allocator_memory_is_pinned(n, cxx):
    # First use of the process: Context::getPinnedMemoryAllocator must run
    # init() before it asks the hooks for the allocator.
    base, last, context, device = must(lambda: cxx.context_pinned_roundtrip(1 << 16),
                                       "Context::getPinnedMemoryAllocator() as the first use of the backend")
    assert device == "cpu", f"the pinned allocator's memory claims device type {device!r}, not cpu"
    assert base and last, ("memory from getPinnedMemoryAllocator() is not reported pinned by "
                           f"isPinnedPtr (base: {base}, last byte: {last})")
    assert context, ("Context::isPinnedPtr does not report memory from getPinnedMemoryAllocator() as "
                     "pinned: the backend was not initialized before the allocation")
    for size in (1, 100, 1 << 20):
        b, l, c, _ = cxx.context_pinned_roundtrip(size)
        assert b and l and c, f"a {size}-byte block from the pinned allocator is not pinned everywhere"


# -------------------------------------------------- low-priority device hooks


@contract("HK-DEV-001")
def test_hooks_device_functions_agree(mod, n, cxx):
    # Fresh process, module not yet initialized: the hooks still answer.
    counts = {"hooks deviceCount()": cxx.hooks_device_count(), "guard deviceCount()": cxx.guard_device_count(),
              "module device_count()": mod.device_count(),
              "torch.accelerator.device_count()": torch.accelerator.device_count()}
    assert set(counts.values()) == {n}, f"device counts disagree: {counts}"
    assert must(cxx.hooks_get_current_device, "hooks getCurrentDevice() in a fresh process") == 0

    def everywhere():
        return {"hooks": cxx.hooks_get_current_device(), "module": mod.current_device(),
                "guard": cxx.guard_get_device()[1], "accelerator": torch.accelerator.current_device_index()}

    def expect(j, after):
        seen = everywhere()
        assert set(seen.values()) == {j}, f"after {after}, the current device should be {j} everywhere: {seen}"

    for j in list(reversed(range(n))) + [0]:
        must(lambda: cxx.hooks_set_current_device(j), f"hooks setCurrentDevice({j})")
        expect(j, f"hooks setCurrentDevice({j})")
    for j in list(reversed(range(n))) + [0]:
        before = mod.current_device()
        assert must(lambda: cxx.hooks_exchange_device(j), f"hooks exchangeDevice({j})") == before
        expect(j, f"hooks exchangeDevice({j})")
        mod.set_device(j)
        assert cxx.hooks_get_current_device() == j
    mod.set_device(n - 1)
    assert must(lambda: cxx.hooks_maybe_exchange_device(-1), "hooks maybeExchangeDevice(-1)") in (n - 1, -1)
    expect(n - 1, "hooks maybeExchangeDevice(-1)")
    assert cxx.hooks_maybe_exchange_device(0) == n - 1, \
        "hooks maybeExchangeDevice(0) did not return the previous device"
    expect(0, "hooks maybeExchangeDevice(0)")

    # The same validation as the module and the guard.
    mod.set_device(n - 1)
    setters = {
        "module set_device": mod.set_device,
        "torch.accelerator.set_device_index": torch.accelerator.set_device_index,
        "guard setDevice": cxx.guard_set_device,
        "hooks setCurrentDevice": cxx.hooks_set_current_device,
        "hooks exchangeDevice": cxx.hooks_exchange_device,
        "torch.accelerator exchangeDevice": torch._C._accelerator_exchangeDevice,
    }
    for bad in (n, n + 5, 100):
        accepted = []
        for name, call in setters.items():
            try:
                call(bad)
            except RuntimeError:
                pass
            else:
                accepted.append(name)
            expect(n - 1, f"the rejected {name}({bad})")
        assert not accepted, f"with {n} device(s), {accepted} accepted index {bad}; every layer must reject it"
        outcomes = {}
        for name, call in (("hooks maybeExchangeDevice", cxx.hooks_maybe_exchange_device),
                           ("torch.accelerator maybeExchangeDevice", torch._C._accelerator_maybeExchangeDevice)):
            try:
                call(bad)
                outcomes[name] = "no-op"
            except RuntimeError:
                outcomes[name] = "raised"
            expect(n - 1, f"{name}({bad})")
        assert len(set(outcomes.values())) == 1, f"maybeExchangeDevice({bad}) is validated differently: {outcomes}"

    # Per thread, like the module.
    mod.set_device(n - 1)
    assert in_thread(cxx.hooks_get_current_device) == 0, "hooks getCurrentDevice() in a new thread is not 0"
    if n > 1:
        in_thread(lambda: cxx.hooks_set_current_device(0))
        expect(n - 1, "hooks setCurrentDevice(0) in another thread")


# ----------------------------------------------------------------- resize


@contract("HK-RESIZE-001")
def test_storage_resize_keeps_the_prefix(dt, n, mod, cxx):
    j = n - 1  # device 0 stays current: the storage must stay on its own device
    size = 4096
    resizers = (("UntypedStorage.resize_", lambda s, m: s.resize_(m)),
                ("hooks resizePrivateUse1Bytes", cxx.hooks_resize_bytes))
    require_allocator(cxx)
    for name, resize in resizers:
        storage = must(lambda: torch.UntypedStorage(size, device=f"{dt}:{j}"),
                       f"torch.UntypedStorage({size}, device='{dt}:{j}')")
        first = pattern(size, 1)
        storage.copy_(cpu_storage(first))
        assert storage_bytes(storage) == first, "bytes written into a device storage do not read back"

        def check(nbytes: int, prefix: bytes, what: str) -> None:
            assert storage.nbytes() == nbytes, f"after {what}, nbytes() is {storage.nbytes()}, not {nbytes}"
            assert storage.device == torch.device(dt, j), f"after {what}, the storage is on {storage.device}"
            data = storage_bytes(storage)
            assert len(data) == nbytes
            assert data[:len(prefix)] == prefix, f"{what} did not keep the first {len(prefix)} bytes"
            if nbytes:
                where = tuple(cxx.hooks_get_device_from_ptr(storage.data_ptr()))
                assert where == (dt, j), f"after {what}, the storage's memory is on {where}, not device {j}"
            assert mod.current_device() == 0, f"{what} left device {mod.current_device()} current"

        must(lambda: resize(storage, 2 * size), f"{name} growing {size} -> {2 * size} bytes")
        check(2 * size, first, f"{name} growing to {2 * size} bytes")
        second = pattern(2 * size, 2)
        storage.copy_(cpu_storage(second))  # the grown tail must be real, usable memory
        assert storage_bytes(storage) == second, f"after {name} grew the storage, its new bytes are not writable"

        must(lambda: resize(storage, size // 2 - 3), f"{name} shrinking to {size // 2 - 3} bytes")
        check(size // 2 - 3, second[:size // 2 - 3], f"{name} shrinking to {size // 2 - 3} bytes")

        must(lambda: resize(storage, 0), f"{name} resizing to 0 bytes")
        check(0, b"", f"{name} resizing to 0 bytes")

        must(lambda: resize(storage, 100), f"{name} growing from 0 to 100 bytes")
        check(100, b"", f"{name} growing from 0 to 100 bytes")
        third = pattern(100, 3)
        storage.copy_(cpu_storage(third))
        assert storage_bytes(storage) == third, f"after {name} grew an empty storage, it is not writable"

    # A tensor's storage, resized through the tensor's view of it.
    t = torch.arange(256, dtype=torch.uint8, device=f"{dt}:{j}")
    t.untyped_storage().resize_(1024)
    assert storage_bytes(t.untyped_storage())[:256] == bytes(range(256))
    assert torch.equal(t.cpu(), torch.arange(256, dtype=torch.uint8)), \
        "after growing its storage, a tensor no longer reads its values"
