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
    "amp-dtypes-empty",
    "autoload-does-nothing",  # (read by openreg_autoload, which runs before this module)
    "autoload-initializes-device",
    "autoload-main-thread-only",  # (read by openreg_autoload)
    "availability-initializes",  # (also in C++: the hooks' isAvailable)
    "default-autocast-dtype-unadvertised",
    "device-context-leaks-on-exception",
    "device-count-at-import-creates-context",
    "dynamo-current-stream-is-default",
    "dynamo-device-count-wrong",
    "dynamo-exchange-returns-new",
    "dynamo-is-gpu-unseen-by-inductor",
    "dynamo-multi-processor-count-missing",
    "dynamo-stream-placeholder",
    "dynamo-synchronize-is-noop",
    "fork-poisons-uninitialized",
    "inductor-buffers-on-current-device",
    "inductor-guard-keeps-kernel-device",
    "load-on-current-device",
    "manual-seed-not-reaching-device",
    "manual-seed-seeds-all",
    "map-location-unchecked",
    "memory-fraction-clamped",  # (also in C++: the allocator's range check)
    "memory-fraction-of-current-device",
    "module-accepts-other-device-type",
    "module-count-zero-before-init",
    "module-device-none-is-device-0",
    "module-is-available-false",
    "module-is-initialized-raises-before-init",
    "module-memory-allocated-off",
    "module-memory-stats-stale",
    "module-set-device-minus-one-raises",
    "module-set-device-negative-counts-from-end",
    "module-set-device-python-only",
    "rng-state-ignores-device",
    "seed-all-seeds-current-only",
    "set-rng-state-all-skips-last",
    "synchronize-ignores-bad-index",
    "unrecorded-event-not-ready",
    "unrecorded-synchronize-raises",
})


def active(mutant_id: str) -> bool:
    return SELECTED == mutant_id


def check(cxx_known: list[str]) -> None:
    if SELECTED is not None and SELECTED not in KNOWN and SELECTED not in cxx_known:
        raise RuntimeError(
            f"OPENREG_MUTANT={SELECTED!r} names no mutant of OpenReg; known: "
            f"{', '.join(sorted(KNOWN | set(cxx_known)))}"
        )
