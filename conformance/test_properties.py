"""Property-based checks: random interleavings of device and stream
operations across threads, checked against a model of the state each
thread should see.

The model is what PyTorch documents and does on top of any backend:

* every thread has its own current device (0 in a new thread) and, per
  device, its own current stream (the default stream in a new thread);
* set_device / torch.accelerator.set_device_index / the hooks'
  setCurrentDevice make a device current; exchangeDevice also returns the
  previous one; torch.accelerator maybe_exchange(-1) does nothing and
  maybe_exchange(j) returns the device current afterwards;
* torch.accelerator.set_stream(s) makes s the current stream of its device
  and its device current;
* the module's device(j) and torch.accelerator.device_index(j) restore the
  device current at entry on exit (None: no-op);
* 'with stream' (torch.Stream.__enter__/__exit__, PyTorch's own code)
  switches to the stream's device and stream, and on exit restores the
  stream, and the device if it differs from the stream's device; entering
  the stream that is already current on its device does nothing.

A backend breaks the model when its device or stream state leaks between
threads, when exchange returns the wrong device, when a guard or the hooks
disagree with the module, or when getStream/exchangeStream mix devices.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

import pytest
import torch

pytest.importorskip("hypothesis", reason="the property-based checks need hypothesis (pip install hypothesis)")

from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, initialize, invariant,  # noqa: E402
                                 precondition, rule, run_state_machine_as_test)

from privateuse1_conformance.harness.evidence import Violation, carry, copy_tags, decided, scope, tag

from ._helpers import in_thread

contract = pytest.mark.contract

MAX_THREADS = 4
MAX_DEPTH = 3  # open contexts per thread


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=30, derandomize=True, deadline=None,
                    database=None, phases=[Phase.explicit, Phase.generate], print_blob=False,
                    suppress_health_check=list(HealthCheck))


class Worker:
    """A thread that runs calls for the state machine, so that one example
    can move between threads that each keep their own device state."""

    def __init__(self, name: str) -> None:
        self.calls: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.calls.get()
            if item is None:
                return
            call, box, done = item
            try:
                box["value"] = call()
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                box["error"] = e
            done.set()

    def call(self, call):
        # No time limit: a call that never returns is a hang the harness sees.
        box: dict = {}
        done = threading.Event()
        self.calls.put((carry(call), box, done))  # (a crash there is charged to the step's scope)
        done.wait()
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def stop(self) -> None:
        self.calls.put(None)
        self.thread.join()


class OwnThread:
    """The test's own thread as thread 0 of every example (no hand-off cost).
    Its state carries over between examples, so teardown resets it."""

    def call(self, call):
        return call()

    def stop(self) -> None:
        pass


@dataclass
class ThreadModel:
    device: int
    streams: list
    contexts: list = field(default_factory=list)  # open contexts: (description, manager, restore, clause)


@dataclass
class Step:
    """A rule that ran: what it did, and the clauses a divergence of the
    device or of the streams seen after it is evidence against."""
    number: int
    text: str
    device_clause: str
    stream_clause: str


class Divergence(Violation):
    """The state seen after a step is not the model's."""


def _first_failure(machine_class):
    return getattr(machine_class, "first_failure", None)


