"""Splitting a run into shards (--shard K/N) and merging their reports.

A scratch suite of nine tests (a failure, a failure whose expectation passes
in another test, a root cause shared by tests that land in different shards)
runs whole and as three shards; the merged report must say what the whole
run says, and `merge` and `verify` must refuse every way of passing off a
partial or altered set of shards as a run. The last test does it for real:
the whole suite against OpenReg in two shards, merged, verifies at full.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from kit_support import DECIDE_ALL, FIXTURE_DIR, run_pytest, verify_problems
from privateuse1_conformance.harness import shard as shard_mod
from privateuse1_conformance.reports import json_report
from privateuse1_conformance.reports import merge as merge_mod

SCRATCH = '''
import pytest

@pytest.mark.contract("DM-NAME-001")
def test_a_pass():
    pass

@pytest.mark.contract("DM-MOD-001")
def test_b_mod_fails():
    assert False, "the module is wrong"

@pytest.mark.contract("DM-MOD-001")
def test_c_mod_passes():
    pass

@pytest.mark.contract("DM-SET-002")
def test_d_stale():
    pass

@pytest.mark.contract("DM-ACC-001")
def test_e_cause():
    raise RuntimeError("no kernel for the op")

@pytest.mark.contract("DM-COUNT-001")
def test_f_cause():
    raise RuntimeError("no kernel for the op")

@pytest.mark.contract("DM-COUNT-002")
@pytest.mark.parametrize("n", range(3))
def test_g_param(n):
    pass
'''

# DM-MOD-001's entry decides a failing test (shard 2) and a passing one
# (shard 3): stale in shard 3 alone, so not stale in the run.
EXPECTATIONS = '''
[[expect]]
contract = "DM-MOD-001"
reason = "known wrong module"

[[expect]]
contract = "DM-SET-002"
reason = "believed broken"
'''
SHARDS = 3
TESTS = 9


def cli(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(FIXTURE_DIR), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run([sys.executable, "-m", "privateuse1_conformance.harness.cli", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ids_of(document: dict) -> list[str]:
    return list(dict.fromkeys(t["nodeid"] for c in document["contracts"] for t in c["tests"]))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The whole run's report, and the three shards' reports (by index)."""
    folder = tmp_path_factory.mktemp("shards")
    suite = folder / "suite"
    suite.mkdir()
    (suite / "test_scratch.py").write_text(SCRATCH)
    (suite / "expect.toml").write_text(EXPECTATIONS)

    def run(name: str, *extra: str):
        cwd = folder / name
        cwd.mkdir()
        return run_pytest(["--backend=openreg", f"--expectations={suite / 'expect.toml'}",
                           str(suite / "test_scratch.py"), *extra], cwd)

    whole = run("whole")
    assert whole.returncode == 1 and whole.report["complete"], whole.stdout[-3000:]
    shards = {}
    for index in range(1, SHARDS + 1):
        result = run(f"shard{index}", f"--shard={index}/{SHARDS}")
        assert result.returncode in (0, 1) and result.report["complete"], result.stdout[-3000:]
        assert f"Shard {index}/{SHARDS}: 3 of the run's {TESTS} tests" in result.stdout
        shards[index] = result.report
    return whole.report, shards, folder


def merged(shards: dict[int, dict], order=None) -> dict:
    order = order or sorted(shards)
    return json_report.to_document(merge_mod.merge([(f"shard{i}.json", shards[i]) for i in order]))


def test_the_shards_split_the_selection_evenly_and_completely(scratch):
    whole, shards, _ = scratch
    parts = [set(ids_of(shards[i])) for i in sorted(shards)]
    assert sorted(len(p) for p in parts) == [3, 3, 3]
    assert set.union(*parts) == set(ids_of(whole)) and sum(map(len, parts)) == TESTS
    records = [shards[i]["provenance"]["shard"] for i in sorted(shards)]
    assert [(r["index"], r["count"], r["selected"]) for r in records] == [(1, 3, 9), (2, 3, 9), (3, 3, 9)]
    assert len({r["selection_sha256"] for r in records}) == 1
    assert whole["provenance"]["shard"] is None and whole["provenance"]["shards"] == []
    # The split is the documented rule: the sorted IDs, dealt round-robin.
    ordered = sorted(ids_of(whole))
    for index in shards:
        assert set(ids_of(shards[index])) == set(ordered[index - 1::SHARDS])


