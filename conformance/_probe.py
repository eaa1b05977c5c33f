"""The kit's C++ probe (``_cxx``), compiled on first use against the running torch.

The probe is a small pybind11 module (sources in ``cxx/``) that calls into
PyTorch's PrivateUse1 registries from C++ and carries the GoogleTest contract
cases. It must be built against exactly the torch that runs the suite (the C++
ABI of torch's headers changes between builds), so the kit ships its sources
and compiles them with PyTorch's own extension tooling
(``torch.utils.cpp_extension.load``) the first time they are needed, into a
cache folder keyed by the torch build, the Python version and the C++ ABI.
Later runs with the same torch load the cached module in milliseconds; a
different torch gets its own folder.

Needs a C++ compiler (``$CXX``, else ``c++``) and GoogleTest's headers and
library (``libgtest-dev`` on Debian/Ubuntu; ``$GTEST_ROOT`` for an install
elsewhere). Without them the first use fails with an error naming what is
missing and how to get it.

    python -m privateuse1_conformance.conformance._probe     # build now, print where
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType

NAME = "_cxx"
SOURCE_DIR = Path(__file__).resolve().parent / "cxx"
# Two translation units, compiled in parallel: the Python bindings (probe.cpp,
# which carries torch's pybind11 headers) and every plain-C++ file as one
# unity build (contracts.cpp includes the others), so that the headers of
# c10, ATen and GoogleTest are parsed once. That and -O0 cut the first
# compile's CPU time roughly in half (29 s -> 15 s measured on this kit's CI
# machine); the probe's own code only calls into the backend, and its speed
# does not matter.
SOURCES = ("probe.cpp", "contracts.cpp")
# NDEBUG as in torch's own (release) build: c10's debug-only assertions
# (c10::Device's index check, for one) must not fire in the probe where they
# do not fire in torch and in the backend under test.
CFLAGS = ("-O0", "-DNDEBUG", "-Wall", "-Wno-unused-parameter")
CACHE_ENV = "PU1C_PROBE_CACHE"
GTEST_ENV = "GTEST_ROOT"

_module: ModuleType | None = None
_lock = threading.Lock()


class ProbeBuildError(RuntimeError):
    """The probe cannot be built here; the message says what is missing."""


def cache_root() -> Path:
    """Where compiled probes live: $PU1C_PROBE_CACHE, else the user's cache folder."""
    from privateuse1_conformance.harness.paths import user_cache

    return user_cache("probe", CACHE_ENV)


def build_key() -> str:
    """One folder per torch build, Python and C++ ABI, and version of the probe's sources and flags."""
    import torch

    sources = hashlib.sha256(" ".join(CFLAGS).encode())
    for path in sorted(SOURCE_DIR.glob("*")):
        if path.suffix in (".cpp", ".h"):
            sources.update(path.name.encode() + b"\0" + path.read_bytes())
    git = (torch.version.git_version or "unknown")[:12]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    python = sysconfig.get_config_var("SOABI") or f"py{sys.version_info[0]}{sys.version_info[1]}"
    return f"torch-{torch.__version__}-{git}-{python}-abi{abi}-src{sources.hexdigest()[:12]}"


def _find(candidates: list[Path]) -> Path | None:
    return next((path for path in candidates if path.exists()), None)


def gtest_prefixes() -> list[Path]:
    """Where GoogleTest is looked for: $GTEST_ROOT, a conda environment, /usr/local, /usr."""
    prefixes = [Path(os.environ[GTEST_ENV])] if os.environ.get(GTEST_ENV) else []
    if os.environ.get("CONDA_PREFIX"):
        prefixes.append(Path(os.environ["CONDA_PREFIX"]))
    return prefixes + [Path("/usr/local"), Path("/usr")]


