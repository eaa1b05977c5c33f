"""OpenReg's torch.backends entry point (openreg_autoload) and how the kit
keeps another backend's autoload out of a run.

Each case runs in a new interpreter that imports only torch, with
TORCH_DEVICE_BACKEND_AUTOLOAD set by the test (the test session itself runs
with it off: tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kit_support import FIXTURE_DIR, PLUGIN, REPO, SUITE

PROBE = """
import json, sys
import torch
name = torch._C._get_privateuse1_backend_name()
device = getattr(torch, name, None)
print(json.dumps({"claimed": name, "openreg": "openreg" in sys.modules,
                  "initialized": bool(device.is_initialized()) if name == "openreg" else None}))
"""


def fresh(code: str, *, autoload: str | None = "1", path: str = "", **env: str) -> subprocess.CompletedProcess:
    child_env = {k: v for k, v in os.environ.items()
                 if k not in ("TORCH_DEVICE_BACKEND_AUTOLOAD", "OPENREG_AUTOLOAD", "OPENREG_MUTANT")}
    if autoload is not None:
        child_env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = autoload
    if path:
        child_env["PYTHONPATH"] = path
    child_env.update(env)
    return subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True, text=True,
                          timeout=120, cwd="/")


def probe(**kwargs) -> dict:
    result = fresh(PROBE, **kwargs)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_import_torch_loads_openreg_without_initializing_it():
    # (autoload unset: PyTorch's default is on)
    assert probe(autoload=None) == {"claimed": "openreg", "openreg": True, "initialized": False}


@pytest.mark.parametrize("switch", [{"autoload": "0"}, {"autoload": "false"}, {"OPENREG_AUTOLOAD": "0"}],
                         ids=["TORCH_DEVICE_BACKEND_AUTOLOAD=0", "TORCH_DEVICE_BACKEND_AUTOLOAD=false",
                              "OPENREG_AUTOLOAD=0"])
def test_switches_turn_it_off(switch):
    assert probe(**switch) == {"claimed": "privateuseone", "openreg": False, "initialized": None}


def test_an_invalid_switch_is_an_error_naming_it():
    result = fresh("import torch", OPENREG_AUTOLOAD="yes")
    assert result.returncode != 0
    assert "OPENREG_AUTOLOAD='yes' is not valid" in result.stderr
    assert "use 1" in result.stderr and "or 0" in result.stderr


def test_it_yields_when_privateuse1_is_already_claimed():
    code = """
import sys, torch
torch.utils.rename_privateuse1_backend("otherdev")
import openreg_autoload
openreg_autoload.load()
print(torch._C._get_privateuse1_backend_name(), "openreg" in sys.modules)
"""
    result = fresh(code, autoload="0", OPENREG_AUTOLOAD="1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["otherdev", "False"]


@pytest.fixture
def other_backend(tmp_path):
    """A second installed backend that declares a torch.backends entry point
    (a dist-info folder and its module on PYTHONPATH)."""
    (tmp_path / "otherdev_backend.py").write_text(
        "import torch\n\ndef load():\n    torch.utils.rename_privateuse1_backend('otherdev')\n")
    info = tmp_path / "otherdev_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: otherdev-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\notherdev = otherdev_backend:load\n")
    return str(tmp_path)


def test_it_yields_to_another_backend_that_declares_autoload(other_backend):
    assert probe(path=other_backend) == {"claimed": "otherdev", "openreg": False, "initialized": None}


def _kit_run(folder, autoload: str | None) -> subprocess.CompletedProcess:
    """pytest --backend=pu1_sync on one contract, with TORCH_DEVICE_BACKEND_AUTOLOAD
    unset (None) or set."""
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    if autoload is not None:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = autoload
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FIXTURE_DIR), env.get("PYTHONPATH", "")) if p)
    manifest = REPO / "tests" / "fixtures" / "pu1_sync" / "manifest.toml"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-q",
                           "--backend=pu1_sync", f"--manifest={manifest}", "--contract=DM-NAME-001",
                           f"--report-dir={folder / 'report'}", "--pyargs", SUITE],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(not (FIXTURE_DIR / "pu1_sync").is_dir(), reason="fixture backends not built (make build)")
def test_the_kit_runs_another_backend_with_autoload_off(tmp_path):
    """OpenReg autoloads in this environment: the run still tests pu1_sync
    (the plugin turns autoload off when the environment does not set it), and
    with autoload forced on the run stops with an error that says which entry
    point claimed PrivateUse1 and how to turn it off."""
    run = _kit_run(tmp_path / "unset", None)
    report = tmp_path / "unset" / "report" / "report.json"
    assert run.returncode == 0 and report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    verdicts = {c["id"]: c["verdict"] for c in json.loads(report.read_text())["contracts"]}
    assert verdicts["DM-NAME-001"] == "pass"
    forced = _kit_run(tmp_path / "on", "1")
    text = forced.stdout + forced.stderr
    assert forced.returncode != 0 and not (tmp_path / "on" / "report" / "report.json").exists(), text[-3000:]
    assert "already claimed by 'openreg'" in text, text[-3000:]
    assert "openreg = openreg_autoload:load" in text and "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in text, text[-3000:]


def test_openreg_refuses_a_torch_it_was_not_built_against():
    """C++ compiled against one torch release must not run inside another:
    `import openreg` fails, saying which torch it was built against and how
    to rebuild."""
    import torch

    result = fresh("import torch\ntorch.__version__ = '2.99.1+cu999'\nimport openreg", autoload="0")
    built = torch.__version__.split("+")[0]
    assert result.returncode != 0
    assert (f"OpenReg was built against torch {built}, this is torch 2.99.1+cu999: rebuild it in this "
            "environment with `pip install --no-build-isolation ./reference_backend`") in result.stderr
    ok = fresh("import torch, openreg\nprint(openreg._C._built_with_torch)", autoload="0")
    assert ok.returncode == 0 and ok.stdout.split() == [built], ok.stderr[-2000:]
