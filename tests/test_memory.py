"""Memory: allocator statistics, empty_cache, memory info, pinned memory and
out-of-memory (contracts MM-*)."""

from __future__ import annotations

import gc

import pytest
import torch

from _support import N, run_json, run_python

A = torch.accelerator
MiB = 1 << 20
# The allocator rounds requests up to size classes (512 B steps up to 1 MiB,
# 2 MiB steps above); these sizes are exact classes, so byte counts are exact.
SMALL = 1 * MiB
LARGE = 4 * MiB


@pytest.fixture
def quiet_device():
    """Device 0 with no queued work, no garbage and an empty cache."""
    gc.collect()
    for i in range(N):
        torch.accelerator.synchronize(i)
    A.empty_cache()
    return 0


def stats(device: int) -> dict[str, int]:
    return {
        "allocated": A.memory_allocated(device),
        "max_allocated": A.max_memory_allocated(device),
        "reserved": A.memory_reserved(device),
        "max_reserved": A.max_memory_reserved(device),
    }


def test_allocations_and_frees_are_tracked(quiet_device):
    """MM-STAT-001: allocated/reserved/peaks follow allocations, frees and empty_cache."""
    d = quiet_device
    start = stats(d)
    assert start["reserved"] == start["allocated"], f"after empty_cache reserved != allocated: {start}"
    x = torch.empty(LARGE, dtype=torch.uint8, device=f"openreg:{d}")
    s1 = stats(d)
    assert s1["allocated"] - start["allocated"] == LARGE, f"allocating 4 MiB: {start} -> {s1}"
    assert s1["reserved"] - start["reserved"] == LARGE, f"allocating 4 MiB (empty cache): {start} -> {s1}"
    assert s1["max_allocated"] >= s1["allocated"]
    y = torch.empty(SMALL, dtype=torch.uint8, device=f"openreg:{d}")
    s2 = stats(d)
    assert s2["allocated"] - s1["allocated"] == SMALL
    del x
    s3 = stats(d)
    assert s3["allocated"] == s2["allocated"] - LARGE, f"freeing 4 MiB: {s2} -> {s3}"
    assert s3["reserved"] == s2["reserved"], "a freed block left the cache without empty_cache"
    assert s3["max_allocated"] >= s2["allocated"], "the peak forgot the 4 MiB block"
    A.reset_peak_memory_stats(d)
    s4 = stats(d)
    assert s4["max_allocated"] == s4["allocated"], f"reset_peak_memory_stats: {s4}"
    A.empty_cache()
    s5 = stats(d)
    assert s5["reserved"] == s5["allocated"] == s3["allocated"], f"empty_cache: {s3} -> {s5}"
    del y
    assert stats(d)["allocated"] == start["allocated"]


def test_reuse_from_cache_does_not_grow_reserved(quiet_device):
    d = quiet_device
    x = torch.empty(LARGE, dtype=torch.uint8, device=f"openreg:{d}")
    del x
    before = stats(d)
    z = torch.empty(LARGE, dtype=torch.uint8, device=f"openreg:{d}")
    after = stats(d)
    assert after["reserved"] == before["reserved"], "a cached block was not reused"
    assert after["allocated"] == before["allocated"] + LARGE
    del z


def test_stats_are_per_device(two_devices, quiet_device):
    before = [A.memory_allocated(i) for i in range(N)]
    x = torch.empty(LARGE, dtype=torch.uint8, device="openreg:1")
    after = [A.memory_allocated(i) for i in range(N)]
    assert after[1] - before[1] == LARGE and after[0] == before[0], (
        f"allocating on openreg:1 changed allocated bytes {before} -> {after}")
    assert torch.openreg.memory_allocated(1) == after[1], "module and accelerator disagree"
    del x


def test_memory_stats_keys_and_counts(quiet_device):
    """MM-STAT-002: memory_stats has the documented keys and counts allocations."""
    d = quiet_device
    x = torch.empty(SMALL, dtype=torch.uint8, device=f"openreg:{d}")
    s = A.memory_stats(d)
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "active_bytes.all.current",
                "allocation.all.current", "segment.all.current", "num_alloc_retries",
                "num_ooms", "requested_bytes.all.current"):
        assert key in s, f"memory_stats lacks {key!r}"
    assert s["allocated_bytes.all.current"] == A.memory_allocated(d)
    assert s["reserved_bytes.all.current"] == A.memory_reserved(d)
    count = s["allocation.all.current"]
    y = torch.empty(SMALL, dtype=torch.uint8, device=f"openreg:{d}")
    assert A.memory_stats(d)["allocation.all.current"] == count + 1
    del x, y


