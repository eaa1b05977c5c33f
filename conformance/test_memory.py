"""Memory: the device allocator's statistics behind torch.accelerator.memory_*,
empty_cache and get_memory_info, pinned host memory, non_blocking copies
(through pinned and pageable memory, with and without a dtype conversion),
out-of-memory, and zero-size tensors.

Statistics are observed through torch.accelerator (which reads the
backend's c10::DeviceAllocator) and compared with what the test allocated
and freed, at odd sizes so that no size class hides a miscount: a backend
whose counters ignore frees, subtract another size than they added, never
reset their peaks or count on the wrong device fails. How a backend rounds or
pools its memory, or whether it keeps per-pool (large/small) statistics at
all, is its own choice.
"""

from __future__ import annotations

import threading

import pytest
import torch

from privateuse1_conformance.harness.evidence import not_applicable

from ._async import RELEASE_DELAY, SCALES, Load, hold, new_stream, unobserved, waited
from ._helpers import check, inconclusive, initialized_by, must, must_raise, require_allocator, scope, spellings

contract = pytest.mark.contract

MiB = 1 << 20
A = torch.accelerator

FAMILIES = ("allocation", "allocated_bytes", "segment", "reserved_bytes", "active", "active_bytes",
            "inactive_split", "inactive_split_bytes")
POOLS = ("all", "large_pool", "small_pool")
METRICS = ("current", "peak", "allocated", "freed")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")
# Sizes in bytes that are no multiple of any plausible size class.
ODD_SIZES = (1, 3, 1000, 4097, 12 + 2 * MiB + 5)


def block(nbytes: int, device: str) -> torch.Tensor:
    return must(lambda: torch.empty(nbytes, dtype=torch.uint8, device=device), f"allocating {nbytes} bytes on {device}")


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
def test_allocations_of_odd_sizes_are_counted_and_uncounted_exactly(dt):
    base = settle(dt, 0)
    for nbytes in ODD_SIZES:
        before = counters(0)["memory_allocated"]
        with scope("MM-STAT-001.1"):
            x = block(nbytes, dt)
            during = counters(0)["memory_allocated"]
        check("MM-STAT-001.1", during >= before + nbytes,
              f"allocating {nbytes} bytes raised memory_allocated() from {before} only to {during}")
        del x
        after = counters(0)["memory_allocated"]
        check("MM-STAT-001.1", after == before,
              f"after allocating and freeing {nbytes} bytes, memory_allocated() is {after}, not back to {before}: the "
              f"free subtracted another amount than the allocation added ({during - before})")
    # Interleaved: freed in another order than allocated.
    blocks = [block(nbytes, dt) for nbytes in ODD_SIZES]
    grown = counters(0)["memory_allocated"] - base["memory_allocated"]
    check("MM-STAT-001.1", grown >= sum(ODD_SIZES), f"{len(blocks)} live blocks of {sum(ODD_SIZES)} bytes raised "
                                                    f"memory_allocated() by only {grown}")
    for index in (2, 0, 4, 1, 3):
        blocks[index] = None
    check("MM-STAT-001.1", counters(0)["memory_allocated"] == base["memory_allocated"],
          f"after freeing every block (in another order), memory_allocated() is {counters(0)['memory_allocated']}, "
          f"not back to {base['memory_allocated']}")
    # Tensors of few elements (3 floats) and their views.
    x = must(lambda: torch.ones(3, device=dt), "torch.ones(3)")
    view = x[1:]
    del x
    check("MM-STAT-001.1", counters(0)["memory_allocated"] > base["memory_allocated"],
          "a view keeps its storage alive, but memory_allocated() dropped when its base was freed")
    del view
    check("MM-STAT-001.1", counters(0)["memory_allocated"] == base["memory_allocated"],
          "after a view of 3 floats and its base are freed, memory_allocated() is not back to its value before")


@contract("MM-STAT-001")
def test_peaks_reserved_memory_and_empty_cache(dt, mod):
    base = settle(dt, 0)
    x = block(4 * MiB + 3, dt)
    after_x = counters(0)
    check("MM-STAT-001.3", after_x["memory_reserved"] >= after_x["memory_allocated"],
          f"memory_reserved() < memory_allocated() with a live tensor: {after_x}")
    check("MM-STAT-001.2", after_x["max_memory_allocated"] >= after_x["memory_allocated"], f"peak below current: {after_x}")
    check("MM-STAT-001.3", after_x["max_memory_reserved"] >= after_x["memory_reserved"], f"peak below current: {after_x}")
    y = block(2 * MiB + 1, dt)
    peak = counters(0)["max_memory_allocated"]
    del x
    after_free = counters(0)
    check("MM-STAT-001.2", after_free["max_memory_allocated"] >= peak,
          f"freeing a tensor lowered max_memory_allocated() from {peak} to {after_free['max_memory_allocated']}")

    with scope("MM-STAT-001.2"):
        must(lambda: A.reset_peak_memory_stats(0), "torch.accelerator.reset_peak_memory_stats(0)")
    reset = counters(0)
    check("MM-STAT-001.2", reset["max_memory_allocated"] == reset["memory_allocated"],
          f"after reset_peak_memory_stats(), max_memory_allocated() is {reset['max_memory_allocated']} but "
          f"memory_allocated() is {reset['memory_allocated']}: the peak must restart from the current value")
    check("MM-STAT-001.3", reset["max_memory_reserved"] == reset["memory_reserved"],
          f"after reset_peak_memory_stats(), max_memory_reserved() is {reset['max_memory_reserved']} but "
          f"memory_reserved() is {reset['memory_reserved']}")
    z = block(MiB + 7, dt)
    with_z = counters(0)
    del z
    check("MM-STAT-001.2", counters(0)["max_memory_allocated"] >= with_z["memory_allocated"]
          >= reset["memory_allocated"] + MiB, f"the peak did not follow a new allocation after reset: {reset} -> {with_z}")

    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        if callable(getattr(mod, name, None)):
            with scope("MM-STAT-001.5"):
                theirs = must(lambda: getattr(mod, name)(0), f"the module's {name}(0)")
            ours = counters(0)[name]
            check("MM-STAT-001.5", theirs == ours,
                  f"the module's {name}(0) is {theirs}, torch.accelerator.{name}(0) is {ours}")

    del y
    check("MM-STAT-001.1", counters(0)["memory_allocated"] == base["memory_allocated"],
          f"after freeing every tensor, memory_allocated() is {counters(0)['memory_allocated']}, not back to "
          f"{base['memory_allocated']}")
    with scope("MM-STAT-001.4"):
        must(A.empty_cache, "torch.accelerator.empty_cache()")
    emptied = counters(0)
    check("MM-STAT-001.4", emptied["memory_reserved"] <= base["memory_reserved"],
          f"after freeing every tensor and empty_cache(), memory_reserved() is {emptied['memory_reserved']}, more than "
          f"the {base['memory_reserved']} reserved before: empty_cache does not release cached memory")


