"""This machine's paths, made portable for a published report.

A report is published and read elsewhere, and a reviewer reruns its
commands on another machine: it must not carry the absolute paths of the
machine that ran it (its user's home, its virtual environment, its
temporary folders). `portable` replaces each known root by a placeholder:

    <site-packages>/...   the Python environment's installed packages
    <stdlib>/...          Python's standard library
    <python>/...          the environment's prefix (its bin/, include/)
    ./...                 the run's working directory (not for `keep_cwd`)
    <tmp>/...             the temporary folder
    ~/...                 the user's home

    <privateuse1_conformance>/...  the kit's package, wherever installed
    <NAME>/...            the backend's package (``add_package``)

so that a traceback keeps the file names that say where a failure happened,
and a command names a file in the working directory as a relative path.
"""

from __future__ import annotations

import functools
import os
import re
import site
import sys
import sysconfig
import tempfile


def user_cache(folder: str, override_env: str):
    """The kit's cache folder `folder` (probe, clauses): $`override_env` if
    set, else the user's cache folder ($XDG_CACHE_HOME or ~/.cache) under
    privateuse1-conformance/."""
    from pathlib import Path

    if os.environ.get(override_env):
        return Path(os.environ[override_env]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "privateuse1-conformance" / folder


_KIT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_packages: list[tuple[str, str]] = [(_KIT_ROOT, "<privateuse1_conformance>")]


def add_package(folder: str, name: str) -> None:
    """Name `folder` (a package's own folder) `<name>` in portable text."""
    _packages.append((folder, f"<{name}>"))
    _roots.cache_clear()


@functools.lru_cache(maxsize=2)
def _roots(cwd: str | None) -> tuple[tuple[re.Pattern, str], ...]:
    named: list[tuple[str, str]] = list(_packages)
    paths = sysconfig.get_paths()
    for key in ("purelib", "platlib"):
        named.append((paths.get(key, ""), "<site-packages>"))
    try:
        named += [(p, "<site-packages>") for p in [*site.getsitepackages(), site.getusersitepackages()]]
    except AttributeError:  # (a virtualenv's old site module)
        pass
    named += [(paths.get("stdlib", ""), "<stdlib>"), (paths.get("platstdlib", ""), "<stdlib>")]
    named += [(sys.prefix, "<python>"), (sys.base_prefix, "<python>")]
    if cwd:
        named.append((cwd, "."))
    named += [(tempfile.gettempdir(), "<tmp>"), (os.path.expanduser("~"), "~")]
    roots: dict[str, str] = {}
    for path, name in named:
        for variant in {path, os.path.realpath(path)} if path else ():
            variant = variant.rstrip("/")
            if variant:  # ("/" would blank every path)
                roots.setdefault(variant, name)
    # Longest first: a virtual environment under the home, the home last.
    ordered = sorted(roots.items(), key=lambda item: len(item[0]), reverse=True)
    return tuple((re.compile(r"(?<![\w.~-])" + re.escape(path) + r"(?=/|\b|$)"), name) for path, name in ordered)


def portable(text: str, keep_cwd: bool = False) -> str:
    """`text` with this machine's absolute paths replaced (see the module's
    doc); the working directory becomes `.` unless `keep_cwd`."""
    if not text or "/" not in text:
        return text
    for pattern, name in _roots(None if keep_cwd else os.getcwd()):
        text = pattern.sub(name, text)
    return text