def _gtest_flags(prefixes: list[Path] | None = None) -> tuple[list[str], list[str]]:
    """(include paths, linker flags) for GoogleTest, or ProbeBuildError saying how to get it."""
    prefixes = gtest_prefixes() if prefixes is None else prefixes
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    header = _find([prefix / "include" / "gtest" / "gtest.h" for prefix in prefixes])
    libdirs = [prefix / sub for prefix in prefixes
               for sub in ("lib", "lib64", f"lib/{multiarch}" if multiarch else "lib")]
    static = _find([libdir / "libgtest.a" for libdir in libdirs])
    shared = _find([libdir / "libgtest.so" for libdir in libdirs])
    if header is None or (static is None and shared is None):
        missing = "headers (gtest/gtest.h)" if header is None else "library (libgtest.a or libgtest.so)"
        raise ProbeBuildError(
            f"the kit's C++ probe needs GoogleTest, whose {missing} was not found under "
            f"{', '.join(str(p) for p in prefixes)}. Install it (Debian/Ubuntu: apt-get install "
            f"libgtest-dev; Fedora: dnf install gtest-devel; conda: conda install -c conda-forge gtest) "
            f"or point {GTEST_ENV} at a prefix holding include/gtest/gtest.h and lib/libgtest.a")
    includes = [str(header.parent.parent)]
    if static is not None:
        # Linked statically and kept out of the module's dynamic symbol table,
        # so that it cannot clash with another GoogleTest in the process (a
        # backend's own tests, for instance).
        return includes, [str(static), "-Wl,--exclude-libs,ALL", "-lpthread"]
    return includes, [f"-L{shared.parent}", f"-Wl,-rpath,{shared.parent}", "-lgtest", "-lpthread"]


def _check_compiler() -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler.split()[0]) is None:
        raise ProbeBuildError(
            f"the kit's C++ probe is compiled on first use, and no C++ compiler was found "
            f"({compiler!r} is not on PATH). Install one (Debian/Ubuntu: apt-get install g++) "
            f"or set CXX to a compiler supporting C++20")


@contextlib.contextmanager
def _exclusive(folder: Path):
    """One builder per folder across processes; released even if the builder dies.

    torch's own build lock (a file created with O_EXCL) stays behind when a
    build is killed, and every later build would wait on it forever: under
    this lock nobody else is building, so such a leftover is removed."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "kit.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            with contextlib.suppress(FileNotFoundError):
                (folder / "lock").unlink()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _import(path: Path) -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(NAME, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(folder: Path, verbose: bool) -> ModuleType:
    import torch
    import torch.utils.cpp_extension as cpp_extension

    _check_compiler()
    includes, ldflags = _gtest_flags()
    print(f"privateuse1-conformance: compiling the kit's C++ probe against torch "
          f"{torch.__version__} into {folder} (once per torch build; {EXPECTED_TIME})",
          file=sys.stderr, flush=True)
    env_path = os.environ.get("PATH", "")
    try:
        import ninja  # the pip package: its binary is not on PATH outside an activated venv

        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + env_path
    except ImportError:
        pass
    try:
        return cpp_extension.load(
            name=NAME,
            sources=[str(SOURCE_DIR / source) for source in SOURCES],
            extra_include_paths=[str(SOURCE_DIR)] + includes,
            extra_cflags=list(CFLAGS),
            extra_ldflags=ldflags,
            build_directory=str(folder),
            verbose=verbose,
        )
    except (RuntimeError, OSError) as e:
        raise ProbeBuildError(
            f"compiling the kit's C++ probe in {folder} failed: {e}. The compiler's output is "
            f"above; `python -m privateuse1_conformance.conformance._probe --verbose` shows "
            f"every command") from e
    finally:
        os.environ["PATH"] = env_path


# What the first compile costs (measured: docs/vendor-guide.md).
EXPECTED_TIME = "about 15 s of CPU: 11 s on two idle cores, longer on a loaded machine"


def _library(folder: Path) -> Path:
    return folder / f"{NAME}{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"


def is_built() -> bool:
    """Whether this torch has a cached build of the probe's sources."""
    return _module is not None or _library(cache_root() / build_key()).exists()


def load(verbose: bool = False) -> ModuleType:
    """The probe module, compiled first if this torch has no cached build of these sources."""
    global _module
    with _lock:
        if _module is None:
            folder = cache_root() / build_key()
            library = _library(folder)
            with _exclusive(folder):
                _module = _import(library) if library.exists() else _compile(folder, verbose)
            sys.modules[f"{__package__}.{NAME}"] = _module
        return _module


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m privateuse1_conformance.conformance._probe",
        description="Compile (if needed) and load the kit's C++ probe; print where it lives.")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    args = parser.parse_args(argv)
    try:
        module = load(verbose=args.verbose)
    except ProbeBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(module.__file__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