@contract("MM-STAT-001")
@pytest.mark.requires("multi-device")
def test_counters_are_per_device(dt, mod, n, two_devices):
    last = n - 1
    base = {i: settle(dt, i) for i in (0, last)}
    mod.set_device(0)
    x = block(4 * MiB + 1, f"{dt}:{last}")
    grew = {i: counters(i)["memory_allocated"] - base[i]["memory_allocated"] for i in (0, last)}
    check("MM-STAT-001.6", grew[last] >= 4 * MiB and grew[0] == 0,
          f"with device 0 current, allocating 4 MiB on device {last} changed memory_allocated() by {grew}: the "
          "statistics must count on the tensor's device")
    A.reset_peak_memory_stats(0)
    check("MM-STAT-001.6", counters(last)["max_memory_allocated"] >= base[last]["memory_allocated"] + 4 * MiB,
          f"reset_peak_memory_stats(0) reset device {last}'s peak")
    del x
    check("MM-STAT-001.6", counters(last)["memory_allocated"] == base[last]["memory_allocated"],
          f"freeing the tensor of device {last} did not return its memory_allocated() to its value before")


@contract("MM-STAT-002")
@pytest.mark.zero_devices_ok
def test_memory_functions_before_initialization(mod, n, cxx):
    if callable(getattr(mod, "is_initialized", None)) and mod.is_initialized():
        inconclusive("the backend was initialized before the test started (at import): there is no state before "
                     "initialization to check", applies=False)

    def ask() -> dict:
        with scope("MM-STAT-002.3"):
            must(A.empty_cache, "torch.accelerator.empty_cache() before the backend was initialized")
            if callable(getattr(mod, "empty_cache", None)):
                must(mod.empty_cache, "the module's empty_cache() before the backend was initialized")
            stats = must(A.memory_stats, "torch.accelerator.memory_stats() before the backend was initialized")
            allocated = must(A.memory_allocated, "torch.accelerator.memory_allocated()")
        return {"stats": stats, "allocated": allocated}

    answer = initialized_by("MM-STAT-002.3", ask, "empty_cache()/memory_stats() before initialization", mod, cxx, n)
    nonzero = {k: v for k, v in answer["stats"].items() if v}
    check("MM-STAT-002.3", not nonzero and answer["allocated"] == 0,
          f"before any allocation, memory_stats() reports {nonzero} and memory_allocated() {answer['allocated']}")


