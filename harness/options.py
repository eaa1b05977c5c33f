"""The pytest plugin's command-line options, and how they share a session
with other suites.

The plugin is loaded into every pytest session of an environment where the
kit is installed (its ``pytest11`` entry point), so its options must not
take names another suite may want. Each option has a canonical name with
the ``--pu1-`` prefix (``--pu1-backend``, ``--pu1-level``, ...), always
registered, and a short alias (``--backend``, ``--level``, ...) registered
only when no other plugin or initial conftest of the session has claimed
that name: the aliases are added last, after the initial conftests (the
only ones that may add options) were loaded. Values are not validated here
(no ``choices``, no ``type``): a session of another suite that happens to be
given ``--level 8`` must not stop on the kit's idea of a level; a conformance
session checks them (``check``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (the CLI imports this module before pytest)
    import pytest

PREFIX = "--pu1-"
GROUP = "privateuse1-conformance"
DEFAULT_TIMEOUT = 60.0
ISOLATION_MODES = ("fork", "none")

# name -> addoption's keyword arguments (besides dest).
OPTIONS: dict[str, dict[str, Any]] = {
    "backend": dict(default=None, metavar="NAME",
                    help="backend under test: a registered profile name or an importable module"),
    "level": dict(default=None, metavar="LEVEL",
                  help="run contracts up to this level: core, standard or full (default: the manifest's claim, "
                       "else full)"),
    "manifest": dict(default=None, metavar="TOML", help="manifest TOML of the backend (overrides the profile's)"),
    "expectations": dict(default=None, metavar="TOML",
                         help="expectations TOML (known failures by contract ID; overrides the manifest's)"),
    "report-dir": dict(default=None, metavar="DIR", help="write the compliance report into this folder"),
    "contract": dict(action="append", default=[], metavar="ID[,ID...]",
                     help="run only the tests of these contracts (repeatable)"),
    "test-id": dict(action="append", default=[], metavar="TEST",
                    help="run only this test, named as the reports name it (e.g. "
                         "test_streams.py::test_name[param]; a module or a test without its parameters selects "
                         "all it holds; repeatable)"),
    "registry": dict(default=None, metavar="TOML",
                     help="contract registry TOML (default: the suite's own; for testing the kit itself)"),
    "isolation": dict(default="fork", metavar="MODE",
                      help="fork: run each test in a forked child (default); none: in-process (debugging only)"),
    "contract-timeout": dict(default=None, metavar="SECONDS",
                             help=f"seconds before a test counts as hung (default {DEFAULT_TIMEOUT:g})"),
    "operators": dict(default="default", metavar="SELECTION",
                      help="the operators area's OpInfo entries: default (the operators most models use), all, "
                           "none, or comma-separated names and fnmatch patterns (docs/operators.md)"),
    "shard": dict(default=None, metavar="K/N",
                  help="run only shard K of N of the selected tests (a deterministic split; combine the N "
                       "reports with `privateuse1-conformance merge`, docs/reports.md)"),
    "allow-untested-torch": dict(action="store_true", default=False,
                                 help="run although the installed torch is outside the range the kit supports"),
}


def dest(name: str) -> str:
    """The attribute of pytest's option namespace that holds option `name`."""
    return "pu1_" + name.replace("-", "_")


def value(config: pytest.Config, name: str) -> Any:
    """The value of option `name` (canonical or alias: they share it)."""
    return config.getoption(dest(name))


def add_canonical(parser: pytest.Parser) -> None:
    group = parser.getgroup(GROUP, "PrivateUse1 conformance (each option also as --NAME where no other "
                                   "plugin or conftest of the session has that name)")
    for name, attrs in OPTIONS.items():
        group.addoption(PREFIX + name, dest=dest(name), **attrs)


def add_aliases(parser: pytest.Parser) -> list[str]:
    """Register `--NAME` for each option whose short name is still free;
    return the names another plugin or conftest had already taken."""
    group = parser.getgroup(GROUP)
    taken = []
    for name, attrs in OPTIONS.items():
        if f"--{name}" in _claimed(parser):
            taken.append(name)
            continue
        try:
            group.addoption(f"--{name}", dest=dest(name), **{**attrs, "help": argparse.SUPPRESS})
        except (argparse.ArgumentError, ValueError):
            taken.append(name)
    return taken


def _claimed(parser: pytest.Parser) -> set[str]:
    """Every option string registered so far (pytest's own included)."""
    names = set(getattr(parser, "_opt2dest", {}))
    for group in [getattr(parser, "_anonymous", None), *getattr(parser, "_groups", [])]:
        for option in getattr(group, "options", []) if group is not None else []:
            names.update(option.names())
    return names


def early(args: Sequence[str], parser: pytest.Parser, invocation: Path) -> tuple[bool, list[str]]:
    """Before the initial conftests are loaded, when the command line is
    parsed only in part (the short aliases are not registered yet): whether
    this session is a conformance run, and its positional arguments (the
    paths or, with --pyargs, module names). `--pu1-backend` always is ours;
    `--backend` is, unless a plugin already registered it or one of the
    initial conftests about to be loaded (of the paths given, else of the
    working directory) may."""
    claimed = _claimed(parser)
    mine = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name, attrs in OPTIONS.items():
        names = [PREFIX + name] + ([f"--{name}"] if f"--{name}" not in claimed else [])
        mine.add_argument(*names, dest=dest(name), action=attrs.get("action", "store"))
    ours, rest = mine.parse_known_args([str(a) for a in args])
    try:
        positional = [str(a) for a in (parser.parse_known_args(rest).file_or_dir or [])]
    except Exception:  # noqa: BLE001 - pytest reports a bad command line itself, later
        positional = []
    if not ours.pu1_backend:
        return False, positional
    if not _given(args, PREFIX + "backend"):
        pyargs = any(str(a) == "--pyargs" for a in args)
        anchors = [invocation / a for a in positional if not pyargs] or [invocation]
        for anchor in anchors:
            if not anchor.is_dir():
                continue
            for conftest in (anchor / "conftest.py", *(d / "conftest.py" for d in anchor.glob("test*") if d.is_dir())):
                try:
                    if "--backend" in conftest.read_text(errors="replace"):
                        return False, positional  # (it may register its own --backend: see pytest_configure)
                except OSError:
                    continue
    return True, positional


def _given(args: Sequence[str], option: str) -> bool:
    return any(str(a) == option or str(a).startswith(option + "=") for a in args)


def check(config: pytest.Config) -> list[str]:
    """The conformance session's option values that are not valid, each as a
    message naming the option and what it takes."""
    from . import registry as registry_mod

    problems = []
    level = value(config, "level")
    if level is not None and level not in registry_mod.LEVELS:
        problems.append(f"--level: {level!r} is not a level; the levels are {', '.join(registry_mod.LEVELS)}")
    if value(config, "isolation") not in ISOLATION_MODES:
        problems.append(f"--isolation: {value(config, 'isolation')!r}; it takes {' or '.join(ISOLATION_MODES)}")
    if timeout(config) is None:
        problems.append(f"--contract-timeout: {value(config, 'contract-timeout')!r} is not a number of seconds "
                        "greater than 0")
    return problems


def timeout(config: pytest.Config) -> float | None:
    """--contract-timeout in seconds (None: not a positive number)."""
    given = value(config, "contract-timeout")
    if given is None:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(given)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 and seconds != float("inf") else None
