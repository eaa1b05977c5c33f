"""Hooks: the backend's PrivateUse1HooksInterface, directly (through the
kit's C++ probe) and the way PyTorch reaches it: at::Context (lazy init,
default generators, pointers, pinned memory), autograd, pin_memory(),
torch.Generator, at::from_blob and storage resizing.

Every test runs in a fresh process in which the backend was imported but
never initialized, so "before the first use" is the state each test starts
from. Side effects ("does not initialize") are judged against the state
observed just before the call (_helpers.initialized_by). Calls of init()
are counted without the backend's help: the probe interposes on the hooks
object's vtable (cxx/hooks_watch.cpp); an instrumentation init_count(), if
the backend has one, also sees calls made before the test started."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from ._helpers import (check, in_thread, inconclusive, initialized_by, must, must_raise, names_number, names_range,
                       require_allocator, scope)

contract = pytest.mark.contract

# An invalid index may be refused with any of these.
INDEX_ERRORS = (RuntimeError, IndexError, ValueError)


def contexts(cxx, n: int) -> list[int]:
    """The devices for which the hooks report a primary context."""
    return [i for i in range(n) if must(lambda: cxx.hooks_has_primary_context(i), f"hooks hasPrimaryContext({i})")]


def storage_bytes(storage) -> bytes:
    """The bytes of an UntypedStorage (any device), read through a CPU copy."""
    cpu = storage.cpu()
    # (tolist, not numpy: the kit does not need numpy, and torch does not either)
    return bytes(torch.empty(0, dtype=torch.uint8).set_(cpu).tolist())


def cpu_storage(data: bytes):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).untyped_storage()


def pattern(size: int, salt: int) -> bytes:
    return bytes((k * 131 + salt * 17 + (k >> 8)) % 251 for k in range(size))


# ------------------------------------------------------------ registration


@contract("HK-REG-001")
@pytest.mark.zero_devices_ok
def test_hooks_are_registered_once(cxx):
    check("HK-REG-001.1", cxx.hooks_registered(),
          "no PrivateUse1HooksInterface is registered: the backend must call "
          "at::RegisterPrivateUse1HooksInterface(new YourHooks()) when its library loads")
    before = cxx.hooks_address()
    with scope("HK-REG-001.2"):
        must_raise(cxx.hooks_register_second, "registering a second PrivateUse1 hooks object "
                   "(at::RegisterPrivateUse1HooksInterface)", RuntimeError)
    check("HK-REG-001.2", cxx.hooks_registered() and cxx.hooks_address() == before,
          "a refused second registration replaced the backend's hooks object")


# ------------------------------------------------------ isBuilt / isAvailable


@contract("HK-BUILT-001")
@pytest.mark.zero_devices_ok
def test_is_built(cxx, dt, n):
    answers = {}
    with scope("HK-BUILT-001.1"):
        answers["in a fresh process"] = [must(cxx.hooks_is_built, "the hooks' isBuilt()") for _ in range(5)]
        answers["in a new thread"] = [in_thread(lambda: must(cxx.hooks_is_built, "isBuilt() in a new thread"))]
        if n:
            must(lambda: torch.ones(2, device=f"{dt}:{n - 1}"), "creating a tensor on the device")
            answers["after a device was used"] = [must(cxx.hooks_is_built, "isBuilt() after a device was used")]
    wrong = {when: a for when, a in answers.items() if any(x is not True for x in a)}
    check("HK-BUILT-001.1", not wrong, f"isBuilt() must return True for a backend that is loaded: {wrong}")


@contract("HK-AVAIL-001")
@pytest.mark.zero_devices_ok
def test_is_available_neither_raises_nor_initializes(cxx, mod, n, dt):
    expected = n > 0

    def ask(when: str) -> None:
        with scope("HK-AVAIL-001.1"):
            answers = [must(cxx.hooks_is_available, "the hooks' isAvailable()") for _ in range(10)]
            answers.append(in_thread(lambda: must(cxx.hooks_is_available, "isAvailable() in a new thread")))
        wrong = [a for a in answers if a is not expected]
        check("HK-AVAIL-001.1", not wrong,
              f"{when}, with {n} device(s), isAvailable() must return {expected}, but returned {wrong}")

    initialized_by("HK-AVAIL-001.2", lambda: ask("in a fresh process"), "the hooks' isAvailable()", mod, cxx, n)
    if n:
        must(lambda: torch.ones(4, device=f"{dt}:{n - 1}"), f"creating a tensor on device {n - 1}")
        initialized_by("HK-AVAIL-001.2", lambda: ask("after a device was used"),
                       "the hooks' isAvailable() (after a device was used)", mod, cxx, n)


# ------------------------------------------------------------------- init


# The contracts whose entry points the init paths call: a failure or a crash
# inside one of those calls is evidence about that contract, not about init.
INIT_PATH_CONTRACTS = ("HK-PIN-001", "HK-GEN-001", "HK-GEN-002", "HK-PTR-001", "HK-PIN-002")


def _init_paths(dt: str, n: int, cxx, unclaimed) -> dict:
    """Calls that make PyTorch run the hooks' init() (at::Context::lazyInitDevice)
    or that use what init() prepares: name -> (the contract whose entry point
    it is, or None, and the call), for the features the backend claims."""
    last = n - 1

    def device_pointer():
        t = torch.empty(16, device=f"{dt}:{last}")
        return cxx.context_get_device_from_ptr(t.data_ptr() + 4)

    paths = {
        "Tensor.pin_memory()": ("pinned-memory", "HK-PIN-001", lambda: torch.ones(64).pin_memory()),
        "torch.empty(pin_memory=True)": ("pinned-memory", "HK-PIN-001", lambda: torch.empty(64, pin_memory=True)),
        "Context::getPinnedMemoryAllocator": ("pinned-memory", "HK-PIN-001", lambda: cxx.context_pinned_roundtrip(256)),
        "Context::defaultGenerator": ("generators", "HK-GEN-001", lambda: cxx.context_default_generator(last)),
        "a random op on the device": ("generators", "HK-GEN-001", lambda: torch.rand(8, device=dt)),
        "torch.Generator(device)": ("generators", "HK-GEN-002", lambda: torch.Generator(device=f"{dt}:{last}")),
        "a device tensor": (None, None, lambda: torch.empty(8, device=f"{dt}:{last}")),
        "Context::getDeviceFromPtr": (None, "HK-PTR-001", device_pointer),
        "Tensor.is_pinned()": ("pinned-memory", "HK-PIN-002", lambda: torch.ones(8).pin_memory().is_pinned()),
    }
    return {name: (owner, call) for name, (feature, owner, call) in paths.items() if feature not in unclaimed}


def _use(paths: dict, name: str):
    """Take path `name`: charged to the contract whose entry point it is."""
    owner, call = paths[name]
    if owner is None:
        return must(call, name)
    with scope(owner):
        return must(call, name)


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


class InitCalls:
    """The hooks' init() calls as the kit can see them: counted by the probe's
    interposer from the start of the test, PyTorch's own lazy-init flag, and
    the backend's init_count() instrumentation if it has one (which also sees
    calls made before the test's process was forked)."""

    def __init__(self, cxx, instrument) -> None:
        self.cxx = cxx
        self.watched = cxx.hooks_watch()
        self.instrumented = instrument("init_count")

    def counts(self) -> dict[str, int]:
        counts = {}
        if self.watched:
            counts["init() calls seen by the kit"] = self.cxx.hooks_watch_calls()["init"]
        if self.instrumented:
            counts["init_count() instrumentation"] = int(self.instrumented())
        return counts

    def describe(self) -> str:
        counts = self.counts()
        flag = self.cxx.context_initialized()
        return (", ".join(f"{k}: {v}" for k, v in counts.items()) or "init() calls cannot be counted") + \
            f"; PyTorch's lazy-init flag {'set' if flag else 'unset'}"


