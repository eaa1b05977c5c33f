"""Mutation testing of the suite: run it against deliberately broken
variants of a backend ("mutants") and require each to be rejected.

The mutant registry (conformance/mutants.toml) names the backend, the
environment variable that selects a mutant in it, and every mutant with the
contract IDs it violates. For each mutant:

1. the tests of its contracts run with the mutant selected; if one of them
   gives fail, error, crash or hang, the mutant is **killed** (on target);
2. otherwise the whole suite runs: a failure elsewhere makes it **killed
   off-target** (the suite noticed, but not where it should have), no failure
   leaves it **survived**. Neither counts towards the score.

Before any mutant, the same tests run once without a mutant and must all
pass: a check that already fails would otherwise "kill" every mutant.
The score is killed / total.

docs/mutation-testing.md's table of mutants is generated from the registry
and a recorded kill matrix (render_table / splice; the CLI's --markdown).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import registry as registry_mod

# The plugin, by its pytest11 entry point's name (loaded even with
# PYTEST_DISABLE_PLUGIN_AUTOLOAD set).
PLUGIN = "privateuse1_conformance"
SUITE = "privateuse1_conformance.conformance"
KILLING_VERDICTS = {"fail", "error", "crash", "hang"}


class MutantRegistryError(ValueError):
    """The mutant registry is malformed."""


@dataclass(frozen=True)
class Mutant:
    id: str
    contracts: tuple[str, ...]
    description: str
    clauses: tuple[str, ...] = ()   # the clauses of those contracts it breaks
    ordering: bool = False          # its bug shows only while work is in flight (run repeatedly by the kit's tests)
    operators: str = ""             # --operators for its run (a mutant of one operator need not run the area's subset)


@dataclass
class MutantRegistry:
    path: Path
    backend: str
    selector_env: str
    mutants: dict[str, Mutant]


def default_path() -> Path:
    from importlib import resources

    return Path(str(resources.files("privateuse1_conformance.conformance") / "mutants.toml"))


def load(path: str | Path, contracts: registry_mod.Registry) -> MutantRegistry:
    path = Path(path)
    data = registry_mod.read_toml(path, MutantRegistryError, "mutant registry")
    try:
        backend, selector = data["backend"], data["selector_env"]
        entries = data["mutant"]
    except KeyError as e:
        raise MutantRegistryError(f"{path}: missing {e}") from None
    mutants: dict[str, Mutant] = {}
    for entry in entries:
        mutant_id = entry.get("id", "")
        where = f"{path}: mutant {mutant_id or '?'}"
        if not mutant_id or mutant_id in mutants:
            raise MutantRegistryError(f"{where}: missing or duplicate id")
        ids = tuple(entry.get("contracts", ()))
        if not ids:
            raise MutantRegistryError(f"{where}: names no contract")
        if len(set(ids)) != len(ids):
            raise MutantRegistryError(f"{where}: contracts {list(ids)} name a contract twice")
        unknown = [c for c in ids if c not in contracts.contracts]
        if unknown:
            raise MutantRegistryError(f"{where}: unknown contracts {unknown}")
        if not entry.get("description"):
            raise MutantRegistryError(f"{where}: needs a description")
        clauses = tuple(entry.get("clauses", ()))
        for clause in clauses:
            contract_id, _, number = clause.partition(".")
            contract = contracts.contracts.get(contract_id)
            if contract_id not in ids or contract is None or not number.isdigit() \
                    or not 1 <= int(number) <= len(contract.clauses):
                raise MutantRegistryError(f"{where}: clause {clause!r} is not a clause of its contracts {list(ids)}")
        unknown_keys = set(entry) - {"id", "contracts", "description", "clauses", "ordering", "operators"}
        if unknown_keys:
            raise MutantRegistryError(f"{where}: unknown keys {sorted(unknown_keys)}")
        operators = entry.get("operators", "")
        if not isinstance(operators, str):
            raise MutantRegistryError(f"{where}: operators must be an --operators value (a string)")
        mutants[mutant_id] = Mutant(mutant_id, ids, entry["description"], clauses, bool(entry.get("ordering", False)),
                                    operators)
    return MutantRegistry(path, backend, selector, mutants)


@dataclass
class Outcome:
    mutant: str
    contracts: list[str]
    status: str                 # killed | killed-off-target | survived | error
    killing_tests: list[str] = field(default_factory=list)
    killing_contracts: list[str] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)  # contract -> verdict
    seconds: float = 0.0
    note: str = ""


def _run_suite(backend: str, env: dict[str, str], contracts: list[str] | None,
               timeout: float, operators: str = "") -> tuple[dict | None, str]:
    """Run the suite in a fresh process; return (report, output tail)."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        args = [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-q",
                "--pyargs", SUITE, f"--backend={backend}", f"--report-dir={tmp}/report",
                f"--contract-timeout={timeout}"]
        if contracts:
            args.append("--contract=" + ",".join(contracts))
        if operators:
            args.append(f"--operators={operators}")
        proc = subprocess.run(args, cwd=tmp, env={**os.environ, **env}, capture_output=True, text=True)
        report_file = Path(tmp) / "report" / "report.json"
        report = json.loads(report_file.read_text()) if report_file.exists() else None
        return report, (proc.stdout + proc.stderr)[-3000:]