def test_the_merged_report_says_what_the_whole_run_says(scratch):
    whole, shards, _ = scratch
    document = merged(shards, order=[3, 1, 2])  # any order
    assert json_report.schema_problems(document) == []
    assert json_report.digest_problem(document) is None
    assert document["complete"] is True

    def verdicts(d):
        return {c["id"]: (c["verdict"], c["satisfied"], sorted((t["nodeid"], t["verdict"]) for t in c["tests"]))
                for c in d["contracts"]}

    assert verdicts(document) == verdicts(whole)
    assert document["summary"] == whole["summary"]
    # The expectation that passed in one shard and failed in another is not stale.
    assert document["summary"]["stale_expectations"] == ["DM-SET-002"]
    # The cause shared by tests of two shards is one root cause.
    assert [(g["cause"], len(g["tests"])) for g in document["summary"]["root_causes"]] == [
        ("RuntimeError: no kernel for the op", 2)]
    # The provenance: every shard's record, and the whole run's command.
    provenance = document["provenance"]
    assert provenance["shard"] is None
    assert [(r["index"], r["tests"], r["digest"]) for r in provenance["shards"]] == [
        (i, 3, shards[i]["digest"]["value"]) for i in (1, 2, 3)]
    assert not any(a.startswith("--shard") for a in provenance["command_line"])
    assert all(a.startswith("--shard") for r in provenance["shards"] for a in r["command_line"][-1:])


def test_merge_through_the_command_line_writes_every_format(scratch, tmp_path):
    _, shards, folder = scratch
    paths = [str(folder / f"shard{i}" / "report" / "report.json") for i in (2, 3, 1)]
    result = cli("merge", *paths, "--report-dir", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "merged 3 shards (9 tests)" in result.stdout
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        "report.json", "report.junit.xml", "report.md", "report.html", "badge.svg"}
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "Merged from 3 shards (9 tests)" in markdown and "shard 2/3" in markdown
    # A shard's own renderings say it is a shard.
    shard_markdown = (folder / "shard1" / "report" / "report.md").read_text()
    assert "(shard 1/3)" in shard_markdown and "**Shard 1 of 3**" in shard_markdown
    # verify: no problem of the merge itself (the scratch suite is no whole run and satisfies no level).
    verify = cli("verify", str(tmp_path / "out" / "report.json"), "--level", "core", cwd=tmp_path)
    assert verify.returncode == 1
    assert not [line for line in verify.stdout.splitlines() if "the run was narrowed" not in line
                and any(word in line for word in ("shard", "digest", "inconsistent", "incomplete", "provenance:"))]


def refused(named: list[tuple[str, dict]]) -> str:
    with pytest.raises(merge_mod.MergeError) as caught:
        merge_mod.merge(named)
    return "\n".join(caught.value.problems)


def test_merge_refuses_anything_but_every_untouched_shard_of_one_run(scratch):
    whole, shards, _ = scratch
    one, two, three = (("s1", shards[1]), ("s2", shards[2]), ("s3", shards[3]))
    assert "missing shard(s) 3/3" in refused([one, two])
    assert "given more than once: 2/3" in refused([one, two, two, three])
    assert "not a shard's report" in refused([one, two, three, ("whole", whole)])

    edited = copy.deepcopy(shards[2])
    next(c for c in edited["contracts"] if c["tests"])["tests"].pop()
    assert "digest mismatch" in refused([one, ("edited", edited), three])

    # The edit made consistent (verdicts and summary recomputed) and sealed
    # again: the tests are not the part of the run the shard's index says.
    resealed = json_report.seal(json_report.to_document(json_report.from_document(edited)))
    assert "not the part of the run its index says" in refused([one, ("resealed", resealed), three])

    # A verdict edited and sealed again, its tests untouched: the digest
    # holds, but the shard no longer says what its tests say. Merging it
    # would launder it into a consistent merged report.
    laundered = copy.deepcopy(shards[2])
    contract = next(c for c in laundered["contracts"] if c["tests"])
    contract["verdict"] = "fail" if contract["verdict"] == "pass" else "pass"
    problems = refused([one, ("laundered", json_report.seal(laundered)), three])
    assert "laundered: inconsistent" in problems and "/verdict: recorded" in problems, problems

    incomplete = copy.deepcopy(shards[3])
    incomplete["complete"] = False
    assert "incomplete" in refused([one, two, ("incomplete", json_report.seal(incomplete))])

    other_torch = copy.deepcopy(shards[3])
    other_torch["provenance"]["torch_version"] = "2.99.0"
    assert "provenance torch_version is '2.99.0'" in refused([one, two, ("other", json_report.seal(other_torch))])

    other_split = copy.deepcopy(shards[3])
    other_split["provenance"]["shard"]["count"] = 4
    assert "shard count 4" in refused([one, two, ("other", json_report.seal(other_split))])

    moved = copy.deepcopy(shards[3])  # a copy installed elsewhere: same files, other paths
    moved["provenance"]["registry"]["path"] = "/elsewhere/contracts.toml"
    moved["provenance"]["backend_file"] = "/elsewhere/openreg/__init__.py"
    merge_mod.merge([one, two, ("moved", json_report.seal(moved))])


