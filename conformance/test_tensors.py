"""Tensors on the device: exact round trips for every supported dtype,
copies between devices, views sharing storage, the generated
Tensor/Module/Storage methods, item() and printing."""

from __future__ import annotations

import inspect
import math
import warnings

import pytest
import torch

from ._async import SCALES, Load, hold, new_stream, unobserved, waited
from ._helpers import check, in_thread, inconclusive, must, must_raise, scope, spellings

contract = pytest.mark.contract

# Used when the backend cannot say which dtypes it supports: the ones every
# accelerator PyTorch knows has (float64 and complex types are not universal).
BASIC_DTYPES = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32]

QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}

NAN, INF = float("nan"), float("inf")


def supported_dtypes(dt: str) -> tuple[list[torch.dtype], str]:
    """The dtypes the device reports, and a note for failure messages."""
    try:
        capability = torch.accelerator.get_device_capability(torch.device(dt, 0))
        dtypes = capability["supported_dtypes"]
    except Exception as e:  # noqa: BLE001 - not supported: fall back, and say so
        return list(BASIC_DTYPES), (
            f" (torch.accelerator.get_device_capability() is not supported by the backend "
            f"[{type(e).__name__}: {e}], so only {', '.join(map(str, BASIC_DTYPES))} were checked)")
    return sorted(dtypes, key=str), " (dtypes from torch.accelerator.get_device_capability())"


