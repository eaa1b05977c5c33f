"""Provenance of a run: what was tested, with what, and how."""

from __future__ import annotations

import datetime
import hashlib
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from privateuse1_conformance.reports.model import Provenance

if TYPE_CHECKING:
    from .plugin import ConformanceSession


def _file_record(path: Path | None) -> dict[str, str] | None:
    if path is None:
        return None
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return {"path": str(path), "sha256": digest}


def kit_version() -> str:
    try:
        return metadata.version("privateuse1-conformance")
    except metadata.PackageNotFoundError:
        return "unknown"


def kit_commit() -> str | None:
    """The git commit of the kit's sources, when they are a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def collect(session: ConformanceSession, started: float, duration: float) -> Provenance:
    import torch

    backend = session.backend
    cuda = torch.version.cuda
    seeds = {}
    seed = getattr(session.config.option, "hypothesis_seed", None)
    if seed is not None:
        seeds["hypothesis"] = str(seed)
    warnings = []
    if session.parent_initialized:
        warnings.append("the backend was initialized by importing it; tests ran in processes "
                        "forked from an initialized backend")
    return Provenance(
        kit_version=kit_version(),
        kit_commit=kit_commit(),
        torch_version=torch.__version__,
        torch_build=f"cuda {cuda}" if cuda else "cpu",
        torch_cxx11_abi=bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        python=sys.version.split()[0],
        platform=platform.platform(),
        backend_requested=backend.requested,
        backend_module=backend.module_name,
        backend_version=backend.version,
        device_type=backend.device_type,
        device_count=session.device_count,
        command_line=list(sys.argv),
        level_checked=session.level,
        isolation=session.isolation,
        timeout_s=session.timeout,
        seeds=seeds,
        manifest=_file_record(backend.manifest.path),
        expectations=_file_record(session.expectations_path),
        started=datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(),
        duration_s=round(duration, 3),
        warnings=warnings,
    )
