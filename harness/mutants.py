"""Mutation testing of the suite: run it against deliberately broken
variants of a backend ("mutants") and require each to be rejected.

The mutant registry (conformance/mutants.toml) names the backend, the
environment variable that selects a mutant in it, and every mutant with the
contract IDs and the clauses it violates. For each mutant:

1. the tests of its contracts run with the mutant selected; if a check of
   one of its clauses (a test that decides the clause, or whose failure
   names it) gives fail, error, crash or hang, the mutant is **killed**;
   a failure of its contracts elsewhere is **killed off-clause**;
2. otherwise the whole suite runs: a failure elsewhere makes it **killed
   off-target** (the suite noticed, but not where it should have), no failure
   leaves it **survived**. Only "killed" counts towards the score.

Each mutant runs in two configurations (CONFIGURATIONS): with the backend's
manifest as it is, and with its instrumentation module removed, which no
level needs: a check that can fail only with the instrumentation shows up
there. A mutant that only the instrumentation can kill says why in the
registry (needs_instrumentation).

Before any mutant, the same tests run once without a mutant and must all
pass: a check that already fails would otherwise "kill" every mutant.
The score is killed / total.

A mutant of a contract that needs a newer torch than the one running
(``min_torch``) cannot be killed here: its contract is retired. It runs in
another environment's interpreter (``newer_python``, whose torch is new
enough, with the kit and the backend built there); without one it is an
error in the matrix, never a silent gap. Each outcome records its torch.

The recorded kill matrix (docs/mutation-kill-matrix.json) names the tree it
was measured on (tree_digest); docs/mutation-testing.md's table of mutants is
generated from the registry and that matrix (render_table / splice).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
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
# The configurations of a mutation run: the backend's manifest as it is, and
# without its instrumentation module (block_stream, counters).
INSTRUMENTED, UNINSTRUMENTED = "instrumented", "uninstrumented"
CONFIGURATIONS = (INSTRUMENTED, UNINSTRUMENTED)


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
    needs_instrumentation: str = ""  # why only the instrumentation can kill it ("" : both configurations must)
    min_torch: str = ""             # the newest min_torch of its contracts ("" : any supported torch)


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
        unknown_keys = set(entry) - {"id", "contracts", "description", "clauses", "ordering", "operators", "site",
                                     "needs_instrumentation"}
        if unknown_keys:
            raise MutantRegistryError(f"{where}: unknown keys {sorted(unknown_keys)}")
        operators = entry.get("operators", "")
        if not isinstance(operators, str):
            raise MutantRegistryError(f"{where}: operators must be an --operators value (a string)")
        needs = entry.get("needs_instrumentation", "")
        if not isinstance(needs, str):
            raise MutantRegistryError(f"{where}: needs_instrumentation must be the reason (a string)")
        from .versions import release

        needed = sorted((contracts.contracts[c].min_torch for c in ids if contracts.contracts[c].min_torch),
                        key=release)
        mutants[mutant_id] = Mutant(mutant_id, ids, entry["description"], clauses, bool(entry.get("ordering", False)),
                                    operators, needs, needed[-1] if needed else "")
    return MutantRegistry(path, backend, selector, mutants)


@dataclass
class Outcome:
    mutant: str
    contracts: list[str]
    status: str                 # killed | killed-off-clause | killed-off-target | survived | error
    killing_tests: list[str] = field(default_factory=list)
    killing_contracts: list[str] = field(default_factory=list)
    killing_checks: list[str] = field(default_factory=list)   # the checks of its clauses that failed (when killed)
    verdicts: dict[str, str] = field(default_factory=dict)  # contract -> verdict
    seconds: float = 0.0
    note: str = ""
    torch: str = ""             # the torch it ran on


def manifest_without_instrumentation(backend: str, folder: Path) -> Path:
    """A copy of the backend profile's manifest in `folder` without its
    instrumentation module (the second configuration). Paths in it are
    taken as they are: a manifest naming files relative to itself needs
    them beside the copy."""
    from . import backend as backend_mod

    profile = backend_mod.find_profile(backend) or {}
    if not profile.get("manifest"):
        raise MutantRegistryError(f"the backend profile {backend!r} names no manifest to remove instrumentation from")
    text = Path(profile["manifest"]).read_text(encoding="utf-8")
    copy = folder / "manifest-uninstrumented.toml"
    copy.write_text(re.sub(r"(?m)^\s*instrumentation\s*=.*$", "", text), encoding="utf-8")
    return copy


def _run_suite(backend: str, env: dict[str, str], contracts: list[str] | None,
               timeout: float, operators: str = "", manifest: Path | None = None,
               python: str | None = None) -> tuple[dict | None, str]:
    """Run the suite in a fresh process of `python` (default: this one);
    return (report, output tail)."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        args = [python or sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-q",
                "--pyargs", SUITE, f"--backend={backend}", f"--report-dir={tmp}/report",
                f"--contract-timeout={timeout}"]
        if manifest is not None:
            args.append(f"--manifest={manifest}")
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


