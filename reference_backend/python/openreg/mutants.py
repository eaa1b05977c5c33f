"""OpenReg's mutation run: the conformance suite against every mutant of OpenReg.

    python -m openreg.mutants [--jobs N] [--only ID ...] [--timeout S] [--output F]
    python -m openreg.mutants --markdown KILL_MATRIX.json [--docs PAGE.md]

Each mutant (conformance/mutants.toml, selected with OPENREG_MUTANT) breaks
one clause of a contract; the run requires the suite to reject each on that
clause (docs/mutation-testing.md). This is how the kit's authors prove its
checks can fail, so it is OpenReg's command, not part of the vendor's CLI.
It needs the kit installed (privateuse1-conformance), whose mutation
machinery (privateuse1_conformance.harness.mutants) it drives.

Exit status: 0 only when every mutant was killed on target; 1 otherwise; 2
for bad arguments or an unreadable kill matrix.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


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
    print(f"{len(args.only or registry.mutants)} mutant(s) of {registry.backend!r}, {args.jobs} job(s)")
    result = mutants_mod.run_all(registry, args.only, args.jobs, args.timeout)
    print(mutants_mod.format_matrix(result))
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"kill matrix written to {Path(args.output).resolve()}")
    return 0 if result["score"] == 1.0 else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m openreg.mutants",
        description="Run the conformance suite against every mutant of OpenReg "
                    "(exit 1 unless all are killed on target)")
    parser.add_argument("--jobs", "-j", type=int, default=2, help="mutants run in parallel")
    parser.add_argument("--only", nargs="*", default=[], metavar="ID", help="run just these mutants")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before a test counts as hung")
    parser.add_argument("--output", default="mutants.json", help="where to write the kill matrix (JSON)")
    parser.add_argument("--markdown", metavar="KILL_MATRIX",
                        help="run nothing: print the docs' table of mutants, generated from the registry "
                             "and this kill matrix (a JSON written by --output)")
    parser.add_argument("--docs", metavar="PAGE",
                        help="with --markdown: rewrite the generated block of this page (docs/mutation-testing.md)")
    parser.add_argument("--registry", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    return _run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
