"""Fixtures for the project's own tests of the OpenReg backend (helpers: _support.py)."""

from __future__ import annotations

import pytest
import torch

from _support import N


@pytest.fixture(scope="session")
def n_devices() -> int:
    return N


@pytest.fixture
def two_devices() -> int:
    if N < 2:
        pytest.skip(f"needs at least 2 OpenReg devices, this process has {N}")
    return N


@pytest.fixture(autouse=True)
def _restore_device_zero():
    """Every test starts and ends on device 0 of the calling thread."""
    if N > 0:
        torch.openreg.set_device(0)
    yield
    if N > 0:
        torch.openreg.set_device(0)


def pytest_collection_modifyitems(config, items):
    # A hung backend must not hang the suite.
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(180))
