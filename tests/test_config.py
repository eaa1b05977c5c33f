"""Process configuration: OPENREG_DEVICE_COUNT and OPENREG_DEVICE_MEMORY are
read once per process, so each configuration runs in its own subprocess.
(The default configuration, 0 devices and 4 devices are covered by
test_acceptance.py and the fresh-process tests; 1 MiB devices by test_memory.py.)"""

from __future__ import annotations

import json

import pytest

import torch

from _support import run_json, run_python

GiB = 1 << 30

# Reports what every entry point says about the configuration and tries to use
# the devices; errors are reported as strings, so the child never crashes.
PROBE = """
    import warnings
    r = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r["count"] = torch.openreg.device_count()
        r["available"] = torch.openreg.is_available()
    r["py_warnings"] = [str(w.message) for w in caught]
    r["acc_count"] = torch.accelerator.device_count()
    r["acc_available"] = torch.accelerator.is_available()
    r["hooks_count"] = _cxx.hooks_device_count()
    r["hooks_available"] = _cxx.hooks_is_available()
    r["guard_count"] = _cxx.guard_device_count()
    r["generators"] = len(torch.openreg.default_generators)
    def attempt(fn):
        try:
            return ["ok", fn()]
        except Exception as e:
            return [type(e).__name__, str(e).splitlines()[0]]
    n = r["count"]
    r["memory"] = [attempt(lambda i=i: torch.openreg.mem_get_info(i)[1]) for i in (0, 1, n - 1)]
    last = max(n - 1, 0)
    r["tensor_on_last"] = attempt(lambda: torch.ones(3, device=f"openreg:{last}").cpu().sum().item())
    r["set_last"] = attempt(lambda: (torch.openreg.set_device(last), torch.openreg.current_device())[1])
    r["set_n"] = attempt(lambda: torch.openreg.set_device(n))
    print(json.dumps(r), flush=True)
"""


def probe(env: dict[str, str]) -> tuple[dict, str]:
    rc, out, err = run_python(PROBE, env=env)
    assert rc == 0, f"with {env} the probe died with rc {rc}\nstdout:\n{out}\nstderr:\n{err}"
    return json.loads(out.strip().splitlines()[-1]), err


def assert_consistent(r: dict, n: int) -> None:
    counts = {k: r[k] for k in ("count", "acc_count", "hooks_count", "guard_count", "generators")}
    assert set(counts.values()) == {n}, f"expected {n} devices everywhere: {counts}"
    avail = {k: r[k] for k in ("available", "acc_available", "hooks_available")}
    assert set(avail.values()) == {n > 0}, f"availability with {n} devices: {avail}"


@pytest.mark.parametrize("count,memory,expected_total", [
    ("1", "64K", 64 << 10),
    ("127", None, 4 * GiB),
], ids=["1-device-64K", "127-devices-default-4GiB"])
def test_valid_configurations(count, memory, expected_total):
    """Device count 1..127 and per-device memory (with suffixes) are honoured everywhere."""
    env = {"OPENREG_DEVICE_COUNT": count}
    if memory is not None:
        env["OPENREG_DEVICE_MEMORY"] = memory
    r, _ = probe(env)
    n = int(count)
    assert_consistent(r, n)
    assert r["memory"][0] == r["memory"][2] == ["ok", expected_total], (
        f"OPENREG_DEVICE_MEMORY={memory}: memory totals {r['memory']}")
    if n == 1:
        kind, message = r["memory"][1]
        assert kind == "RuntimeError" and "[0, 1)" in message, f"mem_get_info(1): {r['memory'][1]}"
    assert r["tensor_on_last"] == ["ok", 3.0], f"using openreg:{n - 1}: {r['tensor_on_last']}"
    assert r["set_last"] == ["ok", n - 1]
    kind, message = r["set_n"]
    assert kind == "RuntimeError" and f"[0, {n})" in message, f"set_device({n}): {r['set_n']}"


@pytest.mark.parametrize("name,value", [
    ("OPENREG_DEVICE_COUNT", "128"),
    ("OPENREG_DEVICE_COUNT", "-1"),
    ("OPENREG_DEVICE_COUNT", "abc"),
    ("OPENREG_DEVICE_MEMORY", "lots"),
    ("OPENREG_EXECUTOR", "processes"),
], ids=["count-128", "count-minus-1", "count-abc", "memory-garbage", "executor-garbage"])
def test_invalid_configuration_means_zero_devices_with_a_warning(name, value):
    """Rejected values: device_count() is 0 with a warning naming the setting, every
    entry point agrees, is_available() is False, device use is a clean RuntimeError naming
    the setting, and nothing crashes."""
    r, err = probe({name: value})
    assert_consistent(r, 0)
    setting = f"{name}='{value}'"
    warned = [w for w in r["py_warnings"] if setting in w] or (setting in err and "Warning" in err)
    assert warned, (f"no warning naming {setting} (Python warnings: {r['py_warnings']}; "
                    f"stderr:\n{err})")
    kind, message = r["tensor_on_last"]
    assert kind == "RuntimeError" and setting in message, (
        f"device use with {setting} should be a RuntimeError naming it: {r['tensor_on_last']}")
    # Every entry point that validates an index says why there are none (the
    # audit found mem_get_info(0) saying only "there are no OpenReg devices").
    for outcome in [*r["memory"], r["set_last"]]:
        kind, message = outcome
        assert kind == "RuntimeError" and setting in message, (
            f"with {setting}, {outcome} should be a RuntimeError naming the setting")


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_both_execution_modes_run_pytorch_operators_where_the_mode_says(mode):
    """OPENREG_EXECUTOR picks where devices run; PyTorch's operators work in
    both, and in process mode the device has an executor process of its own
    that computes the queued operators."""
    r = run_json("""
        import os
        x = torch.arange(64.0, device="openreg").view(8, 8)
        y = (x @ x.t()).sum(dim=1)
        value = y.cpu().tolist()
        try:
            pid = openreg._C._executor_pid(0)
        except RuntimeError as e:
            pid = str(e)
        emit({"process_mode": openreg._C._process_mode(), "value": value, "pid": pid,
              "host": os.getpid()})
    """, env={"OPENREG_EXECUTOR": mode})
    x = torch.arange(64.0).view(8, 8)
    assert r["value"] == (x @ x.t()).sum(dim=1).tolist()
    assert r["process_mode"] == (mode == "process")
    if mode == "process":
        assert isinstance(r["pid"], int) and r["pid"] != r["host"]
    else:
        assert "thread mode" in r["pid"] or "process mode" in r["pid"], r["pid"]
