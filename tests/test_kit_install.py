"""The kit as a vendor installs it: alone, into a fresh environment that has
only torch, with one `pip install`, then run from an unrelated folder against
a backend that is not part of the kit, by the CI recipe (the CLI) and by
`pytest --backend` (tests/kit_install.sh does the steps and times them;
docs/vendor-guide.md quotes the times; test_ci_recipe.py and
test_kit_fairness.py judge the same runs as a CI job and by their verdicts).

Needs what a vendor's machine needs: pip able to fetch torch==2.13.0 and the
kit's dependencies (the same sources `make build` installs from), a C++
compiler and GoogleTest for the probe's first use.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from kit_support import FIXTURE_DIR, installed_kit


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if not (FIXTURE_DIR / "pu1_sync").is_dir():
        pytest.fail(f"the fixture backend pu1_sync is not built in {FIXTURE_DIR}: run make build")
    kit = installed_kit(tmp_path_factory)
    return kit.work, kit


def test_the_script_succeeds(installed):
    work, kit = installed
    assert kit.ci.returncode == 0, f"{kit.ci.stdout[-6000:]}\n{kit.ci.stderr[-6000:]}"
    times = dict(line.split("\t") for line in (work / "times.tsv").read_text().splitlines())
    assert set(times) == {"venv", "torch", "kit", "ci-recipe", "pytest-run"}
    print("install and run times (s):", times)


def test_the_first_run_says_it_compiles_the_probe_and_what_it_took(installed):
    """The kit's first use compiles its C++ probe (minutes on two cores):
    the run says so on the terminal before it starts, and how long it took."""
    work, kit = installed
    output = kit.ci.stdout
    assert "compiling the kit's C++ probe against torch 2.13" in output, output[-6000:]
    took = re.search(r"compiled the C\+\+ probe in (\d+) s", output)
    assert took, output[-6000:]
    print("probe compile (s):", took.group(1))


def test_the_kit_alone_was_installed(installed):
    work, kit = installed
    assert kit.ci.returncode == 0, kit.ci.stderr[-4000:]
    python = work / "venv" / "bin" / "python"
    listing = subprocess.run([str(python), "-m", "pip", "list", "--format=json"],
                             capture_output=True, text=True, check=True).stdout
    names = {p["name"].lower() for p in json.loads(listing)}
    assert "privateuse1-conformance" in names
    assert "openreg" not in names, "installing the kit must not install OpenReg"
    assert not any(n.startswith("scikit-build") or n == "cmake" for n in names), names
    # Nothing of OpenReg in the kit's files either.
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert not (Path(site) / "openreg").exists()


@pytest.mark.parametrize("how", ["ci", "serial"])
def test_the_suite_ran_from_an_unrelated_folder(installed, how):
    work, kit = installed
    run = getattr(kit, how)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.report is not None, run.stdout[-4000:]
    summary, provenance = run.report["summary"], run.report["provenance"]
    # The backend is called by its manifest's name, and the suite ran and
    # passed: all of it by the CI recipe (the CLI), its core level by pytest.
    assert provenance["backend_name"] == "pu1_sync"
    assert run.report["complete"]
    assert summary["claimed_level"] == "full"
    assert summary["level_reached"] == ("full" if how == "ci" else "core"), summary["verdicts"]
    # The probe was compiled into the fresh cache (first use), not found elsewhere.
    assert list((work / "probe-cache").glob("torch-*/_cxx*.so"))


def test_the_verdicts_do_not_depend_on_the_number_of_workers(installed):
    """The CLI ran the whole suite with its default (one worker per core),
    pytest its core level with one: every test and contract both ran has the
    same verdict on the independent backend."""
    work, kit = installed
    assert kit.ci.returncode == 0, kit.ci.stderr[-4000:]
    reports = {"cli": kit.ci.report, "pytest": kit.serial.report}
    assert reports["cli"]["provenance"]["workers"] == len(os.sched_getaffinity(0))
    assert reports["pytest"]["provenance"]["workers"] == 1

    def verdicts(report: dict) -> dict[str, str]:
        tests = {t["nodeid"]: t["verdict"] for c in report["contracts"] for t in c["tests"]}
        return {**tests, **{c["id"]: c["verdict"] for c in report["contracts"]}}

    parallel, serial = verdicts(reports["cli"]), verdicts(reports["pytest"])
    assert len(serial) > 100
    differ = {k: (v, parallel.get(k)) for k, v in serial.items() if parallel.get(k) != v}
    assert not differ, f"verdicts that differ between 1 worker and {reports['cli']['provenance']['workers']}: {differ}"
