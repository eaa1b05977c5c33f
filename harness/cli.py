"""privateuse1-conformance: the kit's command-line program.

    privateuse1-conformance run --backend NAME [--level L] [--manifest F]
                                [--expectations F] [--report-dir D] [-- PYTEST ARGS]
    privateuse1-conformance contracts [--level L] [--area A] [--format text|markdown|json]

`run` runs the installed suite with pytest in this process (which becomes
the warm parent every test is forked from) and writes the reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import registry as registry_mod

SUITE_PACKAGE = "privateuse1_conformance.conformance"
PLUGIN = "privateuse1_conformance.harness.plugin"
DEFAULT_REPORT_DIR = "conformance-report"


def _run(args: argparse.Namespace) -> int:
    import pytest

    pytest_args = [
        "-p", PLUGIN,
        "-p", "no:cacheprovider",
        "--pyargs", SUITE_PACKAGE,
        f"--backend={args.backend}",
        f"--report-dir={args.report_dir}",
        f"--contract-timeout={args.timeout}",
    ]
    for option in ("level", "manifest", "expectations"):
        value = getattr(args, option)
        if value:
            pytest_args.append(f"--{option}={value}")
    if args.jobs and args.jobs > 1:
        pytest_args += ["-n", str(args.jobs)]
    pytest_args += args.pytest_args
    code = pytest.main(pytest_args)
    report = Path(args.report_dir) / "report.json"
    if report.exists():
        print(f"reports written to {Path(args.report_dir).resolve()}")
    # pytest: 0 all passed, 1 some failed — both are complete runs.
    return int(code)


def _contracts(args: argparse.Namespace) -> int:
    registry = registry_mod.load(args.registry or registry_mod.default_path())
    contracts = registry.up_to(args.level) if args.level else registry.active()
    if args.area:
        contracts = [c for c in contracts if c.area == args.area]
    if args.format == "json":
        print(json.dumps([c.__dict__ for c in contracts], indent=2, default=list))
    elif args.format == "markdown":
        print(render_markdown(registry, contracts))
    else:
        for c in contracts:
            features = f" [{', '.join(c.features)}]" if c.features else ""
            print(f"{c.id:<15} {c.level:<9} {c.statement}{features}")
    return 0


def render_markdown(registry: registry_mod.Registry, contracts=None) -> str:
    """docs/contracts.md, generated from the registry (never edited by hand)."""
    contracts = registry.active() if contracts is None else contracts
    lines = [
        "# Contracts",
        "",
        "<!-- Generated from conformance/contracts.toml by "
        "`privateuse1-conformance contracts --format markdown`. Do not edit by hand. -->",
        "",
        f"{len(contracts)} contracts. Each has a stable ID that never changes once published.",
        "",
        "## Levels",
        "",
    ]
    for level, description in registry.levels.items():
        count = sum(1 for c in contracts if c.level == level)
        lines.append(f"- **{level}** ({count} contracts): {description}")
    lines += ["", "## Features a manifest may declare absent", "",
              "| feature | optional for the level | what |", "|---|---|---|"]
    for feature in registry.features.values():
        lines.append(f"| `{feature.name}` | {'yes' if feature.optional else 'no'} | {feature.description} |")
    for area, description in registry.areas.items():
        in_area = [c for c in contracts if c.area == area]
        if not in_area:
            continue
        lines += ["", f"## {area}", "", description, "",
                  "| ID | level | statement | features | source |", "|---|---|---|---|---|"]
        for c in in_area:
            statement = c.statement.replace("|", "\\|")
            source = c.source.replace("|", "\\|")
            features = ", ".join(f"`{f}`" for f in c.features)
            lines.append(f"| `{c.id}` | {c.level} | {statement} | {features} | {source} |")
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="privateuse1-conformance",
                                     description="Conformance kit for PyTorch PrivateUse1 backends")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the conformance suite against a backend")
    run.add_argument("--backend", required=True, help="registered profile name or importable module")
    run.add_argument("--level", choices=registry_mod.LEVELS)
    run.add_argument("--manifest")
    run.add_argument("--expectations")
    run.add_argument("--report-dir", default=DEFAULT_REPORT_DIR)
    run.add_argument("--timeout", type=float, default=60.0, help="seconds before a test counts as hung")
    run.add_argument("-j", "--jobs", type=int, default=1, help="parallel workers (pytest-xdist)")
    run.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    run.set_defaults(handler=_run)

    contracts = commands.add_parser("contracts", help="list the contract registry")
    contracts.add_argument("--level", choices=registry_mod.LEVELS, help="up to this level")
    contracts.add_argument("--area")
    contracts.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    contracts.add_argument("--registry", help=argparse.SUPPRESS)
    contracts.set_defaults(handler=_contracts)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
