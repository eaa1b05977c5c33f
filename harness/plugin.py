"""The pytest plugin that turns the conformance suite into a conformance run.

pytest loads it from the kit's ``pytest11`` entry point (named
``privateuse1_conformance``; ``-p no:privateuse1_conformance`` turns it off)
wherever the kit is installed. It stays inert unless ``--backend`` is given,
so it never disturbs other test runs. ``pytest --backend=NAME`` with no path
runs the installed suite, from any folder.

What it does for a run:

* turns PyTorch's backend autoload off for the run unless the environment
  sets TORCH_DEVICE_BACKEND_AUTOLOAD (the kit imports the backend under test
  itself: another installed backend's autoload must not claim PrivateUse1
  first; AL-LOAD-001 checks autoload in fresh interpreters with it on);
* resolves and imports the backend in the (warm) parent process, after
  checking in a throw-away process that importing it does not crash;
* requires every test to declare its contracts with
  ``@pytest.mark.contract("DM-SET-001", ...)`` and fails collection on an
  unknown or retired ID;
* deselects tests above ``--level``;
* runs each test in a child forked from the warm parent (see isolation.py),
  so crashes and hangs become verdicts instead of ending the run;
* assigns verdicts: pass, fail (assertion), error (other exception), crash,
  hang, not-claimed (feature declared absent), xfail / xpass (expectations
  file), skip;
* aggregates per contract, computes the level reached, prints a summary and
  hands the run to ``reports`` (``--report-dir``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shlex
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from . import backend as backend_mod
from . import bounded, evidence
from . import expectations as expectations_mod
from . import isolation, operators as operators_mod, options, registry as registry_mod, shard as shard_mod, versions
from . import turns as turns_mod
from . import paths as paths_mod
from .paths import portable
from privateuse1_conformance.reports.text import one_line

from .results import RunRecorder, cause_of

MARKER = "contract"
REQUIRES = "requires"
DEFAULT_TIMEOUT = options.DEFAULT_TIMEOUT
PREFLIGHT_TIMEOUT = 300.0


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_canonical(parser)  # (the short aliases: pytest_load_initial_conftests)


AUTOLOAD_SWITCH = "TORCH_DEVICE_BACKEND_AUTOLOAD"


# The kit's package folder (privateuse1_conformance/), and the suite in it.
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent
_PACKAGE_NAME = "privateuse1_conformance"
SUITE_FOLDER = _PACKAGE_ROOT / "conformance"


def _as_path(argument: str) -> str:
    """A --pyargs argument naming a module of the kit (the suite, a module of
    it), as the path it names; any other argument as it is."""
    name, separator, rest = argument.partition("::")
    if name != _PACKAGE_NAME and not name.startswith(_PACKAGE_NAME + "."):
        return argument
    base = _PACKAGE_ROOT.joinpath(*name.split(".")[1:])
    for candidate in (base, base.with_name(base.name + ".py")):
        if candidate.exists():
            return str(candidate) + separator + rest
    return argument


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]):
    """Before any conftest can import torch: no autoload for a run (see the
    module's docstring). Children and helper processes inherit the setting.

    And only the suite's conftests: pytest loads the initial conftests from
    the paths given, and, when there are none or they are module names
    (--pyargs, as the CLI runs the suite), from the working directory and
    its test* folders instead. The working directory is often a vendor's
    repository: its conftest.py would join the run (and could change its
    verdicts), and with it (pytest puts its folder first on sys.path) the
    backend's source tree would shadow the installed backend. The paths are
    decided again when the command line is parsed in full (pytest_configure
    names the suite when none is given).

    After the initial conftests are loaded (they are the last that may add
    options): the options' short aliases, where still free (options.py)."""
    namespace = early_config.known_args_namespace
    run, given = options.early(args, parser, early_config.invocation_params.dir)
    if run:
        os.environ.setdefault(AUTOLOAD_SWITCH, "0")
        pyargs = getattr(namespace, "pyargs", False)
        namespace.file_or_dir = ([_as_path(a) for a in given] if pyargs else given) or [str(SUITE_FOLDER)]
    try:
        return (yield)
    finally:
        options.add_aliases(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(*ids): the contract IDs (conformance/contracts.toml) a test checks; the first is "
        "the primary one, charged with any failure no check or scope names"
    )
    config.addinivalue_line(
        "markers", f"{REQUIRES}(*features): the test needs these features although its contracts do not; "
        "without them it is no evidence (inconclusive), never a failure"
    )
    config.addinivalue_line("markers", turns_mod.MARKER_HELP)
    if options.value(config, "backend"):
        problems = options.check(config)
        if problems:
            raise pytest.UsageError("\n".join(problems))
        if config.args_source != pytest.Config.ArgsSource.ARGS:
            # `pytest --backend=X` with no path: the installed suite, not the
            # tests the current folder (or its testpaths setting) names.
            config.args = [str(SUITE_FOLDER)]
        # Short tracebacks on the terminal (the reports keep them complete).
        if config.getoption("tbstyle", "auto") == "auto":
            config.option.tbstyle = "short"
        config.pluginmanager.register(ConformanceSession(config), "privateuse1-conformance-session")


def _preflight_import(module_name: str) -> None:
    """Import the backend in a throw-away process first (a fork of this one,
    which has imported torch and nothing of the backend): a backend that
    crashes or hangs on import must give a clear message, not kill the run
    silently."""

    def question() -> dict:
        import torch

        claimed = torch._C._get_privateuse1_backend_name()
        if claimed != "privateuseone" and module_name not in sys.modules:
            return {"claimed": claimed}  # (another backend, e.g. autoloaded by import torch)
        importlib.import_module(module_name)
        return {}

    try:
        answer = bounded.ask(question, f"importing the backend module {module_name!r}", limit=PREFLIGHT_TIMEOUT)
    except bounded.BackendProbeError as e:
        hint = " (hang on import)" if "did not return within" in str(e) else ""
        details = f":\n{e.details[-4000:]}" if e.details else ""
        raise pytest.UsageError(f"{e}{hint}{details}{_shadowing(module_name)}") from None
    if answer.get("claimed"):
        raise pytest.UsageError(backend_mod.already_claimed(answer["claimed"], module_name))


def _shadowing(module_name: str) -> str:
    """A note when the working directory holds a folder or file of the
    backend's name and is on sys.path (`python -m pytest` puts it there):
    Python then imports the source tree, not the installed backend."""
    top = module_name.partition(".")[0]
    cwd = Path.cwd()
    on_path = any(Path(entry or ".").resolve() == cwd.resolve() for entry in sys.path)
    found = [p for p in (cwd / top, cwd / f"{top}.py") if p.exists()]
    if not (on_path and found):
        return ""
    return (f"\nnote: the working directory holds {found[0].name}{'/' if found[0].is_dir() else ''} and is on sys.path, "
            f"so Python imports that source tree as {top!r}, not the installed backend. Run from another folder, "
            "or with the `privateuse1-conformance` or `pytest` command rather than `python -m pytest` (which puts "
            "the working directory on sys.path).")


# The suite's longest tests (seconds to minutes each: an OpInfo entry's
# every dtype and check, a compile with Inductor), by module: a parallel run
# starts them first.
LONG_MODULES = ("test_opinfo.py", "test_inductor.py", "test_amp_compile.py", "test_autoload.py")


def _long(item: pytest.Item) -> bool:
    return item.path.name in LONG_MODULES and not _placeholder(item)


def _exclusive(item: pytest.Item) -> bool:
    """Whether `item` runs while no other test of a parallel run runs (harness/turns.py)."""
    return item.get_closest_marker(turns_mod.MARKER) is not None


def _warm_imports() -> bool:
    import torch._dynamo  # noqa: F401
    import torch._meta_registrations  # noqa: F401

    return True


def share_cores(workers: int | None) -> str | None:
    """In a parallel run, give each worker's tests their share of the cores
    for torch's intra-op threads (at least one): two workers that each run
    two threads on two cores only take turns on them, and every test runs
    slower beside a neighbour. Set as OMP_NUM_THREADS in the controller's
    environment, which the workers inherit and read when they import torch
    (torch.set_num_threads in a worker would create a thread pool that its
    forked tests cannot use: PyTorch aborts when their autograd threads set
    their own count). The backend sees it (torch.get_num_threads()); nothing
    is changed with one worker or when OMP_NUM_THREADS is already set.
    Returns the value set, or None."""
    if not isinstance(workers, int) or workers < 2 or os.environ.get(THREADS_ENV):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ[THREADS_ENV] = str(max(1, cores // workers))
    return os.environ[THREADS_ENV]


THREADS_ENV = "OMP_NUM_THREADS"


# The one parameter of the operators area's test when the run cannot select
# the area (ConformanceSession.operator_keys).
NOT_SELECTED = "(not selected)"


def _placeholder(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("opinfo_key") == NOT_SELECTED


def _empty_parameter_set(item: pytest.Item) -> bool:
    """pytest's stand-in item for a parametrization with no values."""
    marker = item.get_closest_marker("skip")
    return marker is not None and str(marker.kwargs.get("reason", "")).startswith("got empty parameter set")


class ConformanceSession:
    """State and hooks of one conformance run (registered only with --backend)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        registry_path = options.value(config, "registry") or registry_mod.default_path()
        try:
            self.registry = registry_mod.load(registry_path)
        except (OSError, registry_mod.RegistryError) as e:
            raise pytest.UsageError(f"cannot load the contract registry: {e}") from e
        import torch

        self.warnings: list[str] = []
        problem = versions.torch_problem(torch.__version__)
        if problem and not options.value(config, "allow-untested-torch"):
            raise pytest.UsageError(problem)
        if problem:
            self.warnings.append(f"torch {torch.__version__} is outside the kit's supported range "
                                 f"(torch{versions.SUPPORTED_TORCH}); run anyway, as --allow-untested-torch asked")
        # Contracts whose APIs this torch does not have yet: not run, not counted.
        self.left_out = self.registry.leave_out_for_torch(torch.__version__)
        for contract_id, reason in self.left_out.items():
            self.warnings.append(f"{contract_id} left out: {reason}")
        name = options.value(config, "backend")
        if not hasattr(config, "workerinput"):  # xdist workers: the controller checked
            profile = backend_mod.find_profile(name) or {}
            _preflight_import(profile.get("module", name))
        try:
            self.backend = backend_mod.load(name, options.value(config, "manifest"), self.registry)
        except backend_mod.BackendError as e:
            raise pytest.UsageError(str(e)) from e
        top = sys.modules.get(self.backend.module_name.partition(".")[0])
        package = getattr(top, "__file__", None) or ""
        if os.path.basename(package) == "__init__.py":  # (its files in the reports: harness/paths.py)
            paths_mod.add_package(os.path.dirname(os.path.abspath(package)), top.__name__)
        manifest = self.backend.manifest
        self.level = options.value(config, "level") or manifest.claims or "full"
        expectations_path = options.value(config, "expectations") or manifest.expectations
        try:
            self.expectations = (
                expectations_mod.load(expectations_path, self.registry) if expectations_path
                else expectations_mod.Expectations()
            )
        except expectations_mod.ExpectationsError as e:
            raise pytest.UsageError(str(e)) from e
        self.expectations_path = Path(expectations_path) if expectations_path else None
        self.only = {c.strip() for option in options.value(config, "contract") for c in option.split(",") if c.strip()}
        self.only_tests = [t.strip() for t in options.value(config, "test-id") if t.strip()]
        unknown = sorted(self.only - set(self.registry.contracts))
        if unknown:
            raise pytest.UsageError(f"--contract: unknown contract ID(s) {', '.join(unknown)}")
        self.sharding: shard_mod.Selector | None = None
        if options.value(config, "shard"):
            try:
                self.sharding = shard_mod.Selector(shard_mod.parse(options.value(config, "shard")), self.test_id)
            except ValueError as e:
                raise pytest.UsageError(str(e)) from e
            config.pluginmanager.register(self.sharding, "privateuse1-conformance-shard")
        self.timeout = options.timeout(config)
        self.isolation = options.value(config, "isolation")
        # Why no test can run (the backend did not answer the parent's
        # questions): every test then reports it, and the run ends at once.
        self.setup_problem: str | None = None
        self.device_count, self.parent_initialized = self._probe_backend()
        # Features the backend does not have: declared absent, implied by
        # the hardware (one device cannot show multi-device behaviour), or
        # not described (backend metadata needs the manifest's sample).
        self.unclaimed = set(manifest.unclaimed)
        if self.device_count < 2 and self.setup_problem is None:  # (unknown when the probe failed)
            self.unclaimed.add("multi-device")
        if not manifest.backend_metadata:  # (only a declared sample can be checked)
            self.unclaimed.add("backend-metadata")
        # Imports that the parent warms for the forked tests, tried first in
        # a probe process while the suite is collected (_warm).
        self._warming: bounded.Pending | None = None
        if self.setup_problem is None and not self._is_controller():
            self._warming = bounded.start(_warm_imports, "importing torch._dynamo (which runs the backend's "
                                          "import hooks)", limit=max(self.timeout, 30.0))
        # Parallel runs (pytest-xdist): the workers' turns (harness/turns.py).
        # The controller makes the folder its workers share.
        self._turns_folder: str | None = None
        folder = getattr(config, "workerinput", {}).get(turns_mod.WORKER_INPUT)
        self.turns = turns_mod.Turns(folder) if folder else None
        if self._is_controller():  # before its workers start (pytest_sessionstart)
            share_cores(getattr(config.option, "numprocesses", None))
        self.covered: set[str] = set()
        # The run's selection (provenance.selection): what narrowed it, and
        # the tests it selected (before a --shard split).
        self.narrowed_by: list[str] = []
        self.selected_ids: list[str] = []
        self.recorder = RunRecorder(self)
        self._start = time.time()

    # --------------------------------------------------------- operators

    @functools.cached_property
    def _op_index(self) -> dict:
        """OpInfo key -> entry (PyTorch's op_db, imported in the parent so
        that every forked test shares it). Importing it runs PyTorch's test
        setup, which asks the accelerator questions (its device count): it
        is tried first in a bounded probe, as _warm does for dynamo, so that
        a backend that hangs there costs the operators area, not the run."""
        from privateuse1_conformance.conformance import _opinfo

        def question() -> int:
            return len(_opinfo.load_op_db())

        try:
            bounded.ask(question, "importing PyTorch's OpInfo database (torch.testing._internal."
                                  "common_methods_invocations, which asks the backend for its devices)",
                        limit=max(self.timeout, 60.0))
        except bounded.BackendProbeError as e:
            self.warnings.append(f"{e}; the operators area has no tests in this run")
            return {}
        return {_opinfo.op_key(op): op for op in _opinfo.load_op_db()}

    def operator_keys(self, contracts: Iterable[str] = ()) -> list[str]:
        """The OpInfo entries this run checks (--operators) for a test of
        `contracts`. When the run cannot select that test (its level or
        --contract leaves the contracts out), one placeholder instead: the
        OpInfo database is not imported (seconds) for an area that does not
        run, and the placeholder is covered and deselected like the area's
        tests would be."""
        if contracts and not self.may_select(contracts):
            return [NOT_SELECTED]
        if options.value(self.config, "operators").strip() == "none" or self.setup_problem:
            return []  # (with a setup problem nothing runs: the backend is not asked again)
        if not self._op_index:
            return []
        entries = [(key, op.name) for key, op in self._op_index.items()]
        try:
            return operators_mod.select(entries, options.value(self.config, "operators"))
        except operators_mod.OperatorsError as e:
            raise pytest.UsageError(str(e)) from None

    def operator(self, key: str):
        return self._op_index[key]

    def may_select(self, contracts: Iterable[str]) -> bool:
        """Whether a test of `contracts` can be selected by this run's level,
        --contract and torch (the rules of pytest_collection_modifyitems)."""
        contracts = list(contracts)
        if any(c in self.left_out or c not in self.registry.contracts for c in contracts):
            return False
        rank = registry_mod.LEVELS.index(self.level)
        in_level = min(self.registry.contracts[c].level_rank for c in contracts) <= rank
        return in_level and (not self.only or bool(self.only.intersection(contracts)))

    # ------------------------------------------------------------ helpers

    def _probe_backend(self) -> tuple[int, bool]:
        """(the device count, whether importing the backend initialized it),
        asked in a probe process with a time limit (harness/bounded.py): the
        parent never waits on the backend without one. The count comes from
        the first layer that answers, the module then the hooks; disagreement
        is a contract failure the suite reports, here we only plan the run."""
        module = self.backend.device_module

        def question() -> dict:
            import torch

            count = 0
            for ask in (lambda: module.device_count(), torch._C._accelerator_hooks_device_count):
                try:
                    count = int(ask())
                except Exception:  # noqa: BLE001
                    continue
                if count > 0:
                    break
            is_initialized = getattr(module, "is_initialized", None)
            try:
                initialized = bool(is_initialized()) if callable(is_initialized) else False
            except Exception:  # noqa: BLE001
                initialized = False
            return {"count": count, "initialized": initialized}

        try:
            answer = bounded.ask(question, f"the backend's device_count() / is_initialized()",
                                 limit=max(self.timeout, 10.0))
        except bounded.BackendProbeError as e:
            self.setup_problem = (f"{e}: the kit needs these answers before any test can run, so no test "
                                  "was run")
            return 0, False
        return int(answer["count"]), bool(answer["initialized"])

    def _is_controller(self) -> bool:
        """Whether this process is pytest-xdist's controller (it runs no test)."""
        return getattr(self.config.option, "dist", "no") != "no" and not hasattr(self.config, "workerinput")

    def _warm(self) -> None:
        """Import in the parent what PyTorch imports lazily on the first
        operator that needs a Python meta kernel (seconds), so that forked
        tests do not each pay for it. Importing torch._dynamo runs the
        backend's own import hooks (a device interface registering itself
        per device), so it was tried first in a probe process, started
        before collection: a backend that hangs or crashes there costs the
        tests that compile, not the run."""
        pending, self._warming = self._warming, None
        if pending is None:
            return
        try:
            pending.result()
        except bounded.BackendProbeError as e:
            self.warnings.append(f"{e}; the parent did not import it, so each test imports it itself")
            return
        _warm_imports()

    # ------------------------------------------------------- clauses

    @functools.cached_property
    def _static_clauses(self) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        """(function -> clauses its "# decides" comments or its C++ case
        declare, function -> every clause it mentions), from the suite's
        sources (harness/coverage.py). A C++ case is named "cxx::Suite.Case"."""
        from . import coverage

        declared: dict[str, set[str]] = {}
        mentioned: dict[str, set[str]] = {}
        if self.suite_dir is None:
            return declared, mentioned
        for table, found in ((declared, coverage.declared_by_comment(self.suite_dir)),
                             (mentioned, coverage.checks_by_clause(self.suite_dir))):
            for clause, owners in found.items():
                for owner in owners:
                    file, _, name = owner.partition("::")
                    key = f"cxx::{name}" if file.endswith(".cpp") else owner
                    table.setdefault(key, set()).add(clause)
        return declared, mentioned

    def _function_key(self, nodeid: str) -> str:
        """The key of a test in _static_clauses: file::function, or cxx::Suite.Case."""
        test_id = self.test_id(nodeid)
        head, _, param = test_id.partition("[")
        if head.endswith("::test_cxx") and param:
            return f"cxx::{param.rstrip(']')}"
        return head

    def clauses_of(self, nodeid: str) -> set[str]:
        """Every clause the test's function checks."""
        declared, mentioned = self._static_clauses
        key = self._function_key(nodeid)
        return declared.get(key, set()) | mentioned.get(key, set())

    def clause_outcomes(self, item: pytest.Item, report: pytest.TestReport,
                        error: BaseException | None) -> dict[str, str]:
        """Where the test ran: what it found about each clause (see
        harness/evidence.py). A test that passed decides what its "# decides"
        comments or its C++ case declare; a test that ended as not
        applicable makes its clauses not applicable."""
        outcomes = evidence.clause_outcomes()
        if report.passed and report.when == "call":  # (a check that said it could not observe stays so)
            for clause in self._static_clauses[0].get(self._function_key(item.nodeid), ()):
                outcomes.setdefault(clause, evidence.DECIDED)
        if error is not None and evidence.declared_not_applicable(error):
            for clause in self.clauses_of(item.nodeid):
                outcomes.setdefault(clause, f"n/a: {one_line(getattr(error, 'msg', str(error)), evidence.REASON_LIMIT)}")
        return dict(sorted(outcomes.items()))

    @staticmethod
    def contracts_of(item: pytest.Item) -> list[str]:
        ids: list[str] = []
        for marker in item.iter_markers(MARKER):
            ids.extend(marker.args)
        return ids

    @functools.cached_property
    def suite_dir(self) -> Path | None:
        """The folder of the suite that runs (installed or in a checkout)."""
        try:
            from privateuse1_conformance import conformance

            return Path(conformance.__file__).resolve().parent
        except ImportError:  # pragma: no cover - the kit is always importable when its plugin is
            return None

    def _suite_path(self, nodeid: str) -> str | None:
        """The test file of `nodeid` relative to the suite's folder, or None
        for a test outside the suite (the kit's own tests run scratch suites)."""
        path = nodeid.partition("::")[0]
        if self.suite_dir is None:
            return None
        # A node ID is relative to the rootdir, or, for a file outside it
        # (--pyargs from an unrelated folder), to the argument that named it:
        # the suite's own folder.
        candidate = self.config.rootpath / path
        if not candidate.exists():
            candidate = self.suite_dir / path
        try:
            return candidate.resolve().relative_to(self.suite_dir).as_posix()
        except ValueError:
            return None

    def test_id(self, nodeid: str) -> str:
        """The test's ID in reports: its file relative to the suite's folder
        and its name, whatever the working directory and rootdir (a pytest
        node ID is relative to the rootdir). Tests outside the suite keep
        their node ID."""
        path, sep, rest = nodeid.partition("::")
        return (self._suite_path(nodeid) or path) + sep + rest

    def rerun_command(self, nodeid: str) -> str:
        """A command that reruns one test from any folder: the suite's tests
        are found by the installed suite's package and the test's ID; a test
        outside the suite by its file's absolute path."""
        from .results import rerun_options  # not at the top: results imports this module lazily too

        if self._suite_path(nodeid) is not None:
            return shlex.join([*rerun_options(self), f"--test={self.test_id(nodeid)}"])
        path, _, rest = nodeid.partition("::")
        # (from the working directory; no path of this machine: harness/paths.py)
        target = portable(str((self.config.rootpath / path).resolve())) + (f"::{rest}" if rest else "")
        args = ["pytest", f"--backend={self.backend.requested}"]
        for option in ("manifest", "expectations"):
            value = options.value(self.config, option)
            if value:
                args.append(f"--{option}={portable(str(Path(value).resolve()))}")
        return shlex.join(args + [target])

    def selects(self, item: pytest.Item) -> bool:
        """Whether --test-id selects `item` (no --test-id: every item)."""
        if not self.only_tests:
            return True
        test_id = self.test_id(item.nodeid)
        return any(expectations_mod.matches(t, test_id) for t in self.only_tests)

    # -------------------------------------------------------- collection

    # tryfirst: see every collected test (before -k / -m deselect) for coverage.
    @pytest.hookimpl(tryfirst=True)
    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """The C++ probe, compiled before the suite is collected (its module
        imports it) when this torch has no cached build: said on the
        terminal, with what it costs, since the collection's output is
        captured. In a parallel run the controller builds it, once, before
        it starts the workers. A failed build is reported where the suite
        imports the probe."""
        if hasattr(self.config, "workerinput"):
            return
        from privateuse1_conformance.conformance import _probe

        if _probe.is_built():
            return
        import torch

        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        say = (lambda text: terminal.write_line(text)) if terminal else (lambda text: None)
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            say(f"compiling the kit's C++ probe against torch {torch.__version__}: once per torch build, "
                f"{_probe.EXPECTED_TIME} (cached in {_probe.cache_root()})")
        began = time.monotonic()
        try:
            _probe.load()
        except Exception:  # noqa: BLE001 - the suite's import of the probe reports it
            return
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            say(f"compiled the C++ probe in {time.monotonic() - began:.0f} s")

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        problems = []
        selected, deselected = [], []
        rank = registry_mod.LEVELS.index(self.level)
        evidence.trust({str(item.path) for item in items})  # the run's test modules may declare evidence
        evidence.trusted_caller()  # (warms its caches in the parent: every forked test inherits them)
        for item in items:
            ids = self.contracts_of(item)
            if not ids:
                problems.append(f"{item.nodeid}: declares no contract (use @pytest.mark.contract(ID, ...))")
                continue
            for contract_id in ids:
                contract = self.registry.contracts.get(contract_id)
                if contract is None:
                    problems.append(f"{item.nodeid}: unknown contract ID {contract_id!r}")
                elif contract.retired and contract_id not in self.left_out:
                    problems.append(f"{item.nodeid}: contract {contract_id} is retired ({contract.retired})")
            if any(c not in self.registry.contracts for c in ids):
                continue
            if any(c in self.left_out for c in ids) or _empty_parameter_set(item):
                deselected.append(item)  # (an empty parameter set, e.g. --operators none: nothing to run)
                continue
            self.covered.update(ids)
            in_level = min(self.registry.contracts[c].level_rank for c in ids) <= rank
            if _placeholder(item):
                deselected.append(item)  # (operator_keys: the operators area cannot be selected)
            elif in_level and (not self.only or self.only.intersection(ids)) and self.selects(item):
                selected.append(item)
            else:
                deselected.append(item)
        if problems:
            raise pytest.UsageError("invalid contract declarations:\n  " + "\n  ".join(problems))
        # (an expectation of a contract this run cannot select is not looked
        # at: its tests may not even be parametrized, see operator_keys)
        unmatched = [e for e in self.expectations if e.test is not None and self.may_select([e.contract]) and not any(
            e.contract in self.contracts_of(item) and e.covers(self.test_id(item.nodeid)) for item in items)]
        if unmatched:
            raise pytest.UsageError(
                f"expectations file {self.expectations_path}: no test of the contract matches " + "; ".join(
                    f"{e.contract} test {e.test!r}" for e in unmatched))
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        if hasattr(config, "workerinput"):
            # Parallel run: the longest tests first, so that no worker is
            # left with one of them at the end while the others idle; the
            # tests that run alone together, last, so that a worker runs
            # several in one turn (_turn) and the turns wait for short tests
            # to end. (Measured: those tests moved first made the run 22%
            # slower; moved last without keeping the turn, no change.)
            selected.sort(key=lambda item: (not _long(item), _exclusive(item)))
        items[:] = selected
        self._ours = {self.test_id(item.nodeid) for item in selected}
        if hasattr(config, "workeroutput"):  # xdist worker: tell the controller
            config.workeroutput["privateuse1_covered"] = sorted(self.covered)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """What the run selected, and whether anything narrowed it: an
        option that selects tests (-k, -m, --deselect, --contract, --test,
        paths, --operators with a few entries) or any plugin that dropped
        tests of the selected levels. A narrowed run certifies no level."""
        # Read the suite's sources for the clauses once, here, before any
        # test is forked (each forked test would read them again).
        self._static_clauses  # noqa: B018
        self._warm()
        final = {self.test_id(item.nodeid) for item in session.items}
        ids = self.sharding.ids if self.sharding is not None else final
        self.selected_ids = sorted(ids)
        self.narrowed_by = self.narrowing_options()
        dropped = getattr(self, "_ours", set()) - set(ids)
        if dropped and not self.narrowed_by:
            self.narrowed_by.append(f"{len(dropped)} test(s) of the selected levels were deselected by another "
                                    f"option or plugin (e.g. {sorted(dropped)[0]})")
        if hasattr(self.config, "workeroutput"):  # xdist worker: tell the controller
            self.config.workeroutput["privateuse1_selection"] = [self.selected_ids, self.narrowed_by]

    def narrowing_options(self) -> list[str]:
        """The options and arguments of this run that select part of the suite."""
        option, reasons = self.config.option, []
        if self.only:
            reasons.append(f"--contract {','.join(sorted(self.only))}")
        if self.only_tests:
            reasons.append(f"--test {' '.join(self.only_tests)}")
        for name, flag in (("keyword", "-k"), ("markexpr", "-m")):
            if getattr(option, name, None):
                reasons.append(f"{flag} {getattr(option, name)!r}")
        for name, flag in (("deselect", "--deselect"), ("ignore", "--ignore"), ("ignore_glob", "--ignore-glob")):
            if getattr(option, name, None):
                reasons.append(f"{flag} {' '.join(map(str, getattr(option, name)))}")
        for name, flag in (("lf", "--last-failed"), ("stepwise", "--stepwise"), ("stepwise_skip", "--stepwise-skip"),
                           # a module that failed to import is left out, not failed
                           ("continue_on_collection_errors", "--continue-on-collection-errors")):
            if getattr(option, name, False):
                reasons.append(flag)
        operators = (options.value(self.config, "operators") or "default").strip()
        if operators not in operators_mod.COMPLETE_SELECTIONS:
            reasons.append(f"--operators {operators}")
        for arg in self.config.args:
            if not self._is_the_suite(arg):
                reasons.append(f"the run names {arg!r}, not the whole suite")
        return reasons

    def _is_the_suite(self, arg: str) -> bool:
        """Whether a collection argument names the whole installed suite (its
        folder, or its package with --pyargs)."""
        if "::" in arg or self.suite_dir is None:
            return False
        path = Path(arg)
        if not path.exists():
            try:
                spec = importlib.util.find_spec(arg)
            except (ImportError, ValueError):
                return False
            locations = list(spec.submodule_search_locations or []) if spec else []
            if not locations:
                return False
            path = Path(locations[0])
        return path.resolve() == self.suite_dir

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:  # xdist controller, for each worker
        if self._turns_folder is None:
            self._turns_folder = turns_mod.create_folder()
        node.workerinput[turns_mod.WORKER_INPUT] = self._turns_folder

    @property
    def workers(self) -> int:
        """How many processes ran tests at once (pytest-xdist's workers, else 1)."""
        if not self._is_controller():
            return 1
        return max(1, int(getattr(self.config.option, "numprocesses", 1) or 1))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:  # xdist controller
        output = getattr(node, "workeroutput", {})
        self.covered.update(output.get("privateuse1_covered", []))
        if output.get("privateuse1_selection"):
            self.selected_ids, self.narrowed_by = output["privateuse1_selection"]

    # ---------------------------------------------------------- running

    def unclaimed_contracts(self, contracts: list[str]) -> dict[str, list[str]]:
        """Contract -> the unclaimed features it needs (only those that need some)."""
        out = {}
        for contract_id in contracts:
            missing = sorted(set(self.registry.contracts[contract_id].features) & self.unclaimed)
            if missing:
                out[contract_id] = missing
        return out

    def _missing_requirements(self, item: pytest.Item) -> list[str]:
        required = set()
        for marker in item.iter_markers(REQUIRES):
            required.update(marker.args)
        return sorted(required & self.unclaimed)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool:
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports: list[pytest.TestReport] | None = None  # (given here, the test is not run)
        contracts = self.contracts_of(item)
        unclaimed = self.unclaimed_contracts(contracts)
        missing = self._missing_requirements(item)
        if self.setup_problem:
            reports = [isolation.synthesize(item, "setup", "error", self.setup_problem, 0.0,
                                            cause=self.setup_problem)]
        elif len(unclaimed) == len(contracts):
            reports = [self._not_run_report(item, "not-claimed", self._not_claimed_reason(
                sorted({f for fs in unclaimed.values() for f in fs})))]
        elif missing:
            reason = self._not_claimed_reason(missing).replace("not claimed:", "not applicable here:", 1)
            reports = [self._not_run_report(item, "inconclusive", reason)]
            reports[0].user_properties.append(("clauses", {c: f"n/a: {one_line(reason, evidence.REASON_LIMIT)}"
                                                           for c in self.clauses_of(item.nodeid)}))
        elif (reason := self._operator_not_claimed(item)) and self._in_default_set(item):
            # The default set must be claimed (OP-INFO-001.3): excluding one of its operators fails.
            key = item.callspec.params["opinfo_key"]
            message = operators_mod.default_set_refusal(key, reason)
            report = pytest.TestReport(
                nodeid=item.nodeid, location=item.location, keywords={k: 1 for k in item.keywords},
                outcome="failed", longrepr=message, when="call", sections=[], duration=0.0,
                user_properties=[("verdict", "fail"), ("charged", "OP-INFO-001"),
                                 ("clause", operators_mod.DEFAULT_SET_CLAUSE), ("message", message),
                                 ("clauses", {operators_mod.DEFAULT_SET_CLAUSE: evidence.DECIDED})])
            report.user_properties.append((operators_mod.CELLS_PROPERTY, {
                "operator": key, "cells": {operators_mod.ALL_DTYPES: {"forward": ["not-claimed", reason, 0]}}}))
            reports = [report]
        elif reason:
            report = self._not_run_report(item, "inconclusive", f"not claimed: {reason}")
            report.user_properties.append((operators_mod.CELLS_PROPERTY, {
                "operator": item.callspec.params["opinfo_key"],
                "cells": {operators_mod.ALL_DTYPES: {"forward": ["not-claimed", reason, 0]}}}))
            reports = [report]
        if reports is None:
            with self._turn(item, nextitem):
                if self.isolation == "fork":
                    reports = self._go_on_after_crash(item, isolation.run_forked(item, self.timeout))
                else:
                    from _pytest.runner import runtestprotocol

                    reports = runtestprotocol(item, log=False, nextitem=nextitem)
        elif self.turns is not None:
            self.turns.give_back_kept()  # (kept for this test, which runs no code)
        for report in reports:
            self._finalize(report, contracts, unclaimed)
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _turn(self, item: pytest.Item, nextitem: pytest.Item | None):
        """This worker's turn to run `item` (harness/turns.py); none outside a
        parallel run. An exclusive turn is kept when the next test is
        exclusive too (the run orders them together: collection)."""
        if self.turns is None:
            return contextlib.nullcontext()
        exclusive = _exclusive(item)
        return self.turns.turn(exclusive=exclusive, keep=exclusive and nextitem is not None and _exclusive(nextitem))

    def _go_on_after_crash(self, item: pytest.Item, reports: list[pytest.TestReport]) -> list[pytest.TestReport]:
        """An operators-area test whose process crashed goes on in a fresh
        process after the dtype it crashed in (and again after each later
        crash), so that one crashing dtype does not hide the operator's
        others. The crash stays the test's verdict, charged where it
        happened; the report gets the whole operator matrix row, and each
        contract the outcome of its own checks (a crashed check makes its
        contract a crash). A hang is not gone on from: the next dtype
        would likely cost the whole time limit again."""
        crash = next((r for r in reports if r.when == "call" and r.failed
                      and dict(r.user_properties).get("verdict") == isolation.CRASH), None)
        cells = dict(crash.user_properties).get(operators_mod.CELLS_PROPERTY) if crash else None
        if not cells or not cells.get("at"):
            return reports
        state = operators_mod.after_crash(cells, str(crash.longrepr))
        outcomes, processes = None, 0
        # Each process finishes at least one more cell row (a dtype, or the error inputs').
        limit = len(self.operator(item.callspec.params["opinfo_key"]).supported_dtypes("cpu")) + 1
        while processes < limit:
            processes += 1
            evidence.resume_with({operators_mod.CELLS_PROPERTY: state})
            try:
                more = isolation.run_forked(item, self.timeout)
            finally:
                evidence.resume_with(None)
            call = next((r for r in more if r.when == "call"), None)
            if call is None:  # its setup failed: keep what the crash left
                break
            crash.duration += call.duration
            props = dict(call.user_properties)
            found = props.get(operators_mod.CELLS_PROPERTY) or {}
            if props.get("verdict") == isolation.CRASH and found.get("at"):
                state = operators_mod.after_crash(found, str(call.longrepr))
                continue
            if props.get("verdict") == isolation.HANG and found.get("at"):
                dtype, check = found["at"]
                state = {**found, "cells": {**found.get("cells", {}),
                                            dtype: {**found.get("cells", {}).get(dtype, {}),
                                                    check: ["hang", str(call.longrepr).splitlines()[0], 0]}}}
                state.pop("at", None)
                break
            state, outcomes = found or state, props.get(operators_mod.OUTCOMES_PROPERTY)
            break
        crash.user_properties = [p for p in crash.user_properties if p[0] != operators_mod.CELLS_PROPERTY]
        crash.user_properties += [(operators_mod.CELLS_PROPERTY, state),
                                  (operators_mod.OUTCOMES_PROPERTY, operators_mod.crash_outcomes(state, outcomes))]
        crash.longrepr = (f"{crash.longrepr}\n--- after the crash ---\nthe operator's remaining dtypes ran in "
                          f"{processes} fresh process(es); the operator matrix has their cells")
        return reports

    def _in_default_set(self, item: pytest.Item) -> bool:
        key = item.callspec.params["opinfo_key"]
        return operators_mod.in_default_set(key, self.operator(key).name)

    def _operator_not_claimed(self, item: pytest.Item) -> str | None:
        """Why the manifest does not claim the operator an operators-area test checks, or None."""
        callspec = getattr(item, "callspec", None)
        key = callspec.params.get("opinfo_key") if callspec else None
        if key is None:
            return None
        return self.backend.manifest.operators.excluded(key, self.operator(key).name)

    def _not_claimed_reason(self, features: list[str]) -> str:
        reason = f"not claimed: the backend does not claim feature(s) {', '.join(features)}"
        if "multi-device" in features and "multi-device" not in self.backend.manifest.unclaimed:
            reason += f" (it has {self.device_count} device(s); this needs 2)"
        if "backend-metadata" in features and "backend-metadata" not in self.backend.manifest.unclaimed:
            reason += " (its manifest declares no backend_metadata to check)"
        return reason

    def _not_run_report(self, item: pytest.Item, verdict: str, reason: str) -> pytest.TestReport:
        return pytest.TestReport(
            nodeid=item.nodeid, location=item.location, keywords={k: 1 for k in item.keywords},
            outcome="skipped", longrepr=(str(item.path), item.location[1] or 0, reason),
            when="setup", sections=[], duration=0.0,
            user_properties=[("verdict", verdict)],
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        evidence.forget()  # (where the test runs: the kit's declarations are the test's own)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        """Runs where the test runs (the child): tell fail from error, and
        charge the outcome to the contract it is evidence about."""
        report = yield
        error = call.excinfo.value if call.excinfo is not None else None
        if report.skipped and error is not None and not evidence.raised_by_kit(error):
            # A skip, an xfail or the kit's Inconclusive raised by the
            # backend: only the kit decides that a test is no evidence.
            report.outcome = "failed"
            report.longrepr = (f"the backend raised {type(error).__module__}.{type(error).__name__}"
                               f"({getattr(error, 'msg', str(error))!r}) out of the code under test: only the "
                               "kit's own checks may end a test as skipped or inconclusive, so this is the "
                               f"backend's error\n{call.excinfo.getrepr(style='short')}")
            if hasattr(report, "wasxfail"):
                del report.wasxfail
        if report.passed:
            verdict = "pass"
        elif report.skipped:
            if hasattr(report, "wasxfail"):
                verdict = "xfail"
            elif isinstance(error, evidence.Inconclusive):
                verdict = "inconclusive"
            else:
                verdict = "skip"
        elif call.excinfo is not None and call.when == "call" and call.excinfo.errisinstance(
            (AssertionError, pytest.fail.Exception)
        ):
            verdict = "fail"
        else:
            verdict = "error"
        report.user_properties.append(("verdict", verdict))
        if call.when == "call" or (report.skipped and error is not None):
            report.user_properties.append(("clauses", self.clause_outcomes(item, report, error)))
        if error is not None:
            charged = evidence.contract_of(error)
            if charged:
                report.user_properties.append(("charged", charged))
            for key, value in (("clause", evidence.clause_of(error)), ("step", evidence.step_of(error)),
                               ("cause", cause_of(error) if verdict in ("fail", "error") else None)):
                if value:
                    report.user_properties.append((key, value))
            if isinstance(error, evidence.Violation):
                report.user_properties.append(("message", str(error)))
            if report.failed:  # the complete traceback for the report, whatever the terminal shows
                try:
                    report.user_properties.append(("details", str(item.repr_failure(call.excinfo, style="long"))))
                except Exception:  # noqa: BLE001 - the terminal's version will do
                    pass
        return report

    def charges(self, verdict: str, charged: str | None, contracts: list[str],
                unclaimed: dict[str, list[str]]) -> tuple[dict[str, str], str | None]:
        """What one phase's outcome says about each contract of the test, and
        a note when the charge had to be moved (a check of a contract the
        test does not declare is a kit bug: charged to the primary contract
        as an error that says so)."""
        active = [c for c in contracts if c not in unclaimed]
        primary = active[0] if active else contracts[0]
        result = {c: "not-claimed" for c in unclaimed}
        note = None
        if verdict in ("pass", "xpass", "skip", "inconclusive", "not-claimed"):
            result.update({c: verdict for c in active})
            return result, note
        target = charged or primary
        if target not in contracts:
            note = (f"[kit bug] this failure was charged to {target}, which the test does not declare "
                    f"(@pytest.mark.contract); it is reported against {primary}")
            target, verdict = primary, "error"
        elif target in unclaimed:
            # A check of an unclaimed contract failed: the test exercised a
            # feature the backend declares absent. Nothing is learnt about it,
            # and the test stopped before the others were checked.
            result.update({c: "inconclusive" for c in active})
            return result, note
        result.update({c: "inconclusive" for c in active})
        result[target] = verdict
        return result, note

    def _finalize(self, report: pytest.TestReport, contracts: list[str], unclaimed: dict[str, list[str]]) -> None:
        """Parent side: per-contract charges, expectations, contract IDs."""
        props = dict(report.user_properties)
        verdict = props.get("verdict") or ("pass" if report.passed else "skip" if report.skipped else "error")
        charged = props.get("charged")
        if verdict in (isolation.CRASH, isolation.HANG) and props.get("scope"):
            charged = props["scope"][0]  # the scope the test process was in when it died or hung
            if props["scope"][1]:
                props["step"] = props["scope"][1]
        charges, note = self.charges(verdict, charged, contracts, unclaimed)
        outcomes = props.get(operators_mod.OUTCOMES_PROPERTY)
        if outcomes and report.when == "call":
            # An operators-area test checks several contracts independently:
            # each gets the outcome of its own checks (test_opinfo.per_contract).
            charges = {c: outcomes[c][0] if c in outcomes else "inconclusive" for c in contracts}
        expected = []
        test_id = self.test_id(report.nodeid)
        for contract_id, charge in charges.items():
            expectation = self.expectations.for_test(contract_id, test_id)
            if expectation is None:
                continue
            if charge in ("fail", "error"):
                charges[contract_id] = "xfail"
                expected.append(expectation.reason)
            elif charge == "pass" and report.when == "call":
                charges[contract_id] = "xpass"
                expected.append(expectation.reason)
        from privateuse1_conformance.reports.model import Verdict

        overall = max((Verdict(v) for v in charges.values()), key=lambda v: v.severity).value
        if overall == "xfail":
            report.outcome = "skipped"
        if expected:
            report.wasxfail = "; ".join(expected)
        keep = ("verdict", "charged", "charges", "contracts", "expectation", "note", "not_claimed")
        report.user_properties = [p for p in report.user_properties if p[0] not in keep and p[0] != "scope"]
        report.user_properties += [("verdict", overall), ("charges", charges), ("contracts", ",".join(contracts))]
        not_claimed = {c: self._not_claimed_reason(unclaimed[c]) for c, v in charges.items()
                       if v == "not-claimed" and unclaimed.get(c)}
        if not_claimed:  # (each contract's own reason, also where the test checked others too)
            report.user_properties.append(("not_claimed", not_claimed))
        if props.get("step") and "step" not in dict(report.user_properties):
            report.user_properties.append(("step", props["step"]))
        if note:
            report.user_properties.append(("note", note))
        if expected:
            report.user_properties.append(("expectation", report.wasxfail))

    # ------------------------------------------------------------ results

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.recorder.add(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        isolation.reap_exited(block=True)
        if self.sharding is not None and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and self.sharding.selected:
            # A shard the split left empty (more shards than tests) is a
            # complete part of the run, not a usage error.
            session.exitstatus = exitstatus = pytest.ExitCode.OK
        self.recorder.finish(exitstatus, self._start, time.time() - self._start)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        self.recorder.print_details(terminalreporter)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._warming is not None:  # (collection ended early: no test ran)
            self._warming.cancel()
        if self.turns is not None:
            self.turns.close()
        if self._turns_folder is not None:
            turns_mod.remove_folder(self._turns_folder)
        # After pytest's own summary and final line: the table, the level and
        # the blocking contracts are the last thing a vendor reads.
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            self.recorder.print_summary(terminal)
