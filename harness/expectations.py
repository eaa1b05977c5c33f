"""The expectations file: known failures of a backend, by contract ID.

    [[expect]]
    contract = "EV-TIME-001"
    reason = "event timing lands in release 2.1 (ticket XYZ-42)"

A test of an expected contract that fails or errors gets the verdict xfail;
one that passes gets xpass, and the entry is reported as stale. Crashes and
hangs are never turned into anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .registry import Registry, read_toml


class ExpectationsError(ValueError):
    """The expectations file is malformed or names unknown contracts."""


@dataclass(frozen=True)
class Expectation:
    contract: str
    reason: str


def load(path: str | Path, registry: Registry) -> dict[str, Expectation]:
    path = Path(path)
    data = read_toml(path, ExpectationsError, "expectations file")
    if set(data) - {"expect"}:
        raise ExpectationsError(f"{path}: unknown top-level keys {sorted(set(data) - {'expect'})}")
    expectations: dict[str, Expectation] = {}
    for index, entry in enumerate(data.get("expect", [])):
        where = f"{path}: entry #{index + 1}"
        contract = entry.get("contract")
        reason = str(entry.get("reason", "")).strip()
        if not contract or not reason:
            raise ExpectationsError(f"{where}: needs both 'contract' and a non-empty 'reason'")
        if contract not in registry.contracts:
            raise ExpectationsError(f"{where}: unknown contract ID {contract!r}")
        if contract in expectations:
            raise ExpectationsError(f"{where}: {contract} is listed twice")
        expectations[contract] = Expectation(contract, reason)
    return expectations
