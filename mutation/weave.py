"""The mutant weaver: OpenReg's mutants, kept as data beside their registry,
written into copies of OpenReg's clean sources.

OpenReg's sources (reference_backend/) are what a vendor reads: they contain
no mutant. Each mutant of conformance/mutants.toml lists its injection sites
(`[[mutant.site]]`): the file, an anchor (`at`, text that occurs exactly once
in the file), optionally the part of the anchor the site acts on (`target`,
occurring once in the anchor; the whole anchor by default), and one action:

- `before = CODE` / `after = CODE`: statements that run only under the mutant,
  just before (after) the target;
- `replace = CODE`: what runs under the mutant instead of the target; `form`
  says whether the target is an `expression` (the default) or a `statement`
  (statements, braces included);
- `declare = CODE`: declarations the mutant's other sites use (state, helper
  functions), placed before the target whatever the selection.

C++ (`make build`'s OpenReg, through mutation/Weave.cmake): every site of a
file is woven into one copy in the build tree, each a run-time choice made by
OPENREG_MUTANT (`openreg_mutant_is("id")`), so one library holds every mutant
(mutant schemata). Inserted code is joined onto the target's line and the copy
starts with `#line 1 "<clean file>"`, so compiler errors, sanitizer reports
and debuggers point at the clean source, at the site's line.

Python (mutation/pyhook.py): only the selected mutant's sites are woven, when
its module is imported; the compiled code carries the clean file's name and
line numbers (a line map, applied to the parsed tree), so tracebacks point at
the clean source too.

    python mutation/weave.py --registry conformance/mutants.toml --root REPO \\
        --source FILE --output WOVEN.cpp     # one C++ file, for the build
    python mutation/weave.py --registry conformance/mutants.toml --root REPO --check
                                             # every site of every file anchors once
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ACTIONS = ("before", "after", "replace", "declare")
FORMS = ("expression", "statement")
CXX_SUFFIXES = (".cpp", ".cc", ".h", ".hpp")
# Every woven C++ file starts with this (one line, before `#line 1`): how a
# site asks whether its mutant is the selected one. The selection itself is
# defined once, in the woven build's generated selection.cpp.
CXX_PRELUDE = ('extern "C" __attribute__((visibility("hidden"))) const char* openreg_mutant_selected; '
               'static inline bool openreg_mutant_is(const char* id) { '
               'return __builtin_expect(openreg_mutant_selected != nullptr, 0) && '
               '__builtin_strcmp(openreg_mutant_selected, id) == 0; }\n')


class WeaveError(Exception):
    """A site that cannot be woven: the message names the mutant and the file."""


@dataclass(frozen=True)
class Site:
    mutant: str
    file: str          # relative to the repository root, POSIX separators
    at: str
    target: str
    action: str
    code: str
    form: str
    order: int         # the registry's order, for sites sharing a position

    def where(self) -> str:
        return f"mutant {self.mutant!r}, site in {self.file}"


def load_sites(registry: Path) -> list[Site]:
    """Every site of the registry, validated for shape (not yet against the files)."""
    data = tomllib.loads(registry.read_text(encoding="utf-8"))
    sites: list[Site] = []
    for mutant in data.get("mutant", []):
        for raw in mutant.get("site", []):
            mid = mutant.get("id", "?")
            actions = [a for a in ACTIONS if a in raw]
            unknown = set(raw) - {"file", "at", "target", "form", *ACTIONS}
            if unknown:
                raise WeaveError(f"mutant {mid!r}: unknown site keys {sorted(unknown)}")
            if "file" not in raw or "at" not in raw or len(actions) != 1:
                raise WeaveError(f"mutant {mid!r}: a site needs `file`, `at` and exactly one of {ACTIONS}")
            form = raw.get("form", "expression")
            if form not in FORMS:
                raise WeaveError(f"mutant {mid!r}, site in {raw['file']}: form must be one of {FORMS}, not {form!r}")
            target = raw.get("target", raw["at"])
            if raw["at"].count(target) != 1:
                raise WeaveError(f"mutant {mid!r}, site in {raw['file']}: the target occurs "
                                 f"{raw['at'].count(target)} times in the anchor, not once: {target!r}")
            sites.append(Site(mid, raw["file"], raw["at"], target, actions[0], raw[actions[0]], form, len(sites)))
    return sites


def mutant_ids(registry: Path) -> set[str]:
    """The IDs of the registry's mutants (those a selection may name)."""
    return {m.get("id") for m in tomllib.loads(registry.read_text(encoding="utf-8")).get("mutant", [])}


@dataclass(frozen=True)
class _Placed:
    site: Site
    start: int   # the target's span in the clean text
    end: int