@contract("MM-STAT-002")
def test_memory_stats_keys_and_consistency(dt, mod):
    x = block(3 * MiB + 5, dt)
    small = block(1000, dt)
    del small
    with scope("MM-STAT-002.1"):
        stats = must(A.memory_stats, "torch.accelerator.memory_stats()")
    expected = [f"{f}.{p}.{m}" for f in FAMILIES for p in POOLS for m in METRICS] + list(COUNTERS)
    missing = [k for k in expected if k not in stats]
    check("MM-STAT-002.1", not missing,
          f"memory_stats() lacks documented keys {missing[:8]}{'...' if len(missing) > 8 else ''} (the registered "
          "allocator must be a c10::DeviceAllocator)")
    bad = {k: v for k, v in stats.items() if not isinstance(v, int) or v < 0}
    check("MM-STAT-002.1", not bad, f"memory_stats() values must be non-negative integers: {bad}")
    for f in FAMILIES:
        for m in ("current", "allocated", "freed"):
            total = stats[f"{f}.all.{m}"]
            parts = stats[f"{f}.large_pool.{m}"] + stats[f"{f}.small_pool.{m}"]
            # Pools are optional: either they add up, or the backend keeps none.
            check("MM-STAT-002.2", parts in (total, 0),
                  f"memory_stats(): {f}.all.{m} = {total} but large + small pools = {parts} (a backend may keep "
                  "aggregate statistics only, leaving the pools at 0, but pools it keeps must add up)")
        for p in POOLS:
            key = f"{f}.{p}"
            check("MM-STAT-002.2", stats[f"{key}.allocated"] - stats[f"{key}.freed"] == stats[f"{key}.current"],
                  f"memory_stats(): {key}.allocated - {key}.freed != {key}.current ({stats[f'{key}.allocated']} - "
                  f"{stats[f'{key}.freed']} != {stats[f'{key}.current']})")
            check("MM-STAT-002.2", stats[f"{key}.peak"] >= stats[f"{key}.current"], f"memory_stats(): {key}.peak < current")
    # (memory_allocated() reads this very key: compare how the counters move instead.)
    before = A.memory_stats()
    extra = block(MiB + 3, dt)
    during = A.memory_stats()
    del extra
    after = A.memory_stats()
    grown = during["allocated_bytes.all.allocated"] - before["allocated_bytes.all.allocated"]
    freed = after["allocated_bytes.all.freed"] - during["allocated_bytes.all.freed"]
    check("MM-STAT-002.2", grown >= MiB + 3 and
          grown == during["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] == freed,
          f"memory_stats() around allocating and freeing {MiB + 3} bytes: allocated_bytes.all.allocated grew by "
          f"{grown}, .current by {during['allocated_bytes.all.current'] - before['allocated_bytes.all.current']}, "
          f".freed by {freed}: all three must move by the same amount, at least the size")
    check("MM-STAT-002.2", stats["allocation.all.current"] >= 1 and stats["allocated_bytes.all.current"] >= 3 * MiB,
          f"memory_stats() does not count a live 3 MiB tensor: {stats['allocation.all.current']} allocations, "
          f"{stats['allocated_bytes.all.current']} bytes")
    check("MM-STAT-002.2", stats["allocated_bytes.all.freed"] >= 1000,
          "memory_stats()['allocated_bytes.all.freed'] does not count a freed tensor")
    check("MM-STAT-002.2", stats["reserved_bytes.all.current"] >= stats["allocated_bytes.all.current"],
          "memory_stats(): reserved_bytes.all.current < allocated_bytes.all.current")
    count = stats["allocation.all.current"]
    y = block(MiB + 3, dt)
    check("MM-STAT-002.2", A.memory_stats()["allocation.all.current"] == count + 1,
          "memory_stats()['allocation.all.current'] did not count one more allocation")
    del y
    check("MM-STAT-002.2", A.memory_stats()["allocation.all.current"] == count,
          "memory_stats()['allocation.all.current'] did not count a free")

    if callable(getattr(mod, "memory_stats", None)):
        # Compared twice, around an allocation: a module answering from a cache agrees only the first time.
        for when in ("", " after one more allocation"):
            with scope("MM-STAT-002.1"):
                theirs = dict(must(mod.memory_stats, "the module's memory_stats()"))
            ours = dict(A.memory_stats())
            differ = {k: (theirs[k], ours[k]) for k in set(theirs) & set(ours) if theirs[k] != ours[k]}
            check("MM-STAT-002.1", not differ, f"the module's memory_stats() and torch.accelerator.memory_stats() "
                                               f"differ{when}: {dict(list(differ.items())[:6])}")
            y = block(MiB + 7, dt)
        del y

    current = A.memory_stats()["allocated_bytes.all.current"]
    with scope("MM-STAT-002.4"):
        must(A.reset_accumulated_memory_stats, "torch.accelerator.reset_accumulated_memory_stats()")
    stats = A.memory_stats()
    left = {k: stats[k] for k in stats if k.endswith((".allocated", ".freed")) and k.split(".")[0] in FAMILIES and stats[k]}
    left.update({k: stats[k] for k in ("num_device_alloc", "num_device_free", "num_ooms") if stats[k]})
    check("MM-STAT-002.4", not left, f"reset_accumulated_memory_stats() left accumulated counters {left}")
    check("MM-STAT-002.4", stats["allocated_bytes.all.current"] == current,
          "reset_accumulated_memory_stats() changed allocated_bytes.all.current")
    del x
    with scope("MM-STAT-002.3"):
        must(A.empty_cache, "torch.accelerator.empty_cache() after initialization")
        if callable(getattr(mod, "empty_cache", None)):
            must(mod.empty_cache, "the module's empty_cache() after initialization")


@contract("MM-STAT-002")
@pytest.mark.exclusive
def test_get_memory_info(dt, mod):
    block(MiB, dt)
    with scope("MM-STAT-002.5"):
        info = must(A.get_memory_info, "torch.accelerator.get_memory_info()")
    check("MM-STAT-002.5", isinstance(info, tuple) and len(info) == 2, f"get_memory_info() returned {info!r}, not "
                                                                       "(free, total)")
    free, total = info
    check("MM-STAT-002.5", isinstance(free, int) and isinstance(total, int) and total > 0 and 0 <= free <= total,
          f"get_memory_info() returned free={free}, total={total}")
    reserved = A.memory_reserved()
    x = block(64 * MiB, dt)
    x.fill_(1)
    grown = A.memory_reserved() - reserved
    free_after, total_after = A.get_memory_info()
    check("MM-STAT-002.5", total_after == total, f"get_memory_info() total changed from {total} to {total_after}")
    if grown >= 64 * MiB:
        check("MM-STAT-002.5", free - free_after >= 32 * MiB,
              f"reserving {grown} more bytes lowered get_memory_info()'s free memory by only {free - free_after} bytes: "
              "free must fall as this process reserves device memory")
    del x
    if callable(getattr(mod, "mem_get_info", None)):
        with scope("MM-STAT-002.5"):
            theirs = must(lambda: mod.mem_get_info(0), "the module's mem_get_info(0)")
        check("MM-STAT-002.5", tuple(theirs)[1] == total, f"the module's mem_get_info(0) total {theirs} differs from "
                                                          f"{total}")


# ----------------------------------------------------------------- pinned


@contract("MM-PIN-001")
def test_pin_memory(dt):
    x = torch.arange(4096, dtype=torch.float32)
    check("MM-PIN-001.1", not x.is_pinned(), "a plain CPU tensor reports is_pinned() True")
    with scope("MM-PIN-001.1"):
        p = must(x.pin_memory, "Tensor.pin_memory()")
    check("MM-PIN-001.1", p.device.type == "cpu" and p.is_pinned(), f"t.pin_memory() is on {p.device}, pinned: "
                                                                     f"{p.is_pinned()}")
    check("MM-PIN-001.1", p.data_ptr() != x.data_ptr() and torch.equal(p, x),
          "pin_memory() of a pageable tensor must copy it, keeping the values")
    check("MM-PIN-001.1", p[1000:].is_pinned(), "a view into pinned memory (interior pointer) reports is_pinned() False")
    check("MM-PIN-001.1", not x.is_pinned(), "pin_memory() made the source tensor pinned")
    for label, make in (("torch.empty(pin_memory=True)", lambda: torch.empty(1000, pin_memory=True)),
                        ("torch.zeros(pin_memory=True)", lambda: torch.zeros(1000, pin_memory=True)),
                        ("torch.tensor(pin_memory=True)", lambda: torch.tensor([1.0, 2.0], pin_memory=True)),
                        ("torch.empty(16 MiB + 3, pin_memory=True)",
                         lambda: torch.empty(16 * MiB + 3, dtype=torch.uint8, pin_memory=True))):
        with scope("MM-PIN-001.2"):
            t = must(make, label)
        check("MM-PIN-001.2", t.device.type == "cpu" and t.is_pinned(), f"{label} is not pinned")
    check("MM-PIN-001.2", torch.zeros(1000, pin_memory=True).sum().item() == 0, "torch.zeros(pin_memory=True) is not 0")
    d = torch.ones(16, device=dt)
    check("MM-PIN-001.1", not d.is_pinned(), "a device tensor reports is_pinned() True")


@contract("MM-PIN-001")
@pytest.mark.parametrize("workers", [0, 1])
def test_dataloader_pins_batches(dt, workers):
    data = torch.arange(64, dtype=torch.float32).view(32, 2)
    dataset = torch.utils.data.TensorDataset(data)
    kwargs = {"multiprocessing_context": "fork"} if workers else {}
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, pin_memory=True, num_workers=workers, **kwargs)
    with scope("MM-PIN-001.3"):
        batches = must(lambda: list(loader), f"iterating DataLoader(pin_memory=True, num_workers={workers})")
    check("MM-PIN-001.3", len(batches) == 4, f"the DataLoader yielded {len(batches)} batches, not 4")
    for i, (batch,) in enumerate(batches):
        check("MM-PIN-001.3", batch.is_pinned(), f"DataLoader(pin_memory=True, num_workers={workers}) yielded an "
                                                 "unpinned batch")
        check("MM-PIN-001.3", torch.equal(batch, data[8 * i: 8 * i + 8]), "a pinned batch has the wrong values")


