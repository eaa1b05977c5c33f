"""Mutants of OpenReg implemented in Python (see csrc/Mutants.h).

OPENREG_MUTANT selects one, read once at import. An unknown ID is an error
at import: a typo must not silently run the unmutated backend.
"""

from __future__ import annotations

import os

SELECTED: str | None = os.environ.get("OPENREG_MUTANT") or None

# The IDs of the mutants implemented in Python; kept in step with
# conformance/mutants.toml by tests/test_mutants.py.
KNOWN: frozenset[str] = frozenset({
    "availability-initializes",  # (also in C++: the hooks' isAvailable)
    "device-context-leaks-on-exception",
    "dynamo-synchronize-is-noop",
    "load-on-current-device",
    "manual-seed-not-reaching-device",
    "map-location-unchecked",
    "module-accepts-other-device-type",
    "module-set-device-minus-one-raises",
    "rng-state-ignores-device",
    "synchronize-ignores-bad-index",
    "unrecorded-event-not-ready",
})


def active(mutant_id: str) -> bool:
    return SELECTED == mutant_id


def check(cxx_known: list[str]) -> None:
    if SELECTED is not None and SELECTED not in KNOWN and SELECTED not in cxx_known:
        raise RuntimeError(
            f"OPENREG_MUTANT={SELECTED!r} names no mutant of OpenReg; known: "
            f"{', '.join(sorted(KNOWN | set(cxx_known)))}"
        )
