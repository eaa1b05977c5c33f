"""Bad input on every entry point that takes a device index or a device and
reaches the backend: the device module's functions, torch.accelerator's
functions, constructors taking device='<name>:<index>' (tensors, storages,
streams, generators), tensor/module moves, and the hooks and guard methods
reached through the kit's C++ probe.

Each entry point is one test, so that a crash costs one verdict. Every
rejected input must raise a Python exception (RuntimeError, ValueError,
TypeError or IndexError) whose message names the offending value (and, for
an index out of range, the valid range or the device count), must not
crash, and must not change the current device. Each entry point is tried
once on a never-initialized backend (validation must not depend on lazy
initialization) and then with every bad value on an initialized one.

Not tested here, because PyTorch validates before the backend is reached
(so no backend can fail): device strings that do not parse ('<name>:-2',
'<name>:abc'; see DM-PARSE-001), indices that do not fit c10::DeviceIndex
in torch.accelerator's bindings, wrong argument types of torch.accelerator
functions, set_device_index(-2) (documented no-op), and torch.Event(device=...)
(which does not reach the backend until record()).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ._helpers import check, inconclusive, must, require_allocator, scope

contract = pytest.mark.contract

ACCEPTED = (RuntimeError, ValueError, TypeError, IndexError)


@dataclass(frozen=True)
class Bad:
    value: Any
    label: str
    names: tuple[str, ...]     # the message must contain one of these
    index: int | None = None   # an out-of-range index: the message must also name the count


def int_names(i: int) -> tuple[str, ...]:
    return (str(i),)


def bad_values(kind: str, dt: str, n: int) -> list[Bad]:
    big = min(n + 100, 127)  # still a valid c10::DeviceIndex, so PyTorch passes it through
    ints = [Bad(n, repr(n), int_names(n), n), Bad(big, repr(big), int_names(big), big)]
    negative = [Bad(-2, "-2", int_names(-2), -2)]
    devices = [Bad(f"{dt}:{n}", repr(f"{dt}:{n}"), int_names(n), n),
               Bad(torch.device(dt, big), f"torch.device({dt!r}, {big})", int_names(big), big)]
    wrong = [
        Bad("abc", "'abc'", ("abc",)),
        Bad(1.5, "1.5", ("1.5", "float")),
        Bad(object(), "object()", ("object",)),
        Bad("cpu:0", "'cpu:0'", ("cpu",)),
        Bad(torch.device("cpu", 0), "torch.device('cpu', 0)", ("cpu",)),
    ]
    huge = [Bad(n + 1000, repr(n + 1000), int_names(n + 1000), n + 1000)]
    return {
        "module": ints + huge + negative + devices[:1] + wrong,
        "accelerator": ints + negative + devices[:1],
        "accelerator-nonnegative": ints + devices[:1],
        "int": ints + negative,
        "device": devices,
        "index": ints,
        "cxx": ints + negative,
        "cxx-device": ints,
    }[kind]


@dataclass(frozen=True)
class Entry:
    name: str
    call: Callable[[SimpleNamespace, Any], Any]
    kind: str
    feature: str | None = None
    attr: str | None = None     # module attribute the entry point needs
    fresh: bool = True          # also try it on a never-initialized backend
    optional: bool = False      # a module convenience PyTorch itself never looks up
    may_ignore_negative: bool = False  # a negative index may be a no-op (as torch.cuda's; DM-SET-002.4)


def enter(make: Callable[[Any], Any], value: Any) -> None:
    with make(value):
        pass


def module_entry(name: str, feature: str | None = None, fresh: bool = True,
                 call: Callable[[SimpleNamespace, Any], Any] | None = None,
                 optional: bool = False, may_ignore_negative: bool = False) -> Entry:
    return Entry(f"module.{name}", call or (lambda c, b: getattr(c.mod, name)(b)), "module", feature,
                 attr=name, fresh=fresh, optional=optional, may_ignore_negative=may_ignore_negative)


def accelerator_entry(name: str, feature: str | None = None, kind: str = "accelerator",
                      fresh: bool = True) -> Entry:
    return Entry(f"torch.accelerator.{name}", lambda c, b: getattr(torch.accelerator, name)(b), kind, feature,
                 fresh=fresh)


MEMORY = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_stats",
          "reset_peak_memory_stats", "reset_accumulated_memory_stats")

ENTRIES = [
    # The device module (PyTorch looks these names up; vendors call them).
    module_entry("set_device", may_ignore_negative=True),
    module_entry("device", call=lambda c, b: enter(c.mod.device, b), may_ignore_negative=True),
    module_entry("synchronize"),
    module_entry("current_stream", "streams", optional=True),
    module_entry("get_rng_state", "generators"),
    module_entry("set_rng_state", "generators", fresh=False, call=lambda c, b: c.mod.set_rng_state(c.state, b)),
    *(module_entry(name, "memory-stats", fresh=False, optional=True) for name in MEMORY + ("mem_get_info",)),
    module_entry("get_device_name", optional=True),
    module_entry("get_device_properties", optional=True),
    module_entry("get_device_capability", optional=True),
    # torch.accelerator: an int goes straight to the backend's guard/allocator.
    accelerator_entry("set_device_index", kind="accelerator-nonnegative"),
    Entry("torch.accelerator.device_index", lambda c, b: enter(torch.accelerator.device_index, b), "int"),
    accelerator_entry("synchronize", fresh=False),  # documented no-op before initialization
    accelerator_entry("current_stream", "streams"),
    Entry("torch.accelerator.set_stream",
          lambda c, b: torch.accelerator.set_stream(
              torch.Stream(stream_id=0, device_index=b, device_type=c.device_type_code)),
          "index", "streams", fresh=False),
    *(accelerator_entry(name, "memory-stats", fresh=False) for name in MEMORY + ("get_memory_info",)),
    accelerator_entry("get_device_capability"),
    # Constructors and moves with device='<name>:<index>'.
    Entry("torch.Stream(device=...)", lambda c, b: torch.Stream(device=b), "device", "streams"),
    Entry("torch.Generator(device=...)", lambda c, b: torch.Generator(device=b), "device", "generators"),
    Entry("torch.empty(3, device=...)", lambda c, b: torch.empty(3, device=b), "device"),
    Entry("torch.empty(0, device=...)", lambda c, b: torch.empty(0, device=b), "device"),
    Entry("torch.tensor(data, device=...)", lambda c, b: torch.tensor([1.0, 2.0], device=b), "device"),
    Entry("torch.randn(3, device=...)", lambda c, b: torch.randn(3, device=b), "device", "generators"),
    Entry("torch.UntypedStorage(4, device=...)",
          lambda c, b: (require_allocator(c.cxx), torch.UntypedStorage(4, device=b)), "device"),
    Entry("cpu_tensor.to(device)", lambda c, b: torch.ones(3).to(b), "device"),
    Entry("device_tensor.to(device)", lambda c, b: c.on_device.to(b), "device", fresh=False),
    Entry("nn.Module.to(device)", lambda c, b: torch.nn.Linear(2, 2).to(b), "device"),
    Entry("Tensor.<name>(index)", lambda c, b: getattr(torch.ones(3), c.dt)(b), "index"),
    # The hooks and the guard, as ATen reaches them.
    Entry("hooks getDefaultGenerator(index)", lambda c, b: c.cxx.hooks_default_generator(b), "cxx", "generators"),
    Entry("hooks getNewGenerator(index)", lambda c, b: c.cxx.hooks_new_generator(b), "cxx", "generators"),
    Entry("guard synchronizeDevice(index)", lambda c, b: c.cxx.guard_synchronize_device(b), "cxx"),
    Entry("guard getStream(Device)", lambda c, b: c.cxx.guard_get_stream_of_type(c.dt, b), "cxx-device",
          "streams"),
]


def names_value(message: str, bad: Bad) -> bool:
    lowered = message.lower()
    for name in bad.names:
        if re.fullmatch(r"-?\d+", name):
            if re.search(rf"(?<![\d.]){re.escape(name)}(?!\d)", message):
                return True
        elif name.lower() in lowered:
            return True
    return False


def names_range(message: str, n: int) -> bool:
    """The device count or the valid range, e.g. '2', '[0, 2)', '0..1', '0 to 1'."""
    return bool(re.search(rf"(?<![\d.-]){n}(?!\d)", message)
                or re.search(rf"0\s*(\.\.|to|-)\s*{n - 1}(?!\d)", message))


def current(mod, cxx) -> dict[str, int]:
    return {
        "module current_device()": mod.current_device(),
        "torch.accelerator.current_device_index()": torch.accelerator.current_device_index(),
        "guard getDevice()": cxx.guard_get_device()[1],
    }


def clause_of(entry: Entry) -> str:
    """ER-MSG-001.1 the module, .2 torch.accelerator, .3 constructors and
    moves, .4 the hooks and the guard."""
    if entry.name.startswith("module."):
        return "ER-MSG-001.1"
    if entry.name.startswith("torch.accelerator"):
        return "ER-MSG-001.2"
    if entry.name.startswith(("hooks", "guard")):
        return "ER-MSG-001.4"
    return "ER-MSG-001.3"


def valid_value(entry: Entry, dt: str) -> Any:
    """Device 0 in the form `entry` takes."""
    return f"{dt}:0" if entry.kind in ("device", "cxx-device") else 0


def _shape(error: BaseException) -> str:
    """An error's type and message with its numbers blanked: the same for
    every index when a function fails whatever the index."""
    return f"{type(error).__name__}: {re.sub(r'[0-9]+', 'N', str(error))}"


def fails_for_device_0_alike(entry: Entry, ctx: SimpleNamespace, error: BaseException) -> bool:
    """Whether `entry` raises for device 0 the error it raised for a bad
    value (numbers aside): a function that fails whatever the index is not
    implemented (NotImplementedError, the "Backend doesn't support ..."
    default of PyTorch's interfaces). Its own contract judges that, not the
    wording of a rejection; a different error for device 0 means the bad
    value was rejected as such, and its wording is judged."""
    try:
        entry.call(ctx, valid_value(entry, ctx.dt))
    except Exception as e:  # noqa: BLE001 - device 0 is only asked whether it fails alike
        return _shape(e) == _shape(error)
    return False


def reject(entry: Entry, bad: Bad, ctx: SimpleNamespace, n: int, when: str) -> None:
    what = f"{entry.name} with {bad.label} ({when}, {n} device(s))"
    try:
        result = entry.call(ctx, bad.value)
    except ACCEPTED as e:
        message = str(e)
        # An index rejected as out of range names the range; one rejected for
        # its type (an int-only function given a string) need not.
        ranged = bad.index is None or isinstance(e, TypeError) or names_range(message, n)
        if not (names_value(message, bad) and ranged) and fails_for_device_0_alike(entry, ctx, e):
            inconclusive(f"{entry.name} raises for device 0 as it does for {bad.label} ({type(e).__name__}: "
                         f"{message[:300]!r}): it is not implemented, which its own contract judges, not the "
                         "wording of a rejection", applies=False)
        check("ER-MSG-001.5", names_value(message, bad),
              f"{what} raised {type(e).__name__} as required, but its message does not name the offending value "
              f"{bad.label}: {message!r}")
        if not ranged:
            check("ER-MSG-001.5", False,
                  f"{what} raised {type(e).__name__} as required, but its message names neither the device count {n} "
                  f"nor the valid range [0, {n}): {message!r}")
        return
    except Exception as e:  # noqa: BLE001
        check(clause_of(entry), False, f"{what} must raise RuntimeError, ValueError, TypeError or IndexError, but "
                                       f"raised {type(e).__name__}: {e}")
    if entry.may_ignore_negative and bad.index is not None and bad.index < 0:
        return  # ignored, as torch.cuda ignores a negative index (the current device is checked by the caller)
    check(clause_of(entry), False, f"{what} must raise, but returned {result!r}")


def pytest_generate_tests(metafunc):
    """Only the entry points this backend has: an optional module function it
    does not define, or one of a feature it does not claim, is no entry point
    at all (a skip would wrongly count against the level)."""
    if "entry" not in metafunc.fixturenames:
        return
    session = metafunc.config.pluginmanager.get_plugin("privateuse1-conformance-session")
    module = session.backend.device_module if session else None
    unclaimed = session.unclaimed if session else set()
    applicable = [
        e for e in ENTRIES
        if not (e.feature and e.feature in unclaimed)
        and not (e.attr and e.optional and not callable(getattr(module, e.attr, None)))
    ]
    metafunc.parametrize("entry", applicable, ids=[e.name for e in applicable])


# decides ER-MSG-001.1 ER-MSG-001.2 ER-MSG-001.3 ER-MSG-001.4 ER-MSG-001.5 ER-MSG-001.6
@contract("ER-MSG-001")
def test_bad_device_argument(entry: Entry, session, dt, mod, n, cxx):
    assert not entry.attr or callable(getattr(mod, entry.attr, None)), (
        f"the device module has no {entry.attr}(), which PyTorch looks up on device modules")
    values = bad_values(entry.kind, dt, n)
    ctx = SimpleNamespace(dt=dt, mod=mod, n=n, cxx=cxx)

    if entry.fresh:
        with scope(clause_of(entry)):
            reject(entry, values[0], ctx, n, "on a never-initialized backend")
        seen = current(mod, cxx)
        moved = {k: v for k, v in seen.items() if v != 0}
        check("ER-MSG-001.6", not moved, f"the rejected {entry.name}({values[0].label}) changed the current device: "
                                         f"{moved}")

    ctx.on_device = must(lambda: torch.ones(3, device=dt), "creating a device tensor")
    ctx.state = must(lambda: mod.get_rng_state(0), "get_rng_state(0)") if entry.feature == "generators" else None
    ctx.device_type_code = torch.accelerator.current_stream().device_type if entry.feature == "streams" else None
    start = n - 1
    mod.set_device(start)
    for bad in values:
        with scope(clause_of(entry)):
            reject(entry, bad, ctx, n, "after initialization")
        seen = current(mod, cxx)
        moved = {k: v for k, v in seen.items() if v != start}
        check("ER-MSG-001.6", not moved, f"the rejected {entry.name}({bad.label}) changed the current device from "
                                         f"{start}: {moved}")


# ----------------------------------------------------------- ER-SYNC-001


def _claimed(dt: str, dtype: torch.dtype) -> bool:
    try:
        return dtype in torch.accelerator.get_device_capability(torch.device(dt, 0))["supported_dtypes"]
    except Exception:  # noqa: BLE001 - the capability query is another contract's
        return False


def _bad_copies(dt: str) -> list[tuple[str, str, Callable[[], torch.Tensor], Callable[[], torch.Tensor], bool]]:
    """(clause, label, make destination, make source, must raise)."""
    device = torch.device(dt, 0)
    cases = [
        ("ER-SYNC-001.1", "zeros(3).copy_(arange(4)) (float32)",
         lambda: torch.zeros(3, device=device), lambda: torch.arange(4.0, device=device), True),
        ("ER-SYNC-001.1", "zeros(3, 2).copy_(ones(2, 3)) (float32 from int32)",
         lambda: torch.zeros(3, 2, device=device),
         lambda: torch.ones(2, 3, dtype=torch.int32, device=device), True),
        ("ER-SYNC-001.1", "zeros(4, 4).t().copy_(arange(5)) (strided, float32)",
         lambda: torch.zeros(4, 4, device=device).t(), lambda: torch.arange(5.0, device=device), True),
        ("ER-SYNC-001.2", "zeros(1).expand(3).copy_(arange(3)) (elements share memory)",
         lambda: torch.zeros(1, device=device).expand(3), lambda: torch.arange(3.0, device=device), False),
    ]
    if _claimed(dt, torch.bits8):
        cases.append(("ER-SYNC-001.2", "zeros(4).copy_(bits8 tensor) (no conversion exists)",
                      lambda: torch.zeros(4, device=device),
                      lambda: torch.zeros(4, dtype=torch.uint8).view(torch.bits8).to(device), False))
    return cases


# decides ER-SYNC-001.1 ER-SYNC-001.2 ER-SYNC-001.3
@contract("ER-SYNC-001")
def test_bad_copy_raises_at_the_call(dt, n):
    for clause, label, make_dst, make_src, required in _bad_copies(dt):
        dst = must(make_dst, f"creating the destination of {label}")
        src = must(make_src, f"creating the source of {label}")
        must(lambda: torch.accelerator.synchronize(0), "torch.accelerator.synchronize(0) before the copy")
        before = must(lambda: dst.cpu(), "reading the destination back")
        raised = None
        try:
            dst.copy_(src)
        except Exception as e:  # noqa: BLE001 - raising at the call is what clause 1 asks
            raised = e
        if required:
            check(clause, isinstance(raised, ACCEPTED),
                  lambda: f"{label} {'returned normally' if raised is None else f'raised {type(raised).__name__}'}"
                          ": a copy whose source does not broadcast to its destination must raise RuntimeError, "
                          "ValueError, TypeError or IndexError at the call")
        deferred = None
        try:
            torch.accelerator.synchronize(0)
        except Exception as e:  # noqa: BLE001 - any error here is the one deferred
            deferred = e
        check("ER-SYNC-001.2" if not required else clause, deferred is None,
              lambda: f"{label} {'raised at the call, but' if raised else 'returned normally and'} the next "
                      f"torch.accelerator.synchronize(0) raised {type(deferred).__name__}: {deferred}")
        if raised is not None:
            after = must(lambda: dst.cpu(), f"reading the destination back after the rejected {label}")
            check(clause, torch.equal(after, before), f"the rejected {label} changed its destination")
        with scope("ER-SYNC-001.3"):
            result = must(lambda: (torch.ones(2, device=torch.device(dt, 0)) + 1).cpu(),
                          f"computing on device 0 after {label}")
            check("ER-SYNC-001.3", torch.equal(result, torch.full((2,), 2.0)),
                  f"after {label} the device computed {result.tolist()} for ones(2) + 1")
