"""What the result recorder and the provenance see of a conformance run.

The plugin's ConformanceSession (plugin.py) holds a run's state; results.py
and provenance.py read it while the plugin drives them. They depend on this
description of it, not on the plugin, so the harness's imports run one way:
plugin -> results -> provenance, and none of them back to the plugin.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pytest

    from .backend import Backend
    from .expectations import Expectations
    from .registry import Registry
    from .shard import Selector


class RunSession(Protocol):
    config: pytest.Config
    registry: Registry
    backend: Backend
    expectations: Expectations
    expectations_path: Path | None
    level: str
    timeout: float
    isolation: str
    sharding: Selector | None
    warnings: list[str]
    unclaimed: set[str]
    covered: set[str]
    selected_ids: list[str]
    narrowed_by: list[str]
    device_count: int
    parent_initialized: bool

    @property
    def workers(self) -> int: ...

    def test_id(self, nodeid: str) -> str: ...

    def rerun_command(self, nodeid: str) -> str: ...
