"""OpenReg's mutation run: the conformance suite against every mutant of OpenReg.

    python mutation/run.py [--jobs N] [--only ID ...] [--configuration C] [--timeout S] [--output F]
                              [--newer-python PYTHON]
    python mutation/run.py --markdown KILL_MATRIX.json [--docs PAGE.md]

Each mutant (conformance/mutants.toml, selected with OPENREG_MUTANT) breaks
one clause of a contract; the run requires the suite to reject each on that
clause, with OpenReg's instrumentation and without it (docs/mutation-testing.md).
The kill matrix it writes names the tree it was measured on (the commit and
a digest of conformance/, harness/, mutation/ and reference_backend/). This is how the
kit's authors prove its checks can fail, so it lives beside the weaver, not
in the vendor's CLI or in OpenReg. It needs the kit installed
(privateuse1-conformance), whose mutation machinery
(privateuse1_conformance.harness.mutants) it drives.

Exit status: 0 only when every mutant was killed on its clauses where it
must be; 1 otherwise; 2 for bad arguments or an unreadable kill matrix.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

# Sources a build compiles: their mutants exist only in the library built
# after the registry last changed (mutation/Weave.cmake weaves at build time).
COMPILED = (".cpp", ".cc", ".h", ".hpp")


def repository_root() -> Path:
    """The checkout this OpenReg comes from (the tree a kill matrix is bound to)."""
    here = Path(__file__).resolve().parent
    try:
        top = subprocess.run(["git", "-C", str(here), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.strip()
        return Path(top)
    except (OSError, subprocess.SubprocessError):
        return Path.cwd()


def tree_record(root: Path, result: dict | None = None) -> dict:
    """The tree a kill matrix is measured on: commit, digest, and a digest of
    each check that killed a mutant (to see later which of them changed)."""
    from privateuse1_conformance.harness import mutants as mutants_mod

    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    checks = sorted({c for m in (result or {}).get("configurations", {}).values()
                     for o in m.get("outcomes", []) for c in o.get("killing_checks", [])})
    return {"commit": commit, "sha256": mutants_mod.tree_digest(root),
            "checks": mutants_mod.check_digests(root, checks)}


def openreg_libraries(python: str) -> list[Path]:
    """The native libraries of the OpenReg that `python` imports (its
    package folders' shared objects), found without importing it."""
    code = ("import importlib.util as u; s = u.find_spec('openreg'); "
            "print('\\n'.join(s.submodule_search_locations or []) if s else '')")
    try:
        found = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    folders = [Path(line) for line in found.stdout.splitlines() if line.strip()]
    return sorted({library for folder in folders for library in folder.rglob("*.so")})


def unwoven(registry_path: Path, ids: list[str], libraries: list[Path]) -> list[str]:
    """The mutants among `ids` with a site in compiled code whose id none of
    `libraries` holds: OpenReg was built before they were added to the
    registry (or renamed), and every check would pass against them, so a
    run would report them as survivors after the whole suite's time each.
    A woven site compiles `openreg_mutant_is("<id>")`, so the id is a string
    of the library; mutants woven only into Python are woven at import."""
    entries = tomllib.loads(Path(registry_path).read_text()).get("mutant", [])
    compiled = [e["id"] for e in entries if e.get("id") in ids
                and any(str(site.get("file", "")).endswith(COMPILED) for site in e.get("site", []))]
    if not compiled:
        return []
    contents = [library.read_bytes() for library in libraries]
    return [m for m in compiled if not any(m.encode() + b"\0" in content for content in contents)]


def refuse_unbuilt(registry, ids: list[str], newer_python: str | None) -> str:
    """Why the run must not start (the mutants OpenReg's build lacks), or ""."""
    from privateuse1_conformance.harness import mutants as mutants_mod

    here = mutants_mod.running_torch()
    newer = [m for m in ids if mutants_mod.too_new(registry.mutants[m], here)]
    interpreters = [(sys.executable, [m for m in ids if m not in newer])]
    if newer and newer_python:
        interpreters.append((newer_python, newer))
    problems = []
    for python, selected in interpreters:
        if not selected:
            continue
        libraries = openreg_libraries(python)
        missing = unwoven(registry.path, selected, libraries)
        if missing:
            where = ", ".join(str(library) for library in libraries) or "no OpenReg library"
            problems.append(f"the OpenReg that {python} imports ({where}) was built without mutant(s) "
                            f"{', '.join(missing)} of {registry.path}: run `make build` (and `make build "
                            "TORCH=<release>` for --newer-python) after changing the mutant registry")
    return "\n".join(problems)


def _run(args: argparse.Namespace) -> int:
    from privateuse1_conformance.harness import mutants as mutants_mod
    from privateuse1_conformance.harness import registry as registry_mod

    contracts = registry_mod.load(registry_mod.default_path())
    registry = mutants_mod.load(args.registry or mutants_mod.default_path(), contracts)
    if args.markdown:
        try:
            result = json.loads(Path(args.markdown).read_text())
        except (OSError, ValueError) as e:
            print(f"cannot read the kill matrix {args.markdown}: {e}", file=sys.stderr)
            return 2
        table = mutants_mod.render_table(registry, contracts, result)
        if not args.docs:
            sys.stdout.write(table)
            return 0
        page = Path(args.docs)
        try:
            page.write_text(mutants_mod.splice(page.read_text(), table))
        except (OSError, ValueError) as e:
            print(f"{args.docs}: {e}", file=sys.stderr)
            return 2
        print(f"{page}: table of {len(registry.mutants)} mutants regenerated")
        return 0
    unknown = [m for m in args.only if m not in registry.mutants]
    if unknown:
        print(f"unknown mutant(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    refusal = refuse_unbuilt(registry, list(args.only or registry.mutants), args.newer_python)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    configurations = mutants_mod.CONFIGURATIONS if args.configuration == "all" else (args.configuration,)
    print(f"{len(args.only or registry.mutants)} mutant(s) of {registry.backend!r}, {args.jobs} job(s), "
          f"configuration(s) {', '.join(configurations)}")
    root = repository_root()
    before = mutants_mod.tree_digest(root)
    result = mutants_mod.run_all(registry, args.only, args.jobs, args.timeout, configurations=configurations,
                                 newer_python=args.newer_python)
    result["tree"] = tree_record(root, result)
    if result["tree"]["sha256"] != before:
        print("the tree changed while the mutants ran: this matrix proves nothing; run again", file=sys.stderr)
        result["tree"]["sha256"] = "changed-during-the-run"
    print(mutants_mod.format_matrix(result))
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"kill matrix written to {Path(args.output).resolve()}")
    ran = dataclasses.replace(registry, mutants={m: registry.mutants[m] for m in args.only}) if args.only else registry
    problems = mutants_mod.matrix_problems(ran, result)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 0 if not problems else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python mutation/run.py",
        description="Run the conformance suite against every mutant of OpenReg "
                    "(exit 1 unless all are killed on target)")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="mutants run in parallel")
    parser.add_argument("--only", nargs="*", default=[], metavar="ID", help="run just these mutants")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before a test counts as hung")
    parser.add_argument("--output", default="mutants.json", help="where to write the kill matrix (JSON)")
    parser.add_argument("--configuration", choices=("all", "instrumented", "uninstrumented"), default="all",
                        help="with OpenReg's instrumentation, without it, or both (default; what a recorded "
                             "matrix needs)")
    parser.add_argument("--markdown", metavar="KILL_MATRIX",
                        help="run nothing: print the docs' table of mutants, generated from the registry "
                             "and this kill matrix (a JSON written by --output)")
    parser.add_argument("--docs", metavar="PAGE",
                        help="with --markdown: rewrite the generated block of this page (docs/mutation-testing.md)")
    parser.add_argument("--newer-python", metavar="PYTHON",
                        help="the interpreter of an environment with a newer torch (the kit and OpenReg built "
                             "there: make build TORCH=<release>) that runs the mutants of contracts this torch "
                             "retires (min_torch); without it they are errors in the matrix")
    parser.add_argument("--registry", help=argparse.SUPPRESS)
    return parser


def keep_bytecode(root: Path) -> None:
    """Every mutant's run starts interpreters that import the kit, pytest
    and the suite; with PYTHONDONTWRITEBYTECODE set (this machine and CI set
    it) each one compiles them from source again, and a mutant takes twice
    as long. As `make` does, the runs write their bytecode to one cache
    outside the tree."""
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        os.environ.setdefault("PYTHONPYCACHEPREFIX", str(root / "build" / "pycache"))


def main(argv: list[str] | None = None) -> int:
    keep_bytecode(repository_root())
    return _run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
