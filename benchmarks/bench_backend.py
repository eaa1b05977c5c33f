"""The reference backend against its physical limits (Python side).

Each measurement is printed next to its baseline and the ratio, and
returned as a dict for run_all.py. Numbers, not assertions.

  * device management from Python: torch.openreg.current_device /
    set_device / exchange, torch.accelerator.* next to a no-op pybind11 call;
  * small-op latency: add_, x + y, sum on 1 Ki and 1 Mi float32 elements,
    OpenReg (synchronous end to end) versus CPU, the same with asynchronous
    operators on (end to end, and per call in a run of 100 queued calls),
    and the launch overhead of an asynchronous call alone;
  * copies: host-to-device, device-to-host, device-to-device and pinned
    asynchronous copies at 4 KiB, 1 MiB and 256 MiB versus memcpy of the
    same bytes (torch's CPU copy);
  * allocator: allocate/free pairs per second, caching versus uncached
    (empty_cache every time) versus a host malloc/free.
"""

from __future__ import annotations

import ctypes
import gc
import statistics
import time
import timeit
from collections.abc import Callable

import torch

import openreg
from openreg import _C

LIBC = ctypes.CDLL(None)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.free.argtypes = [ctypes.c_void_p]


def per_call_ns(stmt: str, number: int, globs: dict, repeat: int = 5) -> float:
    """Best of `repeat` repeats, in nanoseconds per call (the best, because
    these machines are shared: interference only ever adds time)."""
    timer = timeit.Timer(stmt, globals=globs)
    return min(timer.repeat(repeat, number)) / number * 1e9


def best_seconds(fn: Callable[[], None], repeat: int = 5, inner: int = 1) -> float:
    fn()  # warm up (caches, pools, first-use initialization)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return min(times)


def device_management() -> list[dict]:
    globs = {"torch": torch, "_C": _C, "openreg": openreg}
    torch.openreg.current_device()
    floor = per_call_ns("torch.openreg._C._noop()", 200_000, globs)
    rows = [{"name": "no-op pybind11 call (torch.openreg._C._noop)", "ns": round(floor, 1), "ratio": 1.0}]
    for name, stmt, target in (
        ("torch.openreg.current_device()", "torch.openreg.current_device()", 2.0),
        ("torch.openreg.set_device(0)", "torch.openreg.set_device(0)", None),
        ("torch.accelerator.current_device_index()", "torch.accelerator.current_device_index()", None),
        ("torch.accelerator.set_device_index(0)", "torch.accelerator.set_device_index(0)", None),
        ("torch.accelerator exchange + restore", "torch._C._accelerator_exchangeDevice(1); "
         "torch._C._accelerator_exchangeDevice(0)", None),
        ("with torch.accelerator.device_index(1)", "with torch.accelerator.device_index(1): pass", None),
    ):
        ns = per_call_ns(stmt, 100_000, globs)
        rows.append({"name": name, "ns": round(ns, 1), "ratio": round(ns / floor, 2), "target_ratio": target})
    return rows


