"""Ranks for the distributed area: the kit starts them, bounds them, and
brings back what each observed.

A test names a *scenario*, a function ``scenario(rank: Rank) -> None`` of a
conformance module, and :func:`run_ranks` runs it in ``world`` new
interpreters (``python -m privateuse1_conformance.conformance._distributed``)
that import torch and the backend under test, use device ``rank % n``, and
meet through files in a fresh folder: first every rank says it is ready
(imports done, on a busy machine this is the slow part), then the scenario
runs, typically ``rank.init()`` (``init_process_group`` with a file store)
and collectives. Each rank records every step's value or exception as it
goes (:meth:`Rank.step`), and whether its scenario ended or raised; the test
compares those observations with the CPU's results in its own process,
where the kit's evidence is kept.

Nothing here waits without a limit: a rank that does not start, crashes,
or does not finish within the test's budget is killed with all the others,
and its outcome says so with the end of its output. The ranks share the
test's process group, so the harness's kill of a hung test takes them too.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

READY = "ready.{rank}"
RESULT = "result.{rank}.pickle"
OBSERVED = "observed.{rank}.pickle"
OUTPUT_TAIL = 3000


@dataclasses.dataclass
class Rank:
    """What a scenario gets in each rank."""

    rank: int
    world: int
    dt: str
    device: Any                # torch.device of this rank
    process_group: str         # the c10d backend registered for the device type
    folder: Path               # shared by the ranks of this run
    timeout: float             # seconds: the process group's timeout
    args: dict
    instrumentation: Any = None
    _inits: int = 0

    def init(self, backend: str | None = "", timeout: float | None = None, **kwargs) -> None:
        """init_process_group over a new file store. backend "" (default) is
        the mapping 'cpu:gloo,<dt>:<process group>'; None lets PyTorch pick
        the registered backends itself."""
        import torch.distributed as dist

        if backend == "":
            backend = f"cpu:gloo,{self.dt}:{self.process_group}"
        self._inits += 1
        store = self.folder / f"store.{self._inits}"
        dist.init_process_group(backend=backend, init_method=f"file://{store}", rank=self.rank,
                                world_size=self.world,
                                timeout=datetime.timedelta(seconds=timeout or self.timeout), **kwargs)

    def step(self, name: str, call) -> Any:
        """Runs call() and records what it returned, or the exception it
        raised, as observation `name` (written at once: a rank killed later
        still reports it). Returns the value, or None after an exception."""
        try:
            value = call()
        except BaseException as e:  # noqa: BLE001 - an observation, judged by the test
            self.record(name, Raised(f"{type(e).__name__}: {e}", traceback.format_exc()[-2000:]))
            return None
        self.record(name, value)
        return value

    def record(self, name: str, value: Any) -> None:
        try:
            frame = pickle.dumps((name, value))
        except Exception:  # noqa: BLE001 - a process group, a Work: what it is suffices
            frame = pickle.dumps((name, repr(value)))
        with open(self.folder / OBSERVED.format(rank=self.rank), "ab") as f:
            f.write(frame)

    def instrument(self, name: str):
        return getattr(self.instrumentation, name, None) if self.instrumentation else None

    def mark(self, name: str) -> None:
        """Leaves a file the other ranks can look for (ordering, not timing)."""
        (self.folder / f"mark.{name}").write_text(str(self.rank))

    def marked(self, name: str) -> bool:
        return (self.folder / f"mark.{name}").exists()


@dataclasses.dataclass
class Raised:
    """An observation that is an exception: its type and message."""

    message: str
    traceback: str = ""


@dataclasses.dataclass
class Outcome:
    """How one rank ended."""

    rank: int
    error: str | None = None        # type and message of the exception the scenario raised
    traceback: str = ""
    exit: str | None = None         # "exit status 3", "signal SIGABRT", "killed: ..." when it ended without a result
    output: str = ""                # the end of what it printed
    observed: dict = dataclasses.field(default_factory=dict)   # step name -> value or Raised

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit is None

    def describe(self) -> str:
        if self.ok:
            return f"rank {self.rank} finished"
        if self.error is not None:
            return f"rank {self.rank} raised {self.error}\n{self.traceback[-2000:]}"
        return f"rank {self.rank} ended without a result ({self.exit}); its output ends:\n{self.output}"


class _Unpickler(pickle.Unpickler):
    """Maps the ranks' Raised to this module's, whatever name this module
    was imported under (pytest may import the suite by path)."""

    def find_class(self, module: str, name: str):
        if name == "Raised" and module.rsplit(".", 1)[-1] == "_distributed":
            return Raised
        return super().find_class(module, name)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-OUTPUT_TAIL:].decode(errors="replace")


def run_ranks(backend, process_group: str, scenario: str, *, module: str, world: int = 2, budget: float = 50.0,
              pg_timeout: float = 20.0, args: dict | None = None, env: dict | None = None) -> list[Outcome]:
    """Runs `module`.`scenario` in `world` ranks; returns each rank's outcome.
    `budget` bounds the whole run in seconds (start-up included); ranks still
    running then are killed and reported as such."""
    deadline = time.monotonic() + budget
    folder = Path(tempfile.mkdtemp(prefix="pu1c-dist-"))
    spec = {"backend_module": backend.module_name, "dt": backend.device_type,
            "instrumentation": backend.manifest.instrumentation, "process_group": process_group,
            "module": module, "scenario": scenario, "world": world, "folder": str(folder),
            "pg_timeout": pg_timeout, "args": args or {}, "start_by": budget * 0.6}
    (folder / "spec.json").write_text(json.dumps(spec))
    children = []
    for rank in range(world):
        log = open(folder / f"output.{rank}", "wb")
        children.append(subprocess.Popen(
            [sys.executable, "-m", "privateuse1_conformance.conformance._distributed", str(folder), str(rank)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=dict(os.environ, **(env or {}))))
        log.close()
    killed: dict[int, str] = {}
    try:
        while any(child.poll() is None for child in children):
            if time.monotonic() > deadline:
                for rank, child in enumerate(children):
                    if child.poll() is None:
                        started = (folder / READY.format(rank=rank)).exists()
                        killed[rank] = (f"killed: still running after the test's budget of {budget:g} s"
                                        if started else f"killed: not started within {budget:g} s")
                        child.kill()
                for child in children:
                    child.wait()
                break
            time.sleep(0.02)
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    outcomes = []
    for rank, child in enumerate(children):
        outcome = Outcome(rank, output=_tail(folder / f"output.{rank}"))
        observed = folder / OBSERVED.format(rank=rank)
        if observed.exists():
            with open(observed, "rb") as f:
                while True:
                    try:
                        name, value = _Unpickler(f).load()
                    except EOFError:
                        break
                    except Exception as e:  # noqa: BLE001 - a frame cut short by a kill
                        outcome.observed["<unreadable>"] = f"{type(e).__name__}: {e}"
                        break
                    outcome.observed[name] = value
        result = folder / RESULT.format(rank=rank)
        if result.exists() and rank not in killed:
            with open(result, "rb") as f:
                data = pickle.load(f)
            if "error" in data:
                outcome.error, outcome.traceback = data["error"], data["traceback"]
        elif rank in killed:
            outcome.exit = killed[rank]
        else:
            code = child.returncode
            outcome.exit = f"signal {_signal_name(-code)}" if code < 0 else f"exit status {code}"
        outcomes.append(outcome)
    shutil.rmtree(folder, ignore_errors=True)
    return outcomes


def _main(folder: Path, rank: int) -> None:
    spec = json.loads((folder / "spec.json").read_text())
    import torch

    importlib.import_module(spec["backend_module"])
    instrumentation = importlib.import_module(spec["instrumentation"]) if spec["instrumentation"] else None
    scenario = getattr(importlib.import_module(spec["module"]), spec["scenario"])
    world, dt = spec["world"], spec["dt"]
    # Ready: wait (bounded) until every rank has imported everything, so that
    # the process group's timeout covers only the scenario.
    (folder / READY.format(rank=rank)).write_text("")
    start_by = time.monotonic() + spec["start_by"]
    while not all((folder / READY.format(rank=r)).exists() for r in range(world)):
        if time.monotonic() > start_by:
            raise SystemExit(f"rank {rank}: the other ranks did not start within {spec['start_by']:g} s")
        time.sleep(0.01)
    count = torch.accelerator.device_count()
    device = torch.device(dt, rank % count)
    torch.accelerator.set_device_index(device.index)
    context = Rank(rank=rank, world=world, dt=dt, device=device, process_group=spec["process_group"],
                   folder=folder, timeout=spec["pg_timeout"], args=spec["args"], instrumentation=instrumentation)
    data: dict = {}  # no error: the scenario ended (its observations are in OBSERVED)
    try:
        scenario(context)
    except BaseException as e:  # noqa: BLE001 - reported to the test, which judges it
        data = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    payload = pickle.dumps(data)
    partial = folder / (RESULT.format(rank=rank) + ".partial")
    partial.write_bytes(payload)
    partial.rename(folder / RESULT.format(rank=rank))
    sys.stdout.flush()
    # Leave at once: the process group's own teardown (threads of a failed
    # group, a store waiting for an exited peer) must not hold the verdict.
    os._exit(0)


if __name__ == "__main__":
    # Through the package, not __main__: what the ranks pickle (Raised) must
    # unpickle in the test's process.
    from privateuse1_conformance.conformance._distributed import _main as main

    main(Path(sys.argv[1]), int(sys.argv[2]))
