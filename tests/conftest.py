"""Fixtures for the project's own tests of the OpenReg backend.

The helpers live in _support.py so that test modules can import them:
``run_python(code, env)`` runs ``python -c CODE`` in a fresh interpreter with
extra environment variables and returns ``(returncode, stdout, stderr)`` (for
configurations, which are read once per process, lazy initialization and
crashes); ``run_json`` does the same for a child that prints one JSON object.
"""

from __future__ import annotations

import os

# OpenReg declares a torch.backends entry point: without this, import torch
# would load it in this process and in every subprocess, and the fixture
# backends (pu1_minimal, pu1_faulty, pu1_sync) could not claim PrivateUse1.
# The tests of autoload turn it on in their own subprocesses
# (test_autoload.py); the kit's runs turn it off the same way (harness/plugin.py).
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

from _support import N

# The backend test modules of this folder (other modules bring their own limits).
BACKEND_MODULES = {
    "test_device_management.py", "test_hooks.py", "test_guard.py", "test_tensors.py",
    "test_rng.py", "test_memory.py", "test_isolation.py", "test_config.py",
    "test_acceptance.py", "test_streams_events.py", "test_allocator.py", "test_amp.py",
    "test_processes.py", "test_inductor.py",
}


@pytest.fixture(scope="session")
def n_devices() -> int:
    return N


@pytest.fixture
def two_devices() -> int:
    if N < 2:
        pytest.skip(f"needs at least 2 OpenReg devices, this process has {N}")
    return N


@pytest.fixture(autouse=True)
def _restore_device_zero(request):
    """Every backend test starts and ends on device 0 of the calling thread."""
    active = N > 0 and request.node.path.name in BACKEND_MODULES
    if active:
        torch.openreg.set_device(0)
    yield
    if active:
        torch.openreg.set_device(0)


# The modules that run whole suites (minutes each), in the order they start
# in a parallel run (`make test`: -n 2 --dist loadfile --no-loadscope-reorder,
# which hands a worker the next module when its current one has two tests
# left): the longest first, so that none is left running alone at the end.
# The two longest make the two whole runs of pu1_sync side by side (one
# worker each, kit_support.py): test_kit_install.py the install and the CI
# recipe's run, test_kit_fairness.py the one-device run.
# test_ci_recipe.py, which judges the former too, comes last, so that no
# worker waits for it.
LONG_MODULES = ("test_kit_install.py", "test_kit_fairness.py", "test_mutants.py", "test_reports_run.py",
                "test_kit_fixture_backends.py")
LAST_MODULES = ("test_ci_recipe.py",)


def pytest_collection_modifyitems(config, items):
    # A hung backend must not hang the suite.
    for item in items:
        if item.path.name in BACKEND_MODULES and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(180))
    rank = {name: k for k, name in enumerate(LONG_MODULES)}
    rank.update({name: len(LONG_MODULES) + 1 + k for k, name in enumerate(LAST_MODULES)})
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_MODULES)))


# A skip fails the run unless it is an allowed environment limit (skip_gate.py).
from skip_gate import pytest_runtest_logreport, pytest_sessionfinish  # noqa: E402,F401
