"""Memory: the device allocator's statistics behind torch.accelerator.memory_*,
empty_cache and get_memory_info, pinned host memory, non_blocking copies
through pinned memory, out-of-memory, and zero-size tensors.

Statistics are observed through torch.accelerator (which reads the
backend's c10::DeviceAllocator) and compared with what the test allocated
and freed, so a backend whose counters ignore frees, whose peaks never
reset or whose counts land on the wrong device fails.
"""

from __future__ import annotations

import pytest
import torch

from ._helpers import must, must_raise, require_allocator

contract = pytest.mark.contract

MiB = 1 << 20
A = torch.accelerator

FAMILIES = ("allocation", "allocated_bytes", "segment", "reserved_bytes", "active", "active_bytes",
            "inactive_split", "inactive_split_bytes")
POOLS = ("all", "large_pool", "small_pool")
METRICS = ("current", "peak", "allocated", "freed")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


def block(nbytes: int, device: str) -> torch.Tensor:
    t = must(lambda: torch.empty(nbytes, dtype=torch.uint8, device=device),
             f"allocating {nbytes} bytes on {device}")
    return t


def counters(index: int) -> dict[str, int]:
    return {
        "memory_allocated": must(lambda: A.memory_allocated(index), f"torch.accelerator.memory_allocated({index})"),
        "max_memory_allocated": must(lambda: A.max_memory_allocated(index),
                                     f"torch.accelerator.max_memory_allocated({index})"),
        "memory_reserved": must(lambda: A.memory_reserved(index), f"torch.accelerator.memory_reserved({index})"),
        "max_memory_reserved": must(lambda: A.max_memory_reserved(index),
                                    f"torch.accelerator.max_memory_reserved({index})"),
    }


def settle(dt: str, index: int) -> dict[str, int]:
    """Initialize the allocator on device `index`, free everything, return the baseline."""
    probe = block(MiB, f"{dt}:{index}")
    del probe
    must(A.empty_cache, "torch.accelerator.empty_cache()")
    return counters(index)


# ------------------------------------------------------------- statistics


@contract("MM-STAT-001")
def test_counters_track_allocations_and_frees(dt, mod):
    base = settle(dt, 0)
    x = block(4 * MiB, dt)
    after_x = counters(0)
    grew = after_x["memory_allocated"] - base["memory_allocated"]
    assert 4 * MiB <= grew <= 10 * MiB, (
        f"memory_allocated() grew by {grew} bytes after allocating a 4 MiB tensor "
        f"(from {base['memory_allocated']} to {after_x['memory_allocated']})")
    assert after_x["memory_reserved"] >= after_x["memory_allocated"], \
        f"memory_reserved() < memory_allocated() with a live tensor: {after_x}"
    assert after_x["max_memory_allocated"] >= after_x["memory_allocated"], f"peak below current: {after_x}"
    assert after_x["max_memory_reserved"] >= after_x["memory_reserved"], f"peak below current: {after_x}"

    y = block(2 * MiB, dt)
    after_y = counters(0)
    assert after_y["memory_allocated"] >= after_x["memory_allocated"] + 2 * MiB, \
        f"memory_allocated() did not grow by 2 MiB for a second tensor: {after_x} -> {after_y}"
    peak = after_y["max_memory_allocated"]
    assert peak >= after_y["memory_allocated"], f"peak below current: {after_y}"

    del x
    after_free = counters(0)
    assert after_free["memory_allocated"] <= after_y["memory_allocated"] - 4 * MiB, (
        f"memory_allocated() went from {after_y['memory_allocated']} to {after_free['memory_allocated']} "
        f"when a 4 MiB tensor was freed: the statistics ignore frees")
    assert after_free["max_memory_allocated"] >= peak, \
        f"freeing a tensor lowered max_memory_allocated() from {peak} to {after_free['max_memory_allocated']}"

    must(lambda: A.reset_peak_memory_stats(0), "torch.accelerator.reset_peak_memory_stats(0)")
    reset = counters(0)
    assert reset["max_memory_allocated"] == reset["memory_allocated"], (
        f"after reset_peak_memory_stats(), max_memory_allocated() is {reset['max_memory_allocated']} but "
        f"memory_allocated() is {reset['memory_allocated']}: the peak must restart from the current value")
    assert reset["max_memory_reserved"] == reset["memory_reserved"], (
        f"after reset_peak_memory_stats(), max_memory_reserved() is {reset['max_memory_reserved']} but "
        f"memory_reserved() is {reset['memory_reserved']}")
    z = block(MiB, dt)
    with_z = counters(0)
    del z
    assert counters(0)["max_memory_allocated"] >= with_z["memory_allocated"] >= reset["memory_allocated"] + MiB, \
        f"the peak did not follow a new allocation after reset_peak_memory_stats(): {reset} -> {with_z}"

    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        if callable(getattr(mod, name, None)):
            theirs = must(lambda: getattr(mod, name)(0), f"the module's {name}(0)")
            ours = counters(0)[name]
            assert theirs == ours, f"the module's {name}(0) is {theirs}, torch.accelerator.{name}(0) is {ours}"

    del y
    final = counters(0)
    assert final["memory_allocated"] == base["memory_allocated"], (
        f"after freeing every tensor, memory_allocated() is {final['memory_allocated']}, not back to "
        f"{base['memory_allocated']}")
    must(A.empty_cache, "torch.accelerator.empty_cache()")
    emptied = counters(0)
    assert emptied["memory_reserved"] <= base["memory_reserved"], (
        f"after freeing every tensor and empty_cache(), memory_reserved() is {emptied['memory_reserved']}, "
        f"more than the {base['memory_reserved']} reserved before: empty_cache does not release cached memory")


