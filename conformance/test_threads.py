"""Threads and processes: many threads switching devices, guards and
streams at once, and fork before / after the backend is initialized."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import warnings

import pytest
import torch

from privateuse1_conformance.harness.isolation import read_pipe

from ._helpers import must

contract = pytest.mark.contract

THREADS = 8
ITERATIONS = 40


# ------------------------------------------------------------------ stress


# decides MT-STRESS-001.1 MT-STRESS-001.2
@contract("MT-STRESS-001")
def test_threads_keep_their_own_device_and_streams(dt, mod, n):
    defaults = [torch.accelerator.current_stream(i) for i in range(n)]
    barrier = threading.Barrier(THREADS)
    errors: list[str] = []

    def worker(tid: int) -> None:
        rng = random.Random(1000 + tid)
        device = 0
        streams = list(defaults)

        def check(where: str) -> None:
            seen = {
                "module current_device()": mod.current_device(),
                "torch.accelerator.current_device_index()": torch.accelerator.current_device_index(),
            }
            wrong = {k: v for k, v in seen.items() if v != device}
            if wrong:
                raise AssertionError(f"thread {tid} after {where}: expected device {device}, saw {wrong}")
            for i in range(n):
                current = torch.accelerator.current_stream(i)
                if current != streams[i]:
                    raise AssertionError(
                        f"thread {tid} after {where}: device {i}'s current stream is {current}, "
                        f"expected {streams[i]} (another thread's stream leaked in?)")

        def compute(where: str) -> None:
            value = float(tid * 1000 + rng.randrange(1000))
            t = torch.full((64,), value, device=dt)
            if t.device != torch.device(dt, device):
                raise AssertionError(f"thread {tid} {where}: a new tensor landed on {t.device}, not {dt}:{device}")
            u = t.clone()
            host = u.cpu()
            if not bool((host == value).all()):
                raise AssertionError(f"thread {tid} {where}: wrote {value}, read back {host[:4].tolist()}...")

        try:
            barrier.wait()
            check("thread start")
            own = [torch.Stream(device=torch.device(dt, i)) for i in range(n)]
            for it in range(ITERATIONS):
                op = rng.randrange(7)
                j = rng.randrange(n)
                where = f"iteration {it}"
                if op == 0:
                    mod.set_device(j)
                    device = j
                    check(f"{where}: set_device({j})")
                elif op == 1:
                    saved = device
                    with torch.accelerator.device_index(j):
                        device = j
                        check(f"{where}: entering device_index({j})")
                        compute(f"{where} inside device_index({j})")
                    device = saved
                    check(f"{where}: leaving device_index({j})")
                elif op == 2:
                    saved = device
                    with mod.device(j):
                        device = j
                        check(f"{where}: entering module device({j})")
                    device = saved
                    check(f"{where}: leaving module device({j})")
                elif op == 3:
                    s = own[j] if rng.random() < 0.5 else torch.Stream(device=torch.device(dt, j))
                    saved_device, saved_stream = device, streams[j]
                    with s:
                        # torch: entering the stream that is already current on
                        # its device is a no-op (the device is not switched).
                        if s != saved_stream:
                            device, streams[j] = j, s
                        check(f"{where}: entering 'with stream' on device {j}")
                        compute(f"{where} inside 'with stream'")
                    device, streams[j] = saved_device, saved_stream
                    check(f"{where}: leaving 'with stream' on device {j}")
                elif op == 4:
                    s = own[j] if rng.random() < 0.7 else defaults[j]
                    torch.accelerator.set_stream(s)
                    device, streams[j] = j, s
                    check(f"{where}: set_stream on device {j}")
                elif op == 5:
                    previous = torch._C._accelerator_exchangeDevice(j)
                    if previous != device:
                        raise AssertionError(f"thread {tid} {where}: exchangeDevice({j}) returned {previous}, "
                                             f"the thread's device was {device}")
                    device = j
                    check(f"{where}: exchangeDevice({j})")
                else:
                    compute(f"{where} on the current stream")
                    check(f"{where}: a small operation")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(f"{type(e).__name__}: {e}")
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(tid,), name=f"stress-{tid}") for tid in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # a deadlock is a hang of this test (no progress), reported by the harness
    assert not errors, f"{len(errors)} of {THREADS} threads saw inconsistent state; first: {errors[0]}"
    assert mod.current_device() == 0, "the main thread's device changed while other threads switched devices"
    assert [torch.accelerator.current_stream(i) for i in range(n)] == defaults, \
        "the main thread's current streams changed while other threads switched streams"


# -------------------------------------------------------------------- fork


def run_in_child(body) -> dict:
    """Run `body()` in a forked child; return the dict it returned (JSON).
    Fails the test on a crash or a missing answer. No time limit here: the
    child is in the test's process group, so a child that hangs leaves the
    test without progress and the harness reports the hang."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(read_fd)
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    result = body()
                result["warnings"] = [str(w.message) for w in caught]
            except BaseException as e:  # noqa: BLE001
                result = {"child_error": f"{type(e).__name__}: {e}"}
            data = json.dumps(result).encode()
            while data:
                data = data[os.write(write_fd, data):]
        finally:
            os._exit(0)
    os.close(write_fd)
    try:
        answer, _ = read_pipe(read_fd, float("inf"))
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        pytest.fail(f"the forked child crashed with {signal.Signals(os.WTERMSIG(status)).name}", pytrace=False)
    if not answer:
        pytest.fail("the forked child exited without an answer", pytrace=False)
    return json.loads(answer)


