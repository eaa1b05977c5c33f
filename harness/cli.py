"""privateuse1-conformance: the kit's command-line program.

    privateuse1-conformance run --backend NAME [--level L] [--manifest F] [--expectations F]
                                [--report-dir D] [--contract ID ...] [--operators SELECTION]
                                [--shard K/N] [-- PYTEST ARGS]
    privateuse1-conformance merge SHARD.json ... [--report-dir D]
    privateuse1-conformance verify REPORT.json [--level L] [--backend MODULE]
    privateuse1-conformance diff OLD.json NEW.json [--format text|markdown|json]
    privateuse1-conformance render REPORT.json [--report-dir D]
    privateuse1-conformance contracts [--level L] [--area A] [--format text|markdown|json]

`run` runs the installed suite with pytest in this process (which becomes
the warm parent every test is forked from) and writes the reports.

Exit codes (docs/reports.md): run returns pytest's (0 all passed, 1 some
test did not, 2 interrupted, 3 internal error, 4 usage error); verify 0
verified, 1 not verified, 2 the file is not JSON; diff 0 no regression,
1 regression; merge 0 merged, 1 the reports are not the complete shards of
one run; diff, render and merge 2 when a report cannot be read or is not
schema-valid.

The mutation run of the reference backend is OpenReg's own command
(`python mutation/run.py`, docs/mutation-testing.md), not the vendor's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from privateuse1_conformance.reports import diff as diff_mod
from privateuse1_conformance.reports import json_report, writer
from privateuse1_conformance.reports import merge as merge_mod
from privateuse1_conformance.reports import verify as verify_mod

from . import registry as registry_mod
from . import shard as shard_mod
from .options import PREFIX
from .results import contract_info

EXIT_UNUSABLE_REPORT = 2

SUITE_PACKAGE = "privateuse1_conformance.conformance"
# The plugin, by its pytest11 entry point's name (loaded even with
# PYTEST_DISABLE_PLUGIN_AUTOLOAD set).
PLUGIN = "privateuse1_conformance"
DEFAULT_REPORT_DIR = "conformance-report"


def _run(args: argparse.Namespace) -> int:
    import pytest

    # The plugin's canonical option names (harness/options.py): the short
    # ones may belong to another plugin installed beside the kit.
    pytest_args = [
        "-p", PLUGIN,
        "-p", "no:cacheprovider",
        "--pyargs", SUITE_PACKAGE,
        # (this process imported the kit before pytest started: pytest cannot
        # rewrite the asserts of the plugin's modules, which have none to rewrite)
        "-W", "ignore::pytest.PytestAssertRewriteWarning",
        f"{PREFIX}backend={args.backend}",
        f"{PREFIX}contract-timeout={args.timeout}",
    ]
    # A rerun of some contracts or tests must not overwrite the full run's reports.
    report_dir = args.report_dir or (None if args.contract or args.test else DEFAULT_REPORT_DIR)
    if report_dir:
        pytest_args.append(f"{PREFIX}report-dir={report_dir}")
    for option in ("level", "manifest", "expectations"):
        value = getattr(args, option)
        if value:
            pytest_args.append(f"{PREFIX}{option}={value}")
    if args.allow_untested_torch:
        pytest_args.append(f"{PREFIX}allow-untested-torch")
    if args.operators:
        pytest_args.append(f"{PREFIX}operators={args.operators}")
    if args.shard:
        pytest_args.append(f"{PREFIX}shard={args.shard}")
    pytest_args += [f"{PREFIX}contract={contract_id}" for contract_id in args.contract or ()]
    pytest_args += [f"{PREFIX}test-id={test_id}" for test_id in args.test or ()]
    if args.jobs > 1:
        pytest_args += ["-n", str(args.jobs)]
    pytest_args += args.pytest_args
    # The reports' folder is named in the run's final summary.
    # pytest: 0 all passed, 1 some failed — both are complete runs.
    return int(pytest.main(pytest_args))


def _jobs(value: str) -> int:
    """-j: a positive number, or auto (the CPU cores this process may use)."""
    if value == "auto":
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # (no affinity on this platform)
            return max(1, os.cpu_count() or 1)
    try:
        jobs = int(value)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"must be a positive number of workers or auto, not {value!r}")
    return jobs


def _read_report(path: str) -> dict | None:
    """A schema-valid report, or None after saying why not."""
    try:
        document = json_report.load(path)
    except ValueError as e:
        print(e, file=sys.stderr)
        return None
    problems = json_report.schema_problems(document)
    if problems:
        print(f"{path}: not a valid report (format {json_report.FORMAT} "
              f"version {json_report.FORMAT_VERSION}):", file=sys.stderr)
        for problem in problems[:20]:
            print(f"  - {problem}", file=sys.stderr)
        return None
    return document


def _verify(args: argparse.Namespace) -> int:
    try:
        document = json_report.load(args.report)
    except ValueError as e:
        print(e, file=sys.stderr)
        return EXIT_UNUSABLE_REPORT
    registry_path = Path(args.registry or registry_mod.default_path())
    registry = registry_mod.load(registry_path)
    torch_version = str((document.get("provenance") or {}).get("torch_version") or "")
    try:  # contracts the report's torch does not have yet are not asked of it
        registry.leave_out_for_torch(torch_version)
    except ValueError:
        pass  # (an unreadable version: the torch check below says so)
    contracts = [contract_info(c) for c in registry.active()]
    optional = {f.name for f in registry.features.values() if f.optional}
    result = verify_mod.verify(document, contracts, optional, args.level, kit=kit_facts(registry, args.backend),
                               level_requirements=registry.level_requirements)
    print(verify_mod.format_text(result, args.report), end="")
    return 0 if result.ok else 1


def kit_facts(registry: registry_mod.Registry, backend: str | None = None) -> verify_mod.KitFacts:
    """What this kit knows of itself, for verify: its version, registry and
    files, the test functions of its suite (each at the lowest level of its
    contracts; the C++ cases, whose contracts come from their parameters,
    at core) and, given a backend module, that module's installed files."""
    from . import coverage, provenance, versions

    suite_dir = Path(registry_mod.default_path()).parent
    tests = {}
    for function, ids in coverage.suite_tests(suite_dir).items():
        known = [registry.contracts[c] for c in ids if c in registry.contracts]
        if known and all(c.retired for c in known):
            continue  # (left out for this torch, or retired)
        levels = [c.level_rank for c in known if not c.retired]
        tests[function] = registry_mod.LEVELS[min(levels)] if levels else registry_mod.LEVELS[0]

    def torch_problem(version: str) -> str | None:
        try:
            return versions.torch_problem(version)
        except ValueError as e:
            return str(e)

    return verify_mod.KitFacts(
        version=provenance.kit_version(), registry_sha256=hashlib.sha256(registry.path.read_bytes()).hexdigest(),
        files=provenance.kit_files(), tests=tests, torch_problem=torch_problem,
        backend_module=backend or "", backend_files=provenance.backend_files(backend) if backend else None)


