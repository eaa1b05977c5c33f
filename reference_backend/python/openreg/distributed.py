"""OpenReg's process group for torch.distributed: the backend ``orccl``.

``import openreg`` registers it for the device type ``openreg`` (PyTorch has
already imported ``torch.distributed`` by then, so this costs nothing), so
that ``init_process_group()`` without a backend, or with
``backend="cpu:gloo,openreg:orccl"``, uses it for OpenReg tensors. The
process group itself is C++ (csrc/ProcessGroup.cpp; design in
docs/reference-backend/distributed.md).
"""

from __future__ import annotations

import datetime

import torch.distributed as dist

from . import _C

NAME = "orccl"


def _create(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> dist.ProcessGroup:
    milliseconds = int(timeout.total_seconds() * 1000)
    if milliseconds <= 0:
        raise ValueError(f"OpenReg process group: timeout must be positive, got {timeout}")
    return _C._create_process_group(store, rank, size, milliseconds)


def register() -> None:
    """Registers ``orccl`` for the device type openreg (once)."""
    if not dist.is_available() or NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(NAME, _create, devices=["openreg"])