def _failures(report: dict) -> tuple[list[str], dict[str, str]]:
    """(failing test node IDs, contract -> verdict for contracts that failed)."""
    tests, contracts = [], {}
    for contract in report["contracts"]:
        bad = [t for t in contract["tests"] if t["verdict"] in KILLING_VERDICTS]
        if bad:
            contracts[contract["id"]] = contract["verdict"]
            tests.extend(t["nodeid"] for t in bad)
    return sorted(set(tests)), contracts


def check_baseline(registry: MutantRegistry, timeout: float) -> list[str]:
    """Problems with the unmutated backend on the mutants' contracts."""
    contracts = sorted({c for m in registry.mutants.values() for c in m.contracts})
    # The operators the mutants' runs check (each mutant of the operators area names its own).
    operators = ",".join(sorted({m.operators for m in registry.mutants.values() if m.operators}))
    report, tail = _run_suite(registry.backend, {registry.selector_env: ""}, contracts, timeout, operators)
    if report is None:
        return [f"the baseline run wrote no report:\n{tail}"]
    _, failing = _failures(report)
    return [f"{c} already fails without a mutant ({v})" for c, v in sorted(failing.items())]


def run_mutant(registry: MutantRegistry, mutant: Mutant, timeout: float) -> Outcome:
    start = time.monotonic()
    env = {registry.selector_env: mutant.id}
    outcome = Outcome(mutant.id, list(mutant.contracts), "error")
    report, tail = _run_suite(registry.backend, env, list(mutant.contracts), timeout, mutant.operators)
    if report is None:
        outcome.note = f"the run wrote no report:\n{tail}"
    else:
        tests, failing = _failures(report)
        outcome.verdicts = {c["id"]: c["verdict"] for c in report["contracts"] if c["id"] in mutant.contracts}
        on_target = sorted(set(failing) & set(mutant.contracts))
        if on_target:
            outcome.status, outcome.killing_tests, outcome.killing_contracts = "killed", tests, on_target
        else:
            full, tail = _run_suite(registry.backend, env, None, timeout)
            if full is None:
                outcome.note = f"the whole-suite run wrote no report:\n{tail}"
            else:
                tests, failing = _failures(full)
                outcome.status = "killed-off-target" if failing else "survived"
                outcome.killing_tests, outcome.killing_contracts = tests, sorted(failing)
    outcome.seconds = round(time.monotonic() - start, 1)
    return outcome


def run_all(registry: MutantRegistry, only: list[str] | None, jobs: int, timeout: float,
            progress=print) -> dict:
    start = time.monotonic()
    selected = [registry.mutants[m] for m in only] if only else list(registry.mutants.values())
    problems = check_baseline(registry, timeout)
    if problems:
        return {"baseline_problems": problems, "outcomes": [], "score": None}
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for outcome in pool.map(lambda m: run_mutant(registry, m, timeout), selected):
            outcomes.append(outcome)
            progress(f"{outcome.status:<18} {outcome.mutant:<40} {outcome.seconds:>6.1f} s")
    killed = sum(o.status == "killed" for o in outcomes)
    return {
        "backend": registry.backend,
        "registry": registry.path.name,
        "total": len(outcomes),
        "killed": killed,
        "score": round(killed / len(outcomes), 4) if outcomes else None,
        "jobs": jobs,
        "seconds": round(time.monotonic() - start, 1),
        "baseline_problems": [],
        "outcomes": [asdict(o) for o in outcomes],
    }


