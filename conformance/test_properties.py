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

from ._helpers import in_thread

contract = pytest.mark.contract

MAX_THREADS = 4
MAX_DEPTH = 3  # open contexts per thread
CALL_TIMEOUT = 30.0


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
        box: dict = {}
        done = threading.Event()
        self.calls.put((call, box, done))
        if not done.wait(CALL_TIMEOUT):
            pytest.fail(f"a call in thread {self.thread.name} did not return within {CALL_TIMEOUT} s", pytrace=False)
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def stop(self) -> None:
        self.calls.put(None)
        self.thread.join(CALL_TIMEOUT)


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
    contexts: list = field(default_factory=list)  # open contexts: (description, manager, restore)


def make_machine(dt: str, mod, n: int, cxx, defaults: list, hop_rules: int):
    devices = st.integers(0, n - 1)

    class Machine(RuleBasedStateMachine):
        streams = Bundle("streams")

        def __init__(self) -> None:
            super().__init__()
            self.workers: list = [OwnThread()]
            self.models = [ThreadModel(device=0, streams=list(defaults))]
            self.active = 0

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
                for s in defaults:
                    torch.accelerator.set_stream(s)
                torch.accelerator.set_device_index(0)

        # --------------------------------------------------------- rules

        @initialize(target=streams)
        def a_default_stream(self):
            return defaults[n - 1]

        @rule(target=streams, d=devices, priority=st.sampled_from([0, -1]))
        def new_stream(self, d, priority):
            s = self.run(lambda: torch.Stream(device=torch.device(dt, d), priority=priority))
            assert s.device_index == d, f"torch.Stream(device='{dt}:{d}') is on device {s.device_index}"
            return s

        @rule(d=devices, via=st.sampled_from(["module set_device", "torch.accelerator.set_device_index",
                                              "hooks setCurrentDevice"]))
        def set_device(self, d, via):
            call = {"module set_device": mod.set_device,
                    "torch.accelerator.set_device_index": torch.accelerator.set_device_index,
                    "hooks setCurrentDevice": cxx.hooks_set_current_device}[via]
            self.run(lambda: call(d))
            self.model.device = d

        @rule(d=devices, via=st.sampled_from(["torch.accelerator exchangeDevice", "hooks exchangeDevice"]))
        def exchange(self, d, via):
            call = {"torch.accelerator exchangeDevice": torch._C._accelerator_exchangeDevice,
                    "hooks exchangeDevice": cxx.hooks_exchange_device}[via]
            previous = self.run(lambda: call(d))
            assert previous == self.model.device, \
                f"{via}({d}) returned {previous}, but the thread's device was {self.model.device}"
            self.model.device = d

        @rule(d=st.integers(-1, n - 1))
        def maybe_exchange(self, d):
            result = self.run(lambda: torch._C._accelerator_maybeExchangeDevice(d))
            if d != -1:
                self.model.device = d
            assert result == self.model.device, \
                f"torch.accelerator maybeExchangeDevice({d}) returned {result}, expected {self.model.device}"

        @rule(s=streams)
        def set_stream(self, s):
            self.run(lambda: torch.accelerator.set_stream(s))
            self.model.device = s.device_index
            self.model.streams[s.device_index] = s

        def _enter_device_context(self, d, via: str, cm) -> None:
            self.run(cm.__enter__)
            saved = self.model.device

            def restore(model: ThreadModel) -> None:
                if d is not None:
                    model.device = saved

            self.model.contexts.append((f"{via}({d})", cm, restore))
            if d is not None:
                self.model.device = d

        @precondition(lambda self: len(self.model.contexts) < MAX_DEPTH)
        @rule(d=st.one_of(st.none(), devices))
        def enter_module_device(self, d):
            self._enter_device_context(d, "the module's device", mod.device(d))

        @precondition(lambda self: len(self.model.contexts) < MAX_DEPTH)
        @rule(d=st.one_of(st.none(), devices))
        def enter_device_index(self, d):
            self._enter_device_context(d, "torch.accelerator.device_index", torch.accelerator.device_index(d))

        @precondition(lambda self: len(self.model.contexts) < MAX_DEPTH)
        @rule(s=streams)
        def enter_stream(self, s):
            # A fresh wrapper per 'with': PyTorch keeps the context on the object.
            wrapper = torch.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)
            self.run(wrapper.__enter__)
            d = s.device_index
            saved_device, saved_stream = self.model.device, self.model.streams[d]
            noop = saved_stream == s

            def restore(model: ThreadModel) -> None:
                if noop:
                    return
                model.streams[d] = saved_stream
                if d != saved_device:
                    model.device = saved_device

            self.model.contexts.append((f"with {s}", wrapper, restore))
            if not noop:
                self.model.device = d
                self.model.streams[d] = s

        def _exit(self, with_exception: bool) -> None:
            what, cm, restore = self.model.contexts.pop()
            if with_exception:
                error = KeyError("escapes")
                suppressed = self.run(lambda: cm.__exit__(KeyError, error, None))
            else:
                suppressed = self.run(lambda: cm.__exit__(None, None, None))
            assert not suppressed, f"leaving {what} swallowed the exception"
            restore(self.model)

        @precondition(lambda self: bool(self.model.contexts))
        @rule()
        def exit_context(self):
            self._exit(False)

        @precondition(lambda self: bool(self.model.contexts))
        @rule()
        def exit_context_by_exception(self):
            self._exit(True)

        @invariant()
        def thread_state_matches_the_model(self):
            def observe():
                return {
                    "module current_device()": mod.current_device(),
                    "torch.accelerator.current_device_index()": torch.accelerator.current_device_index(),
                    "hooks getCurrentDevice()": cxx.hooks_get_current_device(),
                    "guard getDevice()": cxx.guard_get_device()[1],
                }, [torch.accelerator.current_stream(i) for i in range(n)], torch.accelerator.current_stream()

            devices_seen, streams_seen, current = self.run(observe)
            model = self.model
            wrong = {k: v for k, v in devices_seen.items() if v != model.device}
            assert not wrong, f"thread {self.active}: expected device {model.device}, saw {wrong}"
            for i in range(n):
                assert streams_seen[i] == model.streams[i], (
                    f"thread {self.active}: the current stream of device {i} is {streams_seen[i]}, "
                    f"expected {model.streams[i]}")
            assert current == model.streams[model.device], (
                f"thread {self.active}: torch.accelerator.current_stream() is {current}, expected the current "
                f"stream of device {model.device}, {model.streams[model.device]}")

    def make_hop(k: int):
        def hop(self, to):
            # `to` names an existing thread, or starts one more (at most MAX_THREADS).
            if to < len(self.workers):
                self.active = to
            else:
                self._new_thread()

        hop.__name__ = f"hop_to_thread_{k}"
        return rule(to=st.integers(0, MAX_THREADS - 1))(hop)

    for k in range(hop_rules):
        setattr(Machine, f"hop_to_thread_{k}", make_hop(k))
    return Machine


def _defaults(n: int) -> list:
    return in_thread(lambda: [torch.accelerator.current_stream(i) for i in range(n)])


@contract("DM-SET-001", "DM-CTX-001", "ST-CUR-001", "GD-PY-001")
def test_device_and_stream_state_follows_the_model(dt, mod, n, cxx):
    machine = make_machine(dt, mod, n, cxx, _defaults(n), hop_rules=1)
    run_state_machine_as_test(machine, settings=_settings(60))


@contract("DM-THREAD-001", "ST-CUR-001")
def test_state_is_per_thread_across_thread_hops(dt, mod, n, cxx):
    machine = make_machine(dt, mod, n, cxx, _defaults(n), hop_rules=4)
    run_state_machine_as_test(machine, settings=_settings(25))