def _merge(args: argparse.Namespace) -> int:
    named = []
    for path in args.shards:
        document = _read_report(path)
        if document is None:
            return EXIT_UNUSABLE_REPORT
        named.append((path, document))
    try:
        run = merge_mod.merge(named)
    except merge_mod.MergeError as e:
        print(f"privateuse1-conformance merge: not merged: these are not the complete shards of one run "
              f"({len(e.problems)} problem(s)):", file=sys.stderr)
        for problem in e.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    paths = writer.write_all(args.report_dir, run)
    shards = run.provenance.shards
    tests = sum(record["tests"] for record in shards)
    print(f"merged {len(shards)} shards ({tests} tests): level reached {run.level_reached or 'none'}")
    for path in paths.values():
        print(path)
    return 0


def _diff(args: argparse.Namespace) -> int:
    old, new = _read_report(args.old), _read_report(args.new)
    if old is None or new is None:
        return EXIT_UNUSABLE_REPORT
    result = diff_mod.diff(old, new)
    print(diff_mod.FORMATS[args.format](result), end="")
    return 1 if result.regressed else 0


def _render(args: argparse.Namespace) -> int:
    document = _read_report(args.report)
    if document is None:
        return EXIT_UNUSABLE_REPORT
    problem = json_report.digest_problem(document)
    if problem:
        print(f"warning: {args.report}: {problem}", file=sys.stderr)
    folder = Path(args.report_dir) if args.report_dir else Path(args.report).parent
    for path in writer.render_all(folder, document).values():
        print(path)
    return 0


