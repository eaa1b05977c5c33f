"""Generators and RNG state: torch.manual_seed reaching the device, one
default generator per device driving that device's random operators,
get/set_rng_state round trips (module and Generator objects), fork_rng,
the module's seeding functions, and offsets.

Random numbers are compared only with numbers drawn on the same device
(never with CPU numbers): a backend may use any algorithm. What every
backend must do is draw from *its own* generators, so several checks look
at torch's CPU default generator too: a device operator that silently
draws from it (typically a CPU fallback of an operator that has no
Generator argument, such as aten::native_dropout) passes a naive
reproducibility check, because torch.manual_seed seeds the CPU as well.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

from ._helpers import check, inconclusive, must, spellings

contract = pytest.mark.contract

SIZE = 256  # numbers per draw: enough that two different streams never agree by chance


def _ops() -> dict[str, Callable[[str], torch.Tensor]]:
    """Random operators that take the device's default generator."""
    return {
        "torch.randn": lambda d: torch.randn(SIZE, device=d),
        "torch.rand": lambda d: torch.rand(SIZE, device=d),
        "torch.randint": lambda d: torch.randint(0, 1 << 30, (SIZE,), device=d),
        "Tensor.normal_": lambda d: torch.empty(SIZE, device=d).normal_(),
        "Tensor.bernoulli_": lambda d: torch.empty(SIZE, device=d).bernoulli_(0.5),
        "torch.nn.functional.dropout": lambda d: torch.nn.functional.dropout(
            torch.ones(SIZE, device=d), 0.5, training=True),
    }


def _generator_ops() -> dict[str, Callable[[str, torch.Generator], torch.Tensor]]:
    """Random operators given an explicit generator."""
    return {
        "torch.randn(generator=g)": lambda d, g: torch.randn(SIZE, device=d, generator=g),
        "torch.rand(generator=g)": lambda d, g: torch.rand(SIZE, device=d, generator=g),
        "torch.randint(generator=g)": lambda d, g: torch.randint(0, 1 << 30, (SIZE,), device=d, generator=g),
        "Tensor.normal_(generator=g)": lambda d, g: torch.empty(SIZE, device=d).normal_(generator=g),
        "Tensor.bernoulli_(generator=g)": lambda d, g: torch.empty(SIZE, device=d).bernoulli_(0.5, generator=g),
    }


OPS = _ops()
GENERATOR_OPS = _generator_ops()


def draw(name: str, device: str) -> torch.Tensor:
    """One draw of operator `name` on `device`, copied to the CPU."""
    result = must(lambda: OPS[name](device), f"{name} on {device}")
    assert result.device.type == torch.device(device).type, f"{name} on {device} returned a tensor on {result.device}"
    return result.cpu()


def draw_all(device: str) -> dict[str, torch.Tensor]:
    """One draw of every operator on `device`, in a fixed order."""
    return {name: draw(name, device) for name in OPS}