# ----------------------------------------------------------------- copies

N = 1 << 22  # floats per copy (16 MiB)


class _Release:
    """Opens a hold after RELEASE_DELAY from another thread (a call that must
    read its source before returning may wait for the held stream)."""

    def __init__(self, held) -> None:
        self.timer = threading.Timer(RELEASE_DELAY, held.release)
        self.timer.daemon = True

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.timer.cancel()


@contract("MM-COPY-001")
@pytest.mark.exclusive
def test_non_blocking_host_to_device(dt, backend):
    expected = torch.arange(N, dtype=torch.float32)
    load = Load(dt, 0)
    stream = torch.accelerator.current_stream(0)
    src = expected.pin_memory()
    with hold(backend, stream, load) as held, _Release(held):
        with scope("MM-COPY-001.1"):
            dst = must(lambda: src.to(dt, non_blocking=True), "pinned.to(device, non_blocking=True)")
    must(A.synchronize, "torch.accelerator.synchronize()")
    check("MM-COPY-001.1", dst.device.type == dt and torch.equal(dst.cpu(), expected),
          "a non_blocking copy from pinned memory differs from the source once synchronized")

    # The idiom x.pin_memory().to(device, non_blocking=True) frees the pinned
    # buffer at once: its memory must not be reused before the copy ran.
    for scale in SCALES:
        with hold(backend, stream, load, scale) as held:
            with scope("MM-COPY-001.3"):
                # Returned while the work before the copy was pending (early):
                # the copy is queued while the block is reused. Returned after
                # it: the copy waited, so the reuse cannot reach it.
                dst, early = waited(lambda: must(lambda: expected.pin_memory().to(dt, non_blocking=True),
                                                 "x.pin_memory().to(device, non_blocking=True)"), held, keep=True)
                reuse = torch.empty(N, dtype=torch.float32, pin_memory=True)
                reuse.fill_(-7.0)
        A.synchronize()
        check("MM-COPY-001.3", torch.equal(dst.cpu(), expected),
              "a non_blocking copy from a pinned tensor that was freed right after the call read overwritten memory: "
              "the pinned allocator must keep the block until the queued copy has run (record an event)",
              observed=early is not None)
        if early is not None:
            break
    else:
        unobserved(backend, "MM-COPY-001.3", "a pinned source freed and reused while its copy was queued")


