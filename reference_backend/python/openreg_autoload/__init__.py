"""OpenReg's ``torch.backends`` entry point: ``import torch`` loads OpenReg.

PyTorch calls every entry point of the group ``torch.backends`` at the end of
``import torch`` unless ``TORCH_DEVICE_BACKEND_AUTOLOAD`` is set to anything
but ``1`` (``_import_device_backends`` in ``torch/__init__.py``). An exception
raised here makes ``import torch`` itself fail.

This module is a package of its own, not part of ``openreg``: importing any
module of ``openreg`` runs ``openreg/__init__.py``, which claims PrivateUse1.
The decision to load must be taken before that import.

OpenReg is a reference backend that is often installed next to a vendor's
backend, so it yields rather than competes for PrivateUse1. ``load()`` does
nothing when:

* ``OPENREG_AUTOLOAD=0`` (OpenReg's own switch; other backends still load),
* PrivateUse1 is already claimed by another backend, or
* another installed distribution declares a ``torch.backends`` entry point
  (the order in which PyTorch calls entry points is not defined, so the only
  deterministic rule is to leave PrivateUse1 to the other backend).

Loading imports ``openreg`` and nothing else: no device is initialized, so a
process forked after ``import torch`` can still use the devices.
"""

from __future__ import annotations

import os
from importlib import metadata

_GROUP = "torch.backends"
_DISTRIBUTION = "openreg"
_SWITCH = "OPENREG_AUTOLOAD"


def _enabled() -> bool:
    value = os.environ.get(_SWITCH, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{_SWITCH}={value!r} is not valid: use 1 (load OpenReg on import torch, "
                         f"the default) or 0 (do not)")
    return value == "1"


def other_declarations() -> list[str]:
    """The ``torch.backends`` entry points other distributions declare."""
    others = []
    for entry_point in metadata.entry_points(group=_GROUP):
        dist = getattr(entry_point, "dist", None)
        name = dist.metadata["Name"] if dist is not None else None
        if name is None or name.lower() != _DISTRIBUTION:
            others.append(f"{entry_point.name} = {entry_point.value} ({name or 'no distribution'})")
    return others


def load() -> None:
    """Load OpenReg unless it should yield (see the module's docstring)."""
    if not _enabled():
        return
    import torch  # already imported: PyTorch calls this at the end of its import

    claimed = torch._C._get_privateuse1_backend_name()
    if claimed != "privateuseone" or other_declarations():
        return
    import openreg