def _place(text: str, sites: list[Site]) -> list[_Placed]:
    placed = []
    for site in sites:
        count = text.count(site.at)
        if count != 1:
            raise WeaveError(f"{site.where()}: the anchor occurs {count} times in the file, not once: {site.at!r}")
        anchor = text.index(site.at)
        start = anchor + site.at.index(site.target)
        placed.append(_Placed(site, start, start + len(site.target)))
    # Replacements of the same span chain; any other overlap of a replaced
    # span with another site is ambiguous.
    for a in placed:
        for b in placed:
            if a is b or a.site.action != "replace":
                continue
            if b.site.action == "replace" and (a.start, a.end) == (b.start, b.end):
                continue
            inside = a.start < b.start < a.end or a.start < b.end < a.end
            if inside or (b.site.action == "replace" and a.start < b.end and b.start < a.end):
                raise WeaveError(f"{a.site.where()} overlaps the site of mutant {b.site.mutant!r}")
    return placed


def _one_line(code: str, site: Site) -> str:
    """C++ code joined onto one line (a site never moves the lines after it)."""
    lines = [line.strip() for line in code.strip().splitlines()]
    joined = []
    for line in lines:
        if line.startswith("//") and "*/" not in line:  # a comment line survives the join as /* ... */
            line = f"/* {line[2:].strip()} */"
        if line.startswith("#") or "//" in line:
            raise WeaveError(f"{site.where()}: C++ site code may hold no preprocessor line or // comment "
                             f"after code (it is joined onto one line): {line!r}")
        joined.append(line)
    return " ".join(line for line in joined if line)


def weave_cxx(text: str, clean_path: str, sites: list[Site]) -> str:
    """The woven copy of one C++ file: every site, each chosen at run time."""
    placed = _place(text, sites)
    inserts: dict[int, list[tuple[int, str]]] = {}   # position -> (order, code)
    replaced: dict[tuple[int, int], list[Site]] = {}
    for p in placed:
        s = p.site
        code = _one_line(s.code, s) if s.action != "declare" else s.code
        cond = f'openreg_mutant_is("{s.mutant}")'
        if s.action == "before":
            inserts.setdefault(p.start, []).append((s.order, f"if ({cond}) {{ {code} }} "))
        elif s.action == "after":
            inserts.setdefault(p.end, []).append((s.order, f" if ({cond}) {{ {code} }}"))
        elif s.action == "declare":
            # Declarations go on lines of their own before the target's line
            # (they may include headers); `#line` then restores the numbering.
            line_start = text.rfind("\n", 0, p.start) + 1
            if text[line_start:p.start].strip():
                raise WeaveError(f"{s.where()}: a `declare` target must start its line")
            line = text.count("\n", 0, p.start) + 1
            block = _dedent(s.code).rstrip("\n")
            inserts.setdefault(line_start, []).append((s.order, f'{block}\n#line {line} "{clean_path}"\n'))
        else:
            replaced.setdefault((p.start, p.end), []).append(s)
    out: list[str] = []
    pos = 0
    edits = sorted({*inserts, *(k[0] for k in replaced)})
    for at in edits:
        out.append(text[pos:at])
        pos = at
        for _, code in sorted(inserts.get(at, [])):
            out.append(code)
        spans = [k for k in replaced if k[0] == at]
        for span in spans:
            original = text[span[0]:span[1]]
            woven = original
            for s in sorted(replaced[span], key=lambda s: -s.order):
                code = _one_line(s.code, s)
                cond = f'openreg_mutant_is("{s.mutant}")'
                if s.form == "expression":
                    woven = f"({cond} ? ({code}) : ({woven}))"
                else:
                    woven = f"if ({cond}) {{ {code} }} else {{ {woven} }}"
            out.append(woven)
            pos = span[1]
    out.append(text[pos:])
    return CXX_PRELUDE + f'#line 1 "{clean_path}"\n' + "".join(out)


