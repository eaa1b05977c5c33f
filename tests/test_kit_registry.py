"""The contract registry: complete, covered by tests, documented."""

from __future__ import annotations

import pytest
from kit_support import REPO, run_pytest

from privateuse1_conformance.harness import cli
from privateuse1_conformance.harness import registry as registry_mod

# The minimum catalog every version of the suite must keep (CONTRACTS-SEED.md).
SEED = """
DM-NAME-001 DM-NAME-002 DM-MOD-001 DM-ACC-001 DM-COUNT-001 DM-COUNT-002 DM-COUNT-003 DM-GET-001
DM-SET-001 DM-SET-002 DM-SET-003 DM-SET-004 DM-XCHG-001 DM-XCHG-002 DM-MXCHG-001 DM-MXCHG-002
DM-CTX-001 DM-THREAD-001 DM-PLACE-001 DM-PARSE-001
HK-REG-001 HK-BUILT-001 HK-AVAIL-001 HK-INIT-001 HK-CTX-001 HK-CTX-002 HK-GEN-001 HK-GEN-002
HK-PTR-001 HK-PIN-001 HK-PIN-002 HK-DEV-001 HK-RESIZE-001
GD-DEV-001 GD-DEV-002 GD-DEV-003 GD-DEV-004 GD-DEV-005 GD-STR-001 GD-STR-002 GD-MULTI-001
GD-CNT-001 GD-PY-001
ST-NEW-001 ST-CUR-001 ST-SYNC-001 ST-WAIT-001 ST-PRIO-001 ST-DEVSYNC-001 ST-REC-001
EV-REC-001 EV-UNREC-001 EV-TIME-001 EV-DEV-001 EV-LEAK-001
RG-SEED-001 RG-STATE-001 RG-INDEP-001 RG-FORK-001 RG-ALL-001 RG-OFFSET-001
MM-STAT-001 MM-STAT-002 MM-PIN-001 MM-COPY-001 MM-OOM-001 MM-ZERO-001
TP-RT-001 TP-D2D-001 TP-VIEW-001 TP-GEN-001 TP-ITEM-001
SR-RT-001 SR-MAP-001 MT-STRESS-001 MT-FORK-001 AC-DTYPE-001 DI-IFACE-001 DI-COMPILE-001 ER-MSG-001
""".split()


def test_registry_holds_every_seed_contract():
    registry = registry_mod.load(registry_mod.default_path())
    missing = [c for c in SEED if c not in registry.contracts or registry.contracts[c].retired]
    assert not missing, f"seed contracts missing from the registry: {missing}"


