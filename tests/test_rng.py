"""Random number generation on OpenReg devices (contracts RG-*)."""

from __future__ import annotations

import warnings

import pytest
import torch

from _support import N, error_text


def draw(device: str = "openreg", n: int = 8, **kwargs) -> torch.Tensor:
    return torch.randn(n, device=device, **kwargs).cpu()


def test_manual_seed_makes_device_draws_reproducible_without_warning():
    """RG-SEED-001: torch.manual_seed(s) reaches the device; no 'does not take effect' warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(1234)
        a = draw()
        torch.manual_seed(1234)
        b = draw()
        torch.manual_seed(4321)
        c = draw()
    assert torch.equal(a, b), "torch.manual_seed(s) does not make torch.randn on openreg reproducible"
    assert not torch.equal(a, c), "different seeds gave the same numbers"
    noisy = [str(w.message) for w in caught if "effect" in str(w.message).lower()
             or "openreg" in str(w.message).lower()]
    assert not noisy, f"seeding warned: {noisy}"


def test_manual_seed_reaches_every_device(n_devices):
    """RG-ALL-001: torch.manual_seed seeds all devices; default generators number N."""
    assert len(torch.openreg.default_generators) == n_devices
    torch.manual_seed(99)
    assert [g.initial_seed() for g in torch.openreg.default_generators] == [99] * n_devices
    firsts = [draw(f"openreg:{i}") for i in range(n_devices)]
    torch.manual_seed(99)
    for i in range(n_devices):
        assert torch.equal(draw(f"openreg:{i}"), firsts[i]), f"openreg:{i} not reproducible"


def test_devices_draw_independently(two_devices):
    """RG-INDEP-001: seeding or drawing on device 0 does not change device 1's sequence."""
    torch.manual_seed(5)
    reference = [draw("openreg:1") for _ in range(3)]
    torch.manual_seed(5)
    observed = []
    for k in range(3):
        draw("openreg:0", n=1000)  # draws on device 0 in between
        torch.openreg.set_device(0)
        torch.openreg.manual_seed(1000 + k)  # seeds the current device (0) only
        torch.openreg.seed()
        observed.append(draw("openreg:1"))
    for k in range(3):
        assert torch.equal(observed[k], reference[k]), (
            f"draw {k} on openreg:1 changed after seeding/drawing on openreg:0")


def test_module_manual_seed_seeds_current_device_only(two_devices):
    torch.manual_seed(0)
    torch.openreg.set_device(1)
    torch.openreg.manual_seed(77)
    assert torch.openreg.default_generators[1].initial_seed() == 77
    assert torch.openreg.default_generators[0].initial_seed() == 0, (
        "torch.openreg.manual_seed seeded a device that is not current")
    assert torch.openreg.initial_seed() == 77


def test_rng_state_round_trip_module(two_devices):
    """RG-STATE-001: get_rng_state / set_rng_state reproduce the sequence, per device."""
    torch.manual_seed(11)
    for device in (0, 1):
        state = torch.openreg.get_rng_state(device)
        assert state.device.type == "cpu" and state.dtype == torch.uint8
        first = draw(f"openreg:{device}")
        draw(f"openreg:{device}")
        torch.openreg.set_rng_state(state, device)
        assert torch.equal(draw(f"openreg:{device}"), first), (
            f"set_rng_state did not restore openreg:{device}")
    states = torch.openreg.get_rng_state_all()
    assert len(states) == N
    expected = [draw(f"openreg:{i}") for i in range(N)]
    torch.openreg.set_rng_state_all(states)
    assert all(torch.equal(draw(f"openreg:{i}"), expected[i]) for i in range(N))
    with pytest.raises(ValueError):
        torch.openreg.set_rng_state_all(states[:-1])


def test_rng_state_without_device_is_the_current_devices(two_devices):
    torch.openreg.default_generators[0].manual_seed(1)
    torch.openreg.default_generators[1].manual_seed(2)
    torch.openreg.set_device(1)
    state = torch.openreg.get_rng_state()
    assert torch.equal(state, torch.openreg.default_generators[1].get_state()), (
        "get_rng_state() on current device 1 is not device 1's state")
    assert not torch.equal(state, torch.openreg.default_generators[0].get_state())


def test_rng_state_round_trip_default_device_and_generator_object():
    """RG-STATE-001 through the default device argument and a Generator object."""
    state = torch.openreg.get_rng_state()
    first = draw()
    torch.openreg.set_rng_state(state)
    assert torch.equal(draw(), first)
    g = torch.Generator(device="openreg")
    g.manual_seed(2024)
    saved = g.get_state()
    a = draw(generator=g)
    b = draw(generator=g)
    assert not torch.equal(a, b)
    g.set_state(saved)
    assert torch.equal(draw(generator=g), a), "Generator.set_state did not restore the sequence"
    clone = torch.Generator(device="openreg")
    clone.set_state(saved)
    assert torch.equal(draw(generator=clone), a), "a state does not transfer between generators"


def test_manual_seed_all_seed_all_initial_seed(n_devices):
    """RG-ALL-001."""
    torch.openreg.manual_seed_all(42)
    assert [g.initial_seed() for g in torch.openreg.default_generators] == [42] * n_devices
    assert torch.openreg.initial_seed() == 42
    torch.openreg.seed_all()
    seeds = {g.initial_seed() for g in torch.openreg.default_generators}
    assert len(seeds) == 1 and seeds != {42}, f"seed_all gave {seeds}"
    torch.openreg.seed()
    assert torch.openreg.initial_seed() == torch.openreg.default_generators[0].initial_seed()


