"""PyTorch operators on OpenReg in the execution mode of this process
(OPENREG_EXECUTOR): median wall times of small operators, launched alone and
waited for, next to the CPU's call. benchmarks/run_all.py runs it once per
mode and puts the modes side by side; it prints one JSON object."""

from __future__ import annotations

import json
import statistics
import time

import torch

import openreg


def median_us(fn, n: int = 300, warm: int = 20) -> float:
    for _ in range(warm):  # the first call with new metadata runs synchronously
        fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e6, 2)


def main() -> None:
    d = "openreg"
    x, y = torch.randn(1024, device=d), torch.randn(1024, device=d)
    a, w = torch.randn(64, 64, device=d), torch.randn(64, 64, device=d)
    xc, yc = x.cpu(), y.cpu()
    stream = torch.openreg.current_stream()
    rows = {
        "CPU x + y, 1 Ki": median_us(lambda: xc + yc),
        "x + y, 1 Ki: the launch (queued)": median_us(lambda: x + y),
        "x + y, 1 Ki, then synchronize": median_us(lambda: (x + y, stream.synchronize())),
        "x.sum().item(), 1 Ki": median_us(lambda: x.sum().item()),
        "nonzero(x > 0), 1 Ki (waits: data-dependent shape)": median_us(lambda: torch.nonzero(x > 0), n=100),
        "10 x (64x64 @ 64x64), then synchronize": median_us(
            lambda: ([a @ w for _ in range(10)], stream.synchronize()), n=50),
    }
    print(json.dumps({"process_mode": openreg._C._process_mode(), "us": rows}))


if __name__ == "__main__":
    main()
