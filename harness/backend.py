"""Finding, loading and describing the backend under test.

``--backend NAME`` is resolved in this order:

1. a registered *profile*: an entry point named NAME in the group
   ``privateuse1_conformance.backends``. Its object is a callable returning a
   mapping with ``module`` (the import name) and optionally ``manifest`` (a
   path to a manifest TOML file);
2. otherwise an importable Python module NAME that claims PrivateUse1 when
   imported (a vendor's ``torch_xyz``).

A manifest (TOML, all keys optional) tells the kit what the backend claims::

    [backend]
    name = "xyz"                  # shown in reports (default: the module's distribution name)
    claims = "standard"           # the level the vendor claims
    unclaimed = ["events"]        # features the backend does not implement
    expectations = "known.toml"   # known failures (relative to the manifest)
    instrumentation = "torch_xyz.conformance_probe"   # optional probe module
    process_group = "xccl"        # its torch.distributed backend (default: the one
                                  # registered for the device type)

    [operators]                   # the operators area's claims (harness/operators.py)

Contracts that need an unclaimed feature get the verdict not-claimed.
The instrumentation module may define any of the functions in
INSTRUMENTATION. They only sharpen checks (count what PyTorch cannot see,
make asynchronous observations deterministic); no check needs them.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from .operators import Claims, OperatorsError
from .registry import LEVELS, Registry, read_toml

ENTRY_POINT_GROUP = "privateuse1_conformance.backends"

# Optional functions a backend can expose to make otherwise invisible rules
# checkable (in the spirit of test262's host-defined $262 object).
INSTRUMENTATION = {
    "device_switch_count": "number of device switches the backend's runtime performed in this process",
    "init_count": "number of times the hooks' init() ran in this process",
    "live_event_count": "number of events the backend's runtime holds (created and not yet destroyed)",
    "block_stream": "block_stream(stream) holds the stream at this point of its queue and returns a function "
                    "that releases it (makes the ordering checks deterministic)",
}


class BackendError(RuntimeError):
    """The backend could not be found, loaded or described."""


@dataclass
class Manifest:
    path: Path | None = None
    name: str | None = None
    claims: str | None = None
    unclaimed: frozenset[str] = frozenset()
    expectations: Path | None = None
    instrumentation: str | None = None
    # Backend metadata the backend keeps (torch._utils.set_tensor_metadata
    # keys and values); declaring it claims the feature backend-metadata.
    backend_metadata: dict[str, bool] = field(default_factory=dict)
    # The operators area's claims ([operators]; harness/operators.py).
    operators: Claims = field(default_factory=Claims)
    # The torch.distributed backend the distributed area checks (None: the
    # one registered for the device type).
    process_group: str | None = None

    @classmethod
    def load(cls, path: str | Path, registry: Registry | None = None) -> Manifest:
        path = Path(path)
        data = read_toml(path, BackendError, "manifest")
        section = data.get("backend", {})
        keys = {"name", "claims", "unclaimed", "expectations", "instrumentation", "backend_metadata",
                "process_group"}
        unknown = set(section) - keys
        if unknown or set(data) - {"backend", "operators"}:
            raise BackendError(
                f"manifest {path}: unknown keys {sorted(unknown | (set(data) - {'backend', 'operators'}))}; "
                f"expected [backend] with {', '.join(sorted(keys))}, and optionally [operators]"
            )
        try:
            operators = Claims.from_table(data.get("operators", {}), f"manifest {path}")
        except OperatorsError as e:
            raise BackendError(str(e)) from None
        backend_metadata = section.get("backend_metadata", {})
        if (not isinstance(backend_metadata, dict)
                or not all(isinstance(k, str) and isinstance(v, bool) for k, v in backend_metadata.items())
                or {"conj", "neg"} & set(backend_metadata)):
            raise BackendError(
                f"manifest {path}: backend_metadata must be a table of names to true/false (the keys "
                f"torch._utils.set_tensor_metadata takes, other than PyTorch's conj and neg), "
                f"got {backend_metadata!r}")
        claims = section.get("claims")
        if claims is not None and claims not in LEVELS:
            raise BackendError(f"manifest {path}: claims must be one of {LEVELS}, got {claims!r}")
        unclaimed = frozenset(section.get("unclaimed", ()))
        if registry is not None:
            bad = unclaimed - set(registry.features)
            if bad:
                raise BackendError(
                    f"manifest {path}: unknown features {sorted(bad)}; "
                    f"known features: {sorted(registry.features)}"
                )
        expectations = section.get("expectations")
        return cls(
            path=path,
            name=section.get("name"),
            claims=claims,
            unclaimed=unclaimed,
            expectations=(path.parent / expectations) if expectations else None,
            instrumentation=section.get("instrumentation"),
            backend_metadata=dict(backend_metadata),
            operators=operators,
            process_group=_process_group(section.get("process_group"), path),
        )


def _process_group(value: Any, path: Path) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise BackendError(f"manifest {path}: process_group must be the name of a torch.distributed backend "
                           f"(a non-empty string), got {value!r}")
    return value


@dataclass
class Backend:
    """A loaded backend: what tests use to reach it."""

    requested: str              # what --backend said
    module_name: str
    module: ModuleType
    device_type: str            # the renamed PrivateUse1 name, e.g. "openreg"
    device_module: ModuleType | None   # torch.<device_type>, None if never registered
    manifest: Manifest
    version: str | None
    instrumentation: ModuleType | None = None
    profile: dict[str, Any] = field(default_factory=dict)
    distribution: str | None = None   # the installed distribution that holds the module

    @property
    def name(self) -> str:
        """How reports call the backend: the manifest's name, else the name of
        the distribution that installed its module, else the module's name.
        Never the device type: two vendors' backends may share one."""
        return self.manifest.name or self.distribution or self.module_name

    def device(self, index: int | None = None):
        import torch

        return torch.device(self.device_type, index) if index is not None else torch.device(self.device_type)

    def instrument(self, function: str):
        """The instrumentation function, or None if the backend lacks it."""
        if function not in INSTRUMENTATION:
            raise KeyError(f"unknown instrumentation function {function!r}")
        return getattr(self.instrumentation, function, None) if self.instrumentation else None