@contract("HK-INIT-001", *INIT_PATH_CONTRACTS)
@pytest.mark.parametrize("first", FIRST_USES, ids=lambda f: "threads-race" if f is None else f)
def test_init_runs_exactly_once_lazily(first, dt, n, mod, cxx, instrument, unclaimed):
    paths = _init_paths(dt, n, cxx, unclaimed)
    if first is not None and first not in paths:
        inconclusive(f"{first} needs a feature the backend does not claim", applies=False)
    calls = InitCalls(cxx, instrument)
    check("HK-INIT-001.1", not cxx.context_initialized() and not any(calls.counts().values()),
          lambda: "in a fresh process, before any device use, the hooks' init() has already run "
                  f"({calls.describe()}): init must run lazily, on the first use")
    # Queries that must not initialize.
    mod.device_count()
    mod.is_available()
    cxx.hooks_is_built()
    cxx.hooks_is_available()
    cxx.hooks_device_count()
    for i in range(n):
        cxx.hooks_has_primary_context(i)
    torch.ones(8).is_pinned()
    check("HK-INIT-001.1", not cxx.context_initialized() and not any(calls.counts().values()),
          lambda: "device_count/is_available/isBuilt/isAvailable/hasPrimaryContext/is_pinned ran the hooks' init() "
                  f"({calls.describe()}); init must wait for the first real use")

    if first is not None:
        _use(paths, first)
        check("HK-INIT-001.2", all(c <= 1 for c in calls.counts().values()),
              lambda: f"after {first} as the first device use: {calls.describe()}; the hooks' init() ran more "
                      "than once")

    names = list(paths)
    workers = 8
    barrier = threading.Barrier(workers)
    errors: list[str] = []

    def work(k: int) -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        order = names[k % len(names):] + names[:k % len(names)]
        for _ in range(3):
            for name in order:
                owner, call = paths[name]
                try:
                    with scope(owner or "HK-INIT-001.3"):  # a crash inside is charged to the call's contract
                        call()
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(f"{name} (thread {k}): {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Each path once more on its own: one that fails alone is its own
    # contract's failure; what fails only concurrently is this contract's.
    for name in names:
        _use(paths, name)
    check("HK-INIT-001.3", not errors, lambda: "concurrent uses of the backend from several threads failed, though "
          "each works alone:\n  " + "\n  ".join(errors[:10]))
    counts = calls.counts()
    check("HK-INIT-001.3", cxx.context_initialized() and all(c == 1 for c in counts.values()),
          lambda: f"after many generator, pinned-memory and pointer calls from {workers} threads: {calls.describe()}; "
                  "the hooks' init() must run exactly once per process (PyTorch calls it through "
                  "at::Context::lazyInitDevice; the backend must not call it again itself)")


# ------------------------------------------------------- hasPrimaryContext


@contract("HK-CTX-001")
def test_has_primary_context_is_false_until_a_device_is_used(n, mod, cxx):
    def ask_repeatedly() -> list[list[int]]:
        with scope("HK-CTX-001.1"):
            return [contexts(cxx, n) for _ in range(20)]

    answers = initialized_by("HK-CTX-001.4", ask_repeatedly, "asking hasPrimaryContext(i) for every device", mod, cxx, n)
    created = sorted({i for answer in answers for i in answer})
    check("HK-CTX-001.1", not created, f"in a fresh process, hasPrimaryContext is True for device(s) {created}")
    for bad in (n, n + 1, 127, -2):
        try:
            answer = cxx.hooks_has_primary_context(bad)
        except INDEX_ERRORS:
            continue
        check("HK-CTX-001.5", answer is False, f"hasPrimaryContext({bad}) with {n} device(s) returned {answer!r}")


@contract("HK-CTX-001")
def test_has_primary_context_tracks_the_devices_used(dt, n, mod, cxx):
    """Devices used one by one, last first, with device 0 current: exactly
    the used ones report a context, in this thread and in another."""
    used: list[int] = []
    keep = []
    for j in reversed(range(n)):
        with scope("HK-CTX-001.2"):
            x = must(lambda: torch.ones(64, device=f"{dt}:{j}"), f"allocating a tensor on device {j}")
            x.add_(1)
        keep.append(x)
        used.append(j)
        expected = sorted(used)
        with scope("HK-CTX-001.2"):
            seen = contexts(cxx, n)
        check("HK-CTX-001.2", seen == expected,
              f"after using device(s) {expected} (device 0 current), hasPrimaryContext is True for {seen}: it must be "
              "True exactly for the devices that were used")
        with scope("HK-CTX-001.3"):
            seen = in_thread(lambda: contexts(cxx, n))
        check("HK-CTX-001.3", seen == expected,
              f"in another thread, hasPrimaryContext is True for {seen}, but the process has used {expected}: "
              "contexts are per process, not per thread")


@contract("HK-CTX-002")
def test_backward_on_the_device(dt, n, mod):
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    x = torch.randn(32, 8)
    target = torch.randn(32, 4)
    cpu_loss = torch.nn.functional.mse_loss(cpu_model(x), target)
    cpu_loss.backward()
    expected = {name: p.grad for name, p in cpu_model.named_parameters()}

    for j in sorted({n - 1, 0}):
        mod.set_device(0)  # the other device stays current for the last one
        device = torch.device(dt, j)
        model = copy.deepcopy(cpu_model)
        model.zero_grad(set_to_none=True)
        with scope("HK-CTX-002.1"):
            model = must(lambda: model.to(device), f"moving a model to {device}")
            loss = torch.nn.functional.mse_loss(model(x.to(device)), target.to(device))
            must(loss.backward, f"loss.backward() on {device} (the autograd engine calls hasPrimaryContext(i) for "
                                "every device index)")
        check("HK-CTX-002.1", torch.allclose(loss.detach().cpu(), cpu_loss.detach(), rtol=1e-5, atol=1e-6),
              f"the loss on {device} differs from CPU")
        for name, p in model.named_parameters():
            check("HK-CTX-002.1", p.grad is not None and p.grad.device == device,
                  f"backward on {device} left the gradient of {name} as "
                  f"{None if p.grad is None else p.grad.device}")
            check("HK-CTX-002.1", torch.allclose(p.grad.cpu(), expected[name], rtol=1e-4, atol=1e-6),
                  f"the gradient of {name} computed on {device} differs from CPU")

        a = torch.arange(6, dtype=torch.float32, device=device).requires_grad_()
        with scope("HK-CTX-002.2"):
            in_thread(lambda: (a * a).sum().backward())
        check("HK-CTX-002.2", a.grad is not None and a.grad.device == device
              and torch.equal(a.grad.cpu(), 2 * torch.arange(6, dtype=torch.float32)),
              f"backward from another thread gave d(sum(a*a))/da = {a.grad} on {device}")


# ------------------------------------------------------------- generators


@contract("HK-GEN-001")
def test_default_generator_is_one_per_device(dt, n, mod, cxx):
    with scope("HK-GEN-001.1"):
        addresses = [must(lambda: cxx.hooks_default_generator_address(i), f"getDefaultGenerator({i})")
                     for i in range(n)]
        again = [cxx.hooks_default_generator_address(i) for i in range(n)]
        other = in_thread(lambda: [cxx.hooks_default_generator_address(i) for i in range(n)])
    check("HK-GEN-001.1", again == addresses, "getDefaultGenerator(i) returned a different generator on a second call")
    check("HK-GEN-001.1", other == addresses, "getDefaultGenerator(i) returned a different generator in another thread")
    check("HK-GEN-001.2", len(set(addresses)) == n, "devices share a default generator: there must be one per device")
    for i in range(n):
        g = cxx.hooks_default_generator(i)
        check("HK-GEN-001.2", g.device == torch.device(dt, i), f"getDefaultGenerator({i}) is a generator of {g.device}")
        check("HK-GEN-001.3", cxx.context_default_generator(i).device == g.device
              and cxx.hooks_default_generator_address(i) == addresses[i],
              f"Context::defaultGenerator({i}) is not the hooks' getDefaultGenerator({i})")

    # The state lives in that one object: seed through one call, read through others.
    for i in range(n):
        cxx.hooks_default_generator(i).manual_seed(1000 + i)
    for i in range(n):
        seeds = (cxx.hooks_default_generator(i).initial_seed(), cxx.context_default_generator(i).initial_seed())
        check("HK-GEN-001.3", seeds == (1000 + i, 1000 + i),
              f"device {i}'s default generator was seeded with {1000 + i}, but getDefaultGenerator({i}) and "
              f"Context::defaultGenerator report {seeds}")

    # Random ops without generator= draw from it.
    for i in range(n):
        generator = cxx.hooks_default_generator(i)
        generator.manual_seed(7)
        with scope("HK-GEN-001.3"):
            a = must(lambda: torch.rand(64, device=f"{dt}:{i}").cpu(), f"torch.rand on device {i}")
            state = generator.get_state()
            generator.manual_seed(7)
            b = torch.rand(64, device=f"{dt}:{i}").cpu()
        check("HK-GEN-001.3", torch.equal(a, b),
              f"re-seeding getDefaultGenerator({i}) did not reproduce torch.rand on device {i}: random ops must draw "
              "from the hooks' default generator")
        generator.manual_seed(7)
        check("HK-GEN-001.3", not torch.equal(generator.get_state(), state),
              f"drawing on device {i} did not advance getDefaultGenerator({i})")

    # -1 means the current device: of the calling thread, whichever it is.
    for j in [*reversed(range(n)), 0]:
        mod.set_device(j)
        with scope("HK-GEN-001.4"):
            got = must(lambda: cxx.hooks_default_generator_address(-1), "getDefaultGenerator(-1)")
        check("HK-GEN-001.4", got == addresses[j], f"with device {j} current, getDefaultGenerator(-1) is not device {j}'s")
    mod.set_device(n - 1)

    def in_new_thread():
        return mod.current_device(), cxx.hooks_default_generator_address(-1)

    with scope("HK-GEN-001.4"):
        current, got = in_thread(in_new_thread)
    check("HK-GEN-001.4", 0 <= current < n and got == addresses[current],
          f"in a new thread whose current device is {current}, getDefaultGenerator(-1) is not that device's")

    for bad in (n, n + 3, -2):
        with scope("HK-GEN-001.5"):
            must_raise(lambda: cxx.hooks_default_generator_address(bad),
                       f"getDefaultGenerator({bad}) with {n} device(s)", INDEX_ERRORS)


@contract("HK-GEN-002")
def test_new_generator_is_fresh_and_independent(dt, n, mod, cxx):
    for i in reversed(range(n)):
        device = torch.device(dt, i)
        with scope("HK-GEN-002.1"):
            g1 = must(lambda: cxx.hooks_new_generator(i), f"getNewGenerator({i})")
            g2 = must(lambda: cxx.hooks_new_generator(i), f"getNewGenerator({i})")
        with scope("HK-GEN-002.3"):
            g3 = must(lambda: torch.Generator(device=f"{dt}:{i}"), f"torch.Generator(device='{dt}:{i}')")
            g4 = must(lambda: torch.Generator(device=device), f"torch.Generator(device={device!r})")
        for clause, name, g in (("HK-GEN-002.1", "getNewGenerator", g1), ("HK-GEN-002.3", "torch.Generator(str)", g3),
                                ("HK-GEN-002.3", "torch.Generator(device)", g4)):
            check(clause, g.device == device, f"{name} for device {i} made a generator of {g.device}")

        default = cxx.hooks_default_generator(i)
        default.manual_seed(99)
        before = default.get_state()
        g1.manual_seed(1)
        g2.manual_seed(2)
        check("HK-GEN-002.1", (g1.initial_seed(), g2.initial_seed()) == (1, 2),
              f"two getNewGenerator({i}) results share their state: they must be distinct generators")
        check("HK-GEN-002.2", default.initial_seed() == 99 and torch.equal(default.get_state(), before),
              f"seeding a new generator of device {i} changed the device's default generator")

        with scope("HK-GEN-002.2"):
            x1 = must(lambda: torch.rand(256, device=device, generator=g1), f"torch.rand(generator=new generator of {i})")
        check("HK-GEN-002.2", x1.device == device and torch.equal(default.get_state(), before),
              f"drawing from a new generator of device {i} advanced the default generator")
        for clause, other in (("HK-GEN-002.1", g2), ("HK-GEN-002.3", g3), ("HK-GEN-002.3", g4)):
            other.manual_seed(1)
            with scope(clause):
                again = torch.rand(256, device=device, generator=other)
            check(clause, torch.equal(again.cpu(), x1.cpu()),
                  f"two fresh generators of device {i} seeded alike gave different numbers: a new generator must "
                  "honour manual_seed")
        g1.manual_seed(2)
        check("HK-GEN-002.1", not torch.equal(torch.rand(256, device=device, generator=g1).cpu(), x1.cpu()),
              f"a new generator of device {i} gives the same numbers for seeds 1 and 2")

    for j in [n - 1, 0]:
        mod.set_device(j)
        with scope("HK-GEN-002.4"):
            made = must(lambda: cxx.hooks_new_generator(-1), "getNewGenerator(-1)")
            bare = must(lambda: torch.Generator(device=dt), f"torch.Generator(device={dt!r})")
        check("HK-GEN-002.4", made.device == torch.device(dt, j), f"with device {j} current, getNewGenerator(-1) "
                                                                   f"made a generator of {made.device}")
        check("HK-GEN-002.4", bare.device == torch.device(dt, j),
              f"with device {j} current, torch.Generator(device={dt!r}) is on {bare.device}")

    for bad in (n, n + 3, -2):
        with scope("HK-GEN-002.5"):
            must_raise(lambda: cxx.hooks_new_generator(bad), f"getNewGenerator({bad}) with {n} device(s)", INDEX_ERRORS)
    with scope("HK-GEN-002.5"):
        must_raise(lambda: torch.Generator(device=f"{dt}:{n}"), f"torch.Generator(device='{dt}:{n}') with {n} device(s)",
                   INDEX_ERRORS)


# --------------------------------------------------------------- pointers


@contract("HK-PTR-001")
def test_device_from_pointer(dt, n, cxx):
    lookups = (("HK-PTR-001.1", "hooks getDeviceFromPtr", cxx.hooks_get_device_from_ptr),
               ("HK-PTR-001.2", "Context::getDeviceFromPtr", cxx.context_get_device_from_ptr))
    tensors = {j: torch.arange(1024, dtype=torch.float32, device=f"{dt}:{j}") for j in reversed(range(n))}
    for j, t in tensors.items():  # device 0 stays current
        base = t.data_ptr()
        nbytes = t.untyped_storage().nbytes()
        pointers = {"the base pointer": base}
        for offset in (1, 4, nbytes // 2, nbytes - 1):
            pointers[f"the interior pointer base+{offset}"] = base + offset
        pointers["a view's data_ptr()"] = t[100:].data_ptr()
        for what, pointer in pointers.items():
            for clause, name, lookup in lookups:
                with scope(clause):
                    got = must(lambda: lookup(pointer), f"{name}({what} of a tensor on device {j})")
                check(clause, tuple(got) == (dt, j), f"{name}({what} of a tensor on {dt}:{j}) returned {got}")
        with scope("HK-PTR-001.1"):
            got = in_thread(lambda: cxx.hooks_get_device_from_ptr(base + 8))
        check("HK-PTR-001.1", tuple(got) == (dt, j), f"getDeviceFromPtr in a new thread returned {got} for device {j} "
                                                      "memory")

    host = torch.arange(1024, dtype=torch.float32)
    for clause, name, lookup in lookups:
        for what, pointer in (("a host (CPU tensor) pointer", host.data_ptr()),
                              ("an interior host pointer", host.data_ptr() + 100)):
            with scope("HK-PTR-001.4"):
                must_raise(lambda: lookup(pointer), f"{name}({what})", (RuntimeError, ValueError))


@contract("HK-PTR-001")
def test_from_blob_finds_the_device(dt, n, cxx):
    for j in reversed(range(n)):
        source = torch.arange(64, dtype=torch.float32, device=f"{dt}:{j}")
        pointer = source.data_ptr() + 8 * 4
        with scope("HK-PTR-001.3"):
            t = must(lambda: cxx.from_blob_float(pointer, 16, -1),
                     f"at::from_blob on memory of device {j} with no device index")
        check("HK-PTR-001.3", t.device == torch.device(dt, j),
              f"at::from_blob on memory of {dt}:{j} made a tensor on {t.device} (getDeviceFromPtr)")
        check("HK-PTR-001.3", torch.equal(t.cpu(), torch.arange(8, 24, dtype=torch.float32)),
              "a tensor made by at::from_blob on device memory does not read that memory")
        del t


# ---------------------------------------------------------- pinned memory


@contract("HK-PIN-002")
def test_is_pinned_is_false_without_initializing(mod, n, cxx):
    pageable = torch.arange(256, dtype=torch.float32)

    def ask() -> list:
        with scope("HK-PIN-002.1"):
            answers = [must(pageable.is_pinned, "Tensor.is_pinned() before any device use") for _ in range(10)]
            answers.append(must(lambda: cxx.context_is_pinned_ptr(pageable.data_ptr()),
                                "Context::isPinnedPtr before any device use"))
            answers.append(pageable[10:].is_pinned())
        return answers

    answers = initialized_by("HK-PIN-002.3", ask, "Tensor.is_pinned() on a never-initialized backend", mod, cxx, n)
    check("HK-PIN-002.1", not any(answers), f"a pageable CPU tensor reports is_pinned() True: {answers}")


@contract("HK-PIN-002")
def test_is_pinned_ptr_tells_pinned_from_pageable_and_device_memory(dt, n, cxx):
    pageable = torch.arange(4096, dtype=torch.uint8)
    with scope("HK-PIN-002.2"):
        pinned = must(pageable.pin_memory, "Tensor.pin_memory()")
        allocated = must(lambda: torch.empty(1000, dtype=torch.float32, pin_memory=True), "torch.empty(pin_memory=True)")
        tiny = must(lambda: torch.empty(1, dtype=torch.uint8, pin_memory=True), "a 1-byte pinned tensor")
        large = must(lambda: torch.empty((1 << 20) + 3, dtype=torch.uint8, pin_memory=True),
                     "a pinned tensor of 1 MiB + 3 bytes")

    def ends(t):
        base, nbytes = t.data_ptr(), t.untyped_storage().nbytes()
        return {"base": base, "base+1": base + 1, "middle": base + nbytes // 2, "last byte": base + nbytes - 1} \
            if nbytes > 1 else {"base": base}

    for name, t in (("pin_memory()", pinned), ("empty(pin_memory=True)", allocated),
                    ("a 1-byte pinned tensor", tiny), ("a 1 MiB + 3 pinned tensor", large)):
        check("HK-PIN-002.2", t.is_pinned(), f"{name}.is_pinned() is False")
        for where, pointer in ends(t).items():
            check("HK-PIN-002.2", cxx.hooks_is_pinned_ptr(pointer) is True, f"isPinnedPtr({where} of {name}) is False")
            check("HK-PIN-002.2", cxx.context_is_pinned_ptr(pointer) is True,
                  f"Context::isPinnedPtr({where} of {name}) is False")
    check("HK-PIN-002.2", pinned[100:].is_pinned(), "a view into pinned memory (an interior pointer) is not pinned")

    for where, pointer in ends(pageable).items():
        check("HK-PIN-002.1", cxx.hooks_is_pinned_ptr(pointer) is False, f"isPinnedPtr({where} of pageable memory) is True")
        check("HK-PIN-002.1", cxx.context_is_pinned_ptr(pointer) is False,
              f"Context::isPinnedPtr({where} of pageable memory) is True")
    check("HK-PIN-002.1", not pageable.is_pinned(), "pageable memory reports is_pinned() True after pinning a copy")

    for j in reversed(range(n)):
        device = torch.arange(4096, dtype=torch.uint8, device=f"{dt}:{j}")
        for where, pointer in ends(device).items():
            check("HK-PIN-002.1", cxx.hooks_is_pinned_ptr(pointer) is False,
                  f"isPinnedPtr({where} of device {j} memory) is True")
            check("HK-PIN-002.1", cxx.context_is_pinned_ptr(pointer) is False,
                  f"Context::isPinnedPtr({where} of device {j} memory) is True")
        check("HK-PIN-002.1", not device.is_pinned(), f"a tensor on device {j} reports is_pinned() True")


@contract("HK-PIN-001")
def test_pinned_allocator_initializes_first(mod, n, cxx, instrument):
    calls = InitCalls(cxx, instrument)
    with scope("HK-PIN-001.1"):
        pinned = must(lambda: torch.arange(64, dtype=torch.float32).pin_memory(),
                      "Tensor.pin_memory() as the first use of the backend")
    watched = cxx.hooks_watch_calls() if calls.watched else None
    check("HK-PIN-001.1", cxx.context_initialized() and all(c == 1 for c in calls.counts().values()),
          lambda: f"after the first pin_memory() of a process: {calls.describe()}; the backend must have been "
                  "initialized once before pinned memory is handed out")
    if watched and watched["pinned_allocator"]:
        check("HK-PIN-001.1", 0 <= watched["first_init"] < watched["first_pinned_allocator"],
              f"the hooks' getPinnedMemoryAllocator() was called before init() ({watched})")
    check("HK-PIN-001.2", pinned.is_pinned(), "the first pin_memory() of the process returned unpinned memory")
    with scope("HK-PIN-001.2"):
        base_pinned, last_pinned, device = must(lambda: cxx.hooks_pinned_roundtrip(4096),
                                                "allocating through the hooks' getPinnedMemoryAllocator()")
    check("HK-PIN-001.3", device == "cpu",
          f"the pinned allocator's memory claims device type {device!r}; pinned memory is host (cpu) memory")
    check("HK-PIN-001.2", base_pinned and last_pinned,
          "isPinnedPtr does not recognize memory from getPinnedMemoryAllocator()")


@contract("HK-PIN-001")
def test_context_pinned_allocator_memory_is_pinned(n, cxx):
    # First use of the process: Context::getPinnedMemoryAllocator runs
    # init() before it asks the hooks for the allocator.
    with scope("HK-PIN-001.2"):
        base, last, context, device = must(lambda: cxx.context_pinned_roundtrip(1 << 16),
                                           "Context::getPinnedMemoryAllocator() as the first use of the backend")
    check("HK-PIN-001.3", device == "cpu", f"the pinned allocator's memory claims device type {device!r}, not cpu")
    check("HK-PIN-001.2", base and last and context,
          f"memory from Context::getPinnedMemoryAllocator() is not reported pinned (hooks isPinnedPtr: base {base}, "
          f"last byte {last}; Context::isPinnedPtr: {context})")
    for size in (1, 100, 1 << 20, 12345):
        b, l, c, _ = cxx.context_pinned_roundtrip(size)
        check("HK-PIN-001.2", b and l and c, f"a {size}-byte block from the pinned allocator is not pinned everywhere")


# -------------------------------------------------- low-priority device hooks


def _everywhere(mod, cxx) -> dict[str, int]:
    return {"hooks getCurrentDevice()": cxx.hooks_get_current_device(), "module current_device()": mod.current_device(),
            "guard getDevice()": cxx.guard_get_device()[1]}


def _agree(clause: str, mod, cxx, j: int, after: str) -> None:
    with scope(clause):
        seen = _everywhere(mod, cxx)
    check(clause, set(seen.values()) == {j}, f"after {after}, the current device should be {j} everywhere: {seen}")


@contract("HK-DEV-001")
@pytest.mark.zero_devices_ok
def test_hooks_device_count_agrees(mod, cxx, dt, n):
    for when in ("in a fresh process", "after a device was used"):
        if when.startswith("after"):
            if not n:
                break
            torch.ones(2, device=f"{dt}:{n - 1}")
        with scope("HK-DEV-001.1"):
            counts = {"hooks deviceCount()": must(cxx.hooks_device_count, "the hooks' deviceCount()"),
                      "guard deviceCount()": cxx.guard_device_count(), "module device_count()": mod.device_count()}
        check("HK-DEV-001.1", set(counts.values()) == {n}, f"{when}, device counts disagree: {counts}")


@contract("HK-DEV-001")
def test_hooks_get_current_device_follows_every_switch(mod, cxx, n):
    with scope("HK-DEV-001.2"):
        first = must(cxx.hooks_get_current_device, "the hooks' getCurrentDevice() in a fresh process")
    check("HK-DEV-001.2", first == mod.current_device(),
          f"in a fresh process the hooks' getCurrentDevice() is {first}, the module says {mod.current_device()}")
    for j in [*reversed(range(n)), 0]:
        mod.set_device(j)
        _agree("HK-DEV-001.2", mod, cxx, j, f"the module's set_device({j})")
        torch.accelerator.set_device_index(j)
        _agree("HK-DEV-001.2", mod, cxx, j, f"torch.accelerator.set_device_index({j})")
    mod.set_device(n - 1)
    with scope("HK-DEV-001.2"):
        seen = in_thread(lambda: (cxx.hooks_get_current_device(), mod.current_device()))
    check("HK-DEV-001.2", seen[0] == seen[1], f"in a new thread the hooks' getCurrentDevice() is {seen[0]}, the module's "
                                              f"current_device() {seen[1]}")


@contract("HK-DEV-001")
def test_hooks_set_exchange_and_maybe_exchange(mod, cxx, n):
    for i in range(n):
        for j in range(n):
            mod.set_device(i)
            with scope("HK-DEV-001.3"):
                must(lambda: cxx.hooks_set_current_device(j), f"the hooks' setCurrentDevice({j})")
            _agree("HK-DEV-001.3", mod, cxx, j, f"the hooks' setCurrentDevice({j}) with device {i} current")
            mod.set_device(i)
            with scope("HK-DEV-001.4"):
                previous = must(lambda: cxx.hooks_exchange_device(j), f"the hooks' exchangeDevice({j})")
            check("HK-DEV-001.4", previous == i,
                  f"the hooks' exchangeDevice({j}) with device {i} current returned {previous}, not {i}")
            _agree("HK-DEV-001.4", mod, cxx, j, f"the hooks' exchangeDevice({j}) with device {i} current")
            mod.set_device(i)
            with scope("HK-DEV-001.5"):
                previous = must(lambda: cxx.hooks_maybe_exchange_device(j), f"the hooks' maybeExchangeDevice({j})")
            check("HK-DEV-001.5", previous == i,
                  f"the hooks' maybeExchangeDevice({j}) with device {i} current returned {previous}, not {i}")
            _agree("HK-DEV-001.5", mod, cxx, j, f"the hooks' maybeExchangeDevice({j}) with device {i} current")
        mod.set_device(i)
        with scope("HK-DEV-001.5"):
            result = must(lambda: cxx.hooks_maybe_exchange_device(-1), "the hooks' maybeExchangeDevice(-1)")
        check("HK-DEV-001.5", result in (i, -1), f"the hooks' maybeExchangeDevice(-1) with device {i} current "
                                                  f"returned {result}")
        _agree("HK-DEV-001.5", mod, cxx, i, "the hooks' maybeExchangeDevice(-1)")
    mod.set_device(n - 1)
    if n > 1:
        with scope("HK-DEV-001.3"):
            in_thread(lambda: cxx.hooks_set_current_device(0))
        _agree("HK-DEV-001.3", mod, cxx, n - 1, "the hooks' setCurrentDevice(0) in another thread")


@contract("HK-DEV-001")
def test_hooks_validate_bad_indices_like_the_module(mod, cxx, n):
    """The hooks reject what the module and the guard reject."""
    mod.set_device(n - 1)
    for bad in (n, n + 5, 100):
        for name, call in (("the hooks' setCurrentDevice", cxx.hooks_set_current_device),
                           ("the hooks' exchangeDevice", cxx.hooks_exchange_device)):
            with scope("HK-DEV-001.6"):
                error = must_raise(lambda: call(bad), f"{name}({bad}) with {n} device(s)", INDEX_ERRORS)
            check("HK-DEV-001.6", names_number(str(error), bad) and names_range(str(error), n),
                  f"{name}({bad}) was rejected, but its message names neither the index {bad} and the device count "
                  f"{n} nor the valid range: {error}")
            _agree("HK-DEV-001.6", mod, cxx, n - 1, f"the rejected {name}({bad})")
        outcomes = {}
        for name, call in (("the hooks' maybeExchangeDevice", cxx.hooks_maybe_exchange_device),
                           ("torch.accelerator maybeExchangeDevice", torch._C._accelerator_maybeExchangeDevice)):
            try:
                call(bad)
                outcomes[name] = "no-op"
            except INDEX_ERRORS:
                outcomes[name] = "raised"
            _agree("HK-DEV-001.6", mod, cxx, n - 1, f"{name}({bad})")
        check("HK-DEV-001.6", len(set(outcomes.values())) == 1,
              f"maybeExchangeDevice({bad}) is validated differently by the hooks and the guard: {outcomes}")


# ----------------------------------------------------------------- resize


# decides HK-RESIZE-001.5
@contract("HK-RESIZE-001")
def test_tensor_resize_at_an_offset(dt, n):
    """Tensor.resize_ of a tensor that starts at a storage offset, as on the
    CPU: the offset stays, the strides become contiguous, and the storage
    holds the offset and the new size (grown where it must, the elements it
    had kept, the new ones writable), within the storage and past its end."""
    device = torch.device(dt, n - 1)
    clause = "HK-RESIZE-001.5"
    for shape in ((3, 4), (10, 5)):
        cpu = torch.arange(48, dtype=torch.float32)[4:14]
        t = torch.arange(48, dtype=torch.float32).to(device)[4:14]
        what = f"Tensor.resize_({shape}) of a tensor at storage offset 4 of a 48-element storage"
        cpu.resize_(shape)
        with scope(clause):
            must(lambda: t.resize_(shape), what)
        layout = (tuple(t.shape), t.stride(), t.storage_offset())
        expected = (tuple(cpu.shape), cpu.stride(), cpu.storage_offset())
        check(clause, layout == expected, f"{what}: shape, strides, offset {layout}, on the CPU {expected}")
        needed = (4 + cpu.numel()) * 4
        nbytes = t.untyped_storage().nbytes()
        check(clause, nbytes >= needed,
              f"{what}: its storage has {nbytes} bytes, but the tensor ends at byte {needed} (the CPU's storage has "
              f"{cpu.untyped_storage().nbytes()}): the offset must count when the storage grows")
        kept = min(cpu.numel(), 44)  # the elements that were in the storage before
        got = t.cpu().reshape(-1)[:kept]
        check(clause, torch.equal(got, cpu.reshape(-1)[:kept]),
              f"{what}: the elements the storage had read {got.tolist()}, on the CPU {cpu.reshape(-1)[:kept].tolist()}")
        with scope(clause):
            must(lambda: t.fill_(7.0), f"writing every element after {what}")
        check(clause, torch.equal(t.cpu(), torch.full(shape, 7.0)),
              f"after {what}, the tensor's new elements are not writable")
        head = torch.empty(0, device=device).set_(t.untyped_storage(), 0, (4,))
        check(clause, torch.equal(head.cpu(), torch.arange(4, dtype=torch.float32)),
              f"after {what}, the storage's elements before the offset changed")


@contract("HK-RESIZE-001")
@pytest.mark.parametrize("via", ["UntypedStorage.resize_", "hooks resizePrivateUse1Bytes"])
def test_storage_resize_keeps_the_prefix(via, dt, n, mod, cxx):
    j = n - 1  # device 0 stays current: the storage must stay on its own device
    size = 4099  # odd sizes: no size class hides a lost byte
    resize = (lambda s, m: s.resize_(m)) if via == "UntypedStorage.resize_" else cxx.hooks_resize_bytes
    clause = {"UntypedStorage.resize_": "HK-RESIZE-001.1", "hooks resizePrivateUse1Bytes": "HK-RESIZE-001.4"}[via]
    require_allocator(cxx)
    storage = must(lambda: torch.UntypedStorage(size, device=f"{dt}:{j}"), f"torch.UntypedStorage({size}, device='{dt}:{j}')")
    first = pattern(size, 1)
    storage.copy_(cpu_storage(first))
    check(clause, storage_bytes(storage) == first, "bytes written into a device storage do not read back")

    def expect(nbytes: int, prefix: bytes, what: str, part: str = clause) -> None:
        check(part, storage.nbytes() == nbytes, f"after {what}, nbytes() is {storage.nbytes()}, not {nbytes}")
        check("HK-RESIZE-001.3", storage.device == torch.device(dt, j), f"after {what}, the storage is on {storage.device}")
        data = storage_bytes(storage)
        check(part, len(data) == nbytes and data[:len(prefix)] == prefix,
              f"{what} did not keep the first {len(prefix)} bytes")
        if nbytes:
            where = tuple(cxx.hooks_get_device_from_ptr(storage.data_ptr()))
            check("HK-RESIZE-001.3", where == (dt, j), f"after {what}, the storage's memory is on {where}, not device {j}")
        check("HK-RESIZE-001.3", mod.current_device() == 0, f"{what} left device {mod.current_device()} current")

    grown = 2 * size + 5
    with scope(clause):
        must(lambda: resize(storage, grown), f"{via} growing {size} -> {grown} bytes")
    expect(grown, first, f"{via} growing to {grown} bytes")
    second = pattern(grown, 2)
    storage.copy_(cpu_storage(second))  # the grown tail must be real, usable memory
    check(clause, storage_bytes(storage) == second, f"after {via} grew the storage, its new bytes are not writable")

    smaller = size // 2 - 3
    with scope(clause):
        must(lambda: resize(storage, smaller), f"{via} shrinking to {smaller} bytes")
    expect(smaller, second[:smaller], f"{via} shrinking to {smaller} bytes")

    with scope("HK-RESIZE-001.2"):
        must(lambda: resize(storage, 0), f"{via} resizing to 0 bytes")
    expect(0, b"", f"{via} resizing to 0 bytes", "HK-RESIZE-001.2")

    with scope("HK-RESIZE-001.2"):
        must(lambda: resize(storage, 101), f"{via} growing from 0 to 101 bytes")
    expect(101, b"", f"{via} growing from 0 to 101 bytes", "HK-RESIZE-001.2")
    third = pattern(101, 3)
    storage.copy_(cpu_storage(third))
    check("HK-RESIZE-001.2", storage_bytes(storage) == third, f"after {via} grew an empty storage, it is not writable")

    if via == "UntypedStorage.resize_":
        # A tensor's storage, resized through the tensor's view of it.
        t = torch.arange(256, dtype=torch.uint8, device=f"{dt}:{j}")
        t.untyped_storage().resize_(1027)
        check(clause, storage_bytes(t.untyped_storage())[:256] == bytes(range(256))
              and torch.equal(t.cpu(), torch.arange(256, dtype=torch.uint8)),
              "after growing its storage, a tensor no longer reads its values")