def format_matrix(result: dict) -> str:
    """The kill matrix: mutant -> status, contracts that failed, tests that failed."""
    if result.get("baseline_problems"):
        return "baseline run failed, no mutant was run:\n  " + "\n  ".join(result["baseline_problems"])
    lines = [f"{'mutant':<40} {'violates':<28} {'status':<18} killed by"]
    for o in result["outcomes"]:
        by = ", ".join(o["killing_contracts"]) or "-"
        tests = "; ".join(t.split("::", 1)[-1] for t in o["killing_tests"][:3])
        more = f" (+{len(o['killing_tests']) - 3})" if len(o["killing_tests"]) > 3 else ""
        lines.append(f"{o['mutant']:<40} {','.join(o['contracts']):<28} {o['status']:<18} {by}"
                     + (f" [{tests}{more}]" if tests else ""))
    lines.append(f"score: {result['killed']}/{result['total']} killed on target"
                 + (f" ({result['score']:.0%})" if result["score"] is not None else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------ docs

TABLE_BEGIN = ("<!-- mutants:begin - generated from conformance/mutants.toml and "
               "docs/mutation-kill-matrix.json by `python -m openreg.mutants --markdown "
               "docs/mutation-kill-matrix.json --docs docs/mutation-testing.md`; do not edit -->")
TABLE_END = "<!-- mutants:end -->"


def _checks(outcome: dict) -> str:
    """The tests that killed a mutant, parametrized cases folded together
    (C++ cases are named one by one: each is its own GoogleTest case)."""
    groups: dict[str, list[str]] = {}
    for nodeid in outcome.get("killing_tests", []):
        head, _, case = nodeid.partition("[")  # parameters may contain '::'
        path, _, function = head.rpartition("::")
        if function == "test_cxx" and case:
            groups.setdefault(f"C++ {case.rstrip(']')}", [])
            continue
        groups.setdefault(f"{path.rpartition('/')[2]}::{function}", []).append(case)
    parts = []
    for name, cases in groups.items():
        cases = [c for c in cases if c]
        parts.append(f"`{name}`" + (f" ({len(cases)} case{'s' if len(cases) > 1 else ''})" if cases else ""))
    return "<br>".join(parts) or "-"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(registry: MutantRegistry, contracts: registry_mod.Registry, result: dict) -> str:
    """The generated block of docs/mutation-testing.md: every mutant of the
    registry (in registry order), its area and contracts, and the checks of
    the recorded kill matrix `result` that killed it."""
    outcomes = {o["mutant"]: o for o in result.get("outcomes", [])}
    killed = sum(outcomes.get(m, {}).get("status") == "killed" for m in registry.mutants)
    lines = [TABLE_BEGIN, ""]
    run = f"{result.get('seconds')} s with `--jobs {result.get('jobs')}`" if result.get("seconds") else "time not recorded"
    lines.append(f"Recorded run: **{killed}/{len(registry.mutants)} mutants killed on target** ({run}).")
    lines += ["", "| mutant | area | breaks | the fault | killed by |", "|---|---|---|---|---|"]
    for mutant in registry.mutants.values():
        outcome = outcomes.get(mutant.id)
        area = contracts.contracts[mutant.contracts[0]].area
        # The clauses it breaks; a contract none of whose clauses is named, by its ID.
        named = {clause.split(".")[0] for clause in mutant.clauses}
        violates = ", ".join([f"`{c}`" for c in mutant.clauses]
                             + [f"`{c}`" for c in mutant.contracts if c not in named])
        if mutant.ordering:
            violates += " (ordering)"
        if outcome is None:
            caught = "**not run**"
        elif outcome["status"] != "killed":
            caught = f"**{outcome['status']}**"
        else:
            caught = _checks(outcome)
        lines.append(f"| `{mutant.id}` | {area} | {violates} | {_cell(mutant.description)} | {caught} |")
    lines += ["", TABLE_END]
    return "\n".join(lines) + "\n"


def splice(page: str, table: str) -> str:
    """`page` with its generated block replaced by `table`."""
    begin, end = page.find(TABLE_BEGIN), page.find(TABLE_END)
    if begin < 0 or end < begin:
        raise ValueError("the page has no generated mutants block (markers "
                         f"{TABLE_BEGIN[:20]}... and {TABLE_END})")
    return page[:begin] + table + page[end + len(TABLE_END) + 1:]


def generated_block(page: str) -> str:
    """The generated block of `page`, markers included ('' if none)."""
    begin, end = page.find(TABLE_BEGIN), page.find(TABLE_END)
    return page[begin:end + len(TABLE_END) + 1] if 0 <= begin < end else ""
