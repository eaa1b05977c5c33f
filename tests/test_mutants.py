"""Mutation testing of the suite (docs/mutation-testing.md): the mutant
registry is consistent with the contracts, every mutant has sites to be
woven into the reference backend, selecting a mutant is safe, the docs' table is generated
from the registry, and every mutant is killed on its clauses by the real
runner, with OpenReg's instrumentation and without it.

The recorded kill matrix (docs/mutation-kill-matrix.json, written by `make
mutants`) must list every mutant as killed where it must be, and must have
been measured on this very tree: a change to conformance/, harness/,
mutation/ or reference_backend/ makes it stale until it is recorded again.

`make test` re-proves a sample through the real runner: for each contract
area one mutant and one configuration chosen by the commit (so that over
many commits every mutant is re-proved in both), every mutant whose killing
checks changed since the matrix was recorded, and the quickest ordering
mutant 20 times on a busy machine. Every ordering mutant 20 times (marker
`mutation`) runs with `make mutants`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from kit_support import REPO, mutation_runner, run_pytest, weaver
from privateuse1_conformance.harness import cli
from privateuse1_conformance.harness import mutants as mutants_mod
from privateuse1_conformance.harness import registry as registry_mod

DOCS_PAGE = REPO / "docs" / "mutation-testing.md"
RECORDED_MATRIX = REPO / "docs" / "mutation-kill-matrix.json"

# Every area of the core and standard levels (and fork, amp, compile) must
# have at least one mutant; pinned memory by its contracts.
AREAS = {"device-management", "hooks", "guard", "streams", "events", "generators", "memory", "tensors",
         "serialization", "threads", "bad-input", "amp", "compile"}
PINNED_CONTRACTS = {"MM-PIN-001", "HK-PIN-001", "HK-PIN-002", "MM-COPY-001"}


@pytest.fixture(scope="module")
def contracts():
    return registry_mod.load(registry_mod.default_path())


@pytest.fixture(scope="module")
def registry(contracts):
    return mutants_mod.load(mutants_mod.default_path(), contracts)


def injection_sites() -> dict[str, list[str]]:
    """Mutant ID -> the files of the reference backend its sites go into
    (woven in by mutation/weave.py)."""
    sites: dict[str, list[str]] = {}
    for site in weaver().load_sites(mutants_mod.default_path()):
        sites.setdefault(site.mutant, []).append(site.file)
    return sites


# ------------------------------------------------------------- registry


def test_registry_is_consistent(registry, contracts):
    assert registry.backend == "openreg" and registry.selector_env == "OPENREG_MUTANT"
    assert len(registry.mutants) >= 40, f"only {len(registry.mutants)} mutants; the issue asks for 40 or more"
    for mutant in registry.mutants.values():
        unknown = [c for c in mutant.contracts if c not in contracts.contracts]
        assert not unknown, f"{mutant.id} names unknown contracts {unknown}"
        retired = [c for c in mutant.contracts if contracts.contracts[c].retired]
        assert not retired, f"{mutant.id} names retired contracts {retired}"
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", mutant.id), f"mutant ID {mutant.id!r} is not kebab-case"
        assert mutant.description.endswith("."), f"{mutant.id}: one sentence, ending with a period"
    areas = {contracts.contracts[c].area for m in registry.mutants.values() for c in m.contracts}
    assert not AREAS - areas, f"no mutant violates a contract of the areas {sorted(AREAS - areas)}"
    assert PINNED_CONTRACTS & {c for m in registry.mutants.values() for c in m.contracts}, \
        "no mutant breaks pinned memory"


def test_the_readme_counts_the_registrys_mutants(registry):
    """The README's figure is the registry's, not a past count."""
    readme = (REPO / "README.md").read_text()
    match = re.search(r"rejects (\d+) deliberately broken variants", readme)
    assert match, "README.md no longer says how many mutants the mutation run rejects"
    assert int(match.group(1)) == len(registry.mutants), (
        f"README.md says {match.group(1)} mutants; conformance/mutants.toml has {len(registry.mutants)}")


def test_registry_rejects_unknown_contracts(tmp_path, contracts):
    bad = tmp_path / "mutants.toml"
    bad.write_text('backend = "openreg"\nselector_env = "OPENREG_MUTANT"\n'
                   '[[mutant]]\nid = "x"\ncontracts = ["NO-SUCH-001"]\ndescription = "Broken."\n')
    with pytest.raises(mutants_mod.MutantRegistryError, match="NO-SUCH-001"):
        mutants_mod.load(bad, contracts)


def test_every_mutant_has_an_injection_site(registry):
    sites = injection_sites()
    without = sorted(set(registry.mutants) - set(sites))
    assert not without, f"mutants without a site in the reference backend: {without}"
    for mutant_id, files in sites.items():
        missing = sorted({f for f in files if not (REPO / f).is_file()})
        assert not missing, f"{mutant_id}: sites in files that do not exist: {missing}"


# ------------------------------------------------------------ selection


@pytest.mark.woven
def test_a_run_refuses_mutants_the_build_lacks(registry, tmp_path):
    """mutation/run.py refuses, before any suite runs, a mutant with sites in
    compiled code that the built library does not hold (the registry changed
    after `make build`): every check would pass against it, and the run would
    report a survivor after the whole suite's time."""
    run = mutation_runner()
    libraries = run.openreg_libraries(sys.executable)
    assert libraries, "found no native library of the OpenReg this interpreter imports"
    assert run.unwoven(registry.path, list(registry.mutants), libraries) == [], \
        "mutants of the registry that `make build` did not weave into OpenReg"
    added = tmp_path / "mutants.toml"
    added.write_text('[[mutant]]\nid = "woven-nowhere"\n[[mutant.site]]\n'
                     'file = "reference_backend/csrc/Guard.cpp"\nat = "x"\n'
                     '[[mutant]]\nid = "python-only"\n[[mutant.site]]\n'
                     'file = "reference_backend/python/openreg/__init__.py"\nat = "x"\n')
    assert run.unwoven(added, ["woven-nowhere", "python-only"], libraries) == ["woven-nowhere"]
    some = next(iter(registry.mutants))
    unbuilt = dataclasses.replace(registry.mutants[some], id="woven-nowhere", min_torch="")
    refusal = run.refuse_unbuilt(dataclasses.replace(registry, path=added, mutants={"woven-nowhere": unbuilt}),
                                 ["woven-nowhere"], None)
    assert "woven-nowhere" in refusal and "make build" in refusal, refusal
    assert run.refuse_unbuilt(registry, [some], None) == ""