def small_ops() -> list[dict]:
    rows = []
    for numel in (1024, 1 << 20):
        x, y = torch.ones(numel, device="openreg"), torch.ones(numel, device="openreg")
        xc, yc = torch.ones(numel), torch.ones(numel)
        number = 2000 if numel == 1024 else 100
        globs = {"torch": torch, "x": x, "y": y, "xc": xc, "yc": yc}
        for op in ("x.add_(1)", "x + y", "x.sum()"):
            cpu = per_call_ns(op.replace("x", "xc").replace("y", "yc"), number, globs, repeat=9)
            # The default (asynchronous operators): end to end (one call and
            # a synchronization), and per call in a run of calls with one
            # synchronization at the end (the host queues, the worker drains).
            before = _C._async_operators()
            _C._set_async_operators(True)
            try:
                per_call_ns(op, number, globs, repeat=1)  # the Meta kernels' answers are kept
                device = per_call_ns(f"{op}; torch.openreg.synchronize()", number, globs, repeat=9)
                queued = per_call_ns(f"for _ in range(100): {op}\ntorch.openreg.synchronize()",
                                     max(1, number // 100), globs, repeat=9) / 100
                # OPENREG_ASYNC_OPERATORS=0: every call waits for its stream.
                _C._set_async_operators(False)
                waiting = per_call_ns(f"{op}; torch.openreg.synchronize()", number, globs, repeat=9)
            finally:
                _C._set_async_operators(before)
            rows.append({"name": f"{op} [{numel} elements]", "openreg_us": round(device / 1e3, 2),
                         "queued_us": round(queued / 1e3, 2), "cpu_us": round(cpu / 1e3, 2),
                         "ratio": round(device / cpu, 2), "queued_ratio": round(queued / cpu, 2),
                         "target_ratio": 2.0 if numel == 1 << 20 else None})
            rows.append({"name": f"{op} [{numel} elements], OPENREG_ASYNC_OPERATORS=0",
                         "openreg_us": round(waiting / 1e3, 2), "cpu_us": round(cpu / 1e3, 2),
                         "ratio": round(waiting / cpu, 2)})
    # Launch overhead alone: the call returns before the work runs (the
    # stream is gated, so nothing can have run yet). All 200 launches queue
    # behind one gate: a copy that ran between two timed launches would leave
    # the CPU kernels' thread pool spinning on this 2-vCPU machine, and the
    # next launch would measure that instead (30-50 us, against 3 us).
    x = torch.ones(1 << 20, device="openreg")
    y = torch.empty(1 << 20, device="openreg")
    xt = x.view(1024, 1024).t()
    yv = y.view(1024, 1024)
    stream = torch.openreg.current_stream()
    stream.synchronize()
    launches = []
    gate = _C._testing_block_stream(stream)
    try:
        for _ in range(200):
            start = time.perf_counter()
            yv.copy_(xt)  # an asynchronous device kernel
            launches.append(time.perf_counter() - start)
    finally:
        _C._testing_open_gate(gate)
    stream.synchronize()
    rows.append({"name": "asynchronous launch overhead (device kernel, y.copy_(x.t()))",
                 "openreg_us": round(statistics.median(launches) * 1e6, 2), "target_us": 10.0})
    return rows


def copies() -> list[dict]:
    rows = []
    stream = torch.openreg.current_stream()
    for nbytes, label in ((4 << 10, "4 KiB"), (1 << 20, "1 MiB"), (256 << 20, "256 MiB")):
        n = nbytes // 4
        host = torch.ones(n)
        host_dst = torch.empty(n)
        pinned = torch.ones(n).pin_memory()
        pinned_dst = torch.empty(n).pin_memory()
        dev = torch.empty(n, device="openreg")
        dev2 = torch.empty(n, device="openreg")
        inner = 200 if nbytes < (1 << 20) else (20 if nbytes == 1 << 20 else 1)
        # The physical limit: libc memcpy of the same bytes, host to host.
        src_ptr, dst_ptr = host.data_ptr(), host_dst.data_ptr()
        memcpy = best_seconds(lambda: ctypes.memmove(dst_ptr, src_ptr, nbytes), inner=inner)

        def h2d():
            dev.copy_(host)

        def d2h():
            host_dst.copy_(dev)

        def d2d():
            dev2.copy_(dev)
            stream.synchronize()

        def pinned_h2d():
            dev.copy_(pinned, non_blocking=True)
            stream.synchronize()

        def pinned_d2h():
            pinned_dst.copy_(dev, non_blocking=True)
            stream.synchronize()

        for name, fn in (("host-to-device", h2d), ("device-to-host", d2h), ("device-to-device", d2d),
                         ("pinned host-to-device (async + sync)", pinned_h2d),
                         ("pinned device-to-host (async + sync)", pinned_d2h)):
            seconds = best_seconds(fn, inner=inner)
            rows.append({"name": f"{name} {label}", "GBps": round(nbytes / seconds / 1e9, 2),
                         "memcpy_GBps": round(nbytes / memcpy / 1e9, 2),
                         "ratio_to_memcpy": round(memcpy / seconds, 2),
                         "target_ratio": 0.8 if nbytes == 256 << 20 and name in (
                             "host-to-device", "device-to-host") else None})
        del host, host_dst, pinned, pinned_dst, dev, dev2
        gc.collect()
    return rows


def allocator() -> list[dict]:
    rows = []
    for nbytes, label in ((4 << 10, "4 KiB"), (1 << 20, "1 MiB")):
        n = nbytes // 4

        def cached():
            torch.empty(n, device="openreg")

        def uncached():
            torch.empty(n, device="openreg")
            torch.openreg.empty_cache()

        def host_malloc():
            LIBC.free(LIBC.malloc(nbytes))

        results = {}
        for name, fn, inner in (("caching allocator", cached, 20000), ("uncached (empty_cache each time)",
                                uncached, 2000), ("host malloc/free", host_malloc, 20000)):
            results[name] = 1.0 / best_seconds(fn, inner=inner)
        for name, per_second in results.items():
            rows.append({"name": f"{name} {label}", "pairs_per_s": round(per_second),
                         "ratio_to_malloc": round(per_second / results["host malloc/free"], 3)})
    return rows


def run() -> dict:
    torch.openreg.init()
    return {
        "device_management_python": device_management(),
        "small_ops": small_ops(),
        "copies": copies(),
        "allocator": allocator(),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