def make_machine(dt: str, mod, n: int, cxx, defaults: list, hop_rules: int, unclaimed=frozenset()):
    devices = st.integers(0, n - 1)
    has_device_context = callable(getattr(mod, "device", None))

    class Machine(RuleBasedStateMachine):
        streams = Bundle("streams")

        first_failure = None  # (exception, steps): kept across hypothesis' replays

        def __init__(self) -> None:
            super().__init__()
            self.workers: list = [OwnThread()]
            self.models = [ThreadModel(device=0, streams=list(defaults))]
            self.active = 0
            self.steps: list[Step] = []

        # ------------------------------------------------------ plumbing

        def _new_thread(self) -> None:
            self.workers.append(Worker(f"model-thread-{len(self.workers)}"))
            self.models.append(ThreadModel(device=0, streams=list(defaults)))
            self.active = len(self.workers) - 1

        @property
        def model(self) -> ThreadModel:
            return self.models[self.active]

        def run(self, call):
            return self.workers[self.active].call(call)

        def step(self, text: str, device_clause: str, stream_clause: str | None = None) -> Step:
            """Record the rule about to run (its calls are charged to
            device_clause, with the step's text, if they raise or crash)."""
            step = Step(len(self.steps) + 1, f"thread {self.active}: {text}", device_clause,
                        stream_clause or device_clause)
            self.steps.append(step)
            return step

        def perform(self, step: Step, call):
            with scope(step.device_clause, f"step {step.number}, {step.text}"):
                try:
                    return self.run(call)
                except BaseException as error:
                    self.remember(error)
                    raise

        def remember(self, error: BaseException) -> None:
            if type(self).first_failure is None:
                type(self).first_failure = (error, [f"{s.number}. {s.text}" for s in self.steps])

        def teardown(self) -> None:
            try:
                for index, (worker, model) in enumerate(zip(self.workers, self.models)):
                    self.active = index
                    while model.contexts:
                        self._exit(False)
            finally:
                for worker in self.workers:
                    worker.stop()
                # Back to a new thread's state for the next example.
                if "streams" not in unclaimed:
                    for s in defaults:
                        torch.accelerator.set_stream(s)
                torch.accelerator.set_device_index(0)

        # --------------------------------------------------------- rules

        @initialize(target=streams)
        def a_default_stream(self):
            return defaults[n - 1]

        @precondition(lambda self: "streams" not in unclaimed)
        @rule(target=streams, d=devices, priority=st.sampled_from([0, -1]))
        def new_stream(self, d, priority):
            step = self.step(f"torch.Stream(device='{dt}:{d}', priority={priority})", "ST-NEW-001.2")
            s = self.perform(step, lambda: torch.Stream(device=torch.device(dt, d), priority=priority))
            self.expect(step, s.device_index == d, f"torch.Stream(device='{dt}:{d}') is on device {s.device_index}")
            return s

        @rule(d=devices, via=st.sampled_from(["module set_device", "torch.accelerator.set_device_index",
                                              "hooks setCurrentDevice"]))
        def set_device(self, d, via):
            # (each API looked up inside the step's scope: a missing one is
            # charged to its own contract)
            call, clause = {"module set_device": (lambda i: mod.set_device(i), "DM-SET-001.1"),
                            "torch.accelerator.set_device_index": (torch.accelerator.set_device_index, "DM-SET-001.2"),
                            "hooks setCurrentDevice": (cxx.hooks_set_current_device, "HK-DEV-001.3")}[via]
            self.perform(self.step(f"{via}({d})", clause), lambda: call(d))
            self.model.device = d

        @rule(d=devices, via=st.sampled_from(["torch.accelerator exchangeDevice", "hooks exchangeDevice"]))
        def exchange(self, d, via):
            call, clause = {"torch.accelerator exchangeDevice": (torch._C._accelerator_exchangeDevice, "DM-XCHG-001.1"),
                            "hooks exchangeDevice": (cxx.hooks_exchange_device, "HK-DEV-001.4")}[via]
            step = self.step(f"{via}({d})", clause)
            previous = self.perform(step, lambda: call(d))
            self.expect(step, previous == self.model.device,
                        f"{via}({d}) returned {previous}, but the thread's device was {self.model.device}")
            self.model.device = d

        @rule(d=st.integers(-1, n - 1))
        def maybe_exchange(self, d):
            step = self.step(f"torch.accelerator maybeExchangeDevice({d})", "DM-MXCHG-001.1" if d == -1 else
                             "DM-MXCHG-002.1")
            result = self.perform(step, lambda: torch._C._accelerator_maybeExchangeDevice(d))
            if d != -1:
                self.model.device = d
            self.expect(step, result in (self.model.device, -1) if d == -1 else result == self.model.device,
                        f"torch.accelerator maybeExchangeDevice({d}) returned {result}, expected {self.model.device}")

        @precondition(lambda self: "streams" not in unclaimed)
        @rule(s=streams)
        def set_stream(self, s):
            self.perform(self.step(f"torch.accelerator.set_stream({s})", "ST-CUR-001.2"),
                         lambda: torch.accelerator.set_stream(s))
            self.model.device = s.device_index
            self.model.streams[s.device_index] = s

        def _enter_device_context(self, d, via: str, make, clause: str) -> None:
            clause = clause if d is not None else "DM-CTX-001.3"
            step = self.step(f"entering {via}({d})", clause)
            cm = self.perform(step, lambda: make(d))
            self.perform(step, cm.__enter__)
            saved = self.model.device

            def restore(model: ThreadModel) -> None:
                if d is not None:
                    model.device = saved

            self.model.contexts.append((f"{via}({d})", cm, restore, clause))
            if d is not None:
                self.model.device = d

        # A module without device() fails DM-CTX-001 in that contract's own
        # test; here its absence must not end the example (and be charged to
        # another contract): the rule is left out.
        @precondition(lambda self: len(self.model.contexts) < MAX_DEPTH and has_device_context)
        @rule(d=st.one_of(st.none(), devices))
        def enter_module_device(self, d):
            self._enter_device_context(d, "the module's device", lambda i: mod.device(i), "DM-CTX-001.1")

        @precondition(lambda self: len(self.model.contexts) < MAX_DEPTH)
        @rule(d=st.one_of(st.none(), devices))
        def enter_device_index(self, d):
            self._enter_device_context(d, "torch.accelerator.device_index", torch.accelerator.device_index,
                                       "DM-CTX-001.2")

        @precondition(lambda self: len(self.model.contexts) < MAX_DEPTH and "streams" not in unclaimed)
        @rule(s=streams)
        def enter_stream(self, s):
            # A fresh wrapper per 'with': PyTorch keeps the context on the object.
            wrapper = torch.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)
            self.perform(self.step(f"entering 'with {s}'", "GD-PY-001.1"), wrapper.__enter__)
            d = s.device_index
            saved_device, saved_stream = self.model.device, self.model.streams[d]
            noop = saved_stream == s

            def restore(model: ThreadModel) -> None:
                if noop:
                    return
                model.streams[d] = saved_stream
                if d != saved_device:
                    model.device = saved_device

            self.model.contexts.append((f"with {s}", wrapper, restore, "GD-PY-001.1"))
            if not noop:
                self.model.device = d
                self.model.streams[d] = s

        def _exit(self, with_exception: bool) -> None:
            what, cm, restore, clause = self.model.contexts.pop()
            if with_exception:
                clause = {"DM-CTX-001.1": "DM-CTX-001.1", "DM-CTX-001.2": "DM-CTX-001.2",
                          "GD-PY-001.1": "GD-PY-001.2"}.get(clause, clause)
                step = self.step(f"leaving {what} by an exception", clause)
                error = KeyError("escapes")
                suppressed = self.perform(step, lambda: cm.__exit__(KeyError, error, None))
            else:
                step = self.step(f"leaving {what}", clause)
                suppressed = self.perform(step, lambda: cm.__exit__(None, None, None))
            self.expect(step, not suppressed, f"leaving {what} swallowed the exception")
            restore(self.model)

        @precondition(lambda self: bool(self.model.contexts))
        @rule()
        def exit_context(self):
            self._exit(False)

        @precondition(lambda self: bool(self.model.contexts))
        @rule()
        def exit_context_by_exception(self):
            self._exit(True)

        def expect(self, step: Step, condition, message: str, clause: str | None = None) -> None:
            decided(clause or step.device_clause)  # (a check of the step's clause)
            if not condition:
                error = Divergence(f"step {step.number} ({step.text}) diverged from the model: {message}",
                                   None, clause or step.device_clause)
                tag(error, (clause or step.device_clause).split(".")[0], clause or step.device_clause,
                    f"step {step.number}, {step.text}")
                self.remember(error)
                raise error

        @invariant()
        def thread_state_matches_the_model(self):
            if not self.steps:
                return
            step = self.steps[-1]

            def observe():
                return {
                    "module current_device()": mod.current_device(),
                    "torch.accelerator.current_device_index()": torch.accelerator.current_device_index(),
                    "guard getDevice()": cxx.guard_get_device()[1],
                }, cxx.hooks_get_current_device(), \
                    ([torch.accelerator.current_stream(i) for i in range(n)], torch.accelerator.current_stream()) \
                    if "streams" not in unclaimed else None

            devices_seen, hooks_seen, streams = self.perform(step, observe)
            model = self.model
            wrong = {k: v for k, v in devices_seen.items() if v != model.device}
            self.expect(step, not wrong, f"thread {self.active}: expected device {model.device}, saw {wrong}")
            self.expect(step, hooks_seen == model.device,
                        f"thread {self.active}: the hooks' getCurrentDevice() is {hooks_seen}, the device is "
                        f"{model.device}", "HK-DEV-001.2")
            if streams is None:
                return
            streams_seen, current = streams
            for i in range(n):
                self.expect(step, streams_seen[i] == model.streams[i],
                            f"thread {self.active}: the current stream of device {i} is {streams_seen[i]}, expected "
                            f"{model.streams[i]}", step.stream_clause)
            self.expect(step, current == model.streams[model.device],
                        f"thread {self.active}: torch.accelerator.current_stream() is {current}, expected the current "
                        f"stream of device {model.device}, {model.streams[model.device]}", step.stream_clause)

    def make_hop(k: int):
        def hop(self, to):
            # `to` names an existing thread, or starts one more (at most MAX_THREADS).
            if to < len(self.workers):
                self.active = to
                self.step("(the test moves to this existing thread)", "DM-THREAD-001.1", "ST-CUR-001.3")
            else:
                self._new_thread()
                self.step("(the test starts this new thread)", "DM-GET-001.2", "ST-CUR-001.1")

        hop.__name__ = f"hop_to_thread_{k}"
        return rule(to=st.integers(0, MAX_THREADS - 1))(hop)

    for k in range(hop_rules):
        setattr(Machine, f"hop_to_thread_{k}", make_hop(k))
    return Machine


