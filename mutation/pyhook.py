"""Weaves the selected mutant's Python sites into OpenReg's modules as they
are imported (mutation/weave.py says how a site is written).

`make build` puts a .pth file into the project's environments
(`python mutation/pyhook.py --install`) that runs `install()` at every
interpreter's start. With OPENREG_MUTANT unset (every
normal run) it returns at once and nothing is hooked: the clean modules load
as they are. With a mutant selected it puts a finder in front of
sys.meta_path: the modules that have sites of that mutant are compiled from
their woven source (never from a cached .pyc), under the clean file's name
and line numbers. Forked and new interpreters inherit the selection and the
hook, as the C++ schemata inherit it through the environment.

Two more duties of a selection, which OpenReg's clean sources know nothing
of:
- an OPENREG_MUTANT that names no mutant of the registry is an error at
  `import openreg` (a typo must not silently run the unmutated backend);
- the selected mutant gets an Inductor cache folder of its own
  (TORCHINDUCTOR_CACHE_DIR gains a `openreg-mutant-<id>` level): Inductor
  reuses generated code across processes by a key that knows nothing of the
  mutant, so code generated under a mutant would otherwise be served to the
  unmutated backend sharing the folder.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "conformance" / "mutants.toml"


class _WovenLoader(importlib.machinery.SourceFileLoader):
    def __init__(self, fullname: str, path: str, sites: list) -> None:
        super().__init__(fullname, path)
        self._sites = sites

    def get_code(self, fullname: str):  # never the clean module's cached bytecode
        return _weaver().compile_python(Path(self.path).read_text(encoding="utf-8"), self.path, self._sites)


class _WovenFinder(importlib.abc.MetaPathFinder):
    def __init__(self, by_path: dict[str, list]) -> None:
        self._by_path = by_path

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.split(".")[0].startswith("openreg"):
            return None
        # The finder that would have found the module (an editable install's
        # own finder, or the path finder) finds it; only its loader changes.
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.origin is None:
            return spec
        sites = self._by_path.get(str(Path(spec.origin).resolve()))
        if sites:
            spec.loader = _WovenLoader(fullname, spec.origin, sites)
        return spec


_WEAVER = None


def _weaver():
    """mutation/weave.py, loaded by its path (it is no installed module)."""
    global _WEAVER
    if _WEAVER is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_openreg_mutation_weave", Path(__file__).with_name("weave.py"))
        _WEAVER = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = _WEAVER   # (its dataclasses look their module up)
        spec.loader.exec_module(_WEAVER)
    return _WEAVER


class _UnknownMutant(importlib.abc.MetaPathFinder):
    """Refuses to import OpenReg under a selection that names no mutant."""

    def __init__(self, message: str) -> None:
        self._message = message

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "openreg":
            raise RuntimeError(self._message)
        return None


def _own_inductor_cache(selected: str) -> None:
    import getpass
    import tempfile

    level = f"openreg-mutant-{selected}"
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if base is None:   # Inductor's default folder
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        base = os.path.join(tempfile.gettempdir(), f"torchinductor_{user.replace(os.sep, '_')}")
    if os.path.basename(os.path.normpath(base)) != level:   # (a child inherits its parent's)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, level)


def install() -> None:
    selected = os.environ.get("OPENREG_MUTANT")
    if not selected or any(type(f).__name__ in ("_WovenFinder", "_UnknownMutant") for f in sys.meta_path):
        return
    weaver = _weaver()
    known = weaver.mutant_ids(REGISTRY)
    if selected not in known:
        sys.meta_path.insert(0, _UnknownMutant(
            f"OPENREG_MUTANT={selected!r} names no mutant of OpenReg (its {len(known)} mutants are those "
            f"of {REGISTRY}); unset it to run OpenReg unmutated"))
        return
    _own_inductor_cache(selected)
    by_path: dict[str, list] = {}
    for site in weaver.load_sites(REGISTRY):
        if site.mutant == selected and site.file.endswith(".py"):
            by_path.setdefault(str((ROOT / site.file).resolve()), []).append(site)
    if by_path:
        sys.meta_path.insert(0, _WovenFinder(by_path))


PTH_NAME = "openreg_mutation_hook.pth"


def write_pth() -> Path:
    """Puts the .pth file that runs install() into this interpreter's site-packages."""
    import sysconfig

    hook = Path(__file__).resolve()
    line = (f"import os; os.environ.get('OPENREG_MUTANT') and "
            f"__import__('runpy').run_path({str(hook)!r}, run_name='openreg_mutation_pyhook')['install']()\n")
    path = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    if not path.exists() or path.read_text(encoding="utf-8") != line:
        path.write_text(line, encoding="utf-8")
    return path


if __name__ == "__main__":
    if sys.argv[1:] != ["--install"]:
        sys.exit("usage: python mutation/pyhook.py --install")
    write_pth()