@contract("MM-STAT-001")
def test_counters_are_per_device(dt, mod, n, two_devices):
    last = n - 1
    base = {i: settle(dt, i) for i in (0, last)}
    mod.set_device(0)
    x = block(4 * MiB, f"{dt}:{last}")
    grew = {i: counters(i)["memory_allocated"] - base[i]["memory_allocated"] for i in (0, last)}
    assert grew[last] >= 4 * MiB and grew[0] == 0, (
        f"with device 0 current, allocating 4 MiB on device {last} changed memory_allocated() by "
        f"{grew}: the statistics must count on the tensor's device")
    A.reset_peak_memory_stats(0)
    assert counters(last)["max_memory_allocated"] >= base[last]["memory_allocated"] + 4 * MiB, \
        f"reset_peak_memory_stats(0) reset device {last}'s peak"
    del x
    assert counters(last)["memory_allocated"] == base[last]["memory_allocated"], \
        f"freeing the tensor of device {last} did not lower its memory_allocated()"


@contract("MM-STAT-002")
@pytest.mark.zero_devices_ok
def test_memory_functions_before_initialization(mod, n, cxx):
    if callable(getattr(mod, "is_initialized", None)) and mod.is_initialized():
        pytest.skip("the backend was initialized before the test started")
    must(A.empty_cache, "torch.accelerator.empty_cache() before the backend was initialized")
    if callable(getattr(mod, "empty_cache", None)):
        must(mod.empty_cache, "the module's empty_cache() before the backend was initialized")
    stats = must(A.memory_stats, "torch.accelerator.memory_stats() before the backend was initialized")
    nonzero = {k: v for k, v in stats.items() if v}
    assert not nonzero, f"before any allocation, memory_stats() reports {nonzero}"
    assert must(A.memory_allocated, "torch.accelerator.memory_allocated()") == 0
    assert not (callable(getattr(mod, "is_initialized", None)) and mod.is_initialized()), \
        "empty_cache()/memory_stats() initialized the backend; before initialization they must be no-ops"
    contexts = [i for i in range(n) if cxx.hooks_has_primary_context(i)]
    assert not contexts, f"empty_cache()/memory_stats() created a context on device(s) {contexts}"