def test_every_contract_has_a_test_and_no_test_names_an_unknown_one(tmp_path):
    # Collecting the whole suite validates every declaration (unknown IDs
    # fail collection); the report lists contracts no test declares.
    run = run_pytest(["--backend=openreg", "--pyargs", "privateuse1_conformance.conformance",
                      "--collect-only"], tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.report is not None, "a collect-only run must still write its report"
    assert run.report["summary"]["uncovered"] == [], run.report["summary"]["uncovered"]


def test_contracts_page_is_generated_from_the_registry():
    registry = registry_mod.load(registry_mod.default_path())
    page = (REPO / "docs" / "contracts.md").read_text()
    assert page == cli.render_markdown(registry), (
        "docs/contracts.md is stale: regenerate it with "
        "`privateuse1-conformance contracts --format markdown > docs/contracts.md`")


def test_every_clause_has_a_check_and_a_mutant_or_a_waiver():
    """Statement coverage (docs/contracts.md): every clause of every active
    contract is decided by a check of the suite and proved failable by a
    mutant, unless the registry waives it with a reason; no check or mutant
    names a clause the registry does not have."""
    from privateuse1_conformance.harness import coverage
    from privateuse1_conformance.harness import mutants as mutants_mod

    registry = registry_mod.load(registry_mod.default_path())
    mutants = mutants_mod.load(mutants_mod.default_path(), registry)
    cover = coverage.coverage(registry, REPO / "conformance", {m.id: list(m.clauses) for m in mutants.mutants.values()})
    assert not cover.no_clauses, f"contracts whose statement is not split into clauses: {cover.no_clauses}"
    assert not cover.unknown, f"clauses named in the suite or the mutant registry but not in the registry: {cover.unknown}"
    gaps = [f"{g.clause} ({', '.join(g.gaps)}): {g.text}" for g in cover.gaps()]
    assert not gaps, "clauses without a check or a mutant, and no waiver:\n  " + "\n  ".join(gaps)
    for contract in registry.active():
        assert contract.decided_by and contract.other_choices, \
            f"{contract.id} does not say what decides it and why other legitimate choices pass"


def test_clause_mentions_are_attributed_to_their_functions(tmp_path):
    from privateuse1_conformance.harness import coverage

    (tmp_path / "cxx").mkdir()
    (tmp_path / "test_x.py").write_text(
        '"""Module docstring naming DM-XCHG-001.1 as an example."""\n'
        "# decides DM-SET-001.1\n@mark\ndef test_a():\n    check('DM-SET-001.2', True, '')\n"
        "    def nested():\n        scope('DM-SET-001.3')\n\n"
        "def helper():\n    scope('DM-GET-001.1')\n\n"
        "def unused():\n    scope('DM-GET-001.2')\n\n"
        "TABLE = {'x': ('DM-CTX-001.1', lambda: helper())}\n\n"
        "def test_b():\n    TABLE['x'][1]()\n")
    (tmp_path / "cxx" / "c.cpp").write_text("TEST_F(GD_DEV_001, Case) {\n  // decides GD-DEV-001.1\n}\n")
    found = coverage.checks_by_clause(tmp_path)
    assert found == {"DM-SET-001.1": ["test_x.py::test_a"], "DM-SET-001.2": ["test_x.py::test_a"],
                     "DM-SET-001.3": ["test_x.py::test_a"],
                     "DM-GET-001.1": ["test_x.py::test_b"],    # the helper's mention: the test reaching it
                     "DM-GET-001.2": ["test_x.py::unused"],    # no test reaches it: the helper itself
                     "DM-CTX-001.1": ["test_x.py::test_b"],
                     "GD-DEV-001.1": ["c.cpp::GD_DEV_001.Case"]}


def test_cli_version_help_and_unknown_area(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith("privateuse1-conformance ")
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    help_text = capsys.readouterr().out
    for option in ("--level", "--manifest", "--expectations"):
        described = help_text.split(option, 2)[-1].split("\n  -", 1)[0]
        assert len(described.split()) > 3, f"run --help has no text for {option}"
    assert cli.main(["contracts", "--area", "no-such-area"]) == 2
    assert "unknown area 'no-such-area'" in capsys.readouterr().err
    assert cli.main(["contracts", "--area", "bad-input"]) == 0
    assert "ER-MSG-001" in capsys.readouterr().out


def test_level_requirements_name_optional_features(tmp_path):
    """full needs at least one of AMP and torch.compile claimed; a
    requirement naming a mandatory or unknown feature is refused."""
    registry = registry_mod.load(registry_mod.default_path())
    assert registry.level_requirements == {"full": ["amp", "compile"]}
    text = registry_mod.default_path().read_text()
    for bad in ('full = ["fork"]', 'full = ["no-such-feature"]', 'huge = ["amp"]'):
        broken = tmp_path / "contracts.toml"
        broken.write_text(text.replace('full = ["amp", "compile"]', bad, 1))
        with pytest.raises(registry_mod.RegistryError, match="level_requirements"):
            registry_mod.load(broken)


def test_known_fixes_point_into_the_vendor_guide_and_are_checked(tmp_path):
    """Every known fix names a section of docs/vendor-guide.md that exists
    and a clause of its own contract; a malformed one is refused."""
    import re

    registry = registry_mod.load(registry_mod.default_path())
    guide = (REPO / "docs" / "vendor-guide.md").read_text()
    sections = {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
                for title in re.findall(r"^#+ (.+)$", guide, re.MULTILINE)}
    fixes = [(c, f) for c in registry.active() for f in c.known_fixes]
    assert len(fixes) >= 8
    for contract, fix in fixes:
        page, _, section = fix.guide.partition("#")
        assert page == "vendor-guide.md" and section in sections, (contract.id, fix.guide)
        assert not fix.clause or fix.clause in contract.clause_ids()
    # A fix is offered only for the symptom it fixes: OP-INFO-001.4 (inputs in
    # other layouts) fails for results with other strides (the fallback's
    # strides fix), for a composite kernel that views its column-major input
    # (torch 2.14.1's group_norm: register the operator), and for other
    # kernels that raise on them (no known fix).
    layout = registry.get("OP-INFO-001")
    strides = layout.known_fix("OP-INFO-001.4", "float32: inputs laid out column-major, sample 0: result 0 of shape "
                                                "(3, 2) has strides (2, 1) on the device, (1, 3) on the CPU")
    view = layout.known_fix("OP-INFO-001.4", "bfloat16: inputs laid out column-major, sample 0: raised RuntimeError: "
                                             "view size is not compatible with input tensor's size and stride")
    assert strides is not None and "strides" in strides.fix
    assert view is not None and "native_group_norm" in view.fix
    assert layout.known_fix("OP-INFO-001.4", "float32: inputs laid out column-major, sample 0: raised "
                                             "RuntimeError: expected a contiguous tensor") is None
    text = registry_mod.default_path().read_text()
    original = 'clause = "OP-SDPA-002.1"'
    for bad, why in (('clause = "OP-SDPA-002.9"', "not one of this contract's"),
                     ('symptom = "(unclosed"', "not a regular expression")):
        broken = tmp_path / "contracts.toml"
        broken.write_text(text.replace(original, bad, 1))
        with pytest.raises(registry_mod.RegistryError, match=why):
            registry_mod.load(broken)


def test_the_suite_index_that_verify_requires_names_every_test_function():
    """verify requires every test function of the level from the kit's own
    sources (harness/coverage.py suite_tests): each is found with the
    contracts its decorators name."""
    from privateuse1_conformance.harness import coverage

    registry = registry_mod.load(registry_mod.default_path())
    tests = coverage.suite_tests(registry_mod.default_path().parent)
    assert tests["test_streams.py::test_synchronize_waits_for_the_work"] == ["ST-SYNC-001"]
    assert tests["test_opinfo.py::test_operator"] == ["OP-INFO-001", "OP-INFO-002", "OP-INFO-003", "OP-INFO-004"]
    assert tests["test_cxx_contracts.py::test_cxx"] == []   # (its contracts come from its parameters: core)
    unknown = {t: ids for t, ids in tests.items() if any(c not in registry.contracts for c in ids)}
    assert not unknown, unknown
    facts = cli.kit_facts(registry)
    assert facts.tests["test_cxx_contracts.py::test_cxx"] == "core"
    assert facts.tests["test_opinfo.py::test_operator"] == "standard"
    assert len(facts.tests) == len(tests)