def draw_with(generator: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, op in GENERATOR_OPS.items():
        result = must(lambda: op(device, generator), f"{name} on {device}")
        out[name] = result.cpu()
    return out


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    return [name for name in a if not torch.equal(a[name], b[name])]


def module_function(mod, name: str):
    function = getattr(mod, name, None)
    assert callable(function), (
        f"the device module has no {name}(): the generator contract (docs/source/accelerator/"
        f"generator.md) expects manual_seed, manual_seed_all, seed, seed_all, initial_seed, "
        f"get_rng_state, set_rng_state, get_rng_state_all and set_rng_state_all")
    return function


def default_generator(cxx, index: int) -> torch.Generator:
    """Device `index`'s default generator, straight from the hooks."""
    return must(lambda: cxx.hooks_default_generator(index), f"hooks getDefaultGenerator({index})")


def check_state_tensor(state, what: str) -> None:
    assert isinstance(state, torch.Tensor), f"{what} returned {type(state).__name__}, not a tensor"
    assert state.device.type == "cpu" and state.dtype == torch.uint8, (
        f"{what} must be a CPU ByteTensor (torch.uint8 on cpu), but is {state.dtype} on {state.device}")
    assert state.numel() > 0, f"{what} is empty"


# ----------------------------------------------------------------- seeding


# decides RG-SEED-001.1 RG-SEED-001.2
@contract("RG-SEED-001")
def test_manual_seed_reaches_the_device(mod, dt, n, cxx):
    for attr in ("_is_in_bad_fork", "manual_seed_all"):
        assert callable(getattr(mod, attr, None)), (
            f"the device module has no {attr}(): torch.manual_seed / torch.seed call "
            f"module.manual_seed_all only when the module defines both _is_in_bad_fork and manual_seed_all")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(1234)
        returned = torch.seed()
    ignored = [str(w.message) for w in caught if "does not take effect" in str(w.message)]
    assert not ignored, f"torch.manual_seed/torch.seed warned that seeding the device does not take effect: {ignored}"
    seeds = {i: default_generator(cxx, i).initial_seed() for i in range(n)}
    wrong = {i: s for i, s in seeds.items() if s != returned}
    assert not wrong, (f"torch.seed() returned {returned} but left the device default generators with initial "
                       f"seeds {wrong}: it must reach every device through the module's manual_seed_all")

    devices = [f"{dt}:0"] + ([f"{dt}:{n - 1}"] if n > 1 else [])
    for device in devices:
        for name in OPS:
            torch.manual_seed(1234)
            first = draw(name, device)
            torch.manual_seed(1234)
            second = draw(name, device)
            assert torch.equal(first, second), (
                f"after torch.manual_seed(1234), {name} on {device} gave different numbers twice: "
                f"torch.manual_seed does not reach the device's default generator")
            torch.manual_seed(4321)
            other = draw(name, device)
            assert not torch.equal(first, other), (
                f"{name} on {device} gave the same numbers after torch.manual_seed(1234) and "
                f"torch.manual_seed(4321): the seed does not reach the generator the operator uses")


# decides RG-SEED-001.3
@contract("RG-SEED-001")
def test_device_generator_drives_device_ops(mod, dt, n):
    """The device's own generator, not torch's CPU default generator, feeds
    random operators on the device."""
    device = f"{dt}:0"
    for name in OPS:
        torch.manual_seed(99)
        cpu_state = torch.get_rng_state()
        first = draw(name, device)
        assert torch.equal(torch.get_rng_state(), cpu_state), (
            f"{name} on {device} advanced torch's CPU default generator: the device operator draws from "
            f"the CPU generator instead of the device's default generator (typical cause: a CPU fallback "
            f"for an operator without a Generator argument, e.g. aten::native_dropout; implement it for "
            f"the device)")
        # Re-seeding only the CPU must not rewind the device.
        torch.random.default_generator.manual_seed(99)
        second = draw(name, device)
        assert not torch.equal(first, second), (
            f"re-seeding only torch's CPU generator made {name} on {device} repeat its numbers: "
            f"the device operator uses the CPU generator")
        # Seeding only the device, with a different CPU seed each time, must.
        mod.manual_seed_all(7)
        torch.random.default_generator.manual_seed(1)
        first = draw(name, device)
        mod.manual_seed_all(7)
        torch.random.default_generator.manual_seed(2)
        second = draw(name, device)
        assert torch.equal(first, second), (
            f"after the module's manual_seed_all(7), {name} on {device} gave different numbers when only "
            f"torch's CPU generator was seeded differently: the device operator depends on the CPU generator")


# -------------------------------------------------------------------- state


# decides RG-STATE-001.1
@contract("RG-STATE-001")
def test_module_rng_state_round_trip(mod, dt, n):
    get_state = module_function(mod, "get_rng_state")
    set_state = module_function(mod, "set_rng_state")
    torch.manual_seed(5)
    state = must(get_state, "the module's get_rng_state()")
    check_state_tensor(state, "get_rng_state()")
    kept = state.clone()
    first = draw_all(f"{dt}:0")
    assert torch.equal(state, kept), \
        "drawing numbers changed a tensor returned earlier by get_rng_state(): it aliases the live state"
    assert not torch.equal(must(get_state, "get_rng_state()"), kept), \
        "drawing numbers on the device did not change get_rng_state(): the state does not describe the generator"
    must(lambda: set_state(state), "the module's set_rng_state(state)")
    again = draw_all(f"{dt}:0")
    wrong = differing(first, again)
    assert not wrong, f"set_rng_state(get_rng_state()) did not reproduce the device's numbers for {wrong}"


# decides RG-STATE-001.2
@contract("RG-STATE-001")
@pytest.mark.requires("multi-device")
def test_module_rng_state_of_another_device(mod, dt, n, two_devices):
    get_state = module_function(mod, "get_rng_state")
    set_state = module_function(mod, "set_rng_state")
    last = n - 1
    torch.manual_seed(6)
    mod.set_device(0)
    for spelling in spellings(dt, last):
        state = must(lambda: get_state(spelling), f"get_rng_state({spelling!r})")
        check_state_tensor(state, f"get_rng_state({spelling!r})")
        state_0 = get_state(0)
        first = draw_all(f"{dt}:{last}")
        must(lambda: set_state(state, spelling), f"set_rng_state(state, {spelling!r})")
        again = draw_all(f"{dt}:{last}")
        wrong = differing(first, again)
        assert not wrong, (f"with device 0 current, get_rng_state({spelling!r}) / set_rng_state(state, "
                           f"{spelling!r}) did not reproduce device {last}'s numbers for {wrong} (is the device "
                           f"argument ignored, or do these operators not draw from device {last}'s generator?)")
        assert torch.equal(get_state(0), state_0), \
            f"set_rng_state(state, {spelling!r}) changed device 0's generator"
        assert mod.current_device() == 0, f"get/set_rng_state({spelling!r}) changed the current device"


# decides RG-STATE-001.3
@contract("RG-STATE-001")
def test_module_rng_state_all_round_trip(mod, dt, n):
    get_all = module_function(mod, "get_rng_state_all")
    set_all = module_function(mod, "set_rng_state_all")
    torch.manual_seed(7)
    states = must(get_all, "get_rng_state_all()")
    assert len(states) == n, f"get_rng_state_all() returned {len(states)} states for {n} device(s)"
    for i, state in enumerate(states):
        check_state_tensor(state, f"get_rng_state_all()[{i}]")
    first = {i: draw_all(f"{dt}:{i}") for i in range(n)}
    must(lambda: set_all(states), "set_rng_state_all(states)")
    again = {i: draw_all(f"{dt}:{i}") for i in range(n)}
    wrong = {i: differing(first[i], again[i]) for i in range(n) if differing(first[i], again[i])}
    assert not wrong, f"set_rng_state_all(get_rng_state_all()) did not reproduce the numbers of devices {wrong}"


# decides RG-STATE-001.4
@contract("RG-STATE-001")
def test_generator_object_state_round_trip(mod, dt, n, cxx):
    for index in sorted({0, n - 1}):
        device = f"{dt}:{index}"
        g = must(lambda: torch.Generator(device=device), f"torch.Generator(device={device!r})")
        assert g.device == torch.device(dt, index), f"torch.Generator(device={device!r}).device is {g.device}"
        g.manual_seed(77)
        state = must(g.get_state, f"Generator({device!r}).get_state()")
        check_state_tensor(state, f"Generator({device!r}).get_state()")
        default_state = default_generator(cxx, index).get_state()
        first = draw_with(g, device)
        assert torch.equal(default_generator(cxx, index).get_state(), default_state), (
            f"drawing with generator=g on {device} advanced the device's default generator: "
            f"random operators ignore their generator argument")
        # The explicit generator, not the default one, decides the numbers.
        default_generator(cxx, index).manual_seed(12345)
        must(lambda: g.set_state(state), f"Generator({device!r}).set_state(state)")
        again = draw_with(g, device)
        wrong = differing(first, again)
        assert not wrong, f"Generator({device!r}).set_state(get_state()) did not reproduce the numbers of {wrong}"
        fresh = torch.Generator(device=device)
        must(lambda: fresh.set_state(state), f"a new Generator({device!r}).set_state(state)")
        copied = draw_with(fresh, device)
        wrong = differing(first, copied)
        assert not wrong, f"a state moved into another generator of {device} did not reproduce {wrong}"
        g.manual_seed(77)
        reseeded = draw_with(g, device)
        wrong = differing(first, reseeded)
        assert not wrong, f"Generator({device!r}).manual_seed(77) did not restart the sequence for {wrong}"


# decides RG-INDEP-001.1 RG-INDEP-001.2 RG-INDEP-001.3
@contract("RG-INDEP-001")
def test_devices_have_independent_generators(mod, dt, n, cxx):
    def seed_each() -> None:
        default_generator(cxx, 0).manual_seed(100)
        default_generator(cxx, 1).manual_seed(200)

    mod.set_device(0)
    seed_each()
    reference_0 = draw_all(f"{dt}:0")
    seed_each()
    reference_1 = draw_all(f"{dt}:1")
    assert differing(reference_0, reference_1), \
        "devices 0 and 1 seeded 100 and 200 gave identical numbers: seeding one device seeds the other"

    # Drawing on and re-seeding device 0 does not move device 1.
    seed_each()
    state_1 = must(lambda: mod.get_rng_state(1), "get_rng_state(1)")
    draw_all(f"{dt}:0")
    draw_all(f"{dt}:0")
    default_generator(cxx, 0).manual_seed(555)
    draw_all(f"{dt}:0")
    assert torch.equal(mod.get_rng_state(1), state_1), "drawing on / seeding device 0 changed get_rng_state(1)"
    wrong = differing(reference_1, draw_all(f"{dt}:1"))
    assert not wrong, f"drawing on / seeding device 0 changed device 1's numbers for {wrong}"

    # The tensor's device, not the current device, picks the generator.
    seed_each()
    mod.set_device(1)
    wrong = differing(reference_0, draw_all(f"{dt}:0"))
    assert not wrong, (f"with device 1 current, random operators on {dt}:0 did not use device 0's generator "
                       f"for {wrong}")
    wrong = differing(reference_1, draw_all(f"{dt}:1"))
    assert not wrong, f"draws on {dt}:0 (device 1 current) changed device 1's numbers for {wrong}"


# ---------------------------------------------------------------- fork_rng


# decides RG-FORK-001.1
@contract("RG-FORK-001")
def test_fork_rng_restores_device_state(mod, dt, n, cxx):
    assert callable(getattr(mod, "get_rng_state", None)) and callable(getattr(mod, "set_rng_state", None)), \
        "fork_rng needs the device module's get_rng_state(device) and set_rng_state(state, device)"
    cases = [("devices=None", None, list(range(n))), (f"devices=[{n - 1}]", [n - 1], [n - 1])]
    if n > 1:
        cases.append((f"devices=range({n})", range(n), list(range(n))))
    def seed_each() -> None:
        # Different seeds per device: restoring one device's state into
        # another (a get_rng_state that ignores its device) must show.
        for i in range(n):
            default_generator(cxx, i).manual_seed(21 + 1000 * i)

    for label, devices, forked in cases:
        mod.set_device(0)
        seed_each()
        reference = {i: draw_all(f"{dt}:{i}") for i in forked}
        seed_each()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # devices=None warns with several devices
            try:
                with torch.random.fork_rng(devices=devices, device_type=dt):
                    for i in forked:
                        draw_all(f"{dt}:{i}")
                        default_generator(cxx, i).manual_seed(999)
                        draw_all(f"{dt}:{i}")
            except AssertionError:
                raise
            except Exception as e:  # noqa: BLE001
                pytest.fail(f"torch.random.fork_rng({label}, device_type={dt!r}) raised "
                            f"{type(e).__name__}: {e}", pytrace=False)
        for i in forked:
            wrong = differing(reference[i], draw_all(f"{dt}:{i}"))
            assert not wrong, (f"after torch.random.fork_rng({label}, device_type={dt!r}) with device 0 "
                               f"current, device {i}'s numbers were not restored for {wrong}")
        assert mod.current_device() == 0, f"fork_rng({label}) changed the current device"


# decides RG-FORK-001.2
@contract("RG-FORK-001")
def test_fork_rng_default_device_type(mod, dt, n):
    """Without device_type, fork_rng forks the current accelerator: this backend."""
    torch.manual_seed(22)
    reference = draw_all(f"{dt}:0")
    torch.manual_seed(22)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.random.fork_rng(devices=[0]):
            draw_all(f"{dt}:0")
    wrong = differing(reference, draw_all(f"{dt}:0"))
    assert not wrong, f"torch.random.fork_rng(devices=[0]) did not restore device 0's numbers for {wrong}"


# --------------------------------------------------------- module seeding


# decides RG-ALL-001.1
@contract("RG-ALL-001")
def test_one_default_generator_per_device(mod, dt, n, cxx):
    generators = [default_generator(cxx, i) for i in range(n)]
    wrong = {i: str(g.device) for i, g in enumerate(generators) if g.device != torch.device(dt, i)}
    assert not wrong, f"hooks getDefaultGenerator(i) returned generators of the wrong device: {wrong}"
    if hasattr(mod, "default_generators"):
        exposed = mod.default_generators
        assert len(exposed) == n, f"the module's default_generators has {len(exposed)} entries for {n} device(s)"
        for i, g in enumerate(exposed):
            assert g.device == torch.device(dt, i), f"default_generators[{i}] is on {g.device}"
            g.manual_seed(4100 + i)
            seen = default_generator(cxx, i).initial_seed()
            assert seen == 4100 + i, (f"seeding the module's default_generators[{i}] with {4100 + i} left the "
                                      f"device's real default generator with seed {seen}")
            first = draw("torch.randn", f"{dt}:{i}")
            g.manual_seed(4100 + i)
            assert torch.equal(first, draw("torch.randn", f"{dt}:{i}")), \
                f"re-seeding the module's default_generators[{i}] did not repeat torch.randn on device {i}"


# decides RG-ALL-001.2 RG-ALL-001.3
@contract("RG-ALL-001")
def test_seeding_functions(mod, dt, n, cxx):
    manual_seed_all = module_function(mod, "manual_seed_all")
    manual_seed = module_function(mod, "manual_seed")
    seed = module_function(mod, "seed")
    seed_all = module_function(mod, "seed_all")
    initial_seed = module_function(mod, "initial_seed")

    def seeds() -> list[int]:
        return [default_generator(cxx, i).initial_seed() for i in range(n)]

    must(lambda: manual_seed_all(31), "manual_seed_all(31)")
    assert seeds() == [31] * n, f"after manual_seed_all(31), the devices' initial seeds are {seeds()}"
    for i in range(n):
        mod.set_device(i)
        assert must(initial_seed, "initial_seed()") == 31, \
            f"with device {i} current, initial_seed() is {initial_seed()} after manual_seed_all(31)"
        first = draw_all(f"{dt}:{i}")
        manual_seed_all(31)
        wrong = differing(first, draw_all(f"{dt}:{i}"))
        assert not wrong, f"manual_seed_all(31) did not restart device {i}'s numbers for {wrong}"

    must(seed_all, "seed_all()")
    after = seeds()
    assert all(s != 31 for s in after), f"seed_all() left initial seeds {after} (they were all 31)"

    last = n - 1
    manual_seed_all(31)
    mod.set_device(last)
    must(lambda: manual_seed(51), "manual_seed(51)")
    expected = [31] * n
    expected[last] = 51
    assert seeds() == expected, (f"with device {last} current, manual_seed(51) left initial seeds {seeds()}; "
                                 f"it seeds the current device only")
    assert initial_seed() == 51, f"initial_seed() is {initial_seed()} after manual_seed(51)"
    must(seed, "seed()")
    after = seeds()
    assert after[last] != 51, f"seed() did not re-seed the current device {last}: initial seeds {after}"
    assert after[:last] == [31] * last, f"seed() on device {last} changed other devices' seeds: {after}"
    assert initial_seed() == after[last], f"initial_seed() is {initial_seed()}, the generator says {after[last]}"


# ----------------------------------------------- torch.accelerator.random


def accelerator_random():
    """torch.accelerator.random (torch 2.14+; RG-ACCEL-001 is retired on older releases)."""
    import torch.accelerator

    random = getattr(torch.accelerator, "random", None)
    assert random is not None, "this torch has no torch.accelerator.random"
    return random


def seed_each_device(mod, n: int, base: int) -> None:
    """Device i seeded with base + i through the module (so that answering for
    the wrong device shows), then device 0 current."""
    manual_seed = module_function(mod, "manual_seed")
    for i in range(n):
        mod.set_device(i)
        must(lambda i=i: manual_seed(base + i), f"manual_seed({base + i}) with device {i} current")
    mod.set_device(0)


# decides RG-ACCEL-001.1
@contract("RG-ACCEL-001")
def test_accelerator_initial_seed(mod, dt, n, cxx):
    random = accelerator_random()
    manual_seed_all = module_function(mod, "manual_seed_all")
    last = n - 1
    must(lambda: manual_seed_all(61), "manual_seed_all(61)")
    for i in sorted({0, last}):
        mod.set_device(i)
        seen = must(random.initial_seed, "torch.accelerator.random.initial_seed()")
        check("RG-ACCEL-001.1", seen == 61,
              f"with device {i} current, torch.accelerator.random.initial_seed() is {seen} after manual_seed_all(61)")
    seed_each_device(mod, n, 6100)
    for current in sorted({0, last}):
        mod.set_device(current)
        seen = must(random.initial_seed, "torch.accelerator.random.initial_seed()")
        check("RG-ACCEL-001.1", seen == 6100 + current,
              f"with device {current} (seeded {6100 + current}) current, torch.accelerator.random.initial_seed() "
              f"is {seen}")
        for i in range(n):
            for spelling in spellings(dt, i):
                seen = must(lambda spelling=spelling: random.initial_seed(spelling),
                            f"torch.accelerator.random.initial_seed({spelling!r})")
                check("RG-ACCEL-001.1", seen == 6100 + i == default_generator(cxx, i).initial_seed(),
                      f"with device {current} current, torch.accelerator.random.initial_seed({spelling!r}) is "
                      f"{seen}; device {i}'s default generator was seeded "
                      f"{default_generator(cxx, i).initial_seed()}")
        check("RG-ACCEL-001.1", mod.current_device() == current,
              "torch.accelerator.random.initial_seed changed the current device")


# decides RG-ACCEL-001.2 RG-ACCEL-001.3
@contract("RG-ACCEL-001")
def test_accelerator_rng_state(mod, dt, n):
    random = accelerator_random()
    get_state = module_function(mod, "get_rng_state")
    set_state = module_function(mod, "set_rng_state")
    last = n - 1
    seed_each_device(mod, n, 6200)
    for i in range(n):
        draw("torch.rand", f"{dt}:{i}")  # states that differ from a fresh seed's, per device
    for current in sorted({0, last}):
        mod.set_device(current)
        state = must(random.get_rng_state, "torch.accelerator.random.get_rng_state()")
        check_state_tensor(state, "torch.accelerator.random.get_rng_state()")
        check("RG-ACCEL-001.2", torch.equal(state, get_state(current)),
              f"with device {current} current, torch.accelerator.random.get_rng_state() differs from the module's "
              f"get_rng_state({current})")
        for i in range(n):
            for spelling in spellings(dt, i):
                state = must(lambda spelling=spelling: random.get_rng_state(spelling),
                             f"torch.accelerator.random.get_rng_state({spelling!r})")
                check_state_tensor(state, f"torch.accelerator.random.get_rng_state({spelling!r})")
                check("RG-ACCEL-001.2", torch.equal(state, get_state(i)),
                      f"with device {current} current, torch.accelerator.random.get_rng_state({spelling!r}) differs "
                      f"from the module's get_rng_state({i})")
            state = random.get_rng_state(i)
            first = draw_all(f"{dt}:{i}")
            must(lambda: set_state(state, i), f"the module's set_rng_state(state, {i})")
            wrong = differing(first, draw_all(f"{dt}:{i}"))
            check("RG-ACCEL-001.2", not wrong,
                  f"the module's set_rng_state of torch.accelerator.random.get_rng_state({i}) did not repeat device "
                  f"{i}'s numbers for {wrong}: the state is not the generator device {i}'s operators draw from")
        check("RG-ACCEL-001.2", mod.current_device() == current,
              "torch.accelerator.random.get_rng_state changed the current device")
    states = must(random.get_rng_state_all, "torch.accelerator.random.get_rng_state_all()")
    check("RG-ACCEL-001.3", len(states) == n,
          f"torch.accelerator.random.get_rng_state_all() returned {len(states)} states for {n} device(s)")
    for i, state in enumerate(states):
        check_state_tensor(state, f"torch.accelerator.random.get_rng_state_all()[{i}]")
        check("RG-ACCEL-001.3", torch.equal(state, get_state(i)),
              f"torch.accelerator.random.get_rng_state_all()[{i}] differs from the module's get_rng_state({i})")


# -------------------------------------------------------------- offsets


# decides RG-OFFSET-001.1
@contract("RG-OFFSET-001")
def test_offsets_round_trip_or_raise_clearly(mod, dt, n, cxx):
    candidates = [
        ("torch.Generator(device)", lambda: torch.Generator(device=f"{dt}:0"), True),
        ("the default generator of device 0", lambda: default_generator(cxx, 0), False),
    ]
    for label, make, explicit in candidates:
        g = make()
        g.manual_seed(3)

        def sample() -> torch.Tensor:
            if explicit:
                return torch.randn(SIZE, device=f"{dt}:0", generator=g).cpu()
            return torch.randn(SIZE, device=f"{dt}:0").cpu()

        supported = True
        for call, what in ((lambda: g.set_offset(16), "set_offset(16)"), (g.get_offset, "get_offset()")):
            try:
                call()
            except RuntimeError as e:  # NotImplementedError is a RuntimeError too
                supported = False
                assert "offset" in str(e).lower(), (
                    f"{label}.{what} raised RuntimeError, as allowed, but its message does not say "
                    f"that offsets are unsupported: {str(e)!r}")
            except Exception as e:  # noqa: BLE001
                pytest.fail(f"{label}.{what} must work or raise RuntimeError, but raised "
                            f"{type(e).__name__}: {e}", pytrace=False)
        if not supported:
            continue
        g.manual_seed(3)
        start = sample()  # offset 0 of seed 3
        g.set_offset(16)
        assert g.get_offset() == 16, f"{label}.set_offset(16) then get_offset() returned {g.get_offset()}"
        first = sample()
        g.set_offset(16)
        assert torch.equal(first, sample()), f"{label}.set_offset(16) did not reproduce the numbers drawn at offset 16"
        # The offset moves the stream: offset 16 is not the seed's start,
        # and offset 0 is (a set_offset that only stores its argument fails).
        assert not torch.equal(first, start), (
            f"{label}.set_offset(16) drew the numbers of offset 0 (those right after manual_seed(3)): the offset was "
            f"stored for get_offset() but did not move the generator")
        g.set_offset(0)
        assert torch.equal(start, sample()), (
            f"{label}.set_offset(0) after drawing did not go back to the numbers right after manual_seed(3)")


# ----------------------------------------------------------- distributions
#
# Each random operator's numbers are compared with the distribution it draws
# from, never with the CPU's numbers. The bounds are 8 standard deviations
# of the statistic (a proportion, a mean, a variance) for DRAWS numbers: a
# correct backend, whatever its algorithm, exceeds one with a probability
# below 1e-14 (the statistics are near normal at this size), so a failure
# is the backend's distribution, not chance. The seeds are fixed as well,
# so a run repeats itself exactly.

DRAWS = 1 << 17
SIGMAS = 8.0


def _normal_cdf(x: float) -> float:
    import math

    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


# name -> (draw on a device, the support check, {threshold: P(X <= threshold)}, mean, variance)
def _distributions() -> dict:
    import math

    n = DRAWS
    return {
        "torch.rand": (lambda d: torch.rand(n, device=d), lambda x: bool(((x >= 0) & (x < 1)).all()),
                       {q: q for q in (0.1, 0.25, 0.5, 0.75, 0.9)}, 0.5, 1 / 12),
        "torch.randn": (lambda d: torch.randn(n, device=d), lambda x: bool(torch.isfinite(x).all()),
                        {t: _normal_cdf(t) for t in (-1.5, -0.5, 0.0, 0.5, 1.5)}, 0.0, 1.0),
        "Tensor.normal_(2, 3)": (lambda d: torch.empty(n, device=d).normal_(2.0, 3.0),
                                 lambda x: bool(torch.isfinite(x).all()),
                                 {2 + 3 * t: _normal_cdf(t) for t in (-1.0, 0.0, 1.0)}, 2.0, 9.0),
        "Tensor.uniform_(-2, 5)": (lambda d: torch.empty(n, device=d).uniform_(-2.0, 5.0),
                                   lambda x: bool(((x >= -2) & (x < 5)).all()),
                                   {-2 + 7 * q: q for q in (0.1, 0.5, 0.9)}, 1.5, 49 / 12),
        "Tensor.exponential_(2)": (lambda d: torch.empty(n, device=d).exponential_(2.0),
                                   lambda x: bool((x >= 0).all()),
                                   {-math.log(1 - q) / 2: q for q in (0.25, 0.5, 0.9)}, 0.5, 0.25),
        "torch.randint(3, 10)": (lambda d: torch.randint(3, 10, (n,), device=d).double(),
                                 lambda x: bool(((x >= 3) & (x < 10)).all()),
                                 {k + 0.5: (k - 2) / 7 for k in range(3, 9)}, 6.0, 4.0),
        "Tensor.bernoulli_(0.3)": (lambda d: torch.empty(n, device=d).bernoulli_(0.3),
                                   lambda x: bool(((x == 0) | (x == 1)).all()), {0.5: 0.7}, 0.3, 0.21),
        "F.dropout(p=0.2)": (lambda d: torch.nn.functional.dropout(torch.ones(n, device=d), 0.2, training=True),
                             lambda x: bool(((x == 0) | ((x - 1.25).abs() < 1e-6)).all()), {0.5: 0.2}, 1.0, 0.25),
        "torch.multinomial([1, 2, 3, 4], replacement)": (
            lambda d: torch.multinomial(torch.tensor([1.0, 2.0, 3.0, 4.0], device=d), n, replacement=True).double(),
            lambda x: bool(((x >= 0) & (x < 4)).all()), {0.5: 0.1, 1.5: 0.3, 2.5: 0.6}, 2.0, 1.0),
    }


DISTRIBUTIONS = _distributions()


def _distribution_problem(x: torch.Tensor, support, cdf: dict, mean: float, variance: float) -> str | None:
    """Why `x` (float64 on the CPU) cannot come from the distribution, or None."""
    n = x.numel()
    if not support(x):
        return f"values outside the distribution's support (min {x.min().item():.6g}, max {x.max().item():.6g})"
    for threshold, p in cdf.items():
        got = (x <= threshold).double().mean().item()
        bound = SIGMAS * (p * (1 - p) / n) ** 0.5
        if abs(got - p) > bound:
            return f"{got:.4f} of the values are <= {threshold:.4g}, expected {p:.4f} (+- {bound:.4f})"
    got_mean = x.mean().item()
    bound = SIGMAS * (variance / n) ** 0.5
    if abs(got_mean - mean) > bound:
        return f"mean {got_mean:.5g}, expected {mean:.5g} (+- {bound:.2g})"
    # The sample variance's standard deviation, from the sample's fourth
    # central moment (no distribution assumed).
    centered = x - x.mean()
    got_variance = centered.square().mean().item()
    fourth = centered.pow(4).mean().item()
    bound = SIGMAS * (max(fourth - got_variance ** 2, 0.0) / n) ** 0.5 + 1e-12
    if abs(got_variance - variance) > bound:
        return f"variance {got_variance:.5g}, expected {variance:.5g} (+- {bound:.2g})"
    return None


# decides RG-DIST-001.1
@contract("RG-DIST-001")
@pytest.mark.parametrize("name", list(DISTRIBUTIONS))
def test_random_operators_draw_from_their_distribution(name, mod, dt, n):
    """The numbers of each random operator on the device have its
    distribution: support, probabilities at several thresholds, mean and
    variance, within 8 standard deviations for 131,072 draws (a correct
    backend fails by chance with probability below 1e-14)."""
    make, support, cdf, mean, variance = DISTRIBUTIONS[name]
    device = f"{dt}:{n - 1}"
    mod.manual_seed_all(1234)
    x = must(lambda: make(device), f"{name} on {device}")
    check("RG-DIST-001.1", x.device == torch.device(device), f"{name} on {device} returned a tensor on {x.device}")
    problem = _distribution_problem(x.cpu().double(), support, cdf, mean, variance)
    check("RG-DIST-001.1", problem is None, lambda: f"{name} on {device}: {problem}")


# Random operators given arguments they must refuse, and the calls.
REFUSED_DRAWS = {
    "torch.randint(5, 3)": lambda d: torch.randint(5, 3, (16,), device=d),
    "Tensor.uniform_(1, 0)": lambda d: torch.empty(16, device=d).uniform_(1.0, 0.0),
    "Tensor.normal_(0, -1)": lambda d: torch.empty(16, device=d).normal_(0.0, -1.0),
    "Tensor.bernoulli_(1.5)": lambda d: torch.empty(16, device=d).bernoulli_(1.5),
    "torch.multinomial(negative weights)": lambda d: torch.multinomial(torch.tensor([1.0, -1.0], device=d), 4,
                                                                       replacement=True),
}


# decides RG-DIST-001.2
@contract("RG-DIST-001")
@pytest.mark.parametrize("name", list(REFUSED_DRAWS))
def test_refused_random_operators_leave_the_generator(name, mod, dt, n):
    """A random operator that refuses its arguments (on the CPU it raises
    before it draws) leaves the device's generator as it was: its state
    afterwards is the state before, and the next numbers are those a run
    without the refused call draws."""
    device = f"{dt}:{n - 1}"
    index = n - 1
    try:
        REFUSED_DRAWS[name]("cpu")
    except (RuntimeError, ValueError):
        pass
    else:  # pragma: no cover - depends on torch
        inconclusive(f"{name} does not raise on the CPU in this torch: nothing to compare with")
    mod.manual_seed_all(4321)
    before = must(lambda: mod.get_rng_state(index), f"get_rng_state({index})")
    expected = must(lambda: torch.rand(64, device=device).cpu(), f"torch.rand on {device}")
    mod.set_rng_state(before, index)
    refused = False
    try:
        REFUSED_DRAWS[name](device)
        torch.accelerator.synchronize(index)
    except (RuntimeError, ValueError):
        refused = True
    check("RG-DIST-001.2", refused, f"{name} on {device} did not raise; on the CPU it raises")
    after = mod.get_rng_state(index)
    check("RG-DIST-001.2", torch.equal(after, before),
          f"{name} on {device} raised but changed the device's generator state: a refused call must not draw")
    got = must(lambda: torch.rand(64, device=device).cpu(), f"torch.rand on {device} after the refused {name}")
    check("RG-DIST-001.2", torch.equal(got, expected),
          f"after the refused {name} on {device}, torch.rand draws other numbers than without it")