@contract("MM-COPY-001")
@pytest.mark.exclusive
def test_non_blocking_device_to_host(dt, backend):
    expected = torch.arange(N, dtype=torch.float32) * 2 + 1
    computed = torch.arange(N, dtype=torch.float32).to(dt) * 2 + 1
    minus3 = torch.full((N,), -3.0, device=dt)
    out = torch.full((N,), -1.0, pin_memory=True)
    load = Load(dt, 0)
    stream = torch.accelerator.current_stream(0)
    with hold(backend, stream, load) as held, _Release(held):
        with scope("MM-COPY-001.2"):
            must(lambda: out.copy_(computed, non_blocking=True), "pinned.copy_(device tensor, non_blocking=True)")
    with scope("MM-COPY-001.2"):
        must(A.synchronize, "torch.accelerator.synchronize()")
    check("MM-COPY-001.2", torch.equal(out, expected),
          "after synchronize(), a non_blocking device-to-pinned copy does not hold the device values")

    # Only copies are queued behind the hold (any other operator may be
    # synchronous on some backend and would wait for it).
    for scale in SCALES:
        with hold(backend, stream, load, scale) as held:
            with scope("MM-COPY-001.3"):
                moved, early = waited(lambda: must(lambda: computed.clone().to("cpu", non_blocking=True),
                                                   "device.clone().to('cpu', non_blocking=True)"), held, keep=True)
                # The device temporary (the clone) is freed at once; new work may reuse its memory.
                overwrite = torch.empty(N, device=dt).copy_(minus3)
        must(A.synchronize, "torch.accelerator.synchronize()")
        check("MM-COPY-001.3", moved.device.type == "cpu" and torch.equal(moved, expected),
              "a non_blocking device-to-host copy of a tensor freed right after the call differs once synchronized: "
              "the copy must run before the freed memory is reused (stream-ordered reuse)", observed=early is not None)
        del overwrite
        if early is not None:
            break
    else:
        unobserved(backend, "MM-COPY-001.3", "a device temporary freed and reused while its copy to the host was queued")


@contract("MM-COPY-001")
@pytest.mark.exclusive
def test_empty_host_cache_keeps_pinned_blocks_of_queued_copies(dt, backend):
    expected = torch.arange(N, dtype=torch.float32) - 5
    load = Load(dt, 0)
    stream = torch.accelerator.current_stream(0)
    for scale in SCALES:
        # Long work, never the gate: empty_host_cache may wait for the copy
        # while holding the interpreter's lock.
        with hold(backend, stream, load, scale, gate=False) as held:
            with scope("MM-COPY-001.4"):
                dst = must(lambda: expected.pin_memory().to(dt, non_blocking=True),
                           "x.pin_memory().to(device, non_blocking=True)")
                pending = held.pending()  # (the copy was queued behind work still running)
                must(torch.accelerator.empty_host_cache, "torch.accelerator.empty_host_cache()")
                reuse = torch.empty(N, dtype=torch.float32, pin_memory=True)
                reuse.fill_(-7.0)
        must(A.synchronize, "torch.accelerator.synchronize()")
        check("MM-COPY-001.4", torch.equal(dst.cpu(), expected),
              "a non_blocking copy from a pinned tensor freed right after the call read overwritten memory after "
              "torch.accelerator.empty_host_cache(): emptying the host cache must keep (or wait for) blocks whose "
              "queued copies have not run", observed=pending)
        if pending:
            return
    unobserved(backend, "MM-COPY-001.4", "torch.accelerator.empty_host_cache() while a copy from a freed pinned "
                                         "block was queued")


COPY_CASES = {
    "pageable to the device": ("MM-COPY-002.1", torch.float32, torch.float32),
    "pageable to the device, float64 to float32": ("MM-COPY-002.2", torch.float64, torch.float32),
    "pageable to the device, int32 to float16": ("MM-COPY-002.2", torch.int32, torch.float16),
}


@contract("MM-COPY-002")
@pytest.mark.parametrize("case", list(COPY_CASES))
@pytest.mark.exclusive
def test_non_blocking_copy_from_pageable_memory_reads_the_source_in_time(case, dt, backend):
    """The default idiom of a DataLoader without pin_memory: the host may
    overwrite (or free) the source as soon as the call has returned."""
    clause, source_dtype, target_dtype = COPY_CASES[case]
    original = (torch.arange(N) % 1000).to(source_dtype)
    expected = original.to(target_dtype)
    load = Load(dt, 0)
    stream = torch.accelerator.current_stream(0)
    for overwrite in ("overwritten", "freed"):
        for scale in SCALES:
            source = original.clone()
            with hold(backend, stream, load, scale) as held:
                with scope(clause):
                    # Returned while the work before the copy was pending: the
                    # host changes the source while the copy is queued.
                    # Returned after it: the call read the source itself.
                    dst, early = waited(lambda: must(
                        lambda: source.to(dt, dtype=target_dtype, non_blocking=True),
                        f"Tensor.to(device, dtype={target_dtype}, non_blocking=True) from pageable memory"), held, keep=True)
                if overwrite == "overwritten":
                    source.fill_(-1)
                else:
                    del source
                    garbage = torch.full((N,), -1, dtype=source_dtype)  # likely to take the freed memory
                queued = early is not None
            with scope(clause):
                must(A.synchronize, "torch.accelerator.synchronize()")
                got = dst.cpu()
            check(clause, dst.dtype == target_dtype and torch.equal(got, expected),
                  f"a non_blocking copy {case} whose source was {overwrite} right after the call returned differs from "
                  "the blocking copy once synchronized: the call must read (or stage) a pageable source before it "
                  "returns", observed=queued)
            if overwrite == "freed":
                del garbage
            if queued:
                break
        else:
            unobserved(backend, clause, f"a pageable source {overwrite} while its non_blocking copy was queued")


