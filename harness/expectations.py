"""The expectations file: known failures of a backend, by contract or by one test of it.

    [[expect]]
    contract = "EV-TIME-001"
    reason = "event timing lands in release 2.1 (ticket XYZ-42)"

    [[expect]]
    contract = "ST-SYNC-001"
    test = "test_streams.py::test_synchronize_waits[2]"   # optional: only this test
    reason = "XYZ-57: synchronize() on the second device returns early"

A test of an expected contract that fails or errors gets the verdict xfail;
one that passes gets xpass, and the entry is reported as stale. Crashes and
hangs are never turned into anything else. `test` names a test as the
reports name it (its file in the suite, `::`, its name); a name without its
`[parameters]`, or a file, covers every test it holds, the same way
`--test` selects. An entry naming a test applies to that test only and is
preferred over an entry for the whole contract; a test entry that matches
no test of its contract is an error when the suite is collected.
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
    test: str | None = None  # None: every test of the contract

    @property
    def label(self) -> str:
        """How reports name the entry: the contract, and the test when it names one."""
        return self.contract if self.test is None else f"{self.contract} [{self.test}]"

    def covers(self, test_id: str) -> bool:
        return self.test is None or matches(self.test, test_id)


def matches(selector: str, test_id: str) -> bool:
    """Whether `selector` (a test ID, one without its parameters, or a file) names `test_id`."""
    bare = test_id.split("[", 1)[0]
    return test_id == selector or bare == selector or test_id.startswith(selector + "::")


class Expectations:
    """The entries of one expectations file, looked up per contract and test."""

    def __init__(self, entries: list[Expectation] = ()) -> None:
        self.entries = list(entries)

    def __bool__(self) -> bool:
        return bool(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def for_test(self, contract_id: str, test_id: str) -> Expectation | None:
        """The entry that applies to `contract_id` in test `test_id`: one naming the test first."""
        candidates = [e for e in self.entries if e.contract == contract_id and e.covers(test_id)]
        candidates.sort(key=lambda e: e.test is None)
        return candidates[0] if candidates else None


def load(path: str | Path, registry: Registry) -> Expectations:
    path = Path(path)
    data = read_toml(path, ExpectationsError, "expectations file")
    if set(data) - {"expect"}:
        raise ExpectationsError(f"{path}: unknown top-level keys {sorted(set(data) - {'expect'})}")
    entries: list[Expectation] = []
    seen: set[tuple[str, str | None]] = set()
    for index, entry in enumerate(data.get("expect", [])):
        where = f"{path}: entry #{index + 1}"
        unknown = set(entry) - {"contract", "test", "reason"}
        if unknown:
            raise ExpectationsError(f"{where}: unknown keys {sorted(unknown)} (known: contract, test, reason)")
        contract = entry.get("contract")
        reason = str(entry.get("reason", "")).strip()
        if not contract or not reason:
            raise ExpectationsError(f"{where}: needs both 'contract' and a non-empty 'reason'")
        if contract not in registry.contracts:
            raise ExpectationsError(f"{where}: unknown contract ID {contract!r}")
        test = entry.get("test")
        if test is not None and (not isinstance(test, str) or not test.strip()):
            raise ExpectationsError(f"{where}: 'test' must name a test, e.g. "
                                    f"'test_streams.py::test_name[param]'")
        test = test.strip() if test else None
        if (contract, test) in seen:
            what = contract if test is None else f"{contract} with test {test!r}"
            raise ExpectationsError(f"{where}: {what} is listed twice")
        seen.add((contract, test))
        entries.append(Expectation(contract, reason, test))
    return Expectations(entries)
