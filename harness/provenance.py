"""Provenance of a run: what was tested, with what, and how."""

from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.util
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from privateuse1_conformance.reports.model import Provenance

from . import backend as backend_mod
from .paths import portable

if TYPE_CHECKING:
    from .session_view import RunSession


def _file_record(path: Path | None) -> dict[str, str] | None:
    if path is None:
        return None
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return {"path": portable(str(Path(path).resolve())), "sha256": digest}


def kit_version() -> str:
    try:
        return metadata.version("privateuse1-conformance")
    except metadata.PackageNotFoundError:
        return "unknown"


def _git(*args: str) -> str | None:
    """Output of a git command in the kit's source folder; None if it fails."""
    here = Path(__file__).resolve().parent
    try:
        result = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def kit_commit() -> str | None:
    """The git commit of the kit's sources, when they are a git checkout
    (suffix -dirty: tracked files were modified)."""
    # An installed kit inside some other repository (a venv in a vendor's
    # checkout) must not report that repository's commit.
    if _git("ls-files", "--error-unmatch", Path(__file__).name) is None:
        return None
    head = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    if head is None:
        return None
    return head.strip() + ("-dirty" if dirty and dirty.strip() else "")


# ------------------------------------------------------------ file hashes

KIT_PACKAGES = ("conformance", "harness", "reports")
_SKIPPED_PARTS = {"__pycache__"}


def _hash_tree(root: Path, prefix: str, suffixes: tuple[str, ...] | None = None) -> dict[str, str]:
    """sha256 of every file under `root` (sorted, by `prefix`/relative
    path), without caches, hidden folders or (with `suffixes`) other files."""
    hashes = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if not path.is_file() or _SKIPPED_PARTS & set(relative.parts) or any(
                part.startswith(".") for part in relative.parts) or path.suffix == ".pyc":
            continue
        if suffixes is not None and not path.name.endswith(suffixes) and ".so." not in path.name:
            continue
        hashes[f"{prefix}/{relative.as_posix()}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


@functools.lru_cache(maxsize=None)
def kit_files() -> dict[str, str]:
    """sha256 of every file of the kit's three packages as installed (or in
    the checkout it runs from): the suite, the harness and the reports."""
    hashes = {}
    for name in KIT_PACKAGES:
        spec = importlib.util.find_spec(f"privateuse1_conformance.{name}")
        for location in (spec.submodule_search_locations or []) if spec else []:
            hashes.update(_hash_tree(Path(location), name))
    return hashes


BACKEND_SUFFIXES = (".py", ".so", ".pyd", ".dylib", ".dll", ".pyi")


def backend_files(module_name: str) -> dict[str, str]:
    """sha256 of the backend's Python files and binaries: every such file of
    its top-level package (all the folders the package spans, e.g. an
    editable install's sources and its built extension), by path from the
    package (a single-file module: the file). Found without importing it,
    so that `verify --backend` can compare them with what is installed."""
    top = module_name.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return {}
    if spec is None:
        return {}
    if spec.submodule_search_locations:
        hashes = {}
        for location in spec.submodule_search_locations:
            if Path(location).is_dir():
                hashes.update(_hash_tree(Path(location), top, BACKEND_SUFFIXES))
        return hashes
    if spec.origin and Path(spec.origin).is_file():
        return {Path(spec.origin).name: hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest()}
    return {}


def differing_files(recorded: dict[str, str], installed: dict[str, str]) -> list[str]:
    """The paths whose hashes differ, or that only one side has (sorted)."""
    return sorted(path for path in set(recorded) | set(installed) if recorded.get(path) != installed.get(path))


# Tools whose version can change a verdict.
PACKAGES = ("pytest", "pytest-xdist", "hypothesis", "numpy")
# Environment variables worth recording are those that steer torch or the
# backend; names that look like credentials never are.
_SECRET = re.compile("TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|KEY", re.IGNORECASE)


def _torch_build(torch) -> str:
    if torch.version.cuda:
        return f"cuda {torch.version.cuda}"
    if getattr(torch.version, "hip", None):
        return f"rocm {torch.version.hip}"
    return "cpu"


def _backend_version(session: RunSession) -> str | None:
    """The backend's version; for a registered profile without one, the
    version of the distribution that registered the profile."""
    if session.backend.version:
        return session.backend.version
    for entry_point in metadata.entry_points(group=backend_mod.ENTRY_POINT_GROUP):
        if entry_point.name == session.backend.requested and entry_point.dist is not None:
            return f"{entry_point.dist.version} ({entry_point.dist.metadata['Name']})"
    return None


def _packages() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def _environment(session: RunSession) -> dict[str, str]:
    prefixes = {"TORCH_", "PYTORCH_", f"{session.backend.device_type.upper()}_",
                f"{session.backend.module_name.split('.')[0].upper()}_"}
    return {
        name: value
        for name, value in sorted(os.environ.items())
        if (name.startswith(tuple(prefixes)) or name in ("PYTHONHASHSEED", "OMP_NUM_THREADS"))
        and not _SECRET.search(name)
    }


def _seeds(session: RunSession) -> dict[str, str]:
    # The suite's own seeds are constants in its code; what varies between
    # runs is Hypothesis' (the suite derandomizes it unless a seed is given)
    # and Python's hash seed.
    seed = getattr(session.config.option, "hypothesis_seed", None)
    return {
        "hypothesis": str(seed) if seed is not None else "derandomized",
        "python_hash": os.environ.get("PYTHONHASHSEED", "random"),
    }


def warnings_of(session: RunSession) -> list[str]:
    """The run's warnings so far (they may grow while it runs)."""
    warnings = [portable(w) for w in session.warnings]
    if session.parent_initialized:
        warnings.append("the backend was initialized by importing it; tests ran in processes "
                        "forked from an initialized backend")
    return warnings


def collect(session: RunSession, started: float, duration: float) -> Provenance:
    import torch

    backend = session.backend
    warnings = warnings_of(session)
    return Provenance(
        kit_version=kit_version(),
        kit_commit=kit_commit(),
        torch_version=torch.__version__,
        torch_build=_torch_build(torch),
        torch_cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        torch_git_version=str(getattr(torch.version, "git_version", "")),
        python=f"{sys.version.split()[0]} ({platform.python_implementation()})",
        platform=platform.platform(),
        backend_requested=backend.requested,
        backend_name=backend.name,
        backend_module=backend.module_name,
        backend_version=_backend_version(session),
        backend_file=portable(str(getattr(backend.module, "__file__", "") or "")),
        device_type=backend.device_type,
        device_count=session.device_count,
        # (a published report carries no path of this machine: harness/paths.py)
        command_line=[portable(arg) for arg in sys.argv],
        working_directory=portable(os.getcwd(), keep_cwd=True),
        level_checked=session.level,
        isolation=session.isolation,
        workers=session.workers,
        timeout_s=session.timeout,
        seeds=_seeds(session),
        manifest=_file_record(backend.manifest.path),
        expectations=_file_record(session.expectations_path),
        registry=_file_record(session.registry.path),
        packages=_packages(),
        environment=_environment(session),
        started=datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(),
        duration_s=round(duration, 3),
        warnings=warnings,
        kit_files=kit_files(),
        backend_files=backend_files(backend.module_name),
    )
