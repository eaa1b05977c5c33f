"""torch.compile with its default compiler, Inductor (DI-INDUCTOR-001,
optional feature ``inductor``).

DI-COMPILE-001 checks what every backend needs for torch.compile (dynamo
and AOTAutograd over the device's eager kernels, backend="aot_eager").
Inductor additionally generates kernels for the device, through the code
generators a backend registers (register_backend_for_device), and calls
them from generated Python. What a user of the device relies on, and what
these checks observe whatever kernel language the backend chose (Triton,
C++, its own): compiled results are eager's, forward and backward, with
static and dynamic shapes; compiled code runs on its tensors' device and
leaves the caller's current device as it was; and compiled kernels run on
the caller's current stream, in order with the work that stream waits for.
A backend that runs compiled kernels synchronously keeps every rule.
"""

from __future__ import annotations

import pytest
import torch

from ._async import check_producer_consumer
from ._helpers import check, must, scope

contract = pytest.mark.contract

CLAUSE_RESULTS = "DI-INDUCTOR-001.1"
CLAUSE_DEVICE = "DI-INDUCTOR-001.2"
CLAUSE_STREAM = "DI-INDUCTOR-001.3"
CLAUSE_SCALARS = "DI-INDUCTOR-001.4"
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


def _model(name: str):
    torch.manual_seed(0)
    # Each starts with a normalization, which Inductor generates kernels for
    # (a matmul or a convolution would read the input through ATen).
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.LayerNorm(32), torch.nn.Linear(32, 64), torch.nn.GELU(),
                                   torch.nn.Linear(64, 10)), (16, 32)
    return torch.nn.Sequential(
        torch.nn.BatchNorm2d(3), torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, 10)), (4, 3, 16, 16)


def _forward_backward(model, x):
    """Outputs, the input's gradient and the parameters' gradients, on the CPU."""
    for p in model.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    out = model(x)
    out.square().sum().backward()
    return [out.detach().cpu(), x.grad.cpu(), *(p.grad.cpu() for p in model.parameters())]


def _mismatch(got, expected) -> str | None:
    names = ["the output", "the input's gradient"] + [f"parameter {k}'s gradient" for k in range(len(got) - 2)]
    for name, g, e in zip(names, got, expected):
        try:
            torch.testing.assert_close(g, e, **TOLERANCE)
        except AssertionError as error:
            return f"{name}: {' '.join(str(error).split())[:400]}"
    return None


# decides DI-INDUCTOR-001.1
@contract("DI-INDUCTOR-001")
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_compiled_models_match_eager(dt, name, dynamic):
    """torch.compile(model) (Inductor, the default) gives eager's outputs and
    gradients. The input is a view at an offset into a larger tensor, as
    compiled code is often given."""
    import torch._dynamo

    torch._dynamo.reset()
    model, shape = _model(name)
    model = must(lambda: model.to(dt), f"moving the {name} to {dt}")
    base = torch.randn((shape[0] + 1, *shape[1:])).to(dt)
    x = base[1:]
    eager = _forward_backward(model, x)
    what = f"torch.compile({name}{', dynamic=True' if dynamic else ''}) forward and backward on {dt}"
    with scope(CLAUSE_RESULTS):
        compiled = must(lambda: _forward_backward(torch.compile(model, dynamic=dynamic), x), what)
    problem = _mismatch(compiled, eager)
    check(CLAUSE_RESULTS, problem is None, lambda: f"{what} differs from eager: {problem}")


# decides DI-INDUCTOR-001.2
@contract("DI-INDUCTOR-001")
@pytest.mark.requires("multi-device")
def test_compiled_code_runs_on_its_tensors_device(dt, n):
    """One compiled function of a tensor on the last device and a tensor on
    device 0, called with device 0 current and with the last current,
    returns each result on its inputs' device with eager's values, and the
    caller's current device is current again after the call."""
    import torch._dynamo

    torch._dynamo.reset()

    def program(a, b):
        return (a.sin() * 2 + 1).sum(dim=0), b.cos() - b

    compiled = torch.compile(program)
    last = n - 1
    a = torch.randn(64, 8).to(f"{dt}:{last}")
    b = torch.randn(32, 4).to(f"{dt}:0")
    expected = program(a.cpu(), b.cpu())
    for current in (0, last):
        torch.accelerator.set_device_index(current)
        try:
            what = f"a compiled function of {dt}:{last} and {dt}:0 tensors while {dt}:{current} is current"
            with scope(CLAUSE_DEVICE):
                results = must(lambda: compiled(a, b), what)
            after = torch.accelerator.current_device_index()
        finally:
            torch.accelerator.set_device_index(0)
        devices = [str(r.device) for r in results]
        check(CLAUSE_DEVICE, devices == [str(a.device), str(b.device)],
              lambda: f"{what} returned tensors on {devices}, expected {[str(a.device), str(b.device)]}")
        check(CLAUSE_DEVICE, after == current,
              f"after {what}, the current device is {after}: compiled code must leave the caller's current device")
        problem = next((str(e)[:300] for g, e in zip(results, expected)
                        if not torch.allclose(g.cpu(), e, **TOLERANCE)), None)
        check(CLAUSE_DEVICE, problem is None, lambda: f"{what} differs from eager")