def _error(call) -> dict:
    try:
        value = call()
    except BaseException as e:  # noqa: BLE001
        return {"raised": type(e).__name__, "is_runtime_error": isinstance(e, RuntimeError), "message": str(e)}
    return {"raised": None, "value": repr(value)}


# decides MT-FORK-001.1
@contract("MT-FORK-001")
def test_fork_before_initialization_works(dt, mod):
    assert not mod.is_initialized(), \
        "the backend is initialized before any device use, so no child can be forked before initialization"

    def child() -> dict:
        bad = mod._is_in_bad_fork() if hasattr(mod, "_is_in_bad_fork") else None
        t = torch.full((3,), 2.5, device=dt)
        return {"bad_fork": bad, "values": t.cpu().tolist(), "device": str(t.device)}

    answer = run_in_child(child)
    assert "child_error" not in answer, \
        f"a child forked before the backend was initialized cannot use the device: {answer['child_error']}"
    assert answer["bad_fork"] is not None, \
        "the device module has no _is_in_bad_fork() (torch.manual_seed relies on it)"
    assert answer["bad_fork"] is False, "a child forked before initialization reports _is_in_bad_fork() == True"
    assert answer["values"] == [2.5, 2.5, 2.5], f"the child read back {answer['values']}"
    # The parent is unaffected and can initialize afterwards.
    t = must(lambda: torch.full((2,), 1.5, device=dt), "using the device in the parent after forking a child")
    assert t.cpu().tolist() == [1.5, 1.5]


# decides MT-FORK-001.2 MT-FORK-001.3
@contract("MT-FORK-001")
def test_fork_after_initialization_is_detected(dt, mod, n):
    parent_tensor = torch.full((3,), 4.0, device=dt)
    assert parent_tensor.cpu().tolist() == [4.0] * 3
    assert mod.is_initialized(), "the module's is_initialized() is False after a device tensor was created"
    assert hasattr(mod, "_is_in_bad_fork"), \
        "the device module has no _is_in_bad_fork(): torch.manual_seed and fork detection rely on it"
    assert mod._is_in_bad_fork() is False, "the parent process reports _is_in_bad_fork() == True"

    def child() -> dict:
        answer = {"bad_fork": bool(mod._is_in_bad_fork())}
        answer["device_count"] = _error(mod.device_count)
        answer["manual_seed"] = _error(lambda: torch.manual_seed(1234))
        answer["new_tensor"] = _error(lambda: torch.empty(4, device=dt))
        answer["old_tensor"] = _error(lambda: parent_tensor.cpu())
        return answer

    answer = run_in_child(child)
    assert "child_error" not in answer, f"the forked child failed unexpectedly: {answer['child_error']}"
    assert answer["bad_fork"] is True, \
        "in a child forked after the backend was initialized, _is_in_bad_fork() must be True"
    assert answer["device_count"]["raised"] is None and answer["device_count"]["value"] == repr(n), \
        f"device_count() in a forked child must still answer {n} without raising: {answer['device_count']}"
    assert answer["manual_seed"]["raised"] is None, \
        f"torch.manual_seed in a forked child must skip the device, but raised: {answer['manual_seed']}"
    skipped = [w for w in answer["warnings"] if "does not take effect" in w]
    assert not skipped, f"torch.manual_seed in the forked child warned: {skipped[0]}"
    new = answer["new_tensor"]
    assert new["raised"] is not None, "creating a device tensor in a child forked after initialization succeeded"
    assert new["is_runtime_error"], f"creating a device tensor in a bad fork must raise RuntimeError, got {new}"
    assert "fork" in new["message"].lower(), \
        f"the error for device use in a bad fork must say it is about fork: {new['message']!r}"
    old = answer["old_tensor"]
    assert old["raised"] is not None and old["is_runtime_error"], (
        "reading a device tensor inherited from the parent in a child forked after initialization must raise "
        f"RuntimeError: {old}")