def check_name(nodeid: str) -> str:
    """The check a report's test is: 'file::function', or 'C++ Suite.Case'
    for a case of the C++ probe (its parameters are the case)."""
    head, _, param = nodeid.partition("[")
    if head.endswith("::test_cxx") and param:
        return f"C++ {param.rstrip(']')}"
    return head.rpartition("/")[2]


def deciding_checks(clauses: tuple[str, ...]) -> set[str]:
    """The checks (check_name form) that decide `clauses`, from the suite's sources."""
    from . import coverage

    suite = Path(coverage.__file__).resolve().parents[1] / "conformance"
    found = coverage.checks_by_clause(suite)
    names = set()
    for clause in clauses:
        for owner in found.get(clause, []):
            file, _, name = owner.partition("::")
            names.add(f"C++ {name}" if file.endswith(".cpp") else owner)
    return names


def _clause_kills(report: dict, mutant: Mutant, deciding: set[str]) -> tuple[list[str], list[str], list[str]]:
    """(tests, contracts, checks) of the failures that kill `mutant` on its
    clauses: a failing test of its contracts that decides one of its clauses,
    or whose failure names one (a mutant naming no clause: any failure of its
    contracts)."""
    tests, contracts, checks = set(), set(), set()
    for contract in report["contracts"]:
        if contract["id"] not in mutant.contracts:
            continue
        for test in contract["tests"]:
            if test["verdict"] not in KILLING_VERDICTS:
                continue
            name = check_name(test["nodeid"])
            if not mutant.clauses or test.get("clause") in mutant.clauses or name in deciding:
                tests.add(test["nodeid"])
                contracts.add(contract["id"])
                checks.add(name)
    return sorted(tests), sorted(contracts), sorted(checks)


def check_baseline(registry: MutantRegistry, timeout: float, manifest: Path | None = None,
                   python: str | None = None, mutants: list[Mutant] | None = None) -> list[str]:
    """Problems with the unmutated backend on the contracts of `mutants`
    (default: all), run by `python`."""
    mutants = list(registry.mutants.values()) if mutants is None else mutants
    contracts = sorted({c for m in mutants for c in m.contracts})
    # The operators the mutants' runs check (each mutant of the operators area names its own).
    operators = ",".join(sorted({m.operators for m in mutants if m.operators}))
    report, tail = _run_suite(registry.backend, {registry.selector_env: ""}, contracts, timeout, operators, manifest,
                              python)
    if report is None:
        return [f"the baseline run wrote no report:\n{tail}"]
    _, failing = _failures(report)
    where = f" (torch {report_torch(report)})" if python else ""
    return [f"{c} already fails without a mutant ({v}){where}" for c, v in sorted(failing.items())]


def report_torch(report: dict) -> str:
    """The torch a report's run had."""
    return str((report.get("provenance") or {}).get("torch_version", ""))


@functools.lru_cache(maxsize=None)
def interpreter_torch(python: str) -> str:
    """The torch version of the interpreter `python` ("" if it has none),
    asked once per run (the matrix and each configuration need it)."""
    try:
        return subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                              text=True, timeout=300, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def running_torch() -> str:
    import torch

    return torch.__version__


def too_new(mutant: Mutant, torch_version: str) -> bool:
    """Whether `mutant`'s contracts are retired on `torch_version`."""
    from .versions import release

    return bool(mutant.min_torch) and (not torch_version or release(torch_version) < release(mutant.min_torch))