def test_memory_info_tracks_reserved_memory(quiet_device):
    """MM-STAT-001: get_memory_info (free, total) sees memory taken from the device."""
    d = quiet_device
    free0, total = A.get_memory_info(d)
    assert total > 0 and 0 <= free0 <= total
    assert torch.openreg.mem_get_info(d) == (free0, total)
    x = torch.empty(LARGE, dtype=torch.uint8, device=f"openreg:{d}")
    free1, total1 = A.get_memory_info(d)
    assert total1 == total and free1 == free0 - LARGE, f"free {free0} -> {free1} after 4 MiB"
    del x
    A.empty_cache()
    assert A.get_memory_info(d)[0] == free0, "empty_cache did not give the block back"


def test_bad_device_index_in_stats_raises(n_devices):
    for fn in (A.memory_allocated, A.memory_stats, A.get_memory_info, A.reset_peak_memory_stats):
        with pytest.raises(RuntimeError, match=r"\[0, %d\)" % n_devices):
            fn(n_devices)


# ------------------------------------------------------------------- pinned


def test_pin_memory_and_is_pinned():
    """MM-PIN-001."""
    plain = torch.arange(10.0)
    assert plain.is_pinned() is False, "a plain CPU tensor reports pinned"
    pinned = plain.pin_memory()
    assert pinned.is_pinned() is True and pinned.device.type == "cpu"
    assert torch.equal(pinned, plain)
    assert plain.is_pinned() is False, "pin_memory() pinned its source"
    assert torch.empty(16, pin_memory=True).is_pinned() is True
    assert pinned[3:].is_pinned() is True, "a view into pinned memory is not pinned"
    assert torch.ones(3, device="openreg").is_pinned() is False


def test_device_tensor_with_pin_memory_is_rejected():
    with pytest.raises(RuntimeError, match="pin_memory"):
        torch.empty(3, device="openreg", pin_memory=True)


# -------------------------------------------------------------- fresh / OOM


def test_is_pinned_before_init_and_out_of_memory():
    """MM-STAT-002 + MM-PIN-002 + MM-OOM-001 in a fresh process with 1 MiB devices:
    empty_cache works before first use without initializing a device; is_pinned() before
    init is False without initializing; exhausting a device raises torch.OutOfMemoryError
    (an error, not a crash) and the device still works afterwards."""
    result = run_json("""
        C = openreg._C
        r = {}
        torch.accelerator.empty_cache()
        torch.openreg.empty_cache()
        r["after_empty_cache"] = [C._runtime_counters()["device_inits"],
                                  [_cxx.hooks_has_primary_context(i) for i in range(2)]]
        r["is_pinned_before_init"] = torch.ones(4).is_pinned()
        r["init_after_is_pinned"] = C._runtime_counters()["hooks_init_calls"]
        r["module_initialized"] = torch.openreg.is_initialized()
        r["total"] = torch.openreg.mem_get_info(0)[1]
        keep = torch.ones(1000, device="openreg")
        try:
            torch.empty(2 << 20, dtype=torch.uint8, device="openreg")
            r["oom"] = None
        except torch.OutOfMemoryError as e:
            r["oom"] = ["OutOfMemoryError", str(e).splitlines()[0]]
        except Exception as e:
            r["oom"] = [type(e).__name__, str(e).splitlines()[0]]
        r["num_ooms"] = torch.accelerator.memory_stats(0).get("num_ooms")
        # (Only native kernels here: the first out= fallback op of a process is slow.)
        r["after"] = keep.fill_(2).cpu().sum().item()
        fits = torch.full((100_000,), 3, dtype=torch.uint8, device="openreg")
        r["fits"] = fits.cpu().sum().item()
        r["other_device"] = torch.ones(10, device="openreg:1").cpu().sum().item()
        emit(r)
    """, env={"OPENREG_DEVICE_MEMORY": "1M"})
    assert result["after_empty_cache"] == [0, [False, False]], (
        f"empty_cache before first use initialized a device: {result['after_empty_cache']}")
    assert result["is_pinned_before_init"] is False
    assert result["init_after_is_pinned"] == 0, "is_pinned() before init initialized the backend"
    assert result["module_initialized"] is False
    assert result["total"] == MiB
    assert result["oom"] is not None, "a 2 MiB allocation on a 1 MiB device succeeded"
    kind, message = result["oom"]
    assert kind == "OutOfMemoryError", f"exhausting the device raised {kind}: {message}"
    assert "out of memory" in message.lower() and "device 0" in message, message
    assert result["num_ooms"] == 1, f"memory_stats num_ooms = {result['num_ooms']}"
    assert result["after"] == 2000.0, "the device does not work after an OOM"
    assert result["fits"] == 300_000
    assert result["other_device"] == 10.0


