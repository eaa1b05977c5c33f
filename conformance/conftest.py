"""Fixtures of the conformance suite.

Tests reach the backend only through these fixtures and PyTorch's public
and documented-private APIs: never by importing a particular backend. Each
test runs in its own process forked from a parent that imported torch and
the backend but never initialized a device (see harness/isolation.py), so
every test starts from a fresh, uninitialized backend.
"""

from __future__ import annotations

import pytest

from privateuse1_conformance.harness.evidence import inconclusive

SESSION_PLUGIN = "privateuse1-conformance-session"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "zero_devices_ok: the test is meaningful for a backend with no devices")
    if not config.getoption("pu1_backend", None):
        raise pytest.UsageError(
            "the conformance suite needs a backend: pytest --backend=NAME (or --pu1-backend=NAME) "
            "(a registered profile such as 'openreg', or an importable module)"
        )


@pytest.fixture(scope="session")
def session(pytestconfig):
    return pytestconfig.pluginmanager.get_plugin(SESSION_PLUGIN)


@pytest.fixture(scope="session")
def backend(session):
    """The backend under test (harness.backend.Backend)."""
    return session.backend


@pytest.fixture(scope="session")
def dt(backend) -> str:
    """The backend's device type name, e.g. 'openreg'."""
    return backend.device_type


@pytest.fixture(scope="session")
def mod(backend, dt):
    """The backend's device module, torch.<name>."""
    if backend.device_module is None:
        pytest.fail(
            f"the backend registered no device module: torch.{dt} does not exist. Call "
            f"torch._register_device_module({dt!r}, module) when the backend is imported",
            pytrace=False,
        )
    return backend.device_module


@pytest.fixture(scope="session")
def unclaimed(session) -> frozenset[str]:
    """Features the backend does not have (declared absent, or implied by one device)."""
    return frozenset(session.unclaimed)


@pytest.fixture(scope="session")
def n(session) -> int:
    """The backend's device count, as its module reports it."""
    return session.device_count


@pytest.fixture(autouse=True)
def _needs_a_device(request, n) -> None:
    """With no device, only the tests marked zero_devices_ok can say anything."""
    if n == 0 and request.node.get_closest_marker("zero_devices_ok") is None:
        pytest.skip("the backend reports no devices")


@pytest.fixture
def two_devices(n) -> None:
    """Tests that need two devices carry @pytest.mark.requires("multi-device")
    (the harness then does not run them on one device); this is a second line
    of defence. With one device such a test is no evidence, never a failure."""
    if n < 2:
        inconclusive(f"needs 2 devices, the backend has {n}", applies=False)


@pytest.fixture(scope="session")
def cxx():
    """The kit's C++ probe: direct calls into the hooks and the device guard."""
    from privateuse1_conformance.conformance import _cxx

    return _cxx


@pytest.fixture
def instrument(backend):
    """instrument(name) -> the backend's instrumentation function, or None.
    Instrumentation only sharpens checks: none may depend on it."""

    def get(name: str):
        return backend.instrument(name)

    return get