def run_mutant(registry: MutantRegistry, mutant: Mutant, timeout: float, manifest: Path | None = None,
               whole_suite: bool = True, python: str | None = None) -> Outcome:
    """One mutant's outcome, run by `python` (default: this interpreter);
    `whole_suite` False: a mutant not killed on its contracts is "survived"
    without running the whole suite to look for a failure elsewhere (for a
    mutant expected to survive there)."""
    start = time.monotonic()
    env = {registry.selector_env: mutant.id}
    outcome = Outcome(mutant.id, list(mutant.contracts), "error")
    report, tail = _run_suite(registry.backend, env, list(mutant.contracts), timeout, mutant.operators, manifest,
                              python)
    if report is None:
        outcome.note = f"the run wrote no report:\n{tail}"
    else:
        outcome.torch = report_torch(report)
        tests, failing = _failures(report)
        outcome.verdicts = {c["id"]: c["verdict"] for c in report["contracts"] if c["id"] in mutant.contracts}
        on_target = sorted(set(failing) & set(mutant.contracts))
        killing = _clause_kills(report, mutant, deciding_checks(mutant.clauses))
        if killing[0]:
            outcome.status = "killed"
            outcome.killing_tests, outcome.killing_contracts, outcome.killing_checks = killing
        elif on_target:
            outcome.status, outcome.killing_tests, outcome.killing_contracts = "killed-off-clause", tests, on_target
            outcome.note = "its contracts failed, but no check of its clauses " + ", ".join(mutant.clauses)
        elif not whole_suite:
            outcome.status = "survived"
            outcome.note = "not killed on its contracts (the whole suite was not run: it is expected to survive here)"
        else:
            full, tail = _run_suite(registry.backend, env, None, timeout, manifest=manifest, python=python)
            if full is None:
                outcome.note = f"the whole-suite run wrote no report:\n{tail}"
            else:
                tests, failing = _failures(full)
                outcome.status = "killed-off-target" if failing else "survived"
                outcome.killing_tests, outcome.killing_contracts = tests, sorted(failing)
    outcome.seconds = round(time.monotonic() - start, 1)
    return outcome


def run_configuration(registry: MutantRegistry, selected: list[Mutant], jobs: int, timeout: float,
                      configuration: str, progress=print, newer_python: str | None = None) -> dict:
    """The kill matrix of one configuration (CONFIGURATIONS). Mutants whose
    contracts this torch retires run in `newer_python` (module docstring)."""
    start = time.monotonic()
    here = running_torch()
    # Absolute (the suite runs in a temporary folder), not resolved (a venv's python is a link to its base).
    newer_python = os.path.abspath(newer_python) if newer_python else None
    newer_torch = interpreter_torch(newer_python) if newer_python else ""
    # interpreter (None: this one) -> its mutants; the mutants nothing here can run.
    groups: dict[str | None, list[Mutant]] = {}
    unrunnable: list[Outcome] = []
    for mutant in selected:
        if not too_new(mutant, here):
            groups.setdefault(None, []).append(mutant)
        elif newer_python and not too_new(mutant, newer_torch):
            groups.setdefault(newer_python, []).append(mutant)
        else:
            unrunnable.append(Outcome(
                mutant.id, list(mutant.contracts), "error", torch=here,
                note=f"its contracts need torch >= {mutant.min_torch}, this run has {here}"
                     + (f" and {newer_python} has {newer_torch or 'no torch'}" if newer_python else
                        "; give the runner an interpreter of a newer torch (--newer-python)")))
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        manifest = (manifest_without_instrumentation(registry.backend, Path(tmp))
                    if configuration == UNINSTRUMENTED else None)
        problems = [p for python, mutants in groups.items()
                    for p in check_baseline(registry, timeout, manifest, python, mutants)]
        if problems:
            return {"baseline_problems": problems, "outcomes": [], "score": None, "total": 0, "killed": 0}
        order = [(python, m) for python, mutants in groups.items() for m in mutants]
        outcomes: list[Outcome] = list(unrunnable)
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for outcome in pool.map(lambda job: run_mutant(registry, job[1], timeout, manifest,
                                                           expected_status(job[1], configuration) == "killed",
                                                           job[0]), order):
                outcomes.append(outcome)
                progress(f"{configuration:<15} {outcome.status:<18} {outcome.mutant:<40} {outcome.seconds:>6.1f} s")
    position = {m.id: k for k, m in enumerate(selected)}
    outcomes.sort(key=lambda o: position[o.mutant])
    killed = sum(o.status == "killed" for o in outcomes)
    return {
        "total": len(outcomes),
        "killed": killed,
        "score": round(killed / len(outcomes), 4) if outcomes else None,
        "jobs": jobs,
        "seconds": round(time.monotonic() - start, 1),
        "baseline_problems": [],
        "outcomes": [asdict(o) for o in outcomes],
    }


def run_all(registry: MutantRegistry, only: list[str] | None, jobs: int, timeout: float,
            progress=print, configurations: tuple[str, ...] = CONFIGURATIONS, tree: dict | None = None,
            newer_python: str | None = None) -> dict:
    """The kill matrix: every selected mutant in each configuration, and the
    tree it was measured on (tree_digest, given by the caller)."""
    selected = [registry.mutants[m] for m in only] if only else list(registry.mutants.values())
    return {
        "backend": registry.backend,
        "registry": registry.path.name,
        "tree": tree or {},
        "torch": running_torch(),
        "newer_torch": interpreter_torch(newer_python) if newer_python else None,
        "configurations": {c: run_configuration(registry, selected, jobs, timeout, c, progress, newer_python)
                           for c in configurations},
    }


