"""OpenReg's Inductor backend (openreg/_inductor.py,
docs/reference-backend/inductor.md): torch.compile's default compiler on
the openreg device. Compiled code must match eager, forward and backward;
its kernels must run on the device their tensors are on, on that device's
current stream, asynchronously; the host must never read device memory (it
would fault); the current device must be the caller's again after a call;
and a kernel that fails must fail the way an OpenReg kernel does (the
stream's next synchronization raises its message).
"""

from __future__ import annotations

import pytest
import torch

import openreg
from openreg import _inductor
from openreg.conformance_profile import block_stream


def _models():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 10))
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10))
    return {"mlp": (mlp, (16, 32)), "cnn": (cnn, (4, 3, 16, 16))}


def _forward_backward(model, x):
    for p in model.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_()
    out = model(x)
    out.square().sum().backward()
    return out.detach().cpu(), x.grad.cpu(), [p.grad.cpu() for p in model.parameters()]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_compiled_models_match_eager_forward_and_backward(name, dynamic):
    model, shape = _models()[name]
    model = model.to("openreg")
    x = torch.randn(shape, device="openreg")
    eager = _forward_backward(model, x)
    compiled = _forward_backward(torch.compile(model, dynamic=dynamic), x)
    torch.testing.assert_close(compiled[0], eager[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(compiled[1], eager[1], atol=1e-4, rtol=1e-4)
    for got, expected in zip(compiled[2], eager[2]):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_dynamic_shapes_compile_once_for_every_batch_size():
    torch._dynamo.reset()
    model, _ = _models()["mlp"]
    model = model.to("openreg")
    compiled = torch.compile(model, dynamic=True)
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for batch in (3, 7, 16):
        x = torch.randn(batch, 32, device="openreg")
        torch.testing.assert_close(compiled(x).cpu(), model(x).cpu(), atol=1e-4, rtol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 1


def test_each_kernel_runs_on_its_tensors_device_and_the_current_device_stays(two_devices):
    def f(a, b):
        # The second result is pointwise: the CPU's scheduler would fuse it
        # with the first's reduction if they were on one device.
        return (a.sin() + 1).sum(), b.cos() * 2 - b

    compiled = torch.compile(f)
    a = torch.randn(100, device="openreg:0")
    b = torch.randn(100, device="openreg:1")
    for current in (0, 1):
        torch.openreg.set_device(current)
        ra, rb = compiled(a, b)
        assert (ra.device, rb.device) == (a.device, b.device)
        assert torch.openreg.current_device() == current
        expected = f(a.cpu(), b.cpu())
        torch.testing.assert_close(ra.cpu(), expected[0])
        torch.testing.assert_close(rb.cpu(), expected[1])


def test_kernels_run_asynchronously_on_the_current_stream():
    """A compiled call on a held stream returns at once, its kernel queued
    there (not on the default stream); the result is right once the stream
    runs."""

    @torch.compile
    def f(x):
        return (x.sin() * 2 + 1).cos()

    x = torch.randn(1000, device="openreg:0")
    f(x)  # compiled and warm
    torch.openreg.synchronize()
    stream = torch.openreg.Stream(0)
    with torch.openreg.stream(stream):
        open_gate = block_stream(stream)
        try:
            y = f(x)
            assert not stream.query(), "the compiled call waited for its kernel"
            assert torch.openreg.default_stream(0).query(), "the kernel went to the default stream"
        finally:
            open_gate()
        stream.synchronize()
    torch.testing.assert_close(y.cpu(), (x.cpu().sin() * 2 + 1).cos())


def test_a_failing_kernel_raises_at_the_next_synchronization_and_the_device_goes_on():
    @torch.compile
    def f(a, b):
        return (a // b) + 1

    a = torch.arange(10, device="openreg")
    b = torch.zeros(10, dtype=torch.long, device="openreg")
    with pytest.raises(RuntimeError, match="an Inductor kernel threw"):
        f(a, b)
        torch.openreg.synchronize()
    assert (torch.ones(2, device="openreg") + 1).cpu().tolist() == [2.0, 2.0]


def test_a_kernel_refuses_host_tensors():
    """A compiled OpenReg kernel never reads host memory: the launcher
    refuses a CPU tensor, naming the argument."""
    launcher = _inductor.compile(
        ["const float*", "float*", "const int64_t"],
        '#include <torch/csrc/inductor/cpp_prefix.h>\n'
        'extern "C" void kernel(const float* in_ptr0, float* out_ptr0, const int64_t n)\n'
        '{ for (int64_t i = 0; i < n; ++i) out_ptr0[i] = in_ptr0[i] + 1; }\n')
    x = torch.arange(4.0, device="openreg")
    out = torch.empty(4, device="openreg")
    launcher(x, out, 4)
    assert out.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(TypeError, match="argument 1 is on cpu"):
        launcher(x, torch.empty(4), 4)
    # A 0-dim CPU tensor the kernel would write is refused too (its value
    # travels to the kernel; nothing would come back).
    with pytest.raises(TypeError, match="argument 1 is a CPU tensor the kernel writes"):
        launcher(x, torch.tensor(0.0), 4)
    if torch.openreg.device_count() > 1:
        with pytest.raises(RuntimeError, match="argument 1 is on openreg:1"):
            launcher(x, torch.empty(4, device="openreg:1"), 4)


def test_a_kernel_takes_host_scalars_by_value():
    """A 0-dim CPU tensor next to OpenReg tensors is read at the launch, as a
    GPU kernel's by-value argument: changing it afterwards, before the
    kernel ran, does not change what the kernel computes."""
    launcher = _inductor.compile(
        ["const float*", "const float*", "float*", "const int64_t"],
        '#include <torch/csrc/inductor/cpp_prefix.h>\n'
        'extern "C" void kernel(const float* in_ptr0, const float* in_ptr1, float* out_ptr0, const int64_t n)\n'
        '{ for (int64_t i = 0; i < n; ++i) out_ptr0[i] = in_ptr0[i] * in_ptr1[0]; }\n')
    x = torch.arange(4.0, device="openreg")
    out = torch.empty(4, device="openreg")
    scalar = torch.tensor(3.0)
    stream = torch.openreg.current_stream()
    gate = block_stream(stream)
    try:
        launcher(x, scalar, out, 4)
        scalar.fill_(-1.0)  # before the kernel runs
    finally:
        gate()
    assert out.cpu().tolist() == [0.0, 3.0, 6.0, 9.0]


MIXED = """
import json, sys, torch, openreg
def f(a, b):
    return (a.sin() * 2 + 1).sum(dim=0), b.cos() - b
a, b = torch.randn(64, 8).to("openreg:1"), torch.randn(32, 4).to("openreg:0")
try:
    print(json.dumps([str(r.device) for r in torch.compile(f)(a, b)]))
except Exception as error:
    print(json.dumps(str(error)))
"""


@pytest.mark.woven
def test_code_generated_under_a_mutant_is_not_served_to_the_backend(two_devices, tmp_path):
    """Inductor's FX graph cache outlives the process, keyed by what
    Inductor knows: a selected mutant gets a cache folder of its own
    (mutation/pyhook.py), so code generated under a mutant is never served
    to the unmutated backend that was given the same folder."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("OPENREG_MUTANT", None)

    def run(mutant=None):
        extra = {"OPENREG_MUTANT": mutant} if mutant else {}
        proc = subprocess.run([sys.executable, "-c", MIXED], env={**env, **extra}, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert "a kernel runs on one device" in run("inductor-buffers-on-current-device")
    assert run() == ["openreg:1", "openreg:0"]


def test_kernels_are_compiled_once():
    """The same graph compiled again (a fresh dynamo cache) reuses the
    compiled kernels, as the CPU's code cache does."""

    def f(x):
        return torch.tanh(x) * 3 - 1

    x = torch.randn(64, device="openreg")
    torch._dynamo.reset()
    torch.compile(f)(x)
    compiled = len(_inductor.KernelCache.cache)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(f)(x).cpu(), f(x.cpu()))
    assert len(_inductor.KernelCache.cache) == compiled


def test_the_device_interface_answers_the_device_class_questions():
    """What torch 2.15's Inductor asks of the interface (the methods exist on
    every release; earlier ones never call them): not a GPU-class device
    (its kernels are CPU-style C++), streams exposed, and as many compute
    units as the device properties say."""
    from torch._dynamo.device_interface import get_interface_for_device

    interface = get_interface_for_device("openreg")
    assert interface.is_gpu() is False
    assert interface.Stream is openreg.Stream
    for device in (None, 0, 1, "openreg:1", torch.device("openreg", 0)):
        count = interface.get_multi_processor_count(device)
        assert count == openreg.get_device_properties(device).multi_processor_count > 0