def compiled_consumer(dt):
    """The consumer of check_producer_consumer: the current stream waits for
    the producer (eagerly), then compiled code reads what the producer
    wrote, on the current stream. (t * 2) * 0.5 is t exactly, computed by a
    generated kernel."""
    import torch._dynamo

    torch._dynamo.reset()
    program = torch.compile(lambda t: (t * 2) * 0.5)

    def consume(producer, consumer, consumed, produced):
        consumer.wait_stream(producer)
        with consumer:
            return must(lambda: program(produced), "a compiled function called with the consumer stream current")

    return consume


# decides DI-INDUCTOR-001.3
@contract("DI-INDUCTOR-001")
@pytest.mark.parametrize("consumer_is_current", [False, True], ids=["new-consumer", "current-consumer"])
def test_compiled_kernels_run_on_the_current_stream(dt, backend, consumer_is_current):
    """Compiled kernels are queued on the caller's current stream: after that
    stream waited for held work on another stream, a compiled call reads
    that work's result (a kernel on any other stream reads the old one).
    The compiled function runs once before the observation, so that
    compiling is not mistaken for the wait."""
    check_producer_consumer(dt, backend, None, consumer_is_current, CLAUSE_STREAM,
                            "a compiled (Inductor) function called on a stream that waits for the producer",
                            consume=compiled_consumer(dt))


def _optimizers(params):
    """The common optimizers, each over its own parameters, as training
    code keeps them: SGD with momentum, Adam and AdamW (whose step counters
    are 0-dim CPU tensors unless capturable=True)."""
    return [torch.optim.SGD(params[0:1], lr=0.1, momentum=0.9),
            torch.optim.Adam(params[1:2], lr=0.01),
            torch.optim.AdamW(params[2:3], lr=0.01, weight_decay=0.1)]


# decides DI-INDUCTOR-001.4
@contract("DI-INDUCTOR-001")
def test_compiled_code_reads_host_scalars(dt):
    """PyTorch's type promotion lets 0-dim CPU tensors (host scalars) mix
    with device tensors, and compiled code must take them as eager code
    does: a compiled function of a device tensor and a host scalar gives
    eager's result, also after the scalar changed in place (its value at
    each call, not the first); and compiled training steps of SGD with
    momentum, Adam and AdamW (whose step counters are host scalars) update
    their parameters as the same optimizers do in eager mode, step after
    step."""
    import torch._dynamo

    torch._dynamo.reset()
    x = torch.randn(64).to(dt)
    scalar = torch.tensor(2.0)
    compiled = torch.compile(lambda t, s: t * s + 1)
    for value in (2.0, -3.0):
        scalar.fill_(value)
        what = f"a compiled function of a {dt} tensor and a 0-dim CPU tensor holding {value}"
        with scope(CLAUSE_SCALARS):
            got = must(lambda: compiled(x, scalar).cpu(), what)
        expected = x.cpu() * value + 1
        check(CLAUSE_SCALARS, torch.allclose(got, expected, **TOLERANCE),
              lambda: f"{what} returned values up to {(got - expected).abs().max().item():.3g} from eager's")

    torch.manual_seed(0)
    initial = [torch.randn(8, 4) for _ in range(3)]
    grads = [[torch.randn(8, 4) for _ in range(3)] for _ in range(2)]
    eager_params = [p.to(dt).requires_grad_() for p in initial]
    compiled_params = [p.to(dt).requires_grad_() for p in initial]
    eager_opts, compiled_opts = _optimizers(eager_params), _optimizers(compiled_params)

    @torch.compile
    def compiled_step():
        for optimizer in compiled_opts:
            optimizer.step()

    names = ["SGD (momentum 0.9)", "Adam", "AdamW"]
    for number, step_grads in enumerate(grads, 1):
        for p, q, g in zip(eager_params, compiled_params, step_grads):
            p.grad, q.grad = g.to(dt), g.to(dt)
        for optimizer in eager_opts:
            optimizer.step()
        what = f"step {number} of compiled SGD, Adam and AdamW on {dt} parameters"
        with scope(CLAUSE_SCALARS):
            must(compiled_step, what)
        for name, p, q in zip(names, eager_params, compiled_params):
            got, expected = q.detach().cpu(), p.detach().cpu()
            check(CLAUSE_SCALARS, torch.allclose(got, expected, rtol=1e-5, atol=1e-6),
                  lambda: f"{what}: {name}'s parameters differ from eager's by up to "
                          f"{(got - expected).abs().max().item():.3g}")


# decides DI-INDUCTOR-002.1
@contract("DI-INDUCTOR-002")
def test_multi_processor_count(dt, n):
    from torch._dynamo.device_interface import get_interface_for_device

    iface = get_interface_for_device(dt)
    for device in (None, 0, n - 1, f"{dt}:{n - 1}", torch.device(dt, 0)):
        count = must(lambda device=device: iface.get_multi_processor_count(device),
                     f"DeviceInterface.get_multi_processor_count({device!r}) (Inductor reads it for every reduction)")
        check("DI-INDUCTOR-002.1", isinstance(count, int) and not isinstance(count, bool) and count > 0,
              f"DeviceInterface.get_multi_processor_count({device!r}) is {count!r}, not a positive int")
        try:
            properties = iface.get_device_properties(device)
        except Exception:  # noqa: BLE001 - no properties to compare with: any positive count passes
            properties = None
        expected = getattr(properties, "multi_processor_count", None)
        if expected is not None:
            check("DI-INDUCTOR-002.1", count == expected,
                  f"DeviceInterface.get_multi_processor_count({device!r}) is {count}, the device properties say "
                  f"multi_processor_count = {expected}")