def expected_status(mutant: Mutant, configuration: str) -> str:
    """What the matrix must record for `mutant`: killed, except without
    instrumentation for a mutant that only the instrumentation kills for
    certain (it may survive there, or be caught by chance: "any")."""
    return "any" if configuration == UNINSTRUMENTED and mutant.needs_instrumentation else "killed"


def matrix_problems(registry: MutantRegistry, result: dict) -> list[str]:
    """Where a kill matrix falls short: a baseline that failed, or a mutant
    missing or not killed on its clauses in a configuration that must kill
    it."""
    problems = []
    for configuration, matrix in result.get("configurations", {}).items():
        problems += [f"{configuration}: baseline: {p}" for p in matrix.get("baseline_problems", [])]
        outcomes = {o["mutant"]: o for o in matrix.get("outcomes", [])}
        for mutant in registry.mutants.values():
            outcome = outcomes.get(mutant.id)
            if outcome is None:
                problems.append(f"{configuration}: {mutant.id} was not run")
                continue
            if expected_status(mutant, configuration) == "killed" and outcome["status"] != "killed":
                problems.append(f"{configuration}: {mutant.id} is {outcome['status']}, not killed on its clauses "
                                f"{', '.join(mutant.clauses) or '(its contracts)'}")
    return problems


# ------------------------------------------------------------------ the tree

# What a kill matrix proves depends on these folders: the suite and its
# registries, the harness that gives verdicts, and the backend with its mutants.
TREE_FOLDERS = ("conformance", "harness", "mutation", "reference_backend")