# ---------------------------------------------------------------- deadlocks
# The allocator must not hold its lock (and the host must not hold what a
# worker needs) while waiting for the device: work finishing on a worker may
# have to free memory meanwhile. Each scenario runs in a subprocess with a
# timeout, so that a regression is a failure, not a hung test run.

def test_out_of_memory_retry_does_not_deadlock_with_pending_frees():
    code = """
import torch
x = torch.ones(4096, 4096, device="openreg")     # 64 MiB
y = torch.empty(4096, 4096, device="openreg")
y.copy_(x.t())                                  # a kernel still queued or running
del x                                           # freed while the kernel may run
try:
    torch.empty(1 << 28, device="openreg")      # 1 GiB: forces the cache release path
except torch.OutOfMemoryError:
    pass
print(float(y[0, 1]))
"""
    returncode, stdout, stderr = run_python(code, env={"OPENREG_DEVICE_MEMORY": "1G"}, timeout=60)
    assert returncode == 0, stderr
    assert stdout.strip().endswith("1.0")


def test_empty_cache_does_not_deadlock_with_running_work():
    code = """
import torch
torch.empty(1024, device="openreg")
x = torch.ones(4096, 4096, device="openreg")
y = torch.empty(4096, 4096, device="openreg")
for _ in range(4):
    y.copy_(x.t())
torch.openreg.empty_cache()                     # holds the GIL while the device finishes
print(torch.openreg.memory_reserved() >= 0)
"""
    returncode, stdout, stderr = run_python(code, timeout=60)
    assert returncode == 0, stderr
    assert stdout.strip().endswith("True")


def test_allocation_while_another_thread_releases_the_cache_waits_instead_of_failing():
    """Thread B runs out of memory and releases the cache, which waits for the
    device (held by a gate). Thread C, out of memory too, must wait for those
    blocks to reach the runtime, not find the cache empty and raise
    OutOfMemoryError with memory about to be free (found by the stress run)."""
    code = """
import threading, time, torch, openreg
MiB = 1 << 20
stats = lambda: torch.openreg.memory_stats(0)
sa, sb, sc, held = [torch.openreg.Stream() for _ in range(4)]
with torch.openreg.stream(sa):
    xs = [torch.empty(2 * MiB, dtype=torch.uint8, device="openreg") for _ in range(4)]
    del xs                                      # 8 MiB cached for sa: the device is full
gate = openreg._C._testing_block_stream(held)   # the device has work that does not finish
results = {}
def allocate(name, stream):
    try:
        with torch.openreg.stream(stream):
            torch.empty(2 * MiB, dtype=torch.uint8, device="openreg")
        results[name] = "ok"
    except Exception as e:
        results[name] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
syncs = stats()["num_sync_all_streams"]
b = threading.Thread(target=allocate, args=("B", sb), daemon=True)
b.start()
deadline = time.monotonic() + 30
while stats()["num_sync_all_streams"] == syncs and time.monotonic() < deadline:
    time.sleep(0.01)                            # until B's release waits for the device
c = threading.Thread(target=allocate, args=("C", sc), daemon=True)
c.start()
c.join(1.0)
during = results.get("C", "waiting")
openreg._C._testing_open_gate(gate)
b.join(30); c.join(30)
emit({"during": during, "B": results.get("B"), "C": results.get("C"), "ooms": stats()["num_ooms"]})
"""
    r = run_json(code, env={"OPENREG_DEVICE_MEMORY": "8M", "OPENREG_DEVICE_COUNT": "1"}, timeout=120)
    assert r["during"] == "waiting", f"C did not wait for B's release of the cache: {r}"
    assert r["B"] == "ok" and r["C"] == "ok" and r["ooms"] == 0, r