def _contracts(args: argparse.Namespace) -> int:
    registry = registry_mod.load(args.registry or registry_mod.default_path())
    contracts = registry.up_to(args.level) if args.level else registry.active()
    if args.area:
        areas = sorted({c.area for c in registry.active()})
        if args.area not in areas:
            print(f"privateuse1-conformance contracts: error: unknown area {args.area!r}; the areas are: "
                  f"{', '.join(areas)}", file=sys.stderr)
            return 2
        contracts = [c for c in contracts if c.area == args.area]
    if args.format == "json":
        print(json.dumps([c.__dict__ for c in contracts], indent=2, default=list))
    elif args.format == "markdown":
        sys.stdout.write(render_markdown(registry, contracts))
    else:
        for c in contracts:
            features = f" [{', '.join(c.features)}]" if c.features else ""
            print(f"{c.id:<15} {c.level:<9} {c.statement}{features}")
    return 0


def _text(text: str) -> str:
    """Registry prose as Markdown: a '<' outside code spans is escaped, or a
    renderer takes `torch.device('<name>:0')` for an HTML tag and drops it."""
    parts = text.split("`")
    return "`".join(part if i % 2 else part.replace("<", "&lt;") for i, part in enumerate(parts))


def _cell(text: str) -> str:
    return _text(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(registry: registry_mod.Registry, contracts=None) -> str:
    """docs/contracts.md, generated from the registry, the suite's sources and
    the mutant registry (never edited by hand): every contract with its
    clauses, the check that decides each, the mutant that proves the check
    can fail, and why a conforming backend making other choices passes."""
    from pathlib import Path

    from . import coverage as coverage_mod
    from . import mutants as mutants_mod

    contracts = registry.active() if contracts is None else contracts
    suite_dir = Path(registry_mod.default_path()).parent
    try:
        mutant_registry = mutants_mod.load(mutants_mod.default_path(), registry)
        mutant_clauses = {m.id: list(m.clauses) for m in mutant_registry.mutants.values()}
        instrumented_only = {m.id for m in mutant_registry.mutants.values() if m.needs_instrumentation}
    except (OSError, mutants_mod.MutantRegistryError):
        mutant_clauses, instrumented_only = {}, set()
    cover = coverage_mod.coverage(registry, suite_dir, mutant_clauses)
    clause_count = sum(len(c.clauses) for c in contracts)
    lines = [
        "# Contracts",
        "",
        "<!-- Generated from conformance/contracts.toml, the suite's sources and conformance/mutants.toml by "
        "`privateuse1-conformance contracts --format markdown`. Do not edit by hand. -->",
        "",
        f"{len(contracts)} contracts, split into {clause_count} clauses. Each contract has a stable ID that never "
        "changes once published; clause *k* of a contract is `<ID>.k`.",
        "",
        "For every clause the tables below name the check that decides it (a test of the suite, or a GoogleTest "
        "case of the kit's C++ probe) and the mutant of the reference backend that proves the check can fail "
        "([mutation testing](mutation-testing.md)), with OpenReg's instrumentation and without it; a mutant that "
        "only the instrumentation kills for certain is marked so (a backend without the instrumentation loses that "
        "assurance: [vendor guide](vendor-guide.md#instrumentation-optional)). A clause without either is listed "
        "with the reason it is waived. A contract passes only when every clause with a check was decided by a "
        "check that could observe it, or does not apply to the backend ([harness](harness.md#clauses-a-pass-needs-"
        "every-clause-decided)). Under each contract: what observation decides it, and why a backend that honours "
        "the statement while making other legitimate choices passes.",
        "",
        "## Levels",
        "",
    ]
    for level, description in registry.levels.items():
        count = sum(1 for c in contracts if c.level == level)
        needed = sorted({f for c in contracts if c.level == level for f in c.features})
        mandatory = [f for f in needed if not registry.features[f].optional]
        one_of = registry.level_requirements.get(level, [])
        lines.append(f"- **{level}** ({count} contracts): {_text(description)}"
                     + (f" Needs the features {', '.join(f'`{f}`' for f in mandatory)}." if mandatory else "")
                     + (f" Needs at least one of the optional features {', '.join(f'`{f}`' for f in one_of)} "
                        "claimed (and its contracts satisfied)." if one_of else ""))
    lines += ["", "## Features a manifest may declare absent", "",
              "| feature | optional for the level | what |", "|---|---|---|"]
    for feature in registry.features.values():
        lines.append(f"| `{feature.name}` | {'yes' if feature.optional else 'no'} | {_cell(feature.description)} |")
    for area, description in registry.areas.items():
        in_area = [c for c in contracts if c.area == area]
        if not in_area:
            continue
        lines += ["", f"## {area}", "", _text(description), "",
                  "| ID | level | statement | features | source |", "|---|---|---|---|---|"]
        for c in in_area:
            features = ", ".join(f"`{f}`" for f in c.features)
            lines.append(f"| [`{c.id}`](#{c.id.lower()}) | {c.level} | {_cell(c.statement)} | {features} | "
                         f"{_cell(c.source)} |")
        for c in in_area:
            lines += ["", f"### {c.id}", "", _text(c.statement), ""]
            if c.decided_by:
                lines += [f"*Decided by:* {_text(c.decided_by)}", ""]
            if c.other_choices:
                lines += [f"*Other legitimate choices:* {_text(c.other_choices)}", ""]
            for fix in c.known_fixes:
                shown = " and ".join(part for part in (f"clause `{fix.clause}` fails" if fix.clause else "",
                                                       f"the failure matches `{fix.symptom}`" if fix.symptom else "")
                                     if part)
                lines += [f"*Known fix* (a failing test's report shows it when {shown}): {_text(fix.fix)} "
                          f"([vendor guide]({fix.guide}))", ""]
            if c.clauses:
                lines += ["| clause | what | decided by | proved by mutant |", "|---|---|---|---|"]
                for clause_id in c.clause_ids():
                    cc = cover.clauses[clause_id]
                    checks = "<br>".join(f"`{x}`" for x in cc.checks) or f"*waived:* {_cell(cc.waived_check)}"
                    mutants = "<br>".join(f"`{m}`" + (" (killed for certain only with instrumentation)" if m in instrumented_only
                                                      else "") for m in cc.mutants) \
                        or f"*waived:* {_cell(cc.waived_mutant)}"
                    lines.append(f"| `{clause_id}` | {_cell(cc.text)} | {checks} | {mutants} |")
    gaps = cover.gaps()
    lines += ["", "## Gaps", ""]
    if gaps:
        lines += [f"- `{g.clause}`: {', '.join(g.gaps)}" for g in gaps]
    else:
        lines.append("None: every clause has a check and a mutant, or a waiver with its reason (above).")
    return "\n".join(lines) + "\n"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("privateuse1-conformance")
    except Exception:  # noqa: BLE001 - not installed as a distribution (a source checkout)
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="privateuse1-conformance",
                                     description="Conformance kit for PyTorch PrivateUse1 backends")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the conformance suite against a backend")
    run.add_argument("--backend", required=True, help="registered profile name or importable module")
    run.add_argument("--level", choices=registry_mod.LEVELS,
                     help="run contracts up to this level (default: the level the manifest claims, "
                          "else full)")
    run.add_argument("--manifest", metavar="TOML",
                     help="the backend's manifest TOML: name, claimed level, optional features it "
                          "does not claim (overrides the backend profile's; docs/vendor-guide.md)")
    run.add_argument("--expectations", metavar="TOML",
                     help="expectations TOML: known failures by contract ID, reported as expected "
                          "(overrides the manifest's; docs/vendor-guide.md)")
    run.add_argument("--report-dir", help=f"where to write the reports (default: {DEFAULT_REPORT_DIR}; "
                                          "none with --contract or --test unless given)")
    run.add_argument("--timeout", type=float, default=60.0, help="seconds before a test counts as hung")
    run.add_argument("--allow-untested-torch", action="store_true",
                     help="run although the installed torch is outside the range the kit supports "
                          "(docs/vendor-guide.md)")
    run.add_argument("--operators", default=None, metavar="SELECTION",
                     help="the operators area's OpInfo entries: default (the operators most models use), all, "
                          "none, or comma-separated names and patterns (docs/operators.md)")
    run.add_argument("--shard", type=shard_mod.argparse_type, default=None, metavar="K/N",
                     help="run only shard K of N: a deterministic split of the selected tests (contracts and "
                          "operators) for a CI matrix of N jobs; `merge` combines the N reports (docs/reports.md)")
    run.add_argument("-j", "--jobs", type=_jobs, default="auto",
                     help="tests run at once, each worker a process (pytest-xdist): a number, or auto (the "
                          "default): one per CPU core this process may use; 1 runs them one after another. "
                          "Tests that observe timing or the whole device run alone whatever the number")
    run.add_argument("--contract", action="append", metavar="ID",
                     help="run only the tests of this contract (repeatable)")
    run.add_argument("--test", action="append", metavar="TEST",
                     help="run only this test, named as the reports name it, e.g. "
                          "'test_streams.py::test_name[param]' (repeatable)")
    run.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    run.set_defaults(handler=_run)

    merge = commands.add_parser(
        "merge", help="combine the reports of the N shards of a run (run --shard K/N) into the run's report, "
                      "which verify accepts; refuses shards that are not the complete, untouched parts of one run")
    merge.add_argument("shards", nargs="+", metavar="SHARD.json", help="the shards' report.json files, any order")
    merge.add_argument("--report-dir", default=DEFAULT_REPORT_DIR,
                       help=f"where to write the merged reports (default: {DEFAULT_REPORT_DIR})")
    merge.set_defaults(handler=_merge)

    verify = commands.add_parser(
        "verify", help="check a report: schema, digest, consistency, a complete and whole run (nothing narrowed), "
                       "provenance (this kit, a supported torch, isolation, the backend's files), and every "
                       "mandatory contract of the level satisfied exactly once; exit 0: consistent and complete")
    verify.add_argument("report", help="report.json")
    verify.add_argument("--level", choices=registry_mod.LEVELS,
                        help="the level to verify (default: the level the report claims, else the one it reached)")
    verify.add_argument("--backend", metavar="MODULE",
                        help="also compare the backend's files the report records with this module's files as "
                             "installed here (its Python files and binaries)")
    verify.add_argument("--registry", help=argparse.SUPPRESS)
    verify.set_defaults(handler=_verify)

    diff = commands.add_parser("diff", help="compare two reports: regressions, fixes, added/removed "
                                            "contracts, level change (exit 1 on a regression)")
    diff.add_argument("old", help="the baseline report.json")
    diff.add_argument("new", help="the report.json to judge")
    diff.add_argument("--format", choices=sorted(diff_mod.FORMATS), default="text")
    diff.set_defaults(handler=_diff)

    render = commands.add_parser("render", help="write the JUnit, Markdown, HTML and badge renderings "
                                                "of a report.json")
    render.add_argument("report", help="report.json")
    render.add_argument("--report-dir", help="where to write them (default: the report's folder)")
    render.set_defaults(handler=_render)

    contracts = commands.add_parser("contracts", help="list the contract registry")
    contracts.add_argument("--level", choices=registry_mod.LEVELS, help="up to this level")
    contracts.add_argument("--area", help="only this area's contracts (an unknown area is an error)")
    contracts.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    contracts.add_argument("--registry", help=argparse.SUPPRESS)
    contracts.set_defaults(handler=_contracts)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