@contract("MM-STAT-002")
def test_memory_stats_keys_and_consistency(dt, mod):
    x = block(3 * MiB, dt)
    small = block(1000, dt)
    del small
    stats = must(A.memory_stats, "torch.accelerator.memory_stats()")
    expected = [f"{f}.{p}.{m}" for f in FAMILIES for p in POOLS for m in METRICS] + list(COUNTERS)
    missing = [k for k in expected if k not in stats]
    assert not missing, (f"memory_stats() lacks documented keys {missing[:8]}{'...' if len(missing) > 8 else ''} "
                         f"(the registered allocator must be a c10::DeviceAllocator)")
    bad = {k: v for k, v in stats.items() if not isinstance(v, int) or v < 0}
    assert not bad, f"memory_stats() values must be non-negative integers: {bad}"
    for f in FAMILIES:
        for m in ("current", "allocated", "freed"):
            total = stats[f"{f}.all.{m}"]
            parts = stats[f"{f}.large_pool.{m}"] + stats[f"{f}.small_pool.{m}"]
            assert total == parts, f"memory_stats(): {f}.all.{m} = {total} but large + small pools = {parts}"
        for p in POOLS:
            key = f"{f}.{p}"
            assert stats[f"{key}.allocated"] - stats[f"{key}.freed"] == stats[f"{key}.current"], (
                f"memory_stats(): {key}.allocated - {key}.freed != {key}.current "
                f"({stats[f'{key}.allocated']} - {stats[f'{key}.freed']} != {stats[f'{key}.current']})")
            assert stats[f"{key}.peak"] >= stats[f"{key}.current"], f"memory_stats(): {key}.peak < current"
    assert stats["allocated_bytes.all.current"] == A.memory_allocated(), \
        "memory_stats()['allocated_bytes.all.current'] differs from memory_allocated()"
    assert stats["allocation.all.current"] >= 1 and stats["allocated_bytes.all.current"] >= 3 * MiB, \
        f"memory_stats() does not count a live 3 MiB tensor: {stats['allocation.all.current']} allocations, " \
        f"{stats['allocated_bytes.all.current']} bytes"
    assert stats["allocated_bytes.all.freed"] >= 1000, \
        "memory_stats()['allocated_bytes.all.freed'] does not count a freed tensor"
    assert stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"], \
        "memory_stats(): reserved_bytes.all.current < allocated_bytes.all.current"
    assert stats["segment.all.current"] >= 1, "memory_stats(): no segment while a tensor is live"

    count = stats["allocation.all.current"]
    y = block(MiB, dt)
    assert A.memory_stats()["allocation.all.current"] == count + 1, \
        "memory_stats()['allocation.all.current'] did not count one more allocation"
    del y
    assert A.memory_stats()["allocation.all.current"] == count, \
        "memory_stats()['allocation.all.current'] did not count a free"

    if callable(getattr(mod, "memory_stats", None)):
        theirs = dict(must(mod.memory_stats, "the module's memory_stats()"))
        ours = dict(A.memory_stats())
        assert theirs == ours, "the module's memory_stats() differs from torch.accelerator.memory_stats()"

    current = A.memory_stats()["allocated_bytes.all.current"]
    must(A.reset_accumulated_memory_stats, "torch.accelerator.reset_accumulated_memory_stats()")
    stats = A.memory_stats()
    left = {k: stats[k] for k in stats
            if k.endswith((".allocated", ".freed")) and k.split(".")[0] in FAMILIES and stats[k]}
    left.update({k: stats[k] for k in ("num_device_alloc", "num_device_free", "num_ooms") if stats[k]})
    assert not left, f"reset_accumulated_memory_stats() left accumulated counters {left}"
    assert stats["allocated_bytes.all.current"] == current, \
        "reset_accumulated_memory_stats() changed allocated_bytes.all.current"
    del x
    must(A.empty_cache, "torch.accelerator.empty_cache() after initialization")
    if callable(getattr(mod, "empty_cache", None)):
        must(mod.empty_cache, "the module's empty_cache() after initialization")


