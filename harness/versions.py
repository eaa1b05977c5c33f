"""Which torch the kit supports, and what a contract needs of it.

The kit reaches into PyTorch's PrivateUse1 surface (hooks, guard, private
accelerator functions), which moves between releases. It declares the torch
releases it supports; a run on a torch outside that range stops at once with
a message saying so, unless ``--allow-untested-torch`` accepts the risk. A
contract whose APIs appeared in a later release than the range's lowest
carries ``min_torch`` in the registry and is left out of runs on an older
torch (reported, never failed).

The range is the releases the kit's own tests run on (`make torch-matrix`:
OpenReg and the independent fixture backend on each, docs/torch-matrix.md);
docs/vendor-guide.md says what to do on another.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# The releases the kit supports, and those its own tests ran on.
SUPPORTED_TORCH = SpecifierSet(">=2.13,<2.16")
TESTED_TORCH = ("2.13.0", "2.14.1", "2.15.0")


def release(version: str) -> Version:
    """A torch version string ('2.13.0+cpu', '2.14.0a0+git1234') as a comparable release."""
    try:
        parsed = Version(str(version))
    except InvalidVersion as e:
        raise ValueError(f"not a torch version: {version!r}") from e
    return Version(parsed.base_version)


def torch_problem(version: str) -> str | None:
    """Why the kit does not support torch `version`, or None if it does."""
    if release(version) in SUPPORTED_TORCH:
        return None
    return (f"torch {version} is outside the range this kit supports (torch{SUPPORTED_TORCH}; "
            f"tested on {', '.join(TESTED_TORCH)}). Install a kit release that supports it, or pass "
            f"--allow-untested-torch to run anyway (a failure may then be the kit's, not the backend's)")