@contract("MM-COPY-002")
@pytest.mark.exclusive
def test_non_blocking_copy_to_pageable_memory_with_conversion(dt, backend):
    src = (torch.arange(N) % 1000).to(torch.float32).to(dt)
    expected = (torch.arange(N) % 1000).to(torch.float64)
    out = torch.full((N,), -1.0, dtype=torch.float64)
    load = Load(dt, 0)
    stream = torch.accelerator.current_stream(0)
    with hold(backend, stream, load) as held, _Release(held):
        with scope("MM-COPY-002.3"):
            must(lambda: out.copy_(src, non_blocking=True), "pageable float64.copy_(device float32, non_blocking=True)")
    with scope("MM-COPY-002.3"):
        must(A.synchronize, "torch.accelerator.synchronize()")
    check("MM-COPY-002.3", torch.equal(out, expected),
          "a non_blocking device-to-pageable copy with a dtype conversion does not hold the device values once "
          "synchronized")


# ------------------------------------------------------------------- OOM


FRACTION_CLAUSES = ("MM-FRAC-001.1", "MM-FRAC-001.2", "MM-FRAC-001.3")


@contract("MM-FRAC-001")
@pytest.mark.exclusive
def test_per_process_memory_fraction(dt, mod, n):
    set_fraction = getattr(mod, "set_per_process_memory_fraction", None)
    get_fraction = getattr(mod, "get_per_process_memory_fraction", None)
    if set_fraction is None or get_fraction is None:
        for clause in FRACTION_CLAUSES:
            not_applicable(clause, f"torch.{dt} offers no set_per_process_memory_fraction and "
                                   "get_per_process_memory_fraction: the process's memory is not limited by fraction")
        return
    last = n - 1
    try:
        with scope("MM-FRAC-001.1"):
            for i in sorted({0, last}):
                seen = must(lambda i=i: get_fraction(i), f"get_per_process_memory_fraction({i})")
                check("MM-FRAC-001.1", seen == 1.0,
                      f"get_per_process_memory_fraction({i}) is {seen!r} before any fraction was set; expected 1.0")
            for i in sorted({0, last}):
                for k, spelling in enumerate(spellings(dt, i)):
                    fraction = 0.5 + 0.125 * k + (0.0625 if i else 0.0)
                    must(lambda: set_fraction(fraction, spelling),
                         f"set_per_process_memory_fraction({fraction}, {spelling!r})")
                    seen = must(lambda: get_fraction(spelling), f"get_per_process_memory_fraction({spelling!r})")
                    check("MM-FRAC-001.1", seen == fraction,
                          f"get_per_process_memory_fraction({spelling!r}) is {seen!r} after "
                          f"set_per_process_memory_fraction({fraction}, {spelling!r})")
                if last != i:
                    other = last if i == 0 else 0
                    seen = get_fraction(other)
                    check("MM-FRAC-001.1", seen == 1.0,
                          f"setting device {i}'s fraction changed device {other}'s to {seen!r}")
                must(lambda: set_fraction(1.0, i), f"set_per_process_memory_fraction(1.0, {i})")

        device = torch.device(dt, last)
        free, total = must(lambda: A.get_memory_info(last), f"torch.accelerator.get_memory_info({last})")
        A.empty_cache()
        reserved = A.memory_reserved(last)
        fraction = min(1.0, (reserved + 64 * MiB) / total)
        if fraction >= 1.0 or free < 512 * MiB:
            for clause in ("MM-FRAC-001.2",):
                not_applicable(clause, f"device {last} has {free} bytes free of {total}: too little to set a limit "
                                       "64 MiB above what the process reserves and allocate around it")
        else:
            with scope("MM-FRAC-001.2"):
                must(lambda: set_fraction(fraction, last), f"set_per_process_memory_fraction({fraction}, {last})")
                small = must(lambda: torch.empty(16 * MiB, dtype=torch.uint8, device=device),
                             f"a 16 MiB allocation within the fraction {fraction} of device {last}")
                must_raise(lambda: torch.empty(256 * MiB, dtype=torch.uint8, device=device),
                           f"a 256 MiB allocation beyond set_per_process_memory_fraction({fraction}) (64 MiB above "
                           f"the {reserved} bytes reserved of {total})", torch.OutOfMemoryError)
                del small
                must(lambda: set_fraction(1.0, last), f"set_per_process_memory_fraction(1.0, {last})")
                big = must(lambda: torch.empty(256 * MiB, dtype=torch.uint8, device=device),
                           "a 256 MiB allocation after the fraction was set back to 1.0")
                del big

        with scope("MM-FRAC-001.3"):
            must(lambda: set_fraction(0.75, 0), "set_per_process_memory_fraction(0.75, 0)")
            for bad in (-0.5, 1.5):
                must_raise(lambda bad=bad: set_fraction(bad, 0), f"set_per_process_memory_fraction({bad}, 0)",
                           (ValueError, RuntimeError), mentions=("fraction",))
            seen = get_fraction(0)
            check("MM-FRAC-001.3", seen == 0.75,
                  f"after rejected fractions, get_per_process_memory_fraction(0) is {seen!r}, not the 0.75 set before")
    finally:
        for i in sorted({0, last}):
            try:
                set_fraction(1.0, i)
            except Exception:  # noqa: BLE001 - the checks above report it
                pass