@contract("MM-STAT-002")
def test_get_memory_info(dt, mod):
    block(MiB, dt)
    info = must(A.get_memory_info, "torch.accelerator.get_memory_info()")
    assert isinstance(info, tuple) and len(info) == 2, f"get_memory_info() returned {info!r}, not (free, total)"
    free, total = info
    assert isinstance(free, int) and isinstance(total, int), f"get_memory_info() returned {info!r}"
    assert total > 0 and 0 <= free <= total, f"get_memory_info() returned free={free}, total={total}"
    reserved = A.memory_reserved()
    x = block(64 * MiB, dt)
    x.fill_(1)
    grown = A.memory_reserved() - reserved
    free_after, total_after = A.get_memory_info()
    assert total_after == total, f"get_memory_info() total changed from {total} to {total_after}"
    if grown >= 64 * MiB:
        assert free - free_after >= 32 * MiB, (
            f"reserving {grown} more bytes lowered get_memory_info()'s free memory by only {free - free_after} "
            f"bytes: free must reflect the device's memory")
    del x
    if callable(getattr(mod, "mem_get_info", None)):
        theirs = must(lambda: mod.mem_get_info(0), "the module's mem_get_info(0)")
        assert tuple(theirs)[1] == total, f"the module's mem_get_info(0) total {theirs} differs from {total}"


# ----------------------------------------------------------------- pinned


@contract("MM-PIN-001")
def test_pin_memory(dt):
    x = torch.arange(4096, dtype=torch.float32)
    assert not x.is_pinned(), "a plain CPU tensor reports is_pinned() True"
    p = must(x.pin_memory, "Tensor.pin_memory()")
    assert p.device.type == "cpu", f"pin_memory() returned a tensor on {p.device}"
    assert p.is_pinned(), "t.pin_memory().is_pinned() is False"
    assert p.data_ptr() != x.data_ptr(), "pin_memory() of a pageable tensor returned the same memory"
    assert torch.equal(p, x), "pin_memory() changed the values"
    assert p[1000:].is_pinned(), "a view into pinned memory (interior pointer) reports is_pinned() False"
    assert not x.is_pinned(), "pin_memory() made the source tensor pinned"
    for label, make in (("torch.empty(pin_memory=True)", lambda: torch.empty(1000, pin_memory=True)),
                        ("torch.zeros(pin_memory=True)", lambda: torch.zeros(1000, pin_memory=True)),
                        ("torch.tensor(pin_memory=True)", lambda: torch.tensor([1.0, 2.0], pin_memory=True)),
                        ("torch.empty(16 MiB, pin_memory=True)",
                         lambda: torch.empty(16 * MiB, dtype=torch.uint8, pin_memory=True))):
        t = must(make, label)
        assert t.device.type == "cpu" and t.is_pinned(), f"{label} is not pinned"
    assert torch.zeros(1000, pin_memory=True).sum().item() == 0, "torch.zeros(pin_memory=True) is not zero"
    d = torch.ones(16, device=dt)
    assert not d.is_pinned(), "a device tensor reports is_pinned() True"


@contract("MM-PIN-001")
@pytest.mark.parametrize("workers", [0, 1])
def test_dataloader_pins_batches(dt, workers):
    data = torch.arange(64, dtype=torch.float32).view(32, 2)
    dataset = torch.utils.data.TensorDataset(data)
    kwargs = {"multiprocessing_context": "fork"} if workers else {}
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, pin_memory=True, num_workers=workers, **kwargs)
    batches = must(lambda: list(loader), f"iterating DataLoader(pin_memory=True, num_workers={workers})")
    assert len(batches) == 4
    for i, (batch,) in enumerate(batches):
        assert batch.is_pinned(), f"DataLoader(pin_memory=True, num_workers={workers}) yielded an unpinned batch"
        assert torch.equal(batch, data[8 * i: 8 * i + 8]), "a pinned batch has the wrong values"


# ----------------------------------------------------------------- copies

N = 1 << 22  # floats per copy (16 MiB): large enough for queued work to be observable


def keep_busy(dt: str) -> None:
    """Queue device work so that what follows waits behind it on the current
    stream: device-to-device copies, asynchronous on every accelerator."""
    a = torch.empty(N, device=dt)
    b = torch.empty(N, device=dt)
    for _ in range(3):
        b.copy_(a)
        a.copy_(b)


