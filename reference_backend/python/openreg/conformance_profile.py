"""How the conformance kit finds OpenReg: `--backend openreg` resolves to this
profile (entry point group ``privateuse1_conformance.backends``)."""

from __future__ import annotations

from pathlib import Path


def profile() -> dict[str, str]:
    return {
        "module": "openreg",
        "manifest": str(Path(__file__).with_name("conformance.toml")),
    }


# Instrumentation (see the kit's vendor guide): rules invisible from Python.
def device_switch_count() -> int:
    """Device switches (orSetDevice calls) the runtime saw in this process."""
    from . import _C

    return int(_C._runtime_counters()["set_device_calls"])


def live_event_count() -> int:
    """Events the runtime holds (created and not yet destroyed)."""
    from . import _C

    return int(_C._runtime_counters()["live_events"])


def init_count() -> int:
    """How many times PyTorch ran the hooks' init() in this process."""
    from . import _C

    return int(_C._runtime_counters()["hooks_init_calls"])


def block_stream(stream):
    """Hold `stream` at this point of its queue (a kernel that waits on a
    gate); returns, once that kernel runs (the stream's last task is then
    certainly running), the function that opens the gate."""
    from . import _C

    gate = _C._testing_block_stream(stream)
    return lambda: _C._testing_open_gate(gate)
