"""The caching device allocator and the pinned host allocator, beyond the
statistics basics of test_memory.py: every torch.accelerator memory API
against one sequence of allocations, stream-aware reuse (with record_stream
and gated streams), the out-of-memory retry after releasing the cache, the
DataLoader's pinned batches and deferred frees of pinned memory still used by
queued copies."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from _support import Background, Gate, N, run_json

pytestmark = pytest.mark.timeout(90)

A = torch.accelerator
MiB = 1 << 20
# Exact size classes (2 MiB steps above 1 MiB, 512-byte steps up to 1 MiB),
# so that byte counts are exact.
LARGE = 4 * MiB
SMALL = 1 * MiB
REUSE = 6 * MiB  # a size no other test of this module allocates


@pytest.fixture
def quiet():
    """No queued work, no garbage and an empty cache on every device."""
    gc.collect()
    for i in range(N):
        A.synchronize(i)
    A.empty_cache()


def alloc(nbytes: int, device: int = 0) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=f"openreg:{device}")


def test_every_memory_api_agrees_with_the_allocations(quiet):
    d = 0
    keep = alloc(512)  # memory_stats is {} until the allocator's first allocation
    A.reset_peak_memory_stats(d)
    A.reset_accumulated_memory_stats(d)
    s = A.memory_stats(d)
    assert s["allocation.all.allocated"] == s["allocation.all.freed"] == 0, "accumulated counts survived the reset"
    assert s["num_device_alloc"] == s["num_device_free"] == s["num_alloc_retries"] == 0
    allocated0, reserved0 = A.memory_allocated(d), A.memory_reserved(d)
    assert reserved0 == allocated0, "after empty_cache nothing is cached"
    total = A.get_memory_info(d)[1]

    def used_on_device() -> int:
        free, total_now = A.get_memory_info(d)
        assert total_now == total
        return total - free

    # Every byte the runtime has handed out is reserved by the allocator.
    assert used_on_device() == reserved0

    before = A.memory_stats(d)
    large, small = alloc(LARGE), alloc(SMALL)
    s = A.memory_stats(d)
    assert A.memory_allocated(d) == allocated0 + LARGE + SMALL
    assert A.memory_reserved(d) == reserved0 + LARGE + SMALL == used_on_device()
    for pool, size in (("large_pool", LARGE), ("small_pool", SMALL)):  # small: up to 1 MiB
        for stat in ("allocated_bytes", "reserved_bytes", "active_bytes"):
            key = f"{stat}.{pool}.current"
            assert s[key] - before[key] == size, f"{key}: {before[key]} -> {s[key]}"
    assert s["allocation.all.allocated"] == 2 and s["num_device_alloc"] == 2
    assert s["segment.all.current"] >= 2 and s["active_bytes.all.current"] == A.memory_allocated(d)
    assert s["requested_bytes.all.current"] == s["allocated_bytes.all.current"], "requests are exact size classes"

    del large
    s = A.memory_stats(d)
    assert A.memory_allocated(d) == allocated0 + SMALL
    assert A.memory_reserved(d) == reserved0 + LARGE + SMALL, "a freed block left the cache by itself"
    assert A.memory_reserved(d) > A.memory_allocated(d), "allocated and reserved do not differ"
    assert s["allocation.all.freed"] == 1 and s["num_device_free"] == 0
    assert A.max_memory_allocated(d) == allocated0 + LARGE + SMALL
    assert A.max_memory_reserved(d) == reserved0 + LARGE + SMALL

    A.empty_cache()
    s = A.memory_stats(d)
    assert A.memory_reserved(d) == A.memory_allocated(d) == allocated0 + SMALL == used_on_device(), (
        "empty_cache did not return the cached block to the device")
    assert s["num_device_free"] == 1 and s["num_sync_all_streams"] >= 1
    assert A.max_memory_reserved(d) == reserved0 + LARGE + SMALL, "empty_cache reset the peak"
    A.reset_peak_memory_stats(d)
    assert A.max_memory_allocated(d) == A.memory_allocated(d)
    assert A.max_memory_reserved(d) == A.memory_reserved(d)
    A.reset_accumulated_memory_stats(d)
    s = A.memory_stats(d)
    assert s["allocation.all.allocated"] == 0 and s["allocation.all.current"] >= 1, (
        "reset_accumulated_memory_stats must keep current values")

    # torch.openreg's functions are the same numbers.
    mod = torch.openreg
    assert mod.memory_allocated(d) == A.memory_allocated(d)
    assert mod.memory_reserved(d) == A.memory_reserved(d)
    assert mod.max_memory_allocated(d) == A.max_memory_allocated(d)
    assert mod.max_memory_reserved(d) == A.max_memory_reserved(d)
    assert mod.memory_stats(d) == A.memory_stats(d)
    assert mod.mem_get_info(d) == A.get_memory_info(d)
    del small, keep


def test_a_freed_block_is_reused_on_its_stream_and_never_handed_to_another(quiet):
    a, b = torch.openreg.Stream(), torch.openreg.Stream()
    with torch.openreg.stream(a):
        x = alloc(REUSE)
        ptr = x.data_ptr()
        del x
        y = alloc(REUSE)
        assert y.data_ptr() == ptr, "the next same-size allocation on the stream did not reuse the block"
        del y
    with torch.openreg.stream(b):
        z = alloc(REUSE)
        assert z.data_ptr() != ptr, "a block cached for stream A was handed to stream B"
    with torch.openreg.stream(a):
        w = alloc(REUSE)
        assert w.data_ptr() == ptr, "the block left stream A's cache"
    del z, w


@pytest.mark.parametrize("user_device", [0, 1], ids=["user on the same device", "user on another device"])
def test_record_stream_defers_reuse_until_the_users_work_is_done(quiet, user_device):
    if user_device >= N:
        pytest.skip("needs 2 devices")
    owner, user = torch.openreg.Stream(0), torch.openreg.Stream(user_device)
    with torch.openreg.stream(owner):
        x = torch.ones(REUSE // 4, device="openreg:0")
    ptr = x.data_ptr()
    out = torch.zeros(REUSE // 4, device=f"openreg:{user_device}")
    # x and out were filled on other streams than the user's: their values
    # are there once those streams ran (operators are asynchronous).
    torch.openreg.synchronize(0)
    torch.openreg.synchronize(user_device)

    def read_x_on_user():
        with torch.openreg.stream(user):
            out.copy_(x)

    with Gate(user) as gate:
        Background(read_x_on_user).value(timeout=10)  # queued behind the gate
        x.record_stream(user)
        del x
        with torch.openreg.stream(owner):
            early = alloc(REUSE)
            assert early.data_ptr() != ptr, (
                "a block freed while a recorded stream still had work on it was reused")
        gate.open()
        user.synchronize()
    with torch.openreg.stream(owner):
        late = alloc(REUSE)
        assert late.data_ptr() == ptr, "the block was not reused once the recorded stream finished"
    assert bool((out == 1).all()), "the user stream read the block after it was reused"
    del early, late


def test_out_of_memory_releases_the_cache_retries_and_keeps_the_device_working():
    """With 8 MiB devices: a 6 MiB request fits only once the cached 4 MiB block
    is released (one retry); a 64 MiB request raises torch.OutOfMemoryError
    naming the sizes; the device keeps working."""
    r = run_json("""
        MiB = 1 << 20
        A = torch.accelerator
        r = {}
        a = torch.empty(4 * MiB, dtype=torch.uint8, device="openreg")
        del a
        r["cached"] = [A.memory_allocated(0), A.memory_reserved(0)]
        b = torch.empty(6 * MiB, dtype=torch.uint8, device="openreg")
        s = A.memory_stats(0)
        r["retried"] = [A.memory_allocated(0), A.memory_reserved(0), s["num_alloc_retries"],
                        s["num_ooms"], s["num_device_free"]]
        try:
            torch.empty(64 * MiB, dtype=torch.uint8, device="openreg")
            r["oom"] = None
        except torch.OutOfMemoryError as e:
            r["oom"] = str(e).splitlines()[0]
        s = A.memory_stats(0)
        r["after_oom"] = [s["num_alloc_retries"], s["num_ooms"], A.memory_allocated(0)]
        r["works"] = torch.arange(10, device="openreg").sum().item()
        del b
        c = torch.empty(7 * MiB, dtype=torch.uint8, device="openreg")
        r["fits_again"] = A.memory_allocated(0)
        emit(r)
    """, env={"OPENREG_DEVICE_MEMORY": "8M"})
    assert r["cached"] == [0, 4 * MiB]
    assert r["retried"] == [6 * MiB, 6 * MiB, 1, 0, 1], (
        "[allocated, reserved, num_alloc_retries, num_ooms, num_device_free] after the retry: "
        f"{r['retried']}")
    message = r["oom"]
    assert message is not None, "a 64 MiB allocation on an 8 MiB device succeeded"
    for part in ("out of memory", "device 0", str(64 * MiB), str(8 * MiB), "allocated"):
        assert part in message, f"the OOM message lacks {part!r}: {message}"
    assert r["after_oom"] == [2, 1, 6 * MiB]
    assert r["works"] == 45
    assert r["fits_again"] == 8 * MiB


# ------------------------------------------------------------------ pinned


@pytest.mark.parametrize("num_workers", [0, 1])
def test_dataloader_pin_memory_yields_pinned_batches(num_workers):
    data = torch.arange(40.0).view(20, 2)
    labels = torch.arange(20)
    loader = DataLoader(TensorDataset(data, labels), batch_size=8, pin_memory=True,
                        num_workers=num_workers)
    batches = list(loader)
    assert len(batches) == 3
    assert all(x.is_pinned() and y.is_pinned() for x, y in batches), "a batch is not pinned"
    moved = [x.to("openreg", non_blocking=True) for x, _ in batches]
    torch.openreg.synchronize()
    assert torch.equal(torch.cat([m.cpu() for m in moved]), data)
    assert torch.equal(torch.cat([y for _, y in batches]), labels)


def test_pinned_memory_freed_during_a_queued_copy_stays_until_the_copy_ran():
    """Free the pinned source right after a gated non_blocking copy: the free
    is deferred (the block stays registered), the copy reads the right data,
    and the block is released once the copy is done. In a subprocess: a
    premature free would make the copy read unmapped memory."""
    r = run_json("""
        import gc
        n = 1 << 18
        s = torch.openreg.Stream()
        dst = torch.zeros(n, device="openreg")
        src = torch.arange(n, dtype=torch.float32).pin_memory()
        ptr = src.data_ptr()
        gate = openreg._C._testing_block_stream(s)
        with torch.openreg.stream(s):
            dst.copy_(src, non_blocking=True)
        del src
        gc.collect()
        r = {"pinned_after_free": _cxx.context_is_pinned_ptr(ptr)}
        torch.empty(16, pin_memory=True)  # allocating reclaims finished deferred frees
        r["pinned_while_queued"] = _cxx.context_is_pinned_ptr(ptr)
        openreg._C._testing_open_gate(gate)
        s.synchronize()
        r["copied"] = torch.equal(dst.cpu(), torch.arange(n, dtype=torch.float32))
        torch.accelerator.empty_host_cache()
        r["pinned_after_copy"] = _cxx.context_is_pinned_ptr(ptr)
        emit(r)
    """)
    assert r["pinned_after_free"] and r["pinned_while_queued"], (
        f"the pinned block was released while a queued copy still read it: {r}")
    assert r["copied"], "the deferred copy read wrong data"
    assert r["pinned_after_copy"] is False, "the deferred block was never released"