def weave_python(text: str, sites: list[Site]) -> tuple[str, list[int]]:
    """The selected mutant's sites written into a Python module's source.

    Returns the woven source and its line map: the clean line (1-based) of
    each woven line. Inserted lines map to their target's line."""
    placed = sorted(_place(text, sites), key=lambda p: (p.start, p.site.order))
    pieces: list[tuple[str, int, bool]] = []   # (text, the clean line it starts on, whether it is clean text)
    pos = 0

    def clean(upto: int) -> None:
        nonlocal pos
        pieces.append((text[pos:upto], text.count("\n", 0, pos) + 1, True))
        pos = upto

    for p in placed:
        if p.start < pos:
            raise WeaveError(f"{p.site.where()}: the site falls on a line another site of the mutant "
                             "already wrote after")
        line = text.count("\n", 0, p.start) + 1
        line_start = text.rfind("\n", 0, p.start) + 1
        prefix = text[line_start:p.start]
        indent = prefix[: len(prefix) - len(prefix.lstrip())]
        block = "".join((indent + l if l.strip() else "") + "\n" for l in _dedent(p.site.code).splitlines())
        if p.site.action in ("before", "declare"):
            if prefix.strip():
                raise WeaveError(f"{p.site.where()}: a Python `{p.site.action}` target must start its line")
            clean(line_start)
            pieces.append((block, line, False))
        elif p.site.action == "after":
            line_end = text.find("\n", p.end)
            clean(len(text) if line_end < 0 else line_end + 1)
            pieces.append((block, line, False))
        else:
            clean(p.start)
            code = p.site.code if p.site.form == "expression" else block.strip()
            pieces.append((code, line, False))
            pos = p.end
    clean(len(text))
    woven = "".join(piece for piece, _, _ in pieces)
    mapping: list[int] = []   # the clean line of each woven line (where the woven line starts)
    at_line_start = True
    for piece, line, is_clean in pieces:
        for char in piece:
            if at_line_start:
                mapping.append(line)
            at_line_start = char == "\n"
            if char == "\n" and is_clean:
                line += 1
    return woven, mapping


def _dedent(code: str) -> str:
    import textwrap
    return textwrap.dedent(code.strip("\n"))


def compile_python(text: str, clean_path: str, sites: list[Site]):
    """Code for a module with `sites` woven in, named and numbered as the clean file."""
    woven, mapping = weave_python(text, sites)
    tree = ast.parse(woven, clean_path)
    for node in ast.walk(tree):
        for attr in ("lineno", "end_lineno"):
            line = getattr(node, attr, None)
            if line is not None and 1 <= line <= len(mapping):
                setattr(node, attr, mapping[line - 1])
    return compile(tree, clean_path, "exec", dont_inherit=True)


def sites_by_file(sites: list[Site]) -> dict[str, list[Site]]:
    files: dict[str, list[Site]] = {}
    for site in sites:
        files.setdefault(site.file, []).append(site)
    return files


def check(root: Path, sites: list[Site]) -> list[str]:
    """Every problem of the registry's sites against the tree: an anchor that
    does not occur exactly once, a missing file, overlapping sites, a Python
    module that does not compile with a mutant woven in."""
    problems: list[str] = []
    for file, file_sites in sorted(sites_by_file(sites).items()):
        path = root / file
        if not path.is_file():
            problems += [f"{s.where()}: no such file" for s in file_sites]
            continue
        text = path.read_text(encoding="utf-8")
        try:
            if file.endswith(CXX_SUFFIXES):
                weave_cxx(text, str(path), file_sites)
            elif file.endswith(".py"):
                for mutant in dict.fromkeys(s.mutant for s in file_sites):
                    try:
                        compile_python(text, str(path), [s for s in file_sites if s.mutant == mutant])
                    except SyntaxError as e:
                        problems.append(f"mutant {mutant!r}, site in {file}: the woven module does not compile: {e}")
            else:
                problems.append(f"{file}: the weaver knows no such kind of source")
        except WeaveError as e:
            problems.append(str(e))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", type=Path, required=True)
    parser.add_argument("--root", type=Path, required=True, help="the repository root (site files are relative to it)")
    parser.add_argument("--source", type=Path, help="a C++ file to weave")
    parser.add_argument("--output", type=Path, help="where its woven copy goes")
    parser.add_argument("--check", action="store_true", help="check every site against the tree")
    parser.add_argument("--list", action="store_true", help="print the files that have sites, one per line")
    args = parser.parse_args(argv)
    try:
        sites = load_sites(args.registry)
    except (WeaveError, tomllib.TOMLDecodeError) as e:
        print(f"weave: {args.registry}: {e}", file=sys.stderr)
        return 1
    root = args.root.resolve()
    if args.list:
        print("\n".join(sorted(sites_by_file(sites))))
        return 0
    if args.check:
        problems = check(root, sites)
        for problem in problems:
            print(f"weave: {problem}", file=sys.stderr)
        return 1 if problems else 0
    if args.source is None or args.output is None:
        parser.error("give --source and --output, or --check, or --list")
    source = args.source.resolve()
    relative = source.relative_to(root).as_posix()
    try:
        woven = weave_cxx(source.read_text(encoding="utf-8"), str(source), sites_by_file(sites).get(relative, []))
    except WeaveError as e:
        print(f"weave: {e}", file=sys.stderr)
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if not args.output.exists() or args.output.read_text(encoding="utf-8") != woven:
        args.output.write_text(woven, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