def _import_openreg(mutant: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OPENREG_MUTANT"}
    if mutant is not None:
        env["OPENREG_MUTANT"] = mutant
    code = "import openreg; print('imported')"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_an_unknown_mutant_fails_at_import():
    proc = _import_openreg("no-such-mutant")
    assert proc.returncode != 0, f"import openreg accepted an unknown mutant:\n{proc.stdout}"
    assert "OPENREG_MUTANT='no-such-mutant' names no mutant" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_no_mutant_selected(value):
    proc = _import_openreg(value)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "imported"


@pytest.mark.parametrize("mutant, expected", [
    (None, ["0", "True"]),
    ("hooks-count-disagrees", ["1", "True"]),       # C++ (woven at build time): deviceCount one too many
    ("module-is-available-false", ["0", "False"]),  # Python (woven at import): is_available() says False
])
def test_a_mutant_is_selected_in_its_layer(mutant, expected):
    env = {k: v for k, v in os.environ.items() if k != "OPENREG_MUTANT"}
    if mutant:
        env["OPENREG_MUTANT"] = mutant
    code = ("import torch, openreg; print(torch._C._accelerator_hooks_device_count() - openreg.device_count(), "
            "openreg.is_available())")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == expected


def test_a_selected_mutant_has_an_inductor_cache_of_its_own(tmp_path):
    """Inductor reuses generated code across processes by a key that knows
    nothing of the mutant: a selection moves the cache one level down, once,
    for the process and its children."""
    env = {k: v for k, v in os.environ.items() if k != "OPENREG_MUTANT"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path)
    code = ("import os, subprocess, sys; print(os.environ['TORCHINDUCTOR_CACHE_DIR']); sys.stdout.flush(); "
            "subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"TORCHINDUCTOR_CACHE_DIR\"])'])")
    for mutant, folder in ((None, tmp_path), ("hooks-count-disagrees", tmp_path / "openreg-mutant-hooks-count-disagrees")):
        proc = subprocess.run([sys.executable, "-c", code], env={**env, **({"OPENREG_MUTANT": mutant} if mutant else {})},
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == [str(folder)] * 2


# ----------------------------------------------------------------- docs


def _matrix() -> dict:
    return json.loads(RECORDED_MATRIX.read_text())


def test_the_kill_matrix_was_measured_on_this_tree():
    """A proof bound to the code it was measured on: the matrix records the
    digest of conformance/, harness/, mutation/ and reference_backend/, which must be
    this tree's."""
    tree = _matrix().get("tree") or {}
    now = mutants_mod.tree_digest(REPO)
    assert tree.get("sha256") == now, (
        f"docs/mutation-kill-matrix.json was measured on another tree (recorded {tree.get('sha256')}, commit "
        f"{tree.get('commit')}; this tree {now}): the suite, the harness or OpenReg changed since. Record it again "
        "with `make mutants`")


def test_a_stale_tree_is_seen(tmp_path):
    """The digest changes with any file of the folders it covers."""
    for folder in mutants_mod.TREE_FOLDERS:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("x = 1\n")
    before = mutants_mod.tree_digest(tmp_path)
    (tmp_path / "harness" / "a.py").write_text("x = 2\n")
    assert mutants_mod.tree_digest(tmp_path) != before
    (tmp_path / "harness" / "a.py").write_text("x = 1\n")
    assert mutants_mod.tree_digest(tmp_path) == before


def test_the_recorded_matrix_kills_every_mutant_where_it_must(registry):
    matrix = _matrix()
    assert set(matrix["configurations"]) == set(mutants_mod.CONFIGURATIONS)
    for configuration, result in matrix["configurations"].items():
        outcomes = {o["mutant"]: o for o in result["outcomes"]}
        stale = sorted(m.id for m in registry.mutants.values()
                       if m.id not in outcomes or outcomes[m.id]["contracts"] != list(m.contracts))
        assert not stale, (f"{RECORDED_MATRIX.name} has no (or an outdated) {configuration} outcome for {stale}: "
                           "record it again with `make mutants`")
    problems = mutants_mod.matrix_problems(registry, matrix)
    assert not problems, "the recorded kill matrix:\n  " + "\n  ".join(problems)
    for result in matrix["configurations"].values():
        for outcome in result["outcomes"]:
            if outcome["status"] == "killed":
                assert outcome["killing_checks"], f"{outcome['mutant']}: killed, but by which check?"


def test_docs_table_is_generated_from_the_registry(registry, contracts):
    matrix = _matrix()
    page = DOCS_PAGE.read_text()
    assert mutants_mod.generated_block(page) == mutants_mod.render_table(registry, contracts, matrix), (
        "the table of docs/mutation-testing.md is stale: regenerate it with `python mutation/run.py "
        "--markdown docs/mutation-kill-matrix.json --docs docs/mutation-testing.md`")
    for mutant in registry.mutants.values():
        assert f"| `{mutant.id}` |" in page


def test_markdown_command_prints_the_table(registry, contracts):
    out = io.StringIO()
    with redirect_stdout(out):
        code = mutation_runner().main(["--markdown", str(RECORDED_MATRIX)])
    assert code == 0
    assert out.getvalue() == mutants_mod.render_table(registry, contracts, json.loads(RECORDED_MATRIX.read_text()))


def test_splice_replaces_only_the_generated_block(registry, contracts):
    page = f"# Title\n\nprose\n\n{mutants_mod.TABLE_BEGIN}\nold\n{mutants_mod.TABLE_END}\n\nafter\n"
    table = mutants_mod.render_table(registry, contracts, {"configurations": {}})
    spliced = mutants_mod.splice(page, table)
    assert spliced.startswith("# Title\n\nprose\n\n") and spliced.endswith("\nafter\n")
    assert mutants_mod.generated_block(spliced) == table
    assert "**not run**" in table
    with pytest.raises(ValueError):
        mutants_mod.splice("no markers", table)


# ------------------------------------------------------------- the run


def _recorded_seconds() -> dict[str, float]:
    """Each mutant's seconds in the recorded matrix (empty when none is
    recorded in this format: the tests of the recorded matrix say so)."""
    try:
        outcomes = _matrix()["configurations"][mutants_mod.INSTRUMENTED]["outcomes"]
    except (OSError, ValueError, KeyError):
        return {}
    return {o["mutant"]: o["seconds"] for o in outcomes}


def _commit() -> str:
    """The commit the sample rotates with (CI_COMMIT overrides it)."""
    commit = os.environ.get("CI_COMMIT")
    if commit:
        return commit
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "no commit"


def _pick(commit: str, salt: str, choices: list) -> object:
    return choices[int(hashlib.sha256(f"{commit}:{salt}".encode()).hexdigest(), 16) % len(choices)]


@functools.lru_cache(maxsize=1)
def _changed_checks() -> frozenset[str]:
    """The checks whose code changed since the matrix was recorded (seconds
    to compute: the same for every commit the sample is drawn for)."""
    recorded = (_matrix().get("tree") or {}).get("checks", {})
    return frozenset(c for c, digest in mutants_mod.check_digests(REPO, list(recorded)).items()
                     if recorded[c] != digest)


def sample(registry, contracts, commit: str) -> dict[str, list[str]]:
    """configuration -> mutants to re-prove: for each contract area, a
    mutant and a configuration chosen by `commit` (a configuration in which
    the mutant must be killed), and every mutant a check of which changed
    since the matrix was recorded (both configurations)."""
    chosen: dict[str, set[str]] = {c: set() for c in mutants_mod.CONFIGURATIONS}
    by_area: dict[str, list] = {}
    here = mutants_mod.running_torch()
    for mutant in sorted(registry.mutants.values(), key=lambda m: m.id):
        if mutants_mod.too_new(mutant, here):
            continue  # its contracts are retired on this torch: `make mutants` runs it on a newer one
        by_area.setdefault(contracts.contracts[mutant.contracts[0]].area, []).append(mutant)
    for area, mutants in sorted(by_area.items()):
        mutant = _pick(commit, area, mutants)
        owed = [c for c in mutants_mod.CONFIGURATIONS if mutants_mod.expected_status(mutant, c) == "killed"]
        chosen[_pick(commit, f"{area}/configuration", owed)].add(mutant.id)
    matrix = _matrix()
    changed = _changed_checks()
    for configuration, result in matrix["configurations"].items():
        for outcome in result["outcomes"]:
            mutant = registry.mutants.get(outcome["mutant"])
            if mutant and set(outcome.get("killing_checks", [])) & changed and not mutants_mod.too_new(mutant, here) and \
                    mutants_mod.expected_status(mutant, configuration) == "killed":
                chosen[configuration].add(mutant.id)
    return {c: sorted(m) for c, m in chosen.items() if m}


def test_a_mutant_of_a_newer_torch_runs_there_or_is_an_error(registry):
    """A mutant whose contract needs a newer torch than this one carries that
    release; without an interpreter of a new enough torch the runner records
    it as an error saying what to give it (never silently skipped), and the
    matrix's problems name it."""
    assert registry.mutants["hooks-generators-are-copies"].min_torch == "2.14"
    assert registry.mutants["dynamo-stream-placeholder"].min_torch == "2.15"
    assert registry.mutants["exchange-returns-new"].min_torch == ""
    newer = registry.mutants["dynamo-stream-placeholder"]
    here = mutants_mod.running_torch()
    for python, says in ((None, "--newer-python"), (sys.executable, f"{sys.executable} has {here}")):
        result = mutants_mod.run_configuration(registry, [newer], jobs=1, timeout=5.0,
                                               configuration=mutants_mod.INSTRUMENTED, progress=lambda line: None,
                                               newer_python=python)
        [outcome] = result["outcomes"]
        assert outcome["status"] == "error" and "need torch >= 2.15" in outcome["note"] and says in outcome["note"], \
            outcome
    import dataclasses

    only = dataclasses.replace(registry, mutants={newer.id: newer})
    problems = mutants_mod.matrix_problems(only, {"configurations": {mutants_mod.INSTRUMENTED: result}})
    assert problems == [f"instrumented: {newer.id} is error, not killed on its clauses DI-IFACE-002.2"]


def test_the_sample_rotates_with_the_commit(registry, contracts):
    """Over commits, every area's sample changes: in a hundred commits each
    area's mutants are chosen more than once, in both configurations."""
    seen: dict[str, set[tuple[str, str]]] = {}
    for k in range(100):
        for configuration, mutants in sample(registry, contracts, f"commit {k}").items():
            for mutant in mutants:
                area = contracts.contracts[registry.mutants[mutant].contracts[0]].area
                seen.setdefault(area, set()).add((mutant, configuration))
    assert set(seen) >= AREAS
    assert all(len(pairs) > 1 for pairs in seen.values()), seen


def _run_and_require_kills(registry, chosen: dict[str, list[str]], tmp_path: Path) -> None:
    problems = []
    for configuration, only in chosen.items():
        selected = [registry.mutants[m] for m in only]
        result = mutants_mod.run_configuration(registry, selected, jobs=2, timeout=60.0,
                                               configuration=configuration, progress=lambda line: None)
        (Path(tmp_path) / f"mutants-{configuration}.json").write_text(json.dumps(result, indent=2))
        problems += [f"{configuration}: baseline: {p}" for p in result["baseline_problems"]]
        problems += [f"{configuration}: {o['mutant']}: {o['status']} {o['killing_contracts']} {o['note'][-500:]}"
                     for o in result["outcomes"] if o["status"] != "killed"]
    assert not problems, ("mutants not killed on their clauses (a bug in the suite: sharpen the check):\n  "
                          + "\n  ".join(problems))


def test_a_sample_of_mutants_is_killed_on_its_clauses(registry, contracts, tmp_path, monkeypatch):
    """One mutant per contract area, and every mutant whose checks changed,
    through the real runner (the sample rotates with the commit)."""
    monkeypatch.chdir(tmp_path)
    chosen = sample(registry, contracts, _commit())
    assert sum(len(m) for m in chosen.values()) >= len(AREAS)
    _run_and_require_kills(registry, chosen, tmp_path)


# --------------------------------------------------- ordering, repeatedly

REPEATS = 20
KILLING = {"fail", "error", "crash", "hang"}


def _ordering_mutants() -> list:
    """Every ordering mutant; all but the quickest to kill (in the recorded
    matrix) only under the `mutation` marker (`make mutants`)."""
    contracts = registry_mod.load(registry_mod.default_path())
    ordering = [m.id for m in mutants_mod.load(mutants_mod.default_path(), contracts).mutants.values() if m.ordering]
    seconds = _recorded_seconds()
    quickest = min(ordering, key=lambda m: (seconds.get(m, float("inf")), m))
    return [m if m == quickest else pytest.param(m, marks=pytest.mark.mutation) for m in sorted(ordering)]


@pytest.fixture(scope="module")
def busy_machine():
    """Every core kept busy by other processes while the ordering mutants
    run: the state in which a check that hopes for a race loses it (a
    worker thread not yet scheduled, work finishing late or early)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


@pytest.mark.parametrize("mutant_id", _ordering_mutants())
def test_ordering_mutant_is_killed_in_every_run(mutant_id, registry, contracts, tmp_path, busy_machine):
    """A bug that shows only while work is in flight must be caught every
    time, not by luck: the tests that decide the mutant's clauses run
    REPEATS times (each in its own process, as always) on a busy machine,
    and every repetition must fail on one of the mutant's contracts."""
    from privateuse1_conformance.harness import coverage

    mutant = registry.mutants[mutant_id]
    suite = Path(coverage.__file__).resolve().parents[1] / "conformance"
    checks = coverage.checks_by_clause(suite)
    tests = sorted({owner for clause in mutant.clauses for owner in checks.get(clause, [])
                    if owner.split("::")[1].startswith("test_")})
    assert tests, f"no test decides the clauses {mutant.clauses} of {mutant_id}"
    run = run_pytest(["--backend=openreg", "--pyargs", "privateuse1_conformance.conformance",
                      f"--count={REPEATS}", *(f"--test-id={t}" for t in tests)], tmp_path,
                     env={"OPENREG_MUTANT": mutant_id})
    assert run.report is not None, run.stdout[-3000:] + run.stderr[-3000:]
    killed: set[int] = set()
    for contract in run.report["contracts"]:
        if contract["id"] not in mutant.contracts:
            continue
        for test in contract["tests"]:
            repetition = re.search(rf"(\d+)-{REPEATS}\]$", test["nodeid"])
            if repetition and test["verdict"] in KILLING:
                killed.add(int(repetition.group(1)))
    missed = sorted(set(range(1, REPEATS + 1)) - killed)
    assert not missed, (f"{mutant_id} survived {len(missed)} of {REPEATS} runs of {tests} (runs {missed}): the "
                        "check relies on timing instead of forcing the window")


def test_the_vendor_cli_has_no_mutants_command(capsys):
    """The mutation run is OpenReg's command (python mutation/run.py), not the vendor's."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["mutants"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'mutants'" in capsys.readouterr().err