def test_verify_refuses_a_shard_and_a_merged_report_that_lost_a_shard(scratch):
    from privateuse1_conformance.reports import verify as verify_mod

    _, shards, _ = scratch
    problems = verify_mod.verify(shards[1], [], set(), "core").problems
    assert any("shard 1 of 3 is part of a run" in p for p in problems)

    document = merged(shards)
    assert verify_mod._shard_problems(document) == []
    lost = copy.deepcopy(document)
    lost["provenance"]["shards"].pop()
    problems = verify_mod._shard_problems(json_report.seal(lost))
    assert any("expected shards 1..3 of 3 once each" in p and "lists 1/3, 2/3" in p for p in problems), problems
    fewer = copy.deepcopy(document)  # a test removed, re-sealed
    for contract in fewer["contracts"]:
        contract["tests"] = [t for t in contract["tests"] if not t["nodeid"].endswith("test_a_pass")]
    problems = verify_mod._shard_problems(json_report.seal(fewer))
    assert any("not the 9 tests the shards' run selected" in p for p in problems), problems


def test_a_shard_the_split_leaves_empty_is_complete_and_merges(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_two.py").write_text(
        'import pytest\n\n@pytest.mark.contract("DM-NAME-001")\n@pytest.mark.parametrize("n", [0, 1])\n'
        'def test_p(n):\n    decide_all("DM-NAME-001")\n' + DECIDE_ALL)
    reports = []
    for index in (1, 2, 3):
        cwd = tmp_path / f"s{index}"
        cwd.mkdir()
        run = run_pytest(["--backend=openreg", str(suite / "test_two.py"), f"--shard={index}/3"], cwd)
        assert run.returncode == 0, run.stdout[-2000:]
        assert run.report["complete"] and len(ids_of(run.report)) == (0 if index == 3 else 1)
        reports.append((f"s{index}", run.report))
    document = json_report.to_document(merge_mod.merge(reports))
    assert len(ids_of(document)) == 2 and document["summary"]["verdicts"]["pass"] == 1


def test_shards_with_parallel_workers(scratch):
    """-j 2 (pytest-xdist): the workers keep the same shard and the
    controller records the whole run's selection."""
    _, shards, folder = scratch
    cwd = folder / "parallel"  # beside the other runs: a scratch test's ID is relative to the rootdir
    cwd.mkdir()
    run = run_pytest(["--backend=openreg", f"--expectations={folder / 'suite' / 'expect.toml'}",
                      str(folder / "suite" / "test_scratch.py"), "--shard=2/3", "-n", "2"], cwd)
    assert run.report["complete"], run.stdout[-3000:]
    assert set(ids_of(run.report)) == set(ids_of(shards[2]))
    assert run.report["provenance"]["shard"] == shards[2]["provenance"]["shard"]


@pytest.mark.parametrize("text", ["0/3", "4/3", "3", "a/b", "1/0", "", "2/3/4", "-1/3"])
def test_a_bad_shard_is_a_usage_error_naming_the_form(text):
    with pytest.raises(ValueError, match=r"--shard: expected K/N with whole numbers 1 <= K <= N"):
        shard_mod.parse(text)


def test_a_bad_shard_on_the_command_line_is_refused_before_anything_runs(tmp_path):
    result = cli("run", "--backend", "openreg", "--shard", "4/3", cwd=tmp_path)
    assert result.returncode == 2
    assert "--shard: expected K/N with whole numbers 1 <= K <= N (e.g. 2/4), got '4/3'" in result.stderr


@given(st.lists(st.text(min_size=1, max_size=12), max_size=60), st.integers(1, 8))
def test_the_parts_partition_the_tests_and_differ_by_at_most_one(ids, count):
    parts = [shard_mod.part(ids, shard_mod.Shard(index, count)) for index in range(1, count + 1)]
    assert set().union(*parts) == set(ids)
    assert sum(map(len, parts)) == len(set(ids))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    # Deterministic whatever the order the tests were collected in.
    assert parts == [shard_mod.part(list(reversed(ids)), shard_mod.Shard(i, count)) for i in range(1, count + 1)]


def test_the_suite_against_openreg_in_two_shards_merges_into_a_report_that_verifies(tmp_path):
    """The CI recipe (docs/reports.md): every contract and two operators,
    split over two jobs, merged, verified for the level OpenReg claims: the
    merged report is consistent and complete but for the operators
    selection, which narrows the run (two operators, not the default set)."""
    for index in (1, 2):
        run = cli("run", "--backend", "openreg", "--operators", "gather,nn.functional.relu", "--shard", f"{index}/2",
                  "--report-dir", f"shard{index}", cwd=tmp_path, timeout=1800)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    merge = cli("merge", "shard1/report.json", "shard2/report.json", "--report-dir", "merged", cwd=tmp_path)
    assert merge.returncode == 0, merge.stderr
    verify = cli("verify", "merged/report.json", cwd=tmp_path)
    assert verify_problems(verify.stdout) == [
        "the run was narrowed (--operators gather,nn.functional.relu): a run of part of the suite certifies "
        "nothing; run the whole suite"], verify.stdout
    document = json.loads((tmp_path / "merged" / "report.json").read_text())
    assert sorted(o["name"] for o in document["operators"]) == ["gather", "nn.functional.relu"]
    assert [r["index"] for r in document["provenance"]["shards"]] == [1, 2]
