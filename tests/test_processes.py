"""Tensors and devices across process boundaries: torch.save / torch.load
(PyTorch's PrivateUse1 location tags, map_location), fork before and after
initialization, and the spawn start method. (Generators: test_rng.py.)"""

from __future__ import annotations

import io
import multiprocessing

import pytest
import torch

from _support import N, error_text, run_json

pytestmark = pytest.mark.timeout(120)


def save(obj) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


def load(buffer: io.BytesIO, **kwargs):
    buffer.seek(0)
    return torch.load(buffer, **kwargs)


def sample(index: int) -> dict[str, torch.Tensor]:
    base = torch.arange(24.0, device=f"openreg:{index}") * (index + 1)
    return {"base": base, "view": base.view(4, 6).t()[1:], "int": torch.arange(5, device=f"openreg:{index}"),
            "half": base.half()}


# ---------------------------------------------------------- serialization


def test_round_trip_keeps_each_device_values_and_views(n_devices):
    original = {i: sample(i) for i in range(n_devices)}
    torch.openreg.set_device(0)
    loaded = load(save(original))
    for i in range(n_devices):
        for key, tensor in original[i].items():
            got = loaded[i][key]
            assert got.device == torch.device("openreg", i), f"{key} of openreg:{i} came back on {got.device}"
            assert got.dtype == tensor.dtype and got.stride() == tensor.stride()
            assert torch.equal(got.cpu(), tensor.cpu())
        assert loaded[i]["view"].untyped_storage().data_ptr() == loaded[i]["base"].untyped_storage().data_ptr(), (
            "a view and its base were loaded into separate storages")
    assert torch.openreg.current_device() == 0, "torch.load changed the current device"


def test_map_location_cpu(n_devices):
    original = sample(n_devices - 1)
    for location in ("cpu", torch.device("cpu"), {f"openreg:{n_devices - 1}": "cpu"}):
        loaded = load(save(original), map_location=location)
        for key, tensor in original.items():
            assert loaded[key].device.type == "cpu", f"map_location={location!r}: {key} on {loaded[key].device}"
            assert torch.equal(loaded[key], tensor.cpu())


def test_map_location_second_device(two_devices):
    original = sample(0)
    for location in ("openreg:1", torch.device("openreg", 1), {"openreg:0": "openreg:1"}):
        loaded = load(save(original), map_location=location)
        for key, tensor in original.items():
            assert loaded[key].device == torch.device("openreg", 1), (
                f"map_location={location!r}: {key} loaded on {loaded[key].device}")
            assert torch.equal(loaded[key].cpu(), tensor.cpu())
    torch.openreg.set_device(1)
    loaded = load(save(original), map_location="openreg")
    assert loaded["base"].device == torch.device("openreg", 1), "map_location='openreg' is not the current device"


def test_map_location_beyond_the_device_count_is_a_clear_error(n_devices):
    buffer = save(sample(0))
    for location in (f"openreg:{n_devices}", {"openreg:0": f"openreg:{n_devices + 3}"}):
        with pytest.raises(RuntimeError) as excinfo:
            load(buffer, map_location=location)
        message = error_text(excinfo)
        wanted = n_devices if isinstance(location, str) else n_devices + 3
        assert f"device {wanted}" in message and f"device_count() is {n_devices}" in message, message
        assert "map_location" in message, f"the error does not say how to fix it: {message}"


# ------------------------------------------------------------------- fork


def test_fork_before_initialization_works_and_after_initialization_fails_cleanly():
    """One fresh process: a child forked before OpenReg initializes uses the
    device; then the parent initializes, and children forked afterwards
    report _is_in_bad_fork() and get a clear error from every device use
    (no hang, no crash: each child exits normally)."""
    r = run_json("""
        import os

        def in_child(fn):
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                try:
                    out = ["ok", fn()]
                except BaseException as e:
                    out = ["raised", type(e).__name__, str(e).splitlines()[0]]
                os.write(write, json.dumps(out).encode())
                os._exit(0)
            os.close(write)
            data = b""
            while chunk := os.read(read, 1 << 16):
                data += chunk
            _, status = os.waitpid(pid, 0)
            return [os.waitstatus_to_exitcode(status), json.loads(data or b"null")]

        r = {"before": in_child(lambda: [torch.openreg._is_in_bad_fork(),
                                         torch.ones(3, device="openreg:1").sum().item(),
                                         torch.openreg.is_initialized()])}
        r["parent_initialized_after_first_child"] = torch.openreg.is_initialized()
        x = torch.ones(3, device="openreg")
        r["state"] = in_child(lambda: [torch.openreg._is_in_bad_fork(), torch.openreg.is_initialized(),
                                       torch.openreg.device_count(), torch.openreg.is_available()])
        uses = {
            "new tensor": lambda: torch.ones(3, device="openreg").tolist(),
            "inherited tensor": lambda: x.cpu().tolist(),
            "current_device": torch.openreg.current_device,
            "synchronize": torch.openreg.synchronize,
            "stream": lambda: torch.openreg.Stream().query(),
            "random": lambda: torch.randn(2, device="openreg").tolist(),
        }
        r["uses"] = {name: in_child(fn) for name, fn in uses.items()}
        r["parent_still_works"] = (x * 2).sum().item()
        emit(r)
    """)
    assert r["before"] == [0, ["ok", [False, 3.0, True]]], f"child forked before init: {r['before']}"
    assert r["parent_initialized_after_first_child"] is False
    assert r["state"] == [0, ["ok", [True, False, N, N > 0]]], f"child forked after init: {r['state']}"
    for name, (exit_code, outcome) in r["uses"].items():
        assert exit_code == 0, f"{name} in a bad-fork child: exit code {exit_code} (crash?)"
        assert outcome[0] == "raised", f"{name} in a bad-fork child succeeded: {outcome}"
        kind, message = outcome[1:]
        assert kind == "RuntimeError" and "fork" in message and "spawn" in message, (
            f"{name} in a bad-fork child: unclear error {kind}: {message}")
    assert r["parent_still_works"] == 6.0


# ------------------------------------------------------------------ spawn


def spawned_worker(index: int) -> list:
    """Runs in a spawned child: a fresh interpreter that imports openreg."""
    import torch

    import openreg  # noqa: F401

    x = torch.arange(4.0, device=f"openreg:{index}")
    return [torch.openreg.is_initialized(), torch.openreg._is_in_bad_fork(), str(x.device), (x * 2).sum().item()]


def test_spawn_start_method_children_use_the_device(n_devices):
    torch.ones(1, device="openreg")  # the parent is initialized: fork would be a bad fork
    index = n_devices - 1
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        result = pool.apply_async(spawned_worker, (index,)).get(timeout=90)
    assert result == [True, False, f"openreg:{index}", 12.0], result
