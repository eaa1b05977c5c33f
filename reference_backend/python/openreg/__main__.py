"""`python -m openreg`: create tensors on every OpenReg device and print a table.

A smoke run of the reference backend: each device gets a tensor, a kernel
(through the CPU fallback), a copy back to the host and a check of the
values. Exits non-zero if any device misbehaves.
"""

from __future__ import annotations

import sys

import torch

import openreg


def main() -> int:
    count = torch.openreg.device_count()
    print(f"torch {torch.__version__}  backend {torch._C._get_privateuse1_backend_name()!r}  "
          f"devices {count}")
    if count == 0:
        print("no OpenReg devices (OPENREG_DEVICE_COUNT=0)")
        return 0
    header = f"{'device':<10} {'memory (MiB)':>12} {'free (MiB)':>10} {'initialized':>11} {'check':>6}"
    print(header)
    print("-" * len(header))
    failures = 0
    for index in range(count):
        device = torch.device("openreg", index)
        x = torch.arange(16, dtype=torch.float32, device=device).reshape(4, 4)
        y = (x * 2 + 1).sum(dim=0)
        expected = (torch.arange(16, dtype=torch.float32).reshape(4, 4) * 2 + 1).sum(dim=0)
        ok = y.device == device and torch.equal(y.cpu(), expected)
        failures += not ok
        free, total = torch.openreg.mem_get_info(index)
        print(f"{str(device):<10} {total / 2**20:>12.0f} {free / 2**20:>10.0f} "
              f"{str(openreg._C._is_device_initialized(index)):>11} {'ok' if ok else 'FAIL':>6}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