@contract("MM-COPY-001")
def test_non_blocking_host_to_device(dt):
    expected = torch.arange(N, dtype=torch.float32)
    src = expected.pin_memory()
    keep_busy(dt)
    dst = must(lambda: src.to(dt, non_blocking=True), "pinned.to(device, non_blocking=True)")
    must(A.synchronize, "torch.accelerator.synchronize()")
    assert dst.device.type == dt
    assert torch.equal(dst.cpu(), expected), "a non_blocking copy from pinned memory differs from the source"
    assert torch.equal(src.to(dt).cpu(), expected), "a blocking copy from pinned memory differs from the source"

    # The idiom x.pin_memory().to(device, non_blocking=True) frees the pinned
    # buffer at once: its memory must not be reused before the copy ran.
    keep_busy(dt)
    dst = expected.pin_memory().to(dt, non_blocking=True)
    reuse = torch.empty(N, dtype=torch.float32, pin_memory=True)
    reuse.fill_(-7.0)
    A.synchronize()
    assert torch.equal(dst.cpu(), expected), (
        "a non_blocking copy from a pinned tensor that was freed right after the call read overwritten memory: "
        "the pinned allocator must keep the block until the queued copy has run (record an event)")


@contract("MM-COPY-001")
def test_non_blocking_device_to_host(dt):
    expected = torch.arange(N, dtype=torch.float32) * 2 + 1
    src = torch.arange(N, dtype=torch.float32).to(dt)
    out = torch.full((N,), -1.0, pin_memory=True)
    keep_busy(dt)
    computed = src * 2 + 1
    must(lambda: out.copy_(computed, non_blocking=True), "pinned.copy_(device tensor, non_blocking=True)")
    must(A.synchronize, "torch.accelerator.synchronize()")
    assert torch.equal(out, expected), \
        "after synchronize(), a non_blocking device-to-pinned copy does not hold the device values"
    assert torch.equal(computed.cpu(), expected), "a blocking device-to-host copy differs"

    keep_busy(dt)
    moved = must(lambda: (src * 2 + 1).to("cpu", non_blocking=True), "device.to('cpu', non_blocking=True)")
    # The device temporary is freed at once; new work may reuse its memory.
    overwrite = torch.full((N,), -3.0, device=dt)
    must(A.synchronize, "torch.accelerator.synchronize()")
    assert moved.device.type == "cpu"
    assert torch.equal(moved, expected), (
        "a non_blocking device-to-host copy of a tensor freed right after the call differs once synchronized: "
        "the copy must run before the freed memory is reused (stream-ordered reuse)")
    del overwrite


# ------------------------------------------------------------------- OOM


@contract("MM-OOM-001")
def test_out_of_memory_is_an_error_and_recoverable(dt, mod):
    warmup = block(MiB, dt)
    del warmup
    ooms = A.memory_stats().get("num_ooms", 0)
    before = A.memory_allocated()

    def absurd():
        return torch.empty(1 << 50, dtype=torch.uint8, device=dt)

    must_raise(absurd, "allocating 2**50 bytes on the device", torch.OutOfMemoryError)
    free, total = must(A.get_memory_info, "torch.accelerator.get_memory_info()")
    must_raise(lambda: torch.empty(total + 1, dtype=torch.uint8, device=dt),
               f"allocating total+1 = {total + 1} bytes (get_memory_info total)", torch.OutOfMemoryError)

    # Grow until the device is full (bounded by 4x the reported total).
    chunk = max(total // 8, MiB)
    held = []
    error = None
    while len(held) * chunk <= 4 * total:
        try:
            held.append(torch.empty(chunk, dtype=torch.uint8, device=dt))
        except torch.OutOfMemoryError as e:
            error = e
            break
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"filling the device raised {type(e).__name__} instead of torch.OutOfMemoryError: {e}",
                        pytrace=False)
    assert error is not None, (f"allocated {len(held)} x {chunk} bytes (4x the reported total of {total}) "
                               f"without torch.OutOfMemoryError")
    assert A.memory_allocated() >= before + len(held) * chunk, \
        "memory_allocated() does not count the blocks that filled the device"
    stats = A.memory_stats()
    assert stats.get("num_ooms", 0) >= ooms + 3, \
        f"memory_stats()['num_ooms'] went from {ooms} to {stats.get('num_ooms')} after three OOM errors"
    del held
    assert A.memory_allocated() == before, \
        f"after the OOMs and freeing every block, memory_allocated() is {A.memory_allocated()}, not {before}"
    must(A.empty_cache, "torch.accelerator.empty_cache() after out-of-memory")

    # The device still works.
    x = must(lambda: torch.arange(1000, dtype=torch.float32, device=dt), "allocating after out-of-memory")
    y = must(lambda: (x * 2 + 1).cpu(), "computing and copying back after out-of-memory")
    assert torch.equal(y, torch.arange(1000, dtype=torch.float32) * 2 + 1), "wrong results after out-of-memory"
    again = must(lambda: torch.empty(chunk, dtype=torch.uint8, device=dt),
                 "allocating one of the freed chunks again after out-of-memory")
    del again
    must_raise(absurd, "allocating 2**50 bytes a second time", torch.OutOfMemoryError)
    must(A.synchronize, "torch.accelerator.synchronize() after out-of-memory")