def test_fork_rng_restores_device_state():
    """RG-FORK-001."""
    torch.manual_seed(3)
    expected = draw()
    torch.manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.random.fork_rng(device_type="openreg"):
            draw(n=100)
    assert torch.equal(draw(), expected), "fork_rng did not restore the device generator"


@pytest.mark.parametrize("which", ["default", "new"])
def test_offsets_raise_a_clear_error(which):
    """RG-OFFSET-001: set_offset/get_offset raise a clear error."""
    g = torch.openreg.default_generators[0] if which == "default" else torch.Generator(device="openreg")
    for call in (lambda: g.set_offset(4), g.get_offset):
        with pytest.raises(RuntimeError) as excinfo:
            call()
        message = error_text(excinfo)
        assert "offset" in message.lower() and "OpenReg" in message, (
            f"unclear offset error: {message!r}")


def test_generator_of_another_type_is_rejected():
    with pytest.raises(RuntimeError, match="openreg"):
        torch.randn(3, device="openreg", generator=torch.Generator())


# ---------------------------------------- generator objects, per device


def test_torch_generator_on_each_device_has_the_full_api(n_devices):
    """RG-STATE-001 / RG-OFFSET-001 through torch.Generator(device='openreg:i')."""
    for i in range(n_devices):
        device = f"openreg:{i}"
        g = torch.Generator(device=device)
        assert g.device == torch.device("openreg", i)
        assert g.manual_seed(7) is g and g.initial_seed() == 7
        state = g.get_state()
        assert state.device.type == "cpu" and state.dtype == torch.uint8
        first = draw(device, generator=g)
        g.set_state(state)
        assert torch.equal(draw(device, generator=g), first), f"set_state did not rewind {device}"
        clone = g.clone_state()
        assert clone.device == g.device and clone is not g
        assert torch.equal(draw(device, generator=clone), draw(device, generator=g)), (
            "clone_state() does not continue the same sequence")
        value = g.seed()
        assert g.initial_seed() == value
        for call in (lambda: g.set_offset(4), g.get_offset):
            with pytest.raises(RuntimeError, match="offset"):
                call()


def test_drawing_and_seeding_elsewhere_leaves_a_devices_state_alone(two_devices):
    """RG-INDEP-001: CPU draws, device 0 draws, a device-0 generator object and
    seeding device 0 do not touch device 1's default generator."""
    torch.manual_seed(5)
    state1 = torch.openreg.get_rng_state(1)
    torch.rand(100)
    draw("openreg:0", n=100)
    draw("openreg:0", generator=torch.Generator(device="openreg:0").manual_seed(1))
    torch.openreg.set_device(0)
    torch.openreg.manual_seed(3)
    assert torch.equal(torch.openreg.get_rng_state(1), state1)


def test_fork_rng_forks_only_the_devices_named(two_devices):
    """RG-FORK-001 with devices=[1]: device 1 is restored, device 0 is not."""
    torch.manual_seed(3)
    expected1 = draw("openreg:1")
    first0, second0 = draw("openreg:0"), draw("openreg:0")
    torch.manual_seed(3)
    with torch.random.fork_rng(devices=[1], device_type="openreg"):
        draw("openreg:1", n=50)
        assert torch.equal(draw("openreg:0"), first0)
    assert torch.equal(draw("openreg:1"), expected1), "fork_rng did not restore openreg:1"
    assert torch.equal(draw("openreg:0"), second0), "fork_rng restored a device it was not given"


def test_dropout_draws_from_the_device_generator(two_devices):
    """F.dropout on the device reaches native_dropout, whose mask comes from
    the device's default generator (not the CPU's, which the CPU fallback
    would use for an operator without a generator argument)."""
    ones = torch.ones(1000, device="openreg:1")
    torch.manual_seed(0)
    a = torch.nn.functional.dropout(ones, 0.5).cpu()
    torch.manual_seed(0)
    torch.rand(100)
    draw("openreg:0", n=100)
    b = torch.nn.functional.dropout(ones, 0.5).cpu()
    assert torch.equal(a, b), "CPU or device-0 draws changed device 1's dropout mask"
    assert set(a.unique().tolist()) == {0.0, 2.0} and 350 < int((a == 0).sum()) < 650
    state = torch.openreg.get_rng_state(1)
    c = torch.nn.functional.dropout(ones, 0.5).cpu()
    torch.openreg.set_rng_state(state, 1)
    assert torch.equal(torch.nn.functional.dropout(ones, 0.5).cpu(), c)
    assert not torch.equal(c, a), "two dropout calls drew the same mask"


def test_a_random_operator_that_raises_leaves_the_generator_alone():
    """Bad input changes no state: the words a random kernel took from the
    generator at its launch are given back when the call raises at the
    host (docs/reference-backend/rng.md)."""
    x = torch.empty(5, device="openreg")
    for _ in range(2):  # the first call with this metadata and a later one
        before = torch.openreg.get_rng_state()
        with pytest.raises(RuntimeError, match="std"):
            x.normal_(0, -1)
        assert torch.equal(torch.openreg.get_rng_state(), before)
    g = torch.Generator(device="openreg").manual_seed(3)
    before = g.get_state()
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(torch.ones(4, device="openreg"), 10, generator=g)
    assert torch.equal(g.get_state(), before)
    x.normal_(generator=g)
    assert not torch.equal(g.get_state(), before), "a call that succeeded drew nothing"
