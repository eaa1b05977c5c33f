"""The documentation site (mkdocs.yml, docs/): it builds with `mkdocs build
--strict`, and that build really fails on a broken link, so a page that links
to a missing page or heading, or to a file outside docs/, cannot be merged.

mkdocs is a test dependency of the project: a missing mkdocs fails these
tests, it does not skip them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # a dependency of mkdocs

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "mkdocs.yml"


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True, text=True, timeout=120)


def output(proc: subprocess.CompletedProcess) -> str:
    return f"exit status {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


@pytest.fixture
def site_copy(tmp_path) -> tuple[Path, dict]:
    """A copy of docs/ and mkdocs.yml in tmp_path, and the parsed config
    (write it back with `save`)."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    config = yaml.safe_load(CONFIG.read_text())
    return tmp_path, config


def save(root: Path, config: dict) -> Path:
    path = root / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    proc = build(CONFIG, site)
    assert proc.returncode == 0, output(proc)
    assert (site / "index.html").is_file(), output(proc)
    # Every page of docs/ became a page of the site.
    for page in (ROOT / "docs").rglob("*.md"):
        relative = page.relative_to(ROOT / "docs")
        html = relative.with_name("index.html") if relative.name == "README.md" else relative.with_suffix(".html")
        assert (site / html).is_file(), f"{relative} was not built as {html}\n{output(proc)}"


def test_strict_build_fails_on_broken_links(site_copy):
    root, config = site_copy
    (root / "docs" / "broken-links.md").write_text(
        "# Broken links\n\n"
        "A [missing page](no-such-page.md), a [missing heading](vendor-guide.md#no-such-heading), "
        "a [missing local heading](#nowhere) and a [file outside docs](../pyproject.toml).\n")
    config["nav"].append({"Broken links": "broken-links.md"})
    proc = build(save(root, config), root / "site")
    assert proc.returncode != 0, output(proc)
    text = proc.stdout + proc.stderr
    for target in ("no-such-page.md", "no-such-heading", "#nowhere", "../pyproject.toml"):
        assert target in text, f"the build did not name the broken link {target!r}\n{output(proc)}"


def test_strict_build_fails_on_a_page_missing_from_the_nav(site_copy):
    root, config = site_copy
    (root / "docs" / "orphan.md").write_text("# Orphan\n\nIn no nav.\n")
    proc = build(save(root, config), root / "site")
    assert proc.returncode != 0, output(proc)
    assert "orphan.md" in proc.stdout + proc.stderr, output(proc)


def test_files_that_are_not_pages_do_not_break_the_build(site_copy):
    """Examples kept next to the pages (CI configurations, scripts, data) are
    copied into the site as they are."""
    root, config = site_copy
    extra = {
        "ci/workflow.yml": "on: [push]\njobs: {}\n",
        "ci/run.sh": "#!/bin/sh\nexit 0\n",
        "ci/result.json": '{"ok": true}\n',
        "ci/manifest.toml": "[backend]\nname = 'x'\n",
    }
    for name, text in extra.items():
        (root / "docs" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "docs" / name).write_text(text)
    proc = build(save(root, config), root / "site")
    assert proc.returncode == 0, output(proc)
    for name, text in extra.items():
        assert (root / "site" / name).read_text() == text, output(proc)