def tree_files(root: Path, folders: tuple[str, ...] = TREE_FOLDERS) -> list[Path]:
    """The files of `folders` under `root`: those git tracks when `root` is
    a checkout (untracked files are not part of the tree), else every file
    but caches and build output."""
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", *folders], capture_output=True,
                                timeout=60, check=True).stdout.decode("utf-8", "surrogateescape")
        files = [root / name for name in listed.split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        files = [path for folder in folders for path in (root / folder).rglob("*")
                 if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"]
    return sorted(path for path in files if path.is_file())


def tree_digest(root: Path, folders: tuple[str, ...] = TREE_FOLDERS) -> str:
    """sha256 over the tree's files: each file's path and content hash."""
    digest = hashlib.sha256()
    for path in tree_files(root, folders):
        digest.update(f"{path.relative_to(root).as_posix()}\0{hashlib.sha256(path.read_bytes()).hexdigest()}\n"
                      .encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def check_digests(root: Path, checks: list[str]) -> dict[str, str]:
    """A sha256 of each check's source (check_name form): a Python test
    function's own source, or a C++ case's file, so that a matrix can tell
    which checks changed since it was recorded."""
    import ast

    suite = root / "conformance"
    sources: dict[str, str] = {}
    for check in sorted(set(checks)):
        if check.startswith("C++ "):
            texts = [p.read_text(encoding="utf-8") for p in sorted((suite / "cxx").glob("contracts_*.cpp"))
                     if check[4:].replace(".", ", ") in p.read_text(encoding="utf-8")]
            sources[check] = hashlib.sha256("".join(texts).encode()).hexdigest()
            continue
        file, _, function = check.partition("::")
        path = suite / file
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8")
        node = next((n for n in ast.parse(source).body if getattr(n, "name", None) == function), None)
        text = ast.get_source_segment(source, node) if node is not None else ""
        sources[check] = hashlib.sha256((text or "").encode()).hexdigest()
    return sources


def format_matrix(result: dict) -> str:
    """The kill matrix, per configuration: mutant -> status, the checks that killed it."""
    lines = []
    for configuration, matrix in result.get("configurations", {}).items():
        lines.append(f"== {configuration}")
        if matrix.get("baseline_problems"):
            lines.append("baseline run failed, no mutant was run:\n  " + "\n  ".join(matrix["baseline_problems"]))
            continue
        lines.append(f"{'mutant':<40} {'violates':<28} {'status':<18} killed by")
        for o in matrix["outcomes"]:
            checks = o.get("killing_checks") or [t.split("::", 1)[-1] for t in o["killing_tests"]]
            more = f" (+{len(checks) - 3})" if len(checks) > 3 else ""
            elsewhere = f" [torch {o['torch']}]" if o.get("torch") and o["torch"] != result.get("torch") else ""
            lines.append(f"{o['mutant']:<40} {','.join(o['contracts']):<28} {o['status']:<18} "
                         + ("; ".join(checks[:3]) + more if checks else "-") + elsewhere)
        lines.append(f"score: {matrix['killed']}/{matrix['total']} killed on their clauses"
                     + (f" ({matrix['score']:.0%})" if matrix["score"] is not None else ""))
    return "\n".join(lines)


# ------------------------------------------------------------------ docs

TABLE_BEGIN = ("<!-- mutants:begin - generated from conformance/mutants.toml and "
               "docs/mutation-kill-matrix.json by `python mutation/run.py --markdown "
               "docs/mutation-kill-matrix.json --docs docs/mutation-testing.md`; do not edit -->")
TABLE_END = "<!-- mutants:end -->"


def _checks(outcome: dict) -> str:
    """The checks of its clauses that killed a mutant, with how many of
    their parametrized cases did."""
    cases: dict[str, int] = {}
    for nodeid in outcome.get("killing_tests", []):
        name = check_name(nodeid)
        if name in outcome.get("killing_checks", [name]):
            cases[name] = cases.get(name, 0) + (1 if "[" in nodeid and not name.startswith("C++") else 0)
    return "<br>".join(f"`{name}`" + (f" ({n} case{'s' if n > 1 else ''})" if n else "")
                       for name, n in cases.items()) or "-"


def _caught(outcome: dict | None) -> str:
    if outcome is None:
        return "**not run**"
    return _checks(outcome) if outcome["status"] == "killed" else f"**{outcome['status']}**"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(registry: MutantRegistry, contracts: registry_mod.Registry, result: dict) -> str:
    """The generated block of docs/mutation-testing.md: every mutant of the
    registry (in registry order), its area and contracts, and the checks of
    the recorded kill matrix `result` that killed it."""
    configurations = result.get("configurations", {})
    outcomes = {c: {o["mutant"]: o for o in configurations.get(c, {}).get("outcomes", [])} for c in CONFIGURATIONS}
    lines = [TABLE_BEGIN, ""]
    tree = result.get("tree") or {}
    here = result.get("torch")
    lines.append(f"Recorded on the tree {tree.get('sha256', '(unrecorded)')[:12]} (commit "
                 f"{tree.get('commit') or 'unrecorded'}) of conformance/, harness/, mutation/ and reference_backend/"
                 + (f", on torch {here}" if here else "")
                 + (f" (the mutants of contracts that need a newer torch on torch {result['newer_torch']})"
                    if result.get("newer_torch") else "") + ":")
    lines.append("")
    for configuration in CONFIGURATIONS:
        matrix = configurations.get(configuration, {})
        killed = sum(outcomes[configuration].get(m, {}).get("status") == "killed" for m in registry.mutants)
        owed = sum(expected_status(m, configuration) == "killed" for m in registry.mutants.values())
        run = (f"{matrix.get('seconds')} s with `--jobs {matrix.get('jobs')}`" if matrix.get("seconds")
               else "time not recorded")
        lines.append(f"- {configuration}: **{killed}/{len(registry.mutants)} mutants killed on their clauses** "
                     f"({owed} must be; {run}).")
    lines += ["", "| mutant | area | breaks | the fault | killed by (instrumented) | without instrumentation |",
              "|---|---|---|---|---|---|"]
    for mutant in registry.mutants.values():
        outcome = outcomes[INSTRUMENTED].get(mutant.id)
        bare = outcomes[UNINSTRUMENTED].get(mutant.id)
        area = contracts.contracts[mutant.contracts[0]].area
        # The clauses it breaks; a contract none of whose clauses is named, by its ID.
        named = {clause.split(".")[0] for clause in mutant.clauses}
        violates = ", ".join([f"`{c}`" for c in mutant.clauses]
                             + [f"`{c}`" for c in mutant.contracts if c not in named])
        if mutant.ordering:
            violates += " (ordering)"
        if mutant.min_torch:
            violates += f" (torch >= {mutant.min_torch})"
        if mutant.needs_instrumentation and (bare or {}).get("status") != "killed":
            without = f"needs the instrumentation: {_cell(mutant.needs_instrumentation)}"
        else:
            without = "killed" if (bare or {}).get("status") == "killed" else _caught(bare)
        lines.append(f"| `{mutant.id}` | {area} | {violates} | {_cell(mutant.description)} | {_caught(outcome)} | "
                     f"{without} |")
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
