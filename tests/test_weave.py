"""The mutant weaver (mutation/weave.py): OpenReg's sources stay clean, and
the mutants of conformance/mutants.toml reach them only through their sites.

Guards against drift: every site anchors exactly once in its file (a test
names the mutant and the file otherwise), reference_backend/ holds no
mutant code, and the weaving itself keeps line numbers and refuses ambiguous
sites. (tests/test_mutants.py checks that every mutant has sites.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kit_support import weaver

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "conformance" / "mutants.toml"


weave = weaver()


def _backend_files() -> list[str]:
    """Every file of reference_backend/ under version control."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "reference_backend"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [line for line in out.splitlines() if line]


def _site(mutant="m", file="f.cpp", at="x", action="before", code="y", target=None, form="expression", order=0):
    return weave.Site(mutant, file, at, target if target is not None else at, action, code, form, order)


def test_every_site_anchors_once_in_its_file():
    problems = weave.check(ROOT, weave.load_sites(REGISTRY))
    assert not problems, "\n".join(problems)


def test_the_reference_backend_holds_no_mutant():
    """OpenReg is the model vendors read: its sources show the contracts and
    nothing else. Every mutant lives in the registry, as sites."""
    hits = []
    for file in _backend_files():
        try:
            text = (ROOT / file).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # (binary: a fuzzing corpus entry)
        hits += [f"{file}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1) if "mutant" in line.lower()]
    assert not hits, "\n".join(hits)


def test_cxx_sites_keep_every_line_where_it_was():
    clean = "int f(int x) {\n  int y = x + 1;\n  return y;\n}\n"
    sites = [
        _site("a", at="  return y;", target="return y;", action="before", code="y = 0;\nreturn -y;", order=0),
        _site("b", at="x + 1", action="replace", code="x - 1", order=1),
        _site("c", at="x + 1", action="replace", code="x * 2", order=2),
        _site("d", at="int f(int x) {", action="declare", code="#include <cstdio>\nstatic int g;", order=3),
    ]
    woven = weave.weave_cxx(clean, "/src/f.cpp", sites)
    body = woven.split('#line 1 "/src/f.cpp"\n', 1)[1]
    assert body.startswith('#include <cstdio>\nstatic int g;\n#line 1 "/src/f.cpp"\nint f(int x) {')
    lines = body.split('#line 1 "/src/f.cpp"\n', 1)[1].splitlines()
    assert len(lines) == 4
    assert lines[1] == ('  int y = (openreg_mutant_is("b") ? (x - 1) : '
                        '((openreg_mutant_is("c") ? (x * 2) : (x + 1))));')
    assert lines[2] == '  if (openreg_mutant_is("a")) { y = 0; return -y; } return y;'


def test_weaver_refuses_what_it_cannot_place():
    text = "a = 1\nb = 1\n"
    with pytest.raises(weave.WeaveError, match=r"mutant 'm'.*f\.py.*2 times"):
        weave.weave_python(text, [_site(file="f.py", at="= 1", code="pass")])
    with pytest.raises(weave.WeaveError, match="0 times"):
        weave.weave_python(text, [_site(file="f.py", at="c = 1", code="pass")])
    with pytest.raises(weave.WeaveError, match="overlaps"):
        weave.weave_cxx("int x = 1 + 2;", "f.cpp", [_site(at="1 + 2", action="replace", code="3"),
                                                    _site("n", at="+ 2;", action="replace", code="- 2;", order=1)])
    with pytest.raises(weave.WeaveError, match="preprocessor"):
        weave.weave_cxx("int x;", "f.cpp", [_site(at="int x;", code="#define A 1")])


def test_python_weaving_maps_tracebacks_to_the_clean_lines(tmp_path):
    clean = textwrap.dedent("""\
        def f(x):
            y = x + 1
            return y


        def g():
            raise ValueError("clean line 7")
        """)
    path = tmp_path / "module.py"
    path.write_text(clean)
    sites = [_site(file="module.py", at="    return y", target="return y", code="y = y * 10\nif y > 100:\n    g()"),
             _site(file="module.py", at="x + 1", action="replace", code="x + 2", order=1)]
    code = weave.compile_python(clean, str(path), sites)
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["f"](1) == 30
    with pytest.raises(ValueError) as raised:
        namespace["f"](20)
    lines = [(entry.name, entry.lineno + 1) for entry in raised.traceback]  # (pytest counts from 0)
    assert lines[-2:] == [("f", 3), ("g", 7)]


def test_the_import_hook_weaves_only_the_selected_mutant(tmp_path):
    """A new interpreter with the hook installed and one of the registry's
    Python mutants selected gets that mutant's code, under the clean file's
    name; without a selection, the clean module."""
    sites = [s for s in weave.load_sites(REGISTRY) if s.file.endswith(".py")]
    assert sites, "the registry has no Python sites"
    site = sites[0]
    module = site.file.split("reference_backend/python/", 1)[1][:-3].replace("/", ".")
    script = textwrap.dedent(f"""\
        import runpy, sys
        runpy.run_path({str(ROOT / 'mutation' / 'pyhook.py')!r})["install"]()
        import importlib.util
        spec = importlib.util.find_spec({module!r})
        code = spec.loader.get_code({module!r})
        import dis
        print(type(spec.loader).__name__, code.co_filename)
        """)
    env = {k: v for k, v in os.environ.items() if k != "OPENREG_MUTANT"}
    clean = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert clean.returncode == 0, clean.stderr
    assert "_WovenLoader" not in clean.stdout
    woven = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                           env={**env, "OPENREG_MUTANT": site.mutant})
    assert woven.returncode == 0, woven.stderr
    loader, filename = woven.stdout.split()
    assert loader == "_WovenLoader" and filename == str((ROOT / site.file).resolve())


def test_every_cxx_file_with_sites_is_compiled_woven():
    """Weave.cmake weaves only the sources of the targets it knows: a site in
    a file no such target compiles (a header, a new target) would leave its
    mutant silently absent from the build. `make build` wrote a woven copy
    of every C++ file that has sites."""
    woven = ROOT / "build" / "openreg" / "woven"
    if not woven.is_dir():
        pytest.skip("OpenReg is not built here with OPENREG_WEAVE (make build)")
    files = {s.file for s in weave.load_sites(REGISTRY) if s.file.endswith(weave.CXX_SUFFIXES)}
    missing = sorted(f for f in files if not (woven / f).is_file())
    assert not missing, f"C++ files with sites that the build compiles clean: {missing}"