@contract("MM-OOM-001")
@pytest.mark.exclusive
def test_out_of_memory_is_an_error_and_recoverable(dt, mod):
    warmup = block(MiB, dt)
    del warmup
    ooms = A.memory_stats().get("num_ooms", 0)
    before = A.memory_allocated()

    def absurd():
        return torch.empty(1 << 50, dtype=torch.uint8, device=dt)

    with scope("MM-OOM-001.1"):
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
            check("MM-OOM-001.1", False, f"filling the device raised {type(e).__name__} instead of "
                                         f"torch.OutOfMemoryError: {e}")
    check("MM-OOM-001.1", error is not None,
          f"allocated {len(held)} x {chunk} bytes (4x the reported total of {total}) without torch.OutOfMemoryError")
    check("MM-OOM-001.2", A.memory_allocated() >= before + len(held) * chunk,
          "memory_allocated() does not count the blocks that filled the device")
    stats = A.memory_stats()
    check("MM-OOM-001.2", stats.get("num_ooms", 0) >= ooms + 3,
          f"memory_stats()['num_ooms'] went from {ooms} to {stats.get('num_ooms')} after three OOM errors")
    fitted = len(held)
    del held
    check("MM-OOM-001.3", A.memory_allocated() == before,
          f"after the OOMs and freeing every block, memory_allocated() is {A.memory_allocated()}, not {before}")
    # The freed chunks may sit in the allocator's cache; a block of another
    # size that the device certainly holds (three chunks fitted at once) must
    # be served without empty_cache(): the allocator gives its cache back and
    # retries before it raises (as CUDA's does).
    if fitted >= 3:
        larger = 2 * chunk + 4097
        with scope("MM-OOM-001.4"):
            try:
                bigger = torch.empty(larger, dtype=torch.uint8, device=dt)
            except torch.OutOfMemoryError as e:
                check("MM-OOM-001.4", False,
                      f"after {fitted} blocks of {chunk} bytes were allocated at once and freed, allocating {larger} "
                      f"bytes (without empty_cache) raised torch.OutOfMemoryError: the allocator must give its cached "
                      f"blocks back and retry by itself before it raises: {e}")
            except Exception as e:  # noqa: BLE001
                check("MM-OOM-001.4", False, f"allocating {larger} bytes after freeing the blocks that filled the "
                                             f"device raised {type(e).__name__}: {e}")
            check("MM-OOM-001.4", bigger.numel() == larger, f"an allocation of {larger} bytes has {bigger.numel()}")
            del bigger
    else:
        not_applicable("MM-OOM-001.4", f"only {fitted} chunks of {chunk} bytes fitted on the device at once: no "
                                       f"block of another size is known to fit after freeing them")
    with scope("MM-OOM-001.3"):
        must(A.empty_cache, "torch.accelerator.empty_cache() after out-of-memory")
        x = must(lambda: torch.arange(1000, dtype=torch.float32, device=dt), "allocating after out-of-memory")
        y = must(lambda: (x * 2 + 1).cpu(), "computing and copying back after out-of-memory")
    check("MM-OOM-001.3", torch.equal(y, torch.arange(1000, dtype=torch.float32) * 2 + 1), "wrong results after OOM")
    with scope("MM-OOM-001.3"):
        again = must(lambda: torch.empty(chunk, dtype=torch.uint8, device=dt),
                     "allocating one of the freed chunks again after out-of-memory")
        del again
        must_raise(absurd, "allocating 2**50 bytes a second time", torch.OutOfMemoryError)
        must(A.synchronize, "torch.accelerator.synchronize() after out-of-memory")


# ----------------------------------------------------- reuse under queued work

REUSE_ELEMENTS = 1 << 19  # 2 MiB of float32: the size of the freed tensor and of the new ones
FRESH = 4  # new tensors of that size, enough to take every same-size block an allocator keeps


def _minus_ones(dt: str) -> torch.Tensor:
    """The values _take_and_overwrite writes, made before a stream is held
    (while one is, a check queues copies only: see conformance/_async.py)."""
    return must(lambda: torch.full((REUSE_ELEMENTS,), -1.0, device=torch.device(dt, 0)), "torch.full")


def _take_and_overwrite(dt: str, stream, minus: torch.Tensor) -> list[torch.Tensor]:
    """Allocate FRESH tensors of the freed tensor's size on `stream`, copy
    -1 into them and wait for the copies (`stream` is never held)."""
    with stream:
        fresh = [torch.empty(REUSE_ELEMENTS, dtype=torch.float32, device=torch.device(dt, 0)) for _ in range(FRESH)]
        for f in fresh:
            f.copy_(minus)
    stream.synchronize()
    return fresh


@contract("MM-REUSE-001")
@pytest.mark.exclusive
def test_a_block_freed_under_queued_work_is_not_handed_to_another_stream(dt, backend):
    device = torch.device(dt, 0)
    load = Load(dt, 0)
    own, other = new_stream(dt, 0), new_stream(dt, 0)
    minus = _minus_ones(dt)
    for scale in SCALES:
        out = load.target()
        with own:  # x belongs to `own`: allocated while it is current
            x = must(lambda: torch.full((REUSE_ELEMENTS,), 3.0, dtype=torch.float32, device=device),
                     "torch.full on a new stream")
        torch.accelerator.synchronize(0)
        with hold(backend, own, load, scale) as held:
            with own:
                out.copy_(x)  # queued behind the hold: reads x later
            del x
            with scope("MM-REUSE-001.1"):
                fresh = _take_and_overwrite(dt, other, minus)
            busy = held.pending()
        own.synchronize()
        got = out.cpu()
        check("MM-REUSE-001.1", bool((got == 3.0).all()),
              lambda: f"work queued on a stream read a tensor freed after the work was queued, and saw "
                      f"{sorted(set(got.unique().tolist()))[:4]} instead of its values 3.0: its memory was used "
                      f"again (by new tensors written on another stream) before the work ran", observed=busy)
        del fresh
        if busy:
            return
    unobserved(backend, "MM-REUSE-001.1", "an allocation on another stream while work on the freed tensor's stream "
                                          "was in flight")