# ------------------------------------------------------------- zero size


@contract("MM-ZERO-001")
def test_zero_size_tensors(dt, n, cxx):
    empty = must(lambda: torch.empty(0, device=dt), "torch.empty(0, device)")
    assert empty.device.type == dt and empty.numel() == 0
    shapes = [(0,), (0, 3), (3, 0), (2, 0, 4)]
    for shape in shapes:
        t = must(lambda: torch.zeros(shape, device=dt), f"torch.zeros({shape}, device)")
        assert t.shape == shape and t.device.type == dt
        assert must(lambda: t.cpu(), f"copying a {shape} tensor to the CPU").shape == shape
        assert must(lambda: (t + 1).shape, f"adding to a {shape} tensor") == shape
    host = torch.empty(0, 5)
    moved = must(lambda: host.to(dt), "copying a (0, 5) CPU tensor to the device")
    assert moved.shape == (0, 5) and moved.device.type == dt
    assert must(lambda: moved.clone().shape, "cloning a zero-size device tensor") == (0, 5)
    total = must(lambda: torch.zeros(0, device=dt).sum().item(), "summing a zero-size device tensor")
    assert total == 0, f"the sum of an empty device tensor is {total}"
    full = torch.arange(6.0, device=dt)
    view = full[3:3]
    assert view.numel() == 0 and view.device == full.device, "an empty slice of a device tensor is wrong"
    joined = must(lambda: torch.cat([torch.empty(0, device=dt), full, view]), "torch.cat with zero-size parts")
    assert torch.equal(joined.cpu(), torch.arange(6.0)), "torch.cat with zero-size parts changed the values"
    target = torch.empty(0, device=dt)
    must(lambda: target.copy_(torch.empty(0)), "copy_ of a zero-size CPU tensor into a zero-size device tensor")
    require_allocator(cxx)
    storage = must(lambda: torch.UntypedStorage(0, device=dt), "torch.UntypedStorage(0, device)")
    assert storage.nbytes() == 0 and storage.device.type == dt
    grown = torch.empty(0, device=dt)
    must(lambda: grown.resize_(10).fill_(2.0), "resizing a zero-size device tensor to 10 and filling it")
    assert torch.equal(grown.cpu(), torch.full((10,), 2.0)), "a zero-size tensor resized to 10 holds wrong values"
    must(lambda: grown.resize_(0), "resizing a device tensor back to 0")
    if n > 1:
        last = torch.empty(0, device=f"{dt}:{n - 1}")
        assert last.device == torch.device(dt, n - 1), f"torch.empty(0, device='{dt}:{n - 1}') is on {last.device}"
        assert last.untyped_storage().device == torch.device(dt, n - 1), \
            f"the storage of torch.empty(0, device='{dt}:{n - 1}') is on {last.untyped_storage().device}"