def special_values(dtype: torch.dtype) -> list | None:
    """Python values that exercise the edges of `dtype`, or None when the
    dtype cannot be built from Python numbers."""
    if dtype == torch.bool:
        return [True, False, True, True, False]
    if dtype in (torch.uint16, torch.uint32, torch.uint64) or (not dtype.is_floating_point
                                                              and not dtype.is_complex):
        try:
            info = torch.iinfo(dtype)
        except TypeError:
            return None
        values = [info.min, info.max, 0, 1, info.max - 1, info.min + 1, info.max // 3]
        if info.min < 0:
            values += [-1, -2]
        return values
    if dtype.is_complex:
        real = torch.finfo(dtype).max
        return [complex(NAN, 1.0), complex(-0.0, INF), complex(1.5, -INF), complex(-real, real),
                complex(0.0, -0.0), complex(1 / 3, -math.pi), complex(torch.finfo(dtype).tiny, -1.0)]
    if dtype.is_floating_point:
        try:
            info = torch.finfo(dtype)
        except TypeError:
            return None
        if dtype.itemsize < 2:  # float8 / float4: built from bits only
            return None
        return [NAN, INF, -INF, -0.0, 0.0, info.max, -info.max, info.tiny, info.tiny * info.eps,
                info.eps, 1 / 3, -math.pi, 65504.0 if dtype == torch.float16 else 1e10]
    return None


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a CPU tensor, for exact comparison (NaN payloads, -0.0)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def byte_pattern(count: int) -> torch.Tensor:
    """Bytes covering every value 0..255, including 0x00 and 0xff runs."""
    values = [(k * 37 + 11) % 256 for k in range(count - 16)] + [0] * 8 + [255] * 8
    return torch.tensor(values, dtype=torch.uint8)


# ----------------------------------------------------------------- round trip


@contract("TP-RT-001")
def test_round_trip_is_exact_for_every_supported_dtype(dt, n):
    dtypes, note = supported_dtypes(dt)
    targets = sorted({f"{dt}:0", f"{dt}:{n - 1}"}) + [dt]
    problems: list[str] = []

    def check(name, dtype, build_cpu, make_device):
        try:  # cases CPU itself cannot represent for this dtype are skipped
            cpu = build_cpu()
            expected_bits = bits(cpu)
        except Exception:  # noqa: BLE001
            return
        for target in targets:
            try:
                on_device = make_device(cpu, target)
                back = on_device.cpu()
            except Exception as e:  # noqa: BLE001 - collected, reported below
                problems.append(f"{dtype} {name} -> {target}: {type(e).__name__}: {str(e)[:200]}")
                continue
            expected = torch.device(target) if ":" in target else torch.device(dt, 0)
            if on_device.device != expected or on_device.dtype != dtype:
                problems.append(f"{dtype} {name}: landed as {on_device.dtype} on {on_device.device}, "
                                f"expected {dtype} on {expected}")
                continue
            if back.dtype != dtype or back.shape != cpu.shape:
                problems.append(f"{dtype} {name}: came back as {back.dtype} {tuple(back.shape)}")
                continue
            try:
                same = torch.equal(bits(back), expected_bits)
            except Exception as e:  # noqa: BLE001
                problems.append(f"{dtype} {name} via {target}: the result cannot be read back "
                                f"({type(e).__name__}: {e})")
                continue
            if not same:
                problems.append(f"{dtype} {name} via {target}: the bytes changed")

    warnings.filterwarnings("ignore", message="ComplexHalf support is experimental")
    for dtype in dtypes:
        if dtype in QUANTIZED:  # no raw-bytes view on CPU; not probed here
            continue
        itemsize = dtype.itemsize
        # Every byte value in the dtype's elements: raw memory must survive.
        raw = byte_pattern(256 + 16 * itemsize)
        raw = raw[: raw.numel() // (itemsize * 16) * itemsize * 16]

        def patterns(raw=raw, dtype=dtype):
            return raw.view(dtype)

        if dtype == torch.bool:
            # PyTorch defines only the bytes 0 and 1 for bool: a backend may
            # normalize any other byte, so bools are built from values only.
            def patterns(dtype=dtype):
                return torch.tensor([True, False, False, True] * 32, dtype=dtype)

        to = lambda c, d: c.to(d)  # noqa: E731
        # decides TP-RT-001.1 TP-RT-001.2 TP-RT-001.3 TP-RT-001.5
        check("bit patterns (Tensor.to)", dtype, patterns, to)
        check("bit patterns, non-contiguous (transposed)", dtype, lambda: patterns().view(-1, 8).t(), to)
        check("bit patterns, 0-dim", dtype, lambda: patterns()[3].clone(), to)
        check("empty", dtype, lambda: patterns()[:0], to)
        check("copy_ into an existing device tensor", dtype, patterns,
              lambda c, d: torch.empty(c.shape, dtype=c.dtype, device=d).copy_(c))
        values = special_values(dtype)
        if values is not None:
            def from_values(values=values, dtype=dtype):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    return torch.tensor(values, dtype=dtype)

            # decides TP-RT-001.4
            check("special values via torch.tensor(x, device=...)", dtype, from_values,
                  lambda c, d, values=values, dtype=dtype: torch.tensor(values, dtype=dtype, device=d))
    assert not problems, (f"round trips through the device are not exact{note}:\n  "
                          + "\n  ".join(problems[:40]))


# ----------------------------------------------------------- device to device


@contract("TP-D2D-001")
def test_copies_between_devices(dt, n, mod):
    count = 1 << 18
    expected = torch.arange(count, dtype=torch.float32) * 3 + 1
    pairs = sorted({(0, 1), (1, 0), (0, n - 1), (n - 1, 0), (n - 1, 1)} - {(i, i) for i in range(n)})
    for i, j in pairs:
        others = [k for k in range(n) if k not in (i, j)]
        current = others[0] if others else max(i, j)  # the source, the target, or neither
        mod.set_device(current)
        source_device, target_device = torch.device(dt, i), torch.device(dt, j)
        where = f"{source_device} -> {target_device} (device {current} current)"
        source = torch.arange(count, dtype=torch.float32).to(source_device).mul_(3).add_(1)
        with scope("TP-D2D-001.1"):
            moved = must(lambda: source.to(target_device), f"Tensor.to {where}")
        check("TP-D2D-001.1", moved.device == target_device, f"Tensor.to {where} landed on {moved.device}")
        check("TP-D2D-001.1", mod.current_device() == current,
              f"Tensor.to {where} left device {mod.current_device()} current")

        into = torch.zeros(count, device=target_device)
        with scope("TP-D2D-001.1"):
            must(lambda: into.copy_(source), f"copy_ {where}")
        source.fill_(-5)  # must not reach the copies already made
        into.add_(0)
        check("TP-D2D-001.1", torch.equal(moved.cpu(), expected), f"Tensor.to {where} changed the values")
        check("TP-D2D-001.3", torch.equal(into.cpu(), expected), f"copy_ {where} changed the values (or saw a later "
                                                                 "write to the source)")
        check("TP-D2D-001.3", torch.equal(source.cpu(), torch.full((count,), -5.0)), f"the source on {source_device} "
                                                                                      "changed")

        with scope("TP-D2D-001.4"):
            fast = must(lambda: source.to(target_device, non_blocking=True), f"non_blocking Tensor.to {where}")
            torch.accelerator.synchronize(j)
        check("TP-D2D-001.4", fast.device == target_device and torch.equal(fast.cpu(), torch.full((count,), -5.0)),
              f"a non_blocking copy {where} gave wrong values after synchronize")

        matrix = torch.arange(64 * 48, dtype=torch.float64).view(64, 48)
        strided = matrix.to(source_device).t()[::2]
        with scope("TP-D2D-001.5"):
            copied = must(lambda: strided.to(target_device), f"a non-contiguous Tensor.to {where}")
            converted = must(lambda: source.to(target_device, dtype=torch.float64), f"Tensor.to {where}, float64")
        check("TP-D2D-001.5", copied.device == target_device and torch.equal(copied.cpu(), matrix.t()[::2]),
              f"a non-contiguous copy {where} changed the values")
        check("TP-D2D-001.5", converted.device == target_device and converted.dtype == torch.float64
              and torch.equal(converted.cpu(), torch.full((count,), -5.0, dtype=torch.float64)),
              f"a converting copy {where} gave other values")


@contract("TP-D2D-001")
@pytest.mark.parametrize("how", ["Tensor.to", "copy_"])
@pytest.mark.exclusive
def test_copies_between_devices_wait_for_the_work_producing_the_source(how, dt, n, mod, backend):
    """The source is written by work queued (and held) on its own device's
    current stream: the copy must read it only after that work, whichever
    device is current and however the backend orders the copy."""
    count = 1 << 20
    for i, j in sorted({(0, n - 1), (n - 1, 0)}):
        # Device i's current stream is a new one, not its default stream:
        # the copy must follow the source device's *current* stream.
        stream = new_stream(dt, i)
        with torch.accelerator.device_index(i):
            torch.accelerator.set_stream(stream)
        mod.set_device(j)  # the target's device current: the source's stream is not
        load = Load(dt, i)
        source = torch.zeros(count, device=torch.device(dt, i))
        values = torch.full((count,), 9.0, dtype=torch.float64, device=torch.device(dt, i))
        target = torch.zeros(count, device=torch.device(dt, j))
        torch.accelerator.synchronize(i)
        torch.accelerator.synchronize(j)
        check("TP-D2D-001.2", torch.accelerator.current_stream(i) == stream,
              f"torch.accelerator.set_stream on {dt}:{i} did not take effect (ST-CUR-001's business)")
        for scale in SCALES:
            with hold(backend, stream, load, scale) as held:
                with torch.accelerator.device_index(i):
                    source.copy_(values)  # queued behind the hold on device i's current stream
                with scope("TP-D2D-001.2"):
                    if how == "Tensor.to":
                        result, early = waited(lambda: source.to(torch.device(dt, j)), held)
                    else:
                        result, early = waited(lambda: target.copy_(source), held)
                # The copy was asked while the source's writer was pending; if
                # the writer is still pending now, the copy must not have run.
                queued = early is not None
            with scope("TP-D2D-001.2"):
                torch.accelerator.synchronize(i)
                torch.accelerator.synchronize(j)
                got = result.cpu()
            check("TP-D2D-001.2", result.device == torch.device(dt, j) and bool((got == 9.0).all()),
                  f"{how} from {dt}:{i} to {dt}:{j} (device {j} current) read the source before the work queued on "
                  f"{dt}:{i}'s current stream had written it: the copy must be ordered after the source's stream",
                  observed=queued)
            if queued:
                break
            source.zero_()
            target.zero_()
            torch.accelerator.synchronize(i)
            torch.accelerator.synchronize(j)
        else:
            unobserved(backend, "TP-D2D-001.2", f"{how} from {dt}:{i} while the source's writer was in flight")


@contract("TP-D2D-001")
@pytest.mark.parametrize("how", ["Tensor.to", "copy_"])
@pytest.mark.exclusive
def test_a_copy_to_a_held_device_reads_memory_nobody_reuses_meanwhile(how, dt, n, mod, backend):
    """The target device's current stream is held when the copy is asked.
    Whatever the copy still has to read on the source device (the source, or
    a staging buffer of the backend's own, freed when the call returns) must
    not be handed to new tensors allocated and written there meanwhile."""
    count = 1 << 19
    for i, j in sorted({(0, n - 1), (n - 1, 0)}):
        mod.set_device(i)  # the source's device current: its allocations reuse what its stream frees
        load = Load(dt, j)
        source = torch.full((count,), 9.0, device=torch.device(dt, i))
        target = torch.zeros(count, device=torch.device(dt, j))
        minus = torch.full((count,), -1.0, device=torch.device(dt, i))
        torch.accelerator.synchronize(i)
        torch.accelerator.synchronize(j)
        stream = torch.accelerator.current_stream(j)
        for scale in SCALES:
            with hold(backend, stream, load, scale) as held:
                with scope("TP-D2D-001.6"):
                    if how == "Tensor.to":
                        result, early = waited(lambda: source.to(torch.device(dt, j)), held, keep=True)
                    else:
                        result, early = waited(lambda: target.copy_(source), held, keep=True)
                    # While the copy may still be queued: new tensors of the
                    # source device, written at once on its (unheld) stream.
                    fresh = [torch.empty(count, device=torch.device(dt, i)) for _ in range(4)]
                    for f in fresh:
                        f.copy_(minus)
                    torch.accelerator.synchronize(i)
            # early None: the held work was not seen pending when the copy was
            # asked (long work that ran too fast), nothing observed. early
            # False: the copy waited for the target's stream (allowed).
            queued = early is not None
            with scope("TP-D2D-001.6"):
                torch.accelerator.synchronize(j)
                got = result.cpu()
            check("TP-D2D-001.6", result.device == torch.device(dt, j) and bool((got == 9.0).all()),
                  lambda: f"{how} from {dt}:{i} to {dt}:{j}, asked while {dt}:{j}'s current stream was held, read "
                          f"{sorted(set(got.unique().tolist()))[:4]} instead of 9.0 after tensors were allocated and "
                          f"written on {dt}:{i} meanwhile: memory the copy had still to read (a staging buffer?) was "
                          f"handed out before the target's stream ran the copy", observed=queued)
            del fresh
            if queued:
                break
            target.zero_()
            torch.accelerator.synchronize(j)
        else:
            unobserved(backend, "TP-D2D-001.6", f"{how} from {dt}:{i} to {dt}:{j} while {dt}:{j}'s stream was held")


# ----------------------------------------------------------------------- views


VIEWS = [
    ("view(6, 8)", lambda t: t.view(6, 8), True),
    ("slice [5:29]", lambda t: t[5:29], True),
    ("strided slice [3::4]", lambda t: t[3::4], True),
    ("transpose of view(6, 8)", lambda t: t.view(6, 8).t(), True),
    ("as_strided((3, 4), (5, 2), 7)", lambda t: torch.as_strided(t, (3, 4), (5, 2), 7), True),
    ("narrow(0, 9, 12)", lambda t: t.narrow(0, 9, 12), True),
    ("select(1, 3) of view(6, 8)", lambda t: t.view(6, 8).select(1, 3), True),
    ("diagonal(1) of view(6, 8)", lambda t: t.view(6, 8).diagonal(1), True),
    ("permute(2, 0, 1) of view(2, 3, 8)", lambda t: t.view(2, 3, 8).permute(2, 0, 1), True),
    ("unsqueeze(1)[::5]", lambda t: t.unsqueeze(1)[::5], True),
    ("expand of a column", lambda t: t[4:10].view(6, 1).expand(6, 5), False),
    ("unfold(0, 4, 3)", lambda t: t.unfold(0, 4, 3), False),
    ("empty slice [7:7]", lambda t: t[7:7], True),
]


# decides TP-VIEW-001.1 TP-VIEW-001.2
@contract("TP-VIEW-001")
@pytest.mark.parametrize("name,make,writable", VIEWS, ids=[v[0] for v in VIEWS])
def test_views_share_storage_like_cpu(name, make, writable, dt, n):
    device = torch.device(dt, n - 1)  # device 0 stays current
    cpu = torch.arange(48, dtype=torch.float32)
    base = cpu.to(device)

    view_cpu = make(cpu)
    view = must(lambda: make(base), f"{name} of a device tensor")
    assert view.device == device, f"{name} of a tensor on {device} is on {view.device}"
    layout = (tuple(view.shape), view.stride(), view.storage_offset())
    expected_layout = (tuple(view_cpu.shape), view_cpu.stride(), view_cpu.storage_offset())
    assert layout == expected_layout, f"{name}: (shape, strides, offset) is {layout}, on CPU {expected_layout}"
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(), \
        f"{name} does not share its base's storage"
    if view.numel():  # PyTorch reports data_ptr() 0 for empty tensors
        assert view.data_ptr() == base.data_ptr() + 4 * view.storage_offset(), \
            f"{name}: data_ptr() is not the storage pointer plus storage_offset() * itemsize"
    assert view._base is base, f"{name}._base is not the tensor it views"
    assert torch.equal(view.cpu(), view_cpu), f"{name} reads {view.cpu()}, on CPU {view_cpu}"

    # Writes through the base show in the view.
    cpu.mul_(-2).add_(1)
    base.copy_(cpu)
    assert torch.equal(view.cpu(), view_cpu), f"after writing the base, {name} reads stale values"
    base.add_(0.5)
    cpu.add_(0.5)
    assert torch.equal(view.cpu(), view_cpu), f"after an in-place op on the base, {name} reads stale values"
    if not writable:
        return
    # Writes through the view show in the base (and nowhere else).
    fresh = torch.arange(view_cpu.numel(), dtype=torch.float32).view(view_cpu.shape) * 10 + 1000
    must(lambda: view.copy_(fresh), f"copying CPU values into {name}")
    view_cpu.copy_(fresh)
    assert torch.equal(base.cpu(), cpu), f"after copy_ into {name}, the base differs from CPU: {base.cpu()}"
    must(lambda: view.mul_(-1), f"an in-place op on {name}")
    view_cpu.mul_(-1)
    assert torch.equal(base.cpu(), cpu), f"after an in-place op on {name}, the base differs from CPU"
    view.fill_(7.25)
    view_cpu.fill_(7.25)
    assert torch.equal(base.cpu(), cpu), f"after fill_ on {name}, the base differs from CPU"


# The same view operator applied to tensors that differ only in layout:
# (name, view, the two tensors of one storage of 48 elements). A backend that
# caches answers by its arguments' metadata (OpenReg's asynchronous path
# does) must key them by all of it.
SAME_STORAGE_PAIRS = {
    "a tensor and its transpose": (lambda t: t.view(6, 8)[:, :6], lambda t: t.view(6, 8)[:, :6].t()),
    "two slices of one storage": (lambda t: t[0:24].view(4, 6), lambda t: t[12:36].view(4, 6)),
    "two strided slices of one storage": (lambda t: t[0::2].view(4, 6), lambda t: t[1::2].view(4, 6)),
}
LAYOUT_VIEWS = [
    ("unfold(1, 2, 1)", lambda t: t.unfold(1, 2, 1)),
    ("diagonal()", lambda t: t.diagonal()),
    ("select(0, 1)", lambda t: t.select(0, 1)),
    ("narrow(1, 1, 3)", lambda t: t.narrow(1, 1, 3)),
    ("t()", lambda t: t.t()),
    ("unsqueeze(1)", lambda t: t.unsqueeze(1)),
    ("unbind(0)", lambda t: t.unbind(0)),
    ("split(2, 1)", lambda t: t.split(2, 1)),
    ("as_strided((2, 2), (1, 3))", lambda t: t.as_strided((2, 2), (1, 3))),
    ("view_as_real of a complex view", lambda t: torch.view_as_real(t[:, :4].view(torch.complex64))),
]


def _views_of(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


# decides TP-VIEW-001.7
@contract("TP-VIEW-001")
@pytest.mark.parametrize("pair", list(SAME_STORAGE_PAIRS))
def test_views_of_tensors_that_differ_only_in_layout(pair, dt, n):
    """Each view operator, called on one tensor and then on another of the
    same storage, dtype and shape that differs only in strides or storage
    offset, gives each the CPU's layout and values: the second call must not
    reuse what the first one answered."""
    device = torch.device(dt, n - 1)
    clause = "TP-VIEW-001.7"
    first, second = SAME_STORAGE_PAIRS[pair]
    cpu = torch.arange(48, dtype=torch.float32)
    base = cpu.to(device)
    for name, view in LAYOUT_VIEWS:
        for which, make in (("first", first), ("second", second)):
            source_cpu = make(cpu)
            try:
                expected = _views_of(view(source_cpu))
            except RuntimeError:
                continue  # the CPU rejects this layout: no evidence
            source = make(base)
            what = f"{name} of the {which} of {pair} {tuple(source.shape)}, strides {source.stride()}, offset " \
                   f"{source.storage_offset()}"
            with scope(clause):
                got = _views_of(must(lambda: view(source), what))
            check(clause, len(got) == len(expected), f"{what} returned {len(got)} tensors, on CPU {len(expected)}")
            for k, (g, e) in enumerate(zip(got, expected)):
                layout = (tuple(g.shape), g.stride(), g.storage_offset())
                wanted = (tuple(e.shape), e.stride(), e.storage_offset())
                check(clause, layout == wanted, f"{what}: view {k} has (shape, strides, offset) {layout}, on CPU {wanted}")
                check(clause, g.untyped_storage().data_ptr() == base.untyped_storage().data_ptr(),
                      f"{what}: view {k} does not share the storage")
                check(clause, torch.equal(g.cpu(), e), f"{what}: view {k} reads {g.cpu().tolist()}, on CPU {e.tolist()}")


# decides TP-VIEW-001.4 TP-VIEW-001.6
@contract("TP-VIEW-001")
def test_set_and_storage_offsets(dt, n):
    device = torch.device(dt, n - 1)
    cpu = torch.arange(48, dtype=torch.float32)
    base = cpu.to(device)
    storage = base.untyped_storage()

    t = must(lambda: torch.empty(0, device=device).set_(storage, 6, (3, 5), (5, 1)),
             "Tensor.set_(storage, offset, size, stride) on the device")
    expected = torch.empty(0).set_(cpu.untyped_storage(), 6, (3, 5), (5, 1))
    assert t.device == device and t.storage_offset() == 6 and t.stride() == (5, 1)
    assert t.data_ptr() == base.data_ptr() + 6 * 4, "set_ with offset 6: data_ptr() is not storage + 24 bytes"
    assert torch.equal(t.cpu(), expected), f"set_ with an offset reads {t.cpu()}, on CPU {expected}"
    t.mul_(-1)
    expected.mul_(-1)
    assert torch.equal(base.cpu(), cpu), "a write through a set_ tensor does not reach the storage's other users"

    # The same overload without strides (they default to contiguous ones):
    # the offset must still count.
    # decides TP-VIEW-001.4
    t = must(lambda: torch.empty(0, device=device).set_(storage, 7, (2, 4)),
             "Tensor.set_(storage, offset, size) without strides on the device")
    expected = torch.empty(0).set_(cpu.untyped_storage(), 7, (2, 4))
    assert t.device == device and t.storage_offset() == 7 and t.stride() == (4, 1), \
        f"set_(storage, 7, (2, 4)) gave offset {t.storage_offset()}, strides {t.stride()} on {t.device}"
    assert t.data_ptr() == base.data_ptr() + 7 * 4, "set_(storage, 7, size): data_ptr() is not storage + 28 bytes"
    assert torch.equal(t.cpu(), expected), f"set_(storage, 7, size) reads {t.cpu()}, on CPU {expected}"
    # set_(storage) compared with the CPU's (not with the storage's size
    # afterwards, which a set_ that resizes the storage changes too).
    every = must(lambda: torch.empty(0, device=device).set_(storage), "Tensor.set_(storage)")
    expected = torch.empty(0).set_(cpu.untyped_storage())
    assert every.data_ptr() == base.data_ptr() and every.shape == expected.shape \
        and storage.nbytes() == cpu.untyped_storage().nbytes(), (
            f"Tensor.set_(storage of {cpu.untyped_storage().nbytes()} bytes) gave shape {tuple(every.shape)} and a "
            f"storage of {storage.nbytes()} bytes; on CPU shape {tuple(expected.shape)} and the storage unchanged")
    assert torch.equal(every.cpu(), expected), "Tensor.set_(storage) reads other values than on CPU"

    # set_(tensor) takes the source's sizes, strides and offset, also those
    # of a non-contiguous view.
    for what, view in (("a contiguous tensor", lambda t: t), ("a strided view at an offset", lambda t: t.view(6, 8)[1:, 1::3]),
                       ("a transposed view", lambda t: t.view(6, 8).t())):
        source, cpu_source = view(base), view(cpu.clone())
        target = must(lambda: torch.empty(3, device=device).set_(source), f"Tensor.set_(tensor) with {what}")
        expected = torch.empty(3).set_(cpu_source)
        layout = (tuple(target.shape), target.stride(), target.storage_offset())
        assert layout == (tuple(expected.shape), expected.stride(), expected.storage_offset()), (
            f"Tensor.set_(tensor) with {what}: sizes, strides, offset {layout}, on CPU "
            f"{(tuple(expected.shape), expected.stride(), expected.storage_offset())}")
        assert target.data_ptr() == source.data_ptr() and torch.equal(target.cpu(), expected), \
            f"Tensor.set_(tensor) with {what} does not read the source's elements"

    whole = must(lambda: torch.empty(3, device=device).set_(base), "Tensor.set_(tensor)")
    assert whole.data_ptr() == base.data_ptr() and torch.equal(whole.cpu(), cpu)
    whole.fill_(2.0)
    assert torch.equal(base.cpu(), torch.full((48,), 2.0)), "set_(tensor) does not share the storage"

    copy = base[5:20:2].contiguous()
    clone = base.clone()
    assert copy.untyped_storage().data_ptr() != storage.data_ptr(), "contiguous() of a strided slice did not copy"
    assert clone.untyped_storage().data_ptr() != storage.data_ptr(), "clone() shares the storage"
    base.fill_(-1)
    assert torch.equal(copy.cpu(), torch.full((8,), 2.0)) and torch.equal(clone.cpu(), torch.full((48,), 2.0)), \
        "a copy made by contiguous()/clone() changed when its source was written"


def _layout(t: torch.Tensor) -> tuple:
    """Shape and the strides that matter (not those of dimensions of size 1)."""
    return tuple(t.shape), tuple(None if size == 1 else stride for size, stride in zip(t.shape, t.stride()))


FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


# decides TP-FORMAT-001.1 TP-FORMAT-001.2 TP-FORMAT-001.3
@contract("TP-FORMAT-001")
def test_memory_formats_match_cpu(dt, n):
    """Factories and conversions that take a memory format give device
    tensors the strides they give CPU tensors: torch.empty with each format,
    the *_like factories of channels-last, permuted and non-dense tensors
    with preserve_format and with each format, contiguous(memory_format)
    and to(memory_format)."""
    device = torch.device(dt, n - 1)
    torch.manual_seed(0)

    def compare(clause: str, what: str, make) -> None:
        expected = make("cpu")
        got = must(lambda: make(device), f"{what} on {device}")
        check(clause, got.device == device, f"{what} on {device} returned a tensor on {got.device}")
        check(clause, _layout(got) == _layout(expected),
              lambda: f"{what}: shape and strides {tuple(got.shape)}, {got.stride()} on the device, "
                      f"{tuple(expected.shape)}, {expected.stride()} on the CPU")

    for shape in ((2, 3, 4, 5), (2, 3, 2, 4, 5)):
        formats = [torch.contiguous_format, FORMATS[len(shape)]]
        for fmt in formats:
            with scope("TP-FORMAT-001.1"):
                compare("TP-FORMAT-001.1", f"torch.empty({shape}, memory_format={fmt})",
                        lambda d, fmt=fmt: torch.empty(shape, memory_format=fmt, device=d))
        cpu = torch.randn(shape)
        sources = {
            "a channels-last tensor": lambda d: cpu.to(d).contiguous(memory_format=FORMATS[len(shape)]),
            "a permuted dense tensor": lambda d: cpu.to(d).transpose(1, -1),
            "a non-dense slice": lambda d: cpu.to(d)[..., ::2],
        }
        factories = {
            "empty_like": lambda t, **kw: torch.empty_like(t, **kw),
            "zeros_like": lambda t, **kw: torch.zeros_like(t, **kw),
            "ones_like": lambda t, **kw: torch.ones_like(t, **kw),
            "full_like": lambda t, **kw: torch.full_like(t, 2.5, **kw),
            "rand_like": lambda t, **kw: torch.rand_like(t, **kw),
        }
        for source_name, source in sources.items():
            for factory_name, factory in factories.items():
                for fmt in [torch.preserve_format, *formats]:
                    what = f"torch.{factory_name}({source_name} of shape {shape}, memory_format={fmt})"
                    with scope("TP-FORMAT-001.2"):
                        compare("TP-FORMAT-001.2", what,
                                lambda d, fmt=fmt, make=source, f=factory: f(make(d), memory_format=fmt))
                    if factory_name in ("zeros_like", "ones_like", "full_like"):
                        got = factory(source(device), memory_format=fmt).cpu()
                        check("TP-FORMAT-001.2", torch.equal(got, factory(source("cpu"), memory_format=fmt)),
                              f"{what} holds other values than on the CPU")
            for fmt in formats:
                for verb, convert in (("contiguous", lambda t, fmt=fmt: t.contiguous(memory_format=fmt)),
                                      ("to", lambda t, fmt=fmt: t.to(memory_format=fmt))):
                    what = f"Tensor.{verb}(memory_format={fmt}) of {source_name} of shape {shape}"
                    with scope("TP-FORMAT-001.3"):
                        compare("TP-FORMAT-001.3", what, lambda d, make=source, c=convert: c(make(d)))
                    got = convert(source(device)).cpu()
                    check("TP-FORMAT-001.3", torch.equal(got, convert(source("cpu"))),
                          f"{what} holds other values than on the CPU")


# decides TP-VIEW-001.5
@contract("TP-VIEW-001")
def test_set_keeps_the_device(dt, n):
    device = torch.device(dt, n - 1)  # device 0 stays current
    emptied = must(lambda: torch.ones(5, device=device).set_(), "Tensor.set_() on the device")
    assert emptied.numel() == 0, f"Tensor.set_() left {emptied.numel()} elements"
    assert emptied.device == device, (
        f"Tensor.set_() on a tensor on {device} (device 0 current) moved it to {emptied.device}: the "
        "empty storage must be made on the tensor's own device (PyTorch's kernels run under a "
        "device guard for self)")
    if n > 1:
        other = torch.zeros(4, device=torch.device(dt, 0)).untyped_storage()
        target = torch.ones(4, device=device)
        must_raise(lambda: target.set_(other), f"Tensor.set_(storage of {dt}:0) on a tensor on {device}",
                   RuntimeError)
        assert target.device == device and torch.equal(target.cpu(), torch.ones(4)), \
            "a refused set_ with a storage of another device changed the tensor"


# decides TP-VIEW-001.3
@contract("TP-VIEW-001")
def test_dtype_views_share_storage(dt, n):
    device = torch.device(dt, n - 1)
    floats = torch.tensor([1.0, -2.0, 0.5, 3.0]).to(device)
    ints = must(lambda: floats.view(torch.int32), "Tensor.view(torch.int32) of a float32 device tensor")
    assert ints.data_ptr() == floats.data_ptr() and ints.device == device
    assert torch.equal(ints.cpu(), floats.cpu().view(torch.int32)), "view(dtype) reinterprets the bytes wrongly"

    cpu = torch.tensor([1 + 2j, -3 - 4j, 0.5j], dtype=torch.complex64)
    complex_base = cpu.to(device)
    real = must(lambda: torch.view_as_real(complex_base), "torch.view_as_real of a device tensor")
    assert real.device == device and real.data_ptr() == complex_base.data_ptr()
    assert real._base is complex_base, "view_as_real of a device tensor is not a view of it"
    assert torch.equal(real.cpu(), torch.view_as_real(cpu))
    real[:, 1].fill_(9.0)
    assert torch.equal(complex_base.cpu().imag, torch.full((3,), 9.0)), \
        "writing through view_as_real did not reach the complex tensor"
    back = must(lambda: torch.view_as_complex(real), "torch.view_as_complex of a device tensor")
    assert back.data_ptr() == complex_base.data_ptr() and torch.equal(back.cpu(), complex_base.cpu())
    assert torch.equal(must(lambda: complex_base.real, "Tensor.real of a complex device tensor").cpu(),
                       torch.tensor([1.0, -3.0, 0.0]))


# ----------------------------------------------------------- generated methods


def _tensor_method(dt):
    method = getattr(torch.Tensor, dt, None)
    assert callable(method), (f"torch.Tensor has no {dt}() method: call "
                              "torch.utils.generate_methods_for_privateuse1_backend()")
    assert isinstance(inspect.getattr_static(torch.Tensor, f"is_{dt}", None), property), \
        f"torch.Tensor.is_{dt} is not a property"
    return method


# decides TP-GEN-001.1 TP-GEN-001.2
@contract("TP-GEN-001")
def test_generated_tensor_and_module_methods(dt, n, mod):
    _tensor_method(dt)
    cpu = torch.arange(6, dtype=torch.float32)
    moved = must(lambda: getattr(cpu, dt)(), f"Tensor.{dt}()")
    assert moved.device == torch.device(dt, mod.current_device()), \
        f"Tensor.{dt}() put the tensor on {moved.device}, not the current device"
    assert torch.equal(moved.cpu(), cpu)
    assert getattr(moved, f"is_{dt}") is True, f"Tensor.is_{dt} is False for a tensor on {moved.device}"
    assert getattr(cpu, f"is_{dt}") is False, f"Tensor.is_{dt} is True for a CPU tensor"
    assert getattr(moved, dt)().data_ptr() == moved.data_ptr(), \
        f"Tensor.{dt}() copied a tensor already on the current device"
    for j in reversed(range(n)):
        for form in spellings(dt, j):
            t = must(lambda: getattr(cpu, dt)(form), f"Tensor.{dt}({form!r})")
            assert t.device == torch.device(dt, j), f"Tensor.{dt}({form!r}) landed on {t.device}"
            assert getattr(t, f"is_{dt}") is True
    fast = must(lambda: getattr(cpu, dt)(non_blocking=True), f"Tensor.{dt}(non_blocking=True)")
    assert torch.equal(fast.cpu(), cpu)
    must_raise(lambda: getattr(cpu, dt)("cpu"), f"Tensor.{dt}('cpu')", (RuntimeError, ValueError))

    assert callable(getattr(torch.nn.Module, dt, None)), f"torch.nn.Module has no {dt}() method"
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    model.register_buffer("scale", torch.full((2,), 3.0))
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    returned = must(lambda: getattr(model, dt)(), f"Module.{dt}()")
    assert returned is model, f"Module.{dt}() must return the module itself"
    for key, value in model.state_dict().items():
        assert value.device == torch.device(dt, mod.current_device()), f"Module.{dt}() left {key} on {value.device}"
        assert torch.equal(value.cpu(), reference[key])
    x = torch.randn(4, 3)
    out = model(getattr(x, dt)())
    assert torch.allclose(out.cpu(), x @ reference["weight"].t() + reference["bias"], atol=1e-6)
    getattr(model, dt)(n - 1)
    assert all(p.device == torch.device(dt, n - 1) for p in model.parameters()), f"Module.{dt}({n - 1}) failed"

    packed_type = torch.nn.utils.rnn.PackedSequence
    if hasattr(packed_type, dt):
        packed = torch.nn.utils.rnn.pack_sequence([torch.ones(3, 2), torch.ones(2, 2)])
        on_device = must(lambda: getattr(packed, dt)(), f"PackedSequence.{dt}()")
        assert on_device.data.device.type == dt and getattr(on_device, f"is_{dt}")


# decides TP-GEN-001.4
@contract("TP-GEN-001")
def test_generated_storage_methods(dt, n, mod):
    if not hasattr(torch.UntypedStorage, dt):
        inconclusive(f"the backend did not generate storage methods (for_storage=False): "
                     f"UntypedStorage.{dt}() does not exist", applies=False)
    cpu = torch.arange(40, dtype=torch.uint8).untyped_storage()
    moved = must(lambda: getattr(cpu, dt)(), f"UntypedStorage.{dt}()")
    assert moved.device == torch.device(dt, mod.current_device()), f"UntypedStorage.{dt}() is on {moved.device}"
    assert getattr(moved, f"is_{dt}") is True and getattr(cpu, f"is_{dt}") is False
    assert bytes(moved.cpu()) == bytes(cpu), f"UntypedStorage.{dt}() changed the bytes"
    assert getattr(moved, dt)() is moved, f"UntypedStorage.{dt}() copied a storage already on the device"
    last = must(lambda: getattr(cpu, dt)(n - 1), f"UntypedStorage.{dt}({n - 1})")
    assert last.device == torch.device(dt, n - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated
        typed = torch.arange(5, dtype=torch.float32).storage()
        on_device = must(lambda: getattr(typed, dt)(), f"TypedStorage.{dt}()")
        assert on_device.device.type == dt and getattr(on_device, f"is_{dt}") and on_device.dtype == torch.float32
        assert list(on_device.cpu()) == [0.0, 1.0, 2.0, 3.0, 4.0]


# decides TP-GEN-001.3
@contract("TP-GEN-001")
@pytest.mark.requires("multi-device")
def test_generated_methods_follow_the_current_device(dt, n, mod, two_devices):
    _tensor_method(dt)
    cpu = torch.arange(4, dtype=torch.float32)
    on_zero = cpu.to(torch.device(dt, 0))
    for j, setter in ((1, mod.set_device), (n - 1, torch.accelerator.set_device_index), (0, mod.set_device)):
        setter(j)
        here = torch.device(dt, j)
        assert getattr(cpu, dt)().device == here, f"with device {j} current, Tensor.{dt}() did not land on it"
        moved = getattr(on_zero, dt)()
        assert moved.device == here and torch.equal(moved.cpu(), cpu), \
            f"with device {j} current, Tensor.{dt}() of a tensor on {dt}:0 did not move it to {j}"
        model = getattr(torch.nn.Linear(2, 2), dt)()
        assert all(p.device == here for p in model.parameters()), f"Module.{dt}() ignored current device {j}"
        if hasattr(torch.UntypedStorage, dt):
            storage = getattr(cpu.untyped_storage(), dt)()
            assert storage.device == here, f"UntypedStorage.{dt}() ignored current device {j}"
    mod.set_device(1)
    device, current = in_thread(lambda: (getattr(cpu, dt)().device, mod.current_device()))
    assert device == torch.device(dt, current), \
        f"in a new thread whose current device is {current}, Tensor.{dt}() landed on {device}"


# --------------------------------------------------------------- item / print


ITEM_CASES = [
    (torch.float32, [NAN, INF, -INF, -0.0, 1 / 3, 3.4e38, 1e-45]),
    (torch.float64, [NAN, -INF, -0.0, math.pi, 1.7e308, 5e-324]),
    (torch.float16, [65504.0, -0.0, INF, 6e-8]),
    (torch.bfloat16, [3.0e38, -0.0, NAN, 1 / 3]),
    (torch.int64, [-(2 ** 63), 2 ** 63 - 1, 0, -1]),
    (torch.int32, [-(2 ** 31), 2 ** 31 - 1, 7]),
    (torch.int8, [-128, 127, 0]),
    (torch.uint8, [0, 255, 17]),
    (torch.bool, [True, False]),
    (torch.complex64, [complex(1.5, -2.0), complex(NAN, INF), complex(-0.0, 0.0)]),
    (torch.complex128, [complex(math.e, -math.pi), complex(-INF, 1e-300)]),
]


def same_scalar(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, complex):
        return same_scalar(a.real, b.real) and same_scalar(a.imag, b.imag)
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b


# decides TP-ITEM-001.1 TP-ITEM-001.2 TP-ITEM-001.3 TP-ITEM-001.4
@contract("TP-ITEM-001")
@pytest.mark.exclusive
def test_item(dt, n, backend):
    device = torch.device(dt, n - 1)
    problems = []
    for dtype, values in ITEM_CASES:
        cpu = torch.tensor(values, dtype=dtype)
        on_device = cpu.to(device)
        for k in range(len(values)):
            try:
                got = on_device[k].item()
            except Exception as e:  # noqa: BLE001
                problems.append(f"{dtype}[{k}].item() raised {type(e).__name__}: {e}")
                continue
            expected = cpu[k].item()
            if not same_scalar(got, expected):
                problems.append(f"{dtype}[{k}].item() is {got!r}, on CPU {expected!r}")
        listed = must(on_device.tolist, f"tolist() of a {dtype} device tensor")
        if len(listed) != len(values) or not all(map(same_scalar, listed, cpu.tolist())):
            problems.append(f"{dtype} tolist() is {listed}, on CPU {cpu.tolist()}")
    assert not problems, "item() of device tensors is wrong:\n  " + "\n  ".join(problems)

    matrix = torch.arange(30, dtype=torch.float32).view(5, 6)
    on_device = matrix.to(device)
    for row, column in ((3, 2), (5, 0), (0, 4)):
        assert on_device.t()[row, column].item() == matrix.t()[row, column].item(), \
            f"item() of element {(row, column)} of a transposed view is wrong (strides/offset ignored?)"
        assert on_device[column, row].item() == matrix[column, row].item()
    assert torch.tensor(2.5, device=device).item() == 2.5, "item() of a 0-dim device tensor is wrong"
    must_raise(lambda: on_device.item(), "item() of a 30-element device tensor", RuntimeError)

    # item() must wait for the queued work that produced the value: a copy
    # queued behind a hold of the current stream (or behind long work).
    product = torch.full((1 << 20,), 48.0, dtype=torch.float64).to(device)
    load = Load(dt, device.index)
    stream = torch.accelerator.current_stream(device.index)
    for scale in SCALES:
        big = torch.full((1 << 20,), 3.0).to(device)
        torch.accelerator.synchronize(device.index)
        with hold(backend, stream, load, scale) as held:
            with torch.accelerator.device_index(device.index):
                big.copy_(product)
            value, early = waited(lambda: big[-1].item(), held)
        check("TP-ITEM-001.4", early is not True, "item() returned while the work producing the value was still held "
                                                  "or pending", observed=early is not None)
        check("TP-ITEM-001.4", value == 48.0, f"item() returned {value}, a value read before the queued work that "
                                              "wrote 48.0 had run", observed=early is not None)
        assert big.sum().item() == 48.0 * (1 << 20)
        if early is not None:
            break
    else:
        unobserved(backend, "TP-ITEM-001.4", "item() of a value written behind work in flight")


PRINT_CASES = [
    ("2-D float", lambda: torch.arange(6, dtype=torch.float32).view(2, 3)),
    ("int64", lambda: torch.tensor([1, -2, 300])),
    ("bool", lambda: torch.tensor([True, False])),
    ("empty", lambda: torch.tensor([])),
    ("0-dim", lambda: torch.tensor(3.25)),
    ("special floats", lambda: torch.tensor([NAN, INF, -0.0])),
    ("float16", lambda: torch.tensor([1.0, 2.5], dtype=torch.float16)),
    ("summarized (2000 elements)", lambda: torch.linspace(-1, 1, 2000)),
    ("complex", lambda: torch.tensor([1 + 2j, -0.5j])),
    ("non-contiguous", lambda: torch.arange(12, dtype=torch.float64).view(3, 4).t()),
]


# decides TP-ITEM-001.5
@contract("TP-ITEM-001")
@pytest.mark.parametrize("name,make", PRINT_CASES, ids=[c[0] for c in PRINT_CASES])
def test_printing(name, make, dt, n):
    cpu = make()
    device = torch.device(dt, n - 1)
    on_device = cpu.to(device)
    text = must(lambda: repr(on_device), f"repr() of a {name} device tensor")
    must(lambda: str(on_device), f"str() of a {name} device tensor")
    marker = f", device='{device}'"
    words = " ".join(text.split())  # line breaks may move to make room for the device
    assert marker in words, f"repr() of a {name} tensor on {device} does not name its device: {text!r}"
    assert words.replace(marker, "") == " ".join(repr(cpu).split()), (
        f"repr() of a {name} device tensor shows other values than on CPU:\n{text}\nvs CPU:\n{repr(cpu)}")


# ------------------------------------------------- negative and conjugate views
#
# torch._neg_view and Tensor.conj() (of a complex tensor) set a bit instead
# of computing: the values are negated or conjugated only when the tensor is
# materialized. PyTorch's Negative and Conjugate fallbacks do that for most
# operators, through clone() and copy_, which is the backend's copy: a
# backend whose copy does not apply the bits, or whose _copy_from the
# fallbacks intercept (they then materialize its argument with clone(), which
# calls _copy_from again, forever), gets wrong values or a crash.

def _materializations(device: torch.device, resolve: str):
    return [
        ("clone()", lambda v: v.clone()),
        (f"{resolve}()", lambda v: getattr(v, resolve)()),
        (".cpu()", lambda v: v.cpu()),
        (f".to('{device}')", lambda v: v.to(device)),
        ("an operator (v * 2)", lambda v: v * 2),
        ("copy_ into a plain device tensor", lambda v: torch.empty_like(v, device=device).copy_(v)),
    ]


def _check_view_materializations(contract_clause: str, view, expected_cpu, base, base_cpu, bit: str,
                                 resolve: str, device: torch.device) -> None:
    check(contract_clause, bool(getattr(view, f"is_{bit}")()), f"the {bit} view does not report is_{bit}()")
    for what, make in _materializations(device, resolve):
        with scope(contract_clause, f"{what} of a {bit} view"):  # (a crash names the materialization)
            got = must(lambda: make(view), f"{what} of a device tensor whose {bit} bit is set")
            got_cpu = must(lambda: got.cpu(), f".cpu() of the result of {what} of a {bit} view")
        factor = 2 if what.startswith("an operator") else 1
        check(contract_clause, not got_cpu.is_neg() and not got_cpu.is_conj()
              and torch.equal(got_cpu.resolve_conj().resolve_neg(), expected_cpu * factor),
              lambda: f"{what} of a {bit} view of a device tensor gives {got_cpu.resolve_conj().resolve_neg()}, "
                      f"on CPU {expected_cpu * factor}")
    check(contract_clause, torch.equal(base.cpu(), base_cpu),
          f"materializing a {bit} view changed the tensor it views")


# decides TP-NEGCONJ-001.1
@contract("TP-NEGCONJ-001")
def test_negative_views_materialize_like_cpu(dt, n):
    device = torch.device(dt, n - 1)
    base_cpu = torch.linspace(-2.5, 4.0, 12).view(3, 4)
    base = base_cpu.to(dt)
    view = must(lambda: torch._neg_view(base), "torch._neg_view of a device tensor")
    _check_view_materializations("TP-NEGCONJ-001.1", view, torch._neg_view(base_cpu).resolve_neg(),
                                 base, base_cpu, "neg", "resolve_neg", device)
    item = must(lambda: view[1, 2].item(), "item() of an element of a negative view")
    check("TP-NEGCONJ-001.1", item == -base_cpu[1, 2].item(),
          f"item() of a negative view reads {item}, on CPU {-base_cpu[1, 2].item()}")


# decides TP-NEGCONJ-001.2
@contract("TP-NEGCONJ-001")
def test_conjugate_views_materialize_like_cpu(dt, n):
    dtypes, _ = supported_dtypes(dt)
    if torch.complex64 not in dtypes:
        inconclusive("the device does not claim complex64: conjugate views have no complex tensor to view",
                     applies=False)
    device = torch.device(dt, n - 1)
    base_cpu = torch.complex(torch.linspace(-2.5, 4.0, 12), torch.linspace(3.0, -1.5, 12)).view(3, 4)
    base = base_cpu.to(dt)
    view = must(lambda: base.conj(), "Tensor.conj() of a complex device tensor")
    _check_view_materializations("TP-NEGCONJ-001.2", view, base_cpu.conj().resolve_conj(),
                                 base, base_cpu, "conj", "resolve_conj", device)


# decides TP-NEGCONJ-001.3
@contract("TP-NEGCONJ-001")
def test_copy_into_negative_and_conjugate_views(dt, n):
    values = torch.linspace(-3.0, 5.0, 8)
    sources = {"the CPU": values, f"{dt}:0": values.to(f"{dt}:0"), f"{dt}:{n - 1}": values.to(f"{dt}:{n - 1}")}
    for where, source in sources.items():
        base = torch.zeros(8, device=dt)
        must(lambda: torch._neg_view(base).copy_(source), f"copy_ from {where} into a negative view")
        check("TP-NEGCONJ-001.3", torch.equal(base.cpu(), -values),
              lambda: f"copy_ from {where} into a negative view of a device tensor left the tensor "
                      f"{base.cpu()}, expected {-values}")
    dtypes, _ = supported_dtypes(dt)
    if torch.complex64 not in dtypes:
        return  # the negative views decided the clause; no complex tensors to conjugate
    complex_values = torch.complex(values, values.flip(0))
    for where, source in {"the CPU": complex_values, f"{dt}:0": complex_values.to(f"{dt}:0")}.items():
        base = torch.zeros(8, dtype=torch.complex64, device=dt)
        must(lambda: base.conj().copy_(source), f"copy_ from {where} into a conjugate view")
        check("TP-NEGCONJ-001.3", torch.equal(base.cpu(), complex_values.conj().resolve_conj()),
              lambda: f"copy_ from {where} into a conjugate view of a device tensor left the tensor "
                      f"{base.cpu()}, expected {complex_values.conj().resolve_conj()}")


# ------------------------------------------------------------ shallow copies

# decides TP-SHALLOW-001.1
@contract("TP-SHALLOW-001")
def test_shallow_copy_compatibility(dt, n):
    cpu = torch.zeros(3)
    pairs = {"a CPU tensor and a device tensor": (cpu, torch.zeros(3, device=dt)),
             "a device tensor and a CPU tensor": (torch.zeros(3, device=dt), cpu),
             f"tensors of {dt}:0 and {dt}:{n - 1}": (torch.zeros(3, device=f"{dt}:0"),
                                                     torch.zeros(3, device=f"{dt}:{n - 1}"))}
    for what, (a, b) in pairs.items():
        answer = must(lambda: torch._has_compatible_shallow_copy_type(a, b),
                      f"torch._has_compatible_shallow_copy_type of {what}")
        check("TP-SHALLOW-001.1", answer is True,
              f"torch._has_compatible_shallow_copy_type is {answer} for {what} (True for dense CPU and CUDA "
              "tensors; c10/core/TensorImpl.h asks PrivateUse1 backends to register the operator)")


# decides TP-SHALLOW-001.2
@contract("TP-SHALLOW-001")
def test_data_assignment_moves_between_cpu_and_device(dt, n):
    device = torch.device(dt, n - 1)
    t = torch.arange(6.0)
    on_device = torch.linspace(-1, 1, 4, dtype=torch.float64).to(device) if torch.float64 in supported_dtypes(dt)[0] \
        else torch.linspace(-1, 1, 4).to(device)
    must(lambda: setattr(t, "data", on_device), "cpu_tensor.data = device_tensor")
    check("TP-SHALLOW-001.2", t.device == device and t.dtype == on_device.dtype and t.shape == on_device.shape,
          f"after cpu_tensor.data = a {on_device.dtype} tensor on {device}, the tensor is {t.dtype} "
          f"{tuple(t.shape)} on {t.device}")
    check("TP-SHALLOW-001.2", t.untyped_storage().data_ptr() == on_device.untyped_storage().data_ptr(),
          "after cpu_tensor.data = device_tensor, the tensor does not share the device tensor's storage")
    back = torch.arange(5.0)
    must(lambda: setattr(t, "data", back), "device_tensor.data = cpu_tensor")
    check("TP-SHALLOW-001.2", t.device.type == "cpu" and torch.equal(t, back),
          f"after device_tensor.data = a CPU tensor, the tensor is on {t.device} with {t}")


# decides TP-SHALLOW-001.3
@contract("TP-SHALLOW-001")
def test_module_to_keeps_parameter_objects(dt, n):
    model = torch.nn.Linear(3, 2)
    model.weight.grad = torch.ones(2, 3)
    before = {name: p for name, p in model.named_parameters()}
    values = {name: p.detach().clone() for name, p in before.items()}
    must(lambda: model.to(torch.device(dt, n - 1)), "Module.to(device)")
    for name, p in model.named_parameters():
        check("TP-SHALLOW-001.3", p is before[name],
              f"Module.to(device) replaced the Parameter {name!r} by a new object instead of swapping its data "
              "(as it does for CUDA): references taken before the move, such as an optimizer's, are stale")
        check("TP-SHALLOW-001.3", p.device == torch.device(dt, n - 1) and torch.equal(p.detach().cpu(), values[name]),
              f"after Module.to(device), {name} is on {p.device} with other values")
    grad = model.weight.grad
    check("TP-SHALLOW-001.3", grad is not None and grad.device == torch.device(dt, n - 1),
          f"after Module.to(device) the weight's gradient is on {None if grad is None else grad.device}")


# ------------------------------------------------------- the claimed dtypes

CONVERSION_VALUES = [0, 1, 2, 3, 5, 0, 1, 7]


def _same_values(got: torch.Tensor, expected: torch.Tensor) -> bool:
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return False
    if torch.equal(bits(got), bits(expected)):
        return True
    if got.dtype.is_floating_point or got.dtype.is_complex:  # NaN payloads may differ
        wide = torch.complex128 if got.dtype.is_complex else torch.float64
        a, b = got.to(wide), expected.to(wide)
        return bool(torch.all((a == b) | (torch.isnan(a) & torch.isnan(b))))
    return False


def _show(t: torch.Tensor) -> str:
    try:
        return str((t.to(torch.complex128) if t.dtype.is_complex else t.to(torch.float64)).tolist())
    except Exception:  # noqa: BLE001 - dtypes that convert to nothing: their bytes
        return f"bytes {bits(t).tolist()}"


def _capabilities(dt: str, n: int) -> dict[int, tuple[list[torch.dtype], str]]:
    result = {}
    for index in sorted({0, n - 1}):
        try:
            claimed = torch.accelerator.get_device_capability(torch.device(dt, index))["supported_dtypes"]
            result[index] = (sorted(claimed, key=str), " (from get_device_capability())")
        except Exception as e:  # noqa: BLE001 - then the basic dtypes are checked, and the note says why
            result[index] = (list(BASIC_DTYPES), f" (get_device_capability() raised {type(e).__name__}: the basic "
                                                 "dtypes were checked)")
    return result


# decides TP-CAP-001.1
@contract("TP-CAP-001")
def test_claimed_dtypes_allocate(dt, n):
    problems = []
    for index, (dtypes, note) in _capabilities(dt, n).items():
        device = torch.device(dt, index)
        for dtype in dtypes:
            try:
                torch.empty(3, 5, dtype=dtype, device=device)
                zeros = torch.zeros(6, dtype=dtype, device=device).cpu()
            except Exception as e:  # noqa: BLE001 - collected, reported below
                problems.append(f"{dtype} on {device}{note}: {type(e).__name__}: {str(e)[:160]}")
                continue
            if not _same_values(zeros, torch.zeros(6, dtype=dtype)):
                problems.append(f"torch.zeros(6, dtype={dtype}) on {device} reads back as {_show(zeros)}")
    check("TP-CAP-001.1", not problems, lambda: "claimed dtypes cannot be allocated:\n  " + "\n  ".join(problems[:30]))


# decides TP-CAP-001.2
@contract("TP-CAP-001")
def test_claimed_dtypes_convert_on_the_device(dt, n):
    warnings.filterwarnings("ignore", message="ComplexHalf support is experimental")
    warnings.filterwarnings("ignore", message="Casting complex values to real")
    problems = []
    for index, (dtypes, note) in _capabilities(dt, n).items():
        device = torch.device(dt, index)
        for source_dtype in dtypes:
            source = torch.tensor(CONVERSION_VALUES, dtype=torch.float32)
            try:
                source = source.to(source_dtype)
            except Exception:  # noqa: BLE001 - no value can be built for it: made of zero bytes
                source = torch.zeros(len(CONVERSION_VALUES) * source_dtype.itemsize, dtype=torch.uint8).view(source_dtype)
            on_device = must(lambda: source.to(device), f"moving a {source_dtype} tensor to {device}")
            for target_dtype in dtypes:
                try:
                    got = on_device.to(target_dtype).cpu()
                except Exception as e:  # noqa: BLE001 - collected, reported below
                    problems.append(f"{source_dtype} -> {target_dtype} on {device}{note}: {type(e).__name__}: "
                                    f"{str(e).splitlines()[0][:160]}")
                    continue
                try:
                    expected = source.to(target_dtype)
                except Exception:  # noqa: BLE001 - the device converts what the CPU cannot: not this clause's
                    continue
                if not _same_values(got, expected):
                    problems.append(f"{source_dtype} -> {target_dtype} on {device}: {_show(got)}, "
                                    f"on CPU {_show(expected)}")
    check("TP-CAP-001.2", not problems,
          lambda: f"{len(problems)} conversions between claimed dtypes fail on the device (get_device_capability "
                  "documents supported dtypes as convertible to each other):\n  " + "\n  ".join(problems[:30]))


# ------------------------------------------------------------ quantized tensors

QUANTIZED = [(torch.qint8, 0.05, 3), (torch.quint8, 0.05, 128), (torch.qint32, 0.001, -7)]
QUANTIZED_IDS = ["qint8", "quint8", "qint32"]


def _quantize(x: torch.Tensor, scale: float, zero_point: int, dtype: torch.dtype, what: str) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch 2.13 deprecates quantized dtypes, on every device
        return must(lambda: torch.quantize_per_tensor(x, scale, zero_point, dtype), what)


def _quantized_inputs() -> list[tuple[str, torch.Tensor]]:
    """Float inputs from one seed: contiguous, non-contiguous, and values far
    beyond every quantized range (saturation)."""
    torch.manual_seed(6)
    return [("contiguous", torch.randn(5, 7) * 3),
            ("transposed", (torch.randn(7, 5) * 3).t()),
            ("saturating", torch.randn(4, 6) * 1e7)]


def _away_from_ties(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Where the integers of a correct quantization are unique: x / scale is
    not within 1e-3 of a rounding tie (k + 0.5), and not between 2**24 and
    2**31 in magnitude, where float32 (in which CPU computes) no longer holds
    every integer and CPU's answer is rounded (qint32 only; beyond 2**31
    every dtype saturates)."""
    scaled = x * (1.0 / scale)
    magnitude = scaled.abs()
    return (((scaled - scaled.floor()) - 0.5).abs() > 1e-3) & ((magnitude < 2 ** 24) | (magnitude > 2 ** 31))


def _same_quantized(clause: str, what: str, got: torch.Tensor, expected: torch.Tensor,
                    where: torch.Tensor | None = None) -> None:
    check(clause, got.is_quantized and got.dtype == expected.dtype,
          f"{what} is {'a quantized ' if got.is_quantized else 'a non-quantized '}{got.dtype} tensor, expected a "
          f"quantized {expected.dtype} one")
    check(clause, got.qscheme() == torch.per_tensor_affine and got.q_scale() == expected.q_scale()
          and got.q_zero_point() == expected.q_zero_point(),
          f"{what} has qscheme {got.qscheme()}, scale {got.q_scale()}, zero point {got.q_zero_point()}; expected "
          f"per_tensor_affine, {expected.q_scale()}, {expected.q_zero_point()}")
    ints = must(lambda: got.int_repr().cpu(), f"{what}: int_repr().cpu()")
    want = expected.int_repr()
    check(clause, ints.shape == want.shape, f"{what}: int_repr() has shape {tuple(ints.shape)}, expected "
                                            f"{tuple(want.shape)}")
    same = ints == want
    if where is not None:
        same |= ~where
    check(clause, bool(same.all()), lambda: f"{what}: {int((~same).sum())} of {same.numel()} integers differ from "
                                            f"CPU's (for example {ints[~same][:4].tolist()} instead of "
                                            f"{want[~same][:4].tolist()})")


# decides TP-QUANT-001.1
@contract("TP-QUANT-001")
@pytest.mark.parametrize("dtype,scale,zero_point", QUANTIZED, ids=QUANTIZED_IDS)
def test_quantize_per_tensor_matches_cpu(dtype, scale, zero_point, dt, n):
    device = torch.device(dt, n - 1)
    for label, x in _quantized_inputs():
        what = f"torch.quantize_per_tensor({label} input on {device}, {scale}, {zero_point}, {dtype})"
        expected = _quantize(x, scale, zero_point, dtype, "torch.quantize_per_tensor on the CPU")
        got = _quantize(x.to(device), scale, zero_point, dtype, what)
        check("TP-QUANT-001.1", got.device == device, f"{what} returned a tensor on {got.device}")
        _same_quantized("TP-QUANT-001.1", what, got, expected, _away_from_ties(x, scale))
        back = must(lambda: got.dequantize(), f"dequantize() of {what}")
        check("TP-QUANT-001.1", back.device == device and back.dtype == torch.float32,
              f"dequantize() of {what} is a {back.dtype} tensor on {back.device}, expected float32 on {device}")
        # From the device's own integers: a rounding tie decided the other
        # way must not count twice.
        ints = got.int_repr().cpu().to(torch.float32)
        want = (ints - zero_point) * scale
        back = back.cpu()
        check("TP-QUANT-001.1", torch.allclose(back, want, rtol=1e-6, atol=1e-6 * scale),
              lambda: f"dequantize() of {what} differs from (int_repr - zero_point) * scale by up to "
                      f"{(back - want).abs().max().item():.3g}")


# decides TP-QUANT-001.2
@contract("TP-QUANT-001")
@pytest.mark.parametrize("dtype,scale,zero_point", QUANTIZED, ids=QUANTIZED_IDS)
def test_quantized_tensors_copy_and_serialize(dtype, scale, zero_point, dt, n, tmp_path):
    device = torch.device(dt, n - 1)
    clause = "TP-QUANT-001.2"
    _, x = _quantized_inputs()[0]
    expected = _quantize(x, scale, zero_point, dtype, "torch.quantize_per_tensor on the CPU")
    uploaded = must(lambda: expected.to(device), f"a quantized {dtype} CPU tensor .to({device})")
    check(clause, uploaded.device == device, f"a quantized CPU tensor .to({device}) is on {uploaded.device}")
    _same_quantized(clause, f"a quantized {dtype} CPU tensor .to({device})", uploaded, expected)
    # The rest starts from CPU's integers, so that a quantization kernel's
    # fault stays clause 1's.
    got = uploaded
    downloaded = must(lambda: got.cpu(), f"a quantized {dtype} {device} tensor .cpu()")
    check(clause, downloaded.device.type == "cpu", f".cpu() of a quantized tensor is on {downloaded.device}")
    _same_quantized(clause, f"a quantized {dtype} {device} tensor .cpu()", downloaded, expected)
    _same_quantized(clause, f"clone() of a quantized {dtype} {device} tensor",
                    must(lambda: got.clone(), f"clone() of a quantized {device} tensor"), expected)
    _same_quantized(clause, f"the slice [1:4, ::2] of a quantized {dtype} {device} tensor",
                    must(lambda: got[1:4, ::2], f"slicing a quantized {device} tensor"), expected[1:4, ::2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        empty = must(lambda: torch._empty_affine_quantized((2, 3), scale=scale, zero_point=zero_point, dtype=dtype,
                                                           device=device),
                     f"torch._empty_affine_quantized((2, 3), ..., dtype={dtype}, device={device})")
    check(clause, empty.is_quantized and empty.device == device and empty.dtype == dtype
          and empty.q_scale() == scale and empty.q_zero_point() == zero_point,
          f"torch._empty_affine_quantized(..., device={device}) made a {empty.dtype} tensor on {empty.device} "
          f"(quantized: {empty.is_quantized})")
    path = tmp_path / "quantized.pt"
    must(lambda: torch.save(got, path), f"torch.save of a quantized {device} tensor")
    loaded = must(lambda: torch.load(path, weights_only=False), f"torch.load of a quantized {device} tensor")
    check(clause, loaded.device == device, f"torch.load of a quantized {device} tensor gave one on {loaded.device}")
    _same_quantized(clause, f"torch.load of a quantized {dtype} {device} tensor", loaded, expected)