@contract("MM-REUSE-001")
@pytest.mark.parametrize("user", ["allocation stream", "record_stream"])
@pytest.mark.exclusive
def test_empty_cache_keeps_memory_that_queued_work_still_reads(user, dt, backend):
    device = torch.device(dt, 0)
    load = Load(dt, 0)
    reader, other = new_stream(dt, 0), new_stream(dt, 0)
    minus = _minus_ones(dt)
    what = ("a tensor freed while work queued on its allocation stream still read it" if user == "allocation stream"
            else "a tensor freed after record_stream(s) while s's queued work still read it")
    for scale in SCALES:
        out = load.target()
        with torch.accelerator.current_stream(0) if user == "record_stream" else reader:
            x = must(lambda: torch.full((REUSE_ELEMENTS,), 3.0, dtype=torch.float32, device=device), "torch.full")
        torch.accelerator.synchronize(0)
        # Long work, not the gate: empty_cache() may wait for the device
        # without releasing the interpreter's lock (torch.accelerator's
        # binding keeps it), so a gate released from Python would never open.
        with hold(backend, reader, load, scale, gate=False) as held:
            with reader:
                out.copy_(x)  # queued behind the long work: reads x later
            if user == "record_stream":
                with scope("MM-REUSE-001.2"):
                    must(lambda: x.record_stream(reader), "Tensor.record_stream(stream)")
            del x
            with scope("MM-REUSE-001.2"):
                _, early = waited(lambda: must(A.empty_cache, "torch.accelerator.empty_cache()"), held, keep=True)
                # Returned while the work was pending: what it gave back
                # must still be kept from new tensors.
                fresh = _take_and_overwrite(dt, other, minus) if early else []
            busy = bool(early) and held.pending()
        reader.synchronize()
        got = out.cpu()
        # early False: empty_cache returned only after the work ran (it
        # waited for it); nothing can have been given back under it.
        check("MM-REUSE-001.2", bool((got == 3.0).all()),
              lambda: f"empty_cache() was called after {what}; the work then saw "
                      f"{sorted(set(got.unique().tolist()))[:4]} instead of 3.0: empty_cache gave the memory back "
                      f"while queued work still used it (wait for the work, or keep the block until it is done)",
              observed=busy or early is False)
        del fresh
        if busy or early is False:
            return
    unobserved(backend, "MM-REUSE-001.2", f"empty_cache() after {what}")


# ------------------------------------------------------------- zero size


@contract("MM-ZERO-001")
def test_zero_size_tensors(dt, n, cxx):
    with scope("MM-ZERO-001.1"):
        empty = must(lambda: torch.empty(0, device=dt), "torch.empty(0, device)")
        check("MM-ZERO-001.1", empty.device.type == dt and empty.numel() == 0, f"torch.empty(0) is {empty!r}")
        for shape in [(0,), (0, 3), (3, 0), (2, 0, 4)]:
            t = must(lambda: torch.zeros(shape, device=dt), f"torch.zeros({shape}, device)")
            check("MM-ZERO-001.1", t.shape == shape and t.device.type == dt, f"torch.zeros({shape}) is {t!r}")
            check("MM-ZERO-001.2", must(lambda: t.cpu(), f"copying a {shape} tensor to the CPU").shape == shape,
                  f"a {shape} device tensor came back with another shape")
            check("MM-ZERO-001.3", must(lambda: (t + 1).shape, f"adding to a {shape} tensor") == shape,
                  f"an operator on a {shape} tensor changed its shape")
    with scope("MM-ZERO-001.2"):
        moved = must(lambda: torch.empty(0, 5).to(dt), "copying a (0, 5) CPU tensor to the device")
        check("MM-ZERO-001.2", moved.shape == (0, 5) and moved.device.type == dt, f"(0, 5) moved as {moved!r}")
        check("MM-ZERO-001.2", must(lambda: moved.clone().shape, "cloning a zero-size device tensor") == (0, 5),
              "clone() changed a zero-size tensor's shape")
        target = torch.empty(0, device=dt)
        must(lambda: target.copy_(torch.empty(0)), "copy_ of a zero-size CPU tensor into a zero-size device tensor")
    with scope("MM-ZERO-001.3"):
        total = must(lambda: torch.zeros(0, device=dt).sum().item(), "summing a zero-size device tensor")
        check("MM-ZERO-001.3", total == 0, f"the sum of an empty device tensor is {total}")
        full = torch.arange(6.0, device=dt)
        view = full[3:3]
        check("MM-ZERO-001.3", view.numel() == 0 and view.device == full.device, "an empty slice of a device tensor")
        joined = must(lambda: torch.cat([torch.empty(0, device=dt), full, view]), "torch.cat with zero-size parts")
        check("MM-ZERO-001.3", torch.equal(joined.cpu(), torch.arange(6.0)), "torch.cat with zero-size parts changed "
                                                                             "the values")
    require_allocator(cxx)
    with scope("MM-ZERO-001.4"):
        storage = must(lambda: torch.UntypedStorage(0, device=dt), "torch.UntypedStorage(0, device)")
        check("MM-ZERO-001.4", storage.nbytes() == 0 and storage.device.type == dt, "a zero-byte storage is wrong")
        grown = torch.empty(0, device=dt)
        must(lambda: grown.resize_(10).fill_(2.0), "resizing a zero-size device tensor to 10 and filling it")
        check("MM-ZERO-001.4", torch.equal(grown.cpu(), torch.full((10,), 2.0)),
              "a zero-size tensor resized to 10 holds wrong values")
        must(lambda: grown.resize_(0), "resizing a device tensor back to 0")
        if n > 1:
            last = torch.empty(0, device=f"{dt}:{n - 1}")
            check("MM-ZERO-001.4", last.device == torch.device(dt, n - 1)
                  and last.untyped_storage().device == torch.device(dt, n - 1),
                  f"torch.empty(0, device='{dt}:{n - 1}') or its storage is on another device")