def _defaults(n: int, unclaimed) -> list:
    if "streams" in unclaimed:
        return [None] * n
    return in_thread(lambda: [torch.accelerator.current_stream(i) for i in range(n)])


def run_machine(machine, examples: int) -> None:
    """Run the state machine; report a divergence as the step that diverged
    (charged to that step's clause), never as hypothesis' replay errors: a
    broken backend may behave differently when hypothesis replays an
    example (FlakyStrategyDefinition, Flaky...), and the first failure seen is
    the evidence."""
    machine.first_failure = None
    try:
        run_state_machine_as_test(machine, settings=_settings(examples))
    except BaseException as error:  # noqa: BLE001 - replaced by the first failure, if any
        first = _first_failure(machine)
        if first is None:
            raise
        cause, steps = first
        message = f"{cause}\nsteps of the example, up to the divergence:\n  " + "\n  ".join(steps[-30:])
        if isinstance(cause, AssertionError):
            replacement = Violation(message)
        else:
            replacement = type(cause)(message) if isinstance(cause, Exception) else cause
        copy_tags(cause, replacement)
        raise replacement from (cause if cause is not error else None)


# Every clause a step of the machine can be evidence against.
MACHINE_CONTRACTS = ("DM-SET-001", "DM-CTX-001", "ST-CUR-001", "GD-PY-001", "DM-XCHG-001", "DM-MXCHG-001",
                     "DM-MXCHG-002", "HK-DEV-001", "ST-NEW-001", "DM-THREAD-001", "DM-GET-001")


@contract(*MACHINE_CONTRACTS)
def test_device_and_stream_state_follows_the_model(dt, mod, n, cxx, unclaimed):
    run_machine(make_machine(dt, mod, n, cxx, _defaults(n, unclaimed), hop_rules=1, unclaimed=unclaimed), 60)


@contract("DM-THREAD-001", *[c for c in MACHINE_CONTRACTS if c != "DM-THREAD-001"])
def test_state_is_per_thread_across_thread_hops(dt, mod, n, cxx, unclaimed):
    run_machine(make_machine(dt, mod, n, cxx, _defaults(n, unclaimed), hop_rules=4, unclaimed=unclaimed), 25)