def find_profile(name: str) -> dict[str, Any] | None:
    """The registered profile called `name`, if any."""
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name == name:
            try:
                profile = entry_point.load()
                profile = profile() if callable(profile) else profile
            except Exception as e:  # noqa: BLE001 - report any failure of the profile
                raise BackendError(f"backend profile {name!r} ({entry_point.value}) failed: {e}") from e
            if not isinstance(profile, dict) or "module" not in profile:
                raise BackendError(
                    f"backend profile {name!r} must be a mapping with a 'module' key, got {profile!r}"
                )
            return profile
    return None


def autoload_declarations() -> list[str]:
    """The ``torch.backends`` entry points installed here: what ``import torch``
    loads unless TORCH_DEVICE_BACKEND_AUTOLOAD is set to anything but 1."""
    try:
        return [f"{ep.name} = {ep.value}" + (f" ({ep.dist.metadata['Name']})" if getattr(ep, "dist", None) else "")
                for ep in metadata.entry_points(group="torch.backends")]
    except Exception:  # noqa: BLE001 - broken metadata must not hide the real error
        return []


def autoload_distributions() -> list[str]:
    """The names of the distributions that declare ``torch.backends`` entry points."""
    try:
        return [ep.dist.metadata["Name"] for ep in metadata.entry_points(group="torch.backends")
                if getattr(ep, "dist", None) is not None]
    except Exception:  # noqa: BLE001
        return []


def already_claimed(claimed: str, module_name: str) -> str:
    """Why `module_name` cannot be loaded: `claimed` holds PrivateUse1."""
    return (f"PrivateUse1 is already claimed by {claimed!r} in this process, before {module_name!r} "
            f"was imported (only one PrivateUse1 backend can be loaded). {_autoload_hint()}")


def _autoload_hint() -> str:
    declared = autoload_declarations()
    autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"
    if declared and autoload:
        return (f"import torch autoloaded {', '.join(declared)} (entry point group torch.backends): "
                "set TORCH_DEVICE_BACKEND_AUTOLOAD=0 to test another backend")
    return "Is a conftest.py, a plugin or a .pth file importing another backend?"


def _distribution_of(module_name: str) -> str | None:
    """The installed distribution that provides `module_name`'s top-level
    package (None for a module found on the path, outside any distribution)."""
    top = module_name.split(".")[0]
    try:
        # First the distribution named like the package (the usual case):
        # scanning every installed distribution's files takes a second.
        try:
            named = metadata.distribution(top)
        except metadata.PackageNotFoundError:
            named = None
        if named is not None and any(f.parts and f.parts[0] in (top, f"{top}.py") for f in named.files or ()):
            return named.metadata["Name"]
        names = metadata.packages_distributions().get(top, [])
        if not names:
            # packages_distributions() (Python 3.11) infers packages from .py
            # files only: a package whose installed files are all compiled
            # (an editable install's extension modules) is found by its files.
            names = [dist.metadata["Name"] for dist in metadata.distributions()
                     if any(f.parts and f.parts[0] == top for f in dist.files or ())]
        return metadata.metadata(names[0])["Name"] if names else None
    except Exception:  # noqa: BLE001 - broken metadata must not stop a run
        return None


def _version_of(module: ModuleType, distribution: str | None) -> str | None:
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    try:
        return metadata.version(distribution) if distribution else None
    except Exception:  # noqa: BLE001
        return None


def load(name: str, manifest_path: str | Path | None = None, registry: Registry | None = None) -> Backend:
    """Resolve and import the backend `name`. Imports torch; never touches a device."""
    profile = find_profile(name) or {}
    module_name = profile.get("module", name)
    manifest_file = manifest_path or profile.get("manifest")
    manifest = Manifest.load(manifest_file, registry) if manifest_file else Manifest()

    import torch

    claimed = torch._C._get_privateuse1_backend_name()
    if claimed != "privateuseone" and module_name not in sys.modules:
        raise BackendError(already_claimed(claimed, module_name))
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - a broken backend must give a clear error
        how = "registered profile" if profile else "module"
        raise BackendError(f"cannot import backend {how} {name!r} (module {module_name!r}): {e!r}") from e
    device_type = torch._C._get_privateuse1_backend_name()
    if device_type == "privateuseone":
        raise BackendError(
            f"importing {module_name!r} did not claim PrivateUse1: "
            "torch.utils.rename_privateuse1_backend(...) was never called"
        )
    # A backend without a device module still gets a complete run: the tests
    # that need the module fail and say what is missing.
    device_module = getattr(torch, device_type, None)
    distribution = _distribution_of(module_name)
    instrumentation = None
    if manifest.instrumentation:
        try:
            instrumentation = importlib.import_module(manifest.instrumentation)
        except Exception as e:  # noqa: BLE001
            raise BackendError(f"cannot import instrumentation module {manifest.instrumentation!r}: {e!r}") from e
    return Backend(
        requested=name,
        module_name=module_name,
        module=module,
        device_type=device_type,
        device_module=device_module,
        manifest=manifest,
        version=_version_of(module, distribution),
        instrumentation=instrumentation,
        profile=profile,
        distribution=distribution,
    )
