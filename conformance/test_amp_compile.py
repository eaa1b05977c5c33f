"""Automatic mixed precision (torch.autocast on the device) and torch.compile
(dynamo's DeviceInterface, and compiling a model on the device).

Both are optional features ('amp', 'compile'): a backend that does not
claim them gets not-claimed, without blocking its level.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from ._helpers import answer_in_new_interpreter, check, inconclusive, must, scope
from ._async import SCALES, Load, check_producer_consumer, hold, new_stream, unobserved, waited

contract = pytest.mark.contract


# ---------------------------------------------------------------------- AMP


# decides AC-DTYPE-001.1
def advertised(mod) -> list[torch.dtype]:
    function = getattr(mod, "get_amp_supported_dtype", None)
    assert callable(function), (
        "the device module has no get_amp_supported_dtype(): torch.autocast(device_type=<name>) "
        "requires it (return the dtypes that have AutocastPrivateUse1 kernels)")
    dtypes = must(function, "get_amp_supported_dtype()")
    assert isinstance(dtypes, (list, tuple)) and all(isinstance(d, torch.dtype) for d in dtypes), \
        f"get_amp_supported_dtype() must return a list of torch.dtype, got {dtypes!r}"
    assert dtypes, "get_amp_supported_dtype() advertises no dtype; a backend without AMP should not claim 'amp'"
    return list(dtypes)


def operands(dt: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    cpu = {
        "a": torch.randn(16, 32, generator=generator),
        "b": torch.randn(32, 8, generator=generator),
        "w": torch.randn(8, 32, generator=generator),
        "bias": torch.randn(8, generator=generator),
    }
    return {k: v.to(dt) for k, v in cpu.items()}


def autocast_ops(t: dict[str, torch.Tensor]):
    return {
        "torch.mm": lambda: torch.mm(t["a"], t["b"]),
        "torch.matmul": lambda: torch.matmul(t["a"], t["b"]),
        "a @ b": lambda: t["a"] @ t["b"],
        "F.linear": lambda: F.linear(t["a"], t["w"], t["bias"]),
    }


def reference(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    cpu = {k: v.cpu() for k, v in t.items()}
    return {name: op().cpu() for name, op in autocast_ops(cpu).items()}


# decides AC-DTYPE-001.2
@contract("AC-DTYPE-001")
def test_autocast_casts_for_every_advertised_dtype(dt, mod):
    dtypes = advertised(mod)
    t = operands(dt)
    expected = reference(t)
    for dtype in dtypes:
        eps = torch.finfo(dtype).eps if dtype.is_floating_point else 1.0
        with torch.autocast(device_type=dt, dtype=dtype):
            assert torch.is_autocast_enabled(dt), f"inside torch.autocast({dt!r}, dtype={dtype}) autocast is disabled"
            assert torch.get_autocast_dtype(dt) == dtype, \
                f"inside torch.autocast({dt!r}, dtype={dtype}), get_autocast_dtype is {torch.get_autocast_dtype(dt)}"
            outputs = {name: must(op, f"{name} under torch.autocast({dt!r}, dtype={dtype})")
                       for name, op in autocast_ops(t).items()}
            with torch.autocast(device_type=dt, enabled=False):
                inner = torch.mm(t["a"], t["b"])
        assert inner.dtype == torch.float32, \
            f"torch.mm inside a nested torch.autocast({dt!r}, enabled=False) returned {inner.dtype}"
        for name, out in outputs.items():
            assert out.device.type == dt, f"{name} under autocast returned a tensor on {out.device}"
            assert out.dtype == dtype, (
                f"{name} under torch.autocast({dt!r}, dtype={dtype}) returned {out.dtype}: the backend advertises "
                f"{dtype} but does not cast (register AutocastPrivateUse1 kernels with the lower_precision_fp "
                f"policy for mm/matmul/linear, or stop advertising {dtype})")
            ref = expected[name]
            tolerance = 16 * eps
            torch.testing.assert_close(out.float().cpu(), ref, rtol=tolerance, atol=tolerance * ref.abs().max().item(),
                                       msg=lambda m, name=name, dtype=dtype: f"{name} under autocast({dtype}): {m}")
        assert not torch.is_autocast_enabled(dt), "autocast stayed enabled after leaving torch.autocast"
        after = torch.mm(t["a"], t["b"])
        assert after.dtype == torch.float32, f"torch.mm after leaving autocast returned {after.dtype}"


# decides AC-DTYPE-001.2
@contract("AC-DTYPE-001")
def test_autocast_backward(dt, mod):
    dtype = advertised(mod)[0]
    a = torch.randn(8, 16, device=dt, requires_grad=True)
    b = torch.randn(16, 4, device=dt, requires_grad=True)
    with torch.autocast(device_type=dt, dtype=dtype):
        out = torch.mm(a, b)
    must(lambda: out.float().sum().backward(), f"backward through torch.mm under autocast({dtype})")
    assert a.grad is not None and a.grad.dtype == torch.float32 and a.grad.device == a.device, \
        f"the gradient of an fp32 leaf under autocast is {None if a.grad is None else (a.grad.dtype, a.grad.device)}"
    expected = torch.ones(8, 4) @ b.detach().cpu().t()
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(a.grad.cpu(), expected, rtol=16 * eps, atol=16 * eps * expected.abs().max().item())


# decides AC-DTYPE-001.3
@contract("AC-DTYPE-001")
def test_default_autocast_dtype_is_advertised(dt, mod):
    """torch.autocast(<name>) without a dtype uses get_autocast_dtype(<name>);
    if that dtype is not advertised, plain autocast silently disables itself."""
    dtypes = advertised(mod)
    default = torch.get_autocast_dtype(dt)
    assert default in dtypes, (
        f"torch.get_autocast_dtype({dt!r}) is {default}, which get_amp_supported_dtype() does not advertise "
        f"({dtypes}): torch.autocast({dt!r}) without dtype= warns and disables itself; call "
        f"torch.set_autocast_dtype({dt!r}, one_of_them) when the backend loads")
    t = operands(dt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast(device_type=dt):
            out = torch.mm(t["a"], t["b"])
    assert out.dtype == default, f"torch.mm under torch.autocast({dt!r}) returned {out.dtype}, not {default}"


# decides AC-DTYPE-001.4
@contract("AC-DTYPE-001")
def test_unsupported_autocast_dtype_warns_and_disables(dt, mod):
    dtypes = advertised(mod)
    candidates = [d for d in (torch.float64, torch.float32) if d not in dtypes]
    if not candidates:
        inconclusive("the backend advertises float64 and float32 for autocast: no unadvertised float dtype to try",
                     applies=False)
    bad = candidates[0]
    t = operands(dt)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(device_type=dt, dtype=bad):
            enabled = torch.is_autocast_enabled(dt)
            out = must(lambda: torch.mm(t["a"], t["b"]), f"torch.mm under torch.autocast({dt!r}, dtype={bad})")
    messages = [str(w.message) for w in caught]
    assert any("not supported" in m for m in messages), \
        f"torch.autocast({dt!r}, dtype={bad}) for an unadvertised dtype did not warn: {messages}"
    assert not enabled, f"torch.autocast({dt!r}, dtype={bad}) stayed enabled for an unadvertised dtype"
    assert out.dtype == torch.float32, f"torch.mm under a disabled autocast returned {out.dtype}"


# ------------------------------------------------------------------ compile


def interface(dt):
    from torch._dynamo.device_interface import get_interface_for_device

    try:
        return get_interface_for_device(dt)
    except NotImplementedError as e:
        pytest.fail(
            f"torch._dynamo.device_interface.get_interface_for_device({dt!r}) raised NotImplementedError ({e}): "
            f"register a DeviceInterface subclass with register_interface_for_device({dt!r}, cls) when the "
            f"backend loads", pytrace=False)


@contract("DI-IFACE-001")
@pytest.mark.exclusive
def test_device_interface_agrees_with_the_module(dt, mod, n, backend):
    from torch._dynamo.device_interface import DeviceGuard, DeviceInterface

    iface = interface(dt)
    assert isinstance(iface, type) and issubclass(iface, DeviceInterface), \
        f"the interface for {dt!r} is {iface!r}, not a DeviceInterface subclass"

    def call(name, *args):
        function = getattr(iface, name)
        try:
            return function(*args)
        except NotImplementedError:
            pytest.fail(f"the {dt!r} DeviceInterface does not implement {name}() (NotImplementedError)",
                        pytrace=False)
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"DeviceInterface.{name}{args!r} raised {type(e).__name__}: {e}", pytrace=False)

    # decides DI-IFACE-001.1
    assert call("device_count") == mod.device_count() == n, \
        f"DeviceInterface.device_count() is {call('device_count')}, the module says {mod.device_count()}"
    assert call("is_available") == mod.is_available(), "DeviceInterface.is_available() disagrees with the module"
    # decides DI-IFACE-001.2
    last = n - 1
    mod.set_device(last)
    assert call("current_device") == last, f"DeviceInterface.current_device() is not the module's {last}"
    call("set_device", 0)
    assert mod.current_device() == 0, "DeviceInterface.set_device(0) did not change the module's current device"
    previous = call("exchange_device", last)
    assert previous == 0 and mod.current_device() == last, \
        f"DeviceInterface.exchange_device({last}) returned {previous} (expected 0) and left {mod.current_device()}"
    call("maybe_exchange_device", 0)
    assert mod.current_device() == 0, "DeviceInterface.maybe_exchange_device(0) did not switch to 0"
    with DeviceGuard(iface, last):
        assert mod.current_device() == last, "dynamo's DeviceGuard(interface, i) did not switch to i"
    assert mod.current_device() == 0, "dynamo's DeviceGuard(interface, i) did not restore the device"
    with must(lambda: iface.device(last), f"DeviceInterface.device({last})"):
        assert mod.current_device() == last, f"DeviceInterface.device({last}) did not switch"
    assert mod.current_device() == 0, f"DeviceInterface.device({last}) did not restore the device"

    # decides DI-IFACE-001.3
    # The current stream, in the default state and in others: a non-default
    # stream current on the current device, and on another device.
    for j in sorted({0, last}):
        mod.set_device(j)
        for label, make in (("the default stream", lambda j=j: torch.accelerator.current_stream(j)),
                            ("a new stream", lambda j=j: torch.Stream(device=torch.device(dt, j)))):
            stream = make()
            torch.accelerator.set_stream(stream)
            seen = call("current_stream")
            check("DI-IFACE-001.3", isinstance(seen, torch.Stream) and seen == stream,
                  f"with {label} of {dt}:{j} current ({stream!r}), DeviceInterface.current_stream() is {seen!r}")
        torch.accelerator.set_stream(torch.accelerator.current_stream(j))
    mod.set_device(0)
    for name, base in (("Stream", torch.Stream), ("Event", torch.Event)):
        cls = getattr(iface, name)
        if cls is not getattr(DeviceInterface, name):
            check("DI-IFACE-001.3", isinstance(cls, type) and issubclass(cls, base),
                  f"DeviceInterface.{name} must subclass torch.{name} for dynamo to capture it")

    # decides DI-IFACE-001.4
    load = Load(dt, last)
    stream = torch.accelerator.current_stream(last)
    for scale in SCALES:
        target = load.target()  # before the hold: only the write is queued behind it
        with hold(backend, stream, load, scale) as held:
            with torch.accelerator.device_index(last):
                load.write(target)
            _, early = waited(lambda: call("synchronize", last), held)
        check("DI-IFACE-001.4", early is not True,
              f"DeviceInterface.synchronize({last}) returned while device {last}'s stream was still held or had work "
              "pending", observed=early is not None)
        check("DI-IFACE-001.4", load.is_final(target) and torch.accelerator.current_stream(last).query(),
              f"DeviceInterface.synchronize({last}) returned before device {last}'s work finished",
              observed=early is not None)
        if early is not None:
            break
    else:
        unobserved(backend, "DI-IFACE-001.4", f"DeviceInterface.synchronize({last}) behind work in flight")
    check("DI-IFACE-001.4", mod.current_device() == 0, "DeviceInterface.synchronize changed the current device")


# What a user's first torch.compile sees: torch, then the backend, then
# Inductor's compiler (which imports torch._inductor.utils and so makes its
# one scan of the registered interfaces for GPU-class devices).
_GPU_CLASS_IN_A_NEW_INTERPRETER = """
import importlib, json, sys
import torch
importlib.import_module(sys.argv[1])
name = torch._C._get_privateuse1_backend_name()
import torch._inductor.compile_fx
import torch._inductor.utils
from torch._dynamo.device_interface import get_interface_for_device
print("ANSWER " + json.dumps({"is_gpu": repr(get_interface_for_device(name).is_gpu()),
                              "inductor": torch._inductor.utils.is_gpu(name),
                              "gpu_types": list(torch._inductor.utils.GPU_TYPES)}))
"""


@contract("DI-IFACE-002")
def test_device_interface_answers_device_class_questions(dt, mod, n, unclaimed, backend):
    # decides DI-IFACE-002.1
    with scope("DI-IFACE-002.1"):
        answer = answer_in_new_interpreter("DI-IFACE-002.1", _GPU_CLASS_IN_A_NEW_INTERPRETER, backend.module_name,
                                           "importing torch, the backend and Inductor's compiler and asking the "
                                           "DeviceInterface's is_gpu()")
    check("DI-IFACE-002.1", answer["is_gpu"] in ("True", "False") and (answer["is_gpu"] == "True") ==
          answer["inductor"],
          f"in a new interpreter (import torch, the backend, then Inductor's compiler, as a first torch.compile "
          f"does), DeviceInterface.is_gpu() is {answer['is_gpu']} but Inductor classifies {dt!r} as "
          f"{'a' if answer['inductor'] else 'not a'} GPU (GPU_TYPES = {answer['gpu_types']}): Inductor scans the "
          f"registered interfaces once, when torch._inductor.utils is imported, so register the interface "
          f"(register_interface_for_device) when the backend is imported, before anything imports Inductor")

    import torch._inductor.utils as inductor_utils
    from torch._dynamo.device_interface import DeviceInterface

    iface = interface(dt)

    def call(name, *args):
        try:
            return getattr(iface, name)(*args)
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"DeviceInterface.{name}{args!r} raised {type(e).__name__}: {e}", pytrace=False)

    # decides DI-IFACE-002.1 (and in this process, whatever imported Inductor first)
    gpu = call("is_gpu")
    check("DI-IFACE-002.1", isinstance(gpu, bool), f"DeviceInterface.is_gpu() returned {gpu!r}, not a bool")
    seen = inductor_utils.is_gpu(dt)
    check("DI-IFACE-002.1", seen == gpu,
          f"DeviceInterface.is_gpu() is {gpu}, but Inductor classifies {dt!r} as {'a' if seen else 'not a'} GPU "
          f"(torch._inductor.utils.GPU_TYPES = {inductor_utils.GPU_TYPES}): register the interface when the "
          f"backend is imported, and answer is_gpu() the same at every call")

    # decides DI-IFACE-002.2
    exposes = call("exposes_streams")
    if "streams" in unclaimed:
        check("DI-IFACE-002.2", isinstance(exposes, bool), f"exposes_streams() returned {exposes!r}, not a bool")
    else:
        check("DI-IFACE-002.2", exposes is True and iface.Stream is not DeviceInterface.Stream,
              f"the backend has streams, but its DeviceInterface does not expose them (exposes_streams() is "
              f"{exposes!r}): set the interface's Stream to the backend's torch.Stream subclass, which is what "
              f"opts the device into Inductor's stream guards")
    if exposes:
        cls = iface.Stream
        check("DI-IFACE-002.2", isinstance(cls, type) and issubclass(cls, torch.Stream),
              f"DeviceInterface.Stream is {cls!r}, not a torch.Stream subclass")
        last = n - 1
        mod.set_device(last)
        for args, kwargs, index in (((), {}, last), ((), {"device": 0}, 0), ((), {"device": last}, last)):
            what = f"DeviceInterface.Stream({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
            stream = must(lambda: cls(*args, **kwargs), f"{what} (exposes_streams() says the class is usable)")
            check("DI-IFACE-002.2", isinstance(stream, torch.Stream) and stream.device == torch.device(dt, index),
                  f"with device {last} current, {what} made {stream!r}, not a stream of {dt}:{index}")
        mod.set_device(0)


# decides DI-COMPILE-001.1 DI-COMPILE-001.2
@contract("DI-COMPILE-001")
def test_compiled_model_matches_eager(dt):
    """torch.compile(backend="aot_eager") on device tensors matches eager,
    forward and backward.

    Why aot_eager: it runs everything a PrivateUse1 backend is asked to
    support for torch.compile without a code generator of its own: dynamo
    traces the model (device tensors become FakeTensors, so the device's
    meta/shape functions and device propagation must work), AOTAutograd
    builds the joint forward/backward graph with functionalization and
    decompositions, and the resulting graphs run on the device with its
    eager kernels. The default backend, inductor, additionally needs a code
    generator registered for the device (register_backend_for_device with
    a Scheduling and wrapper codegen, or Scheduling/PythonWrapperCodegen/
    CppWrapperCodegen on the device module); that is a large optional
    extension, not part of this contract.
    """
    import torch._dynamo

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    eager = model.to(dt)
    x = torch.randn(8, 16).to(dt)

    def loss_of(m, inp):
        out = m(inp)
        return out, (out * out).sum()

    out_eager, loss_eager = loss_of(eager, x)
    loss_eager.backward()
    grads_eager = [p.grad.detach().cpu().clone() for p in eager.parameters()]
    eager.zero_grad(set_to_none=True)

    compiled = must(lambda: torch.compile(eager, backend="aot_eager", fullgraph=True),
                    "torch.compile(model, backend='aot_eager')")
    out_compiled, loss_compiled = must(lambda: loss_of(compiled, x),
                                       "running a torch.compile(backend='aot_eager') model on the device")
    assert out_compiled.device == out_eager.device, f"the compiled model returned a tensor on {out_compiled.device}"
    torch.testing.assert_close(out_compiled.cpu(), out_eager.detach().cpu(), rtol=1e-5, atol=1e-5)
    must(loss_compiled.backward, "backward through a torch.compile(backend='aot_eager') model")
    grads = [p.grad.detach().cpu() for p in eager.parameters()]
    for got, want in zip(grads, grads_eager):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------- stream capture


def stream_program(dt):
    """Device-generic stream code as a user writes it: the current stream,
    a stream context, a new stream, an event recorded on one stream and
    waited for on another, wait_stream, record_event/wait_event."""

    def program(x, side):
        outer = torch.accelerator.current_stream()
        with side:
            inside = torch.accelerator.current_stream()
            y = x * 2
        event = torch.Event(device=dt)
        event.record(side)
        event.wait(outer)
        outer.wait_stream(side)
        marker = side.record_event()
        outer.wait_event(marker)
        fresh = torch.Stream(device=dt)
        return y + 1, outer, inside, fresh

    return program


def compiled(function, what: str):
    import torch._dynamo

    torch._dynamo.reset()
    return must(lambda: torch.compile(function, backend="aot_eager", fullgraph=True),
                f"torch.compile({what}, backend='aot_eager', fullgraph=True)")


def run_compiled(function, args, what: str):
    """Run a compiled function; a graph break under fullgraph=True or an error
    while tracing is the backend's failure of clause 1."""
    with scope("DI-STREAM-001.1"):
        return must(lambda: function(*args), f"calling torch.compile({what}, backend='aot_eager', fullgraph=True)")


@contract("DI-STREAM-001")
def test_compiled_stream_code_traces_and_matches_eager(dt):
    program = stream_program(dt)
    x = torch.arange(16, dtype=torch.float32).to(dt)
    side = new_stream(dt, 0)
    want = program(x, side)[0].cpu()
    got = run_compiled(compiled(program, "stream code"), (x, side), "stream code")[0]
    # decides DI-STREAM-001.1
    check("DI-STREAM-001.1", got.device == torch.device(dt, 0), f"the compiled stream code returned a tensor on "
                                                                 f"{got.device}")
    torch.testing.assert_close(got.cpu(), want)
    torch.accelerator.synchronize(0)


@contract("DI-STREAM-001")
def test_compiled_stream_code_sees_the_streams_of_the_call(dt, n):
    """The streams in compiled code are those of each call, not those seen
    while tracing: the current stream of the call's current device, the
    stream a context entered, a new stream on the current device."""
    program = compiled(stream_program(dt), "stream code")
    last = n - 1
    states = [("the default stream current", 0, False), ("a new stream current", 0, True)]
    if last:
        states += [(f"device {last} current", last, False), (f"a new stream of device {last} current", last, True)]
    for label, index, fresh_current in states:
        before = torch.accelerator.current_stream(0)
        with torch.accelerator.device_index(index):
            x = torch.arange(16, dtype=torch.float32).to(torch.device(dt, index))
            side = new_stream(dt, index)
            caller = new_stream(dt, index) if fresh_current else torch.accelerator.current_stream(index)
            with caller:
                got, outer, inside, fresh = run_compiled(program, (x, side), "stream code")
                after_call = torch.accelerator.current_stream()
            # decides DI-STREAM-001.2
            check("DI-STREAM-001.2", outer == caller,
                  f"with {label}, torch.accelerator.current_stream() in compiled code returned {outer!r}, not the "
                  f"caller's current stream {caller!r}")
            check("DI-STREAM-001.2", inside == side,
                  f"with {label}, torch.accelerator.current_stream() inside `with side:` in compiled code returned "
                  f"{inside!r}, not {side!r}")
            check("DI-STREAM-001.2", after_call == caller,
                  f"with {label}, the current stream after the compiled call is {after_call!r}, not {caller!r}: the "
                  "compiled `with side:` did not restore it")
            check("DI-STREAM-001.2", isinstance(fresh, torch.Stream) and fresh.device == torch.device(dt, index)
                  and fresh not in (caller, side),
                  f"with {label}, torch.Stream(device={dt!r}) in compiled code made {fresh!r}: expected a new "
                  f"stream of {dt}:{index}")
            # The result was computed on the caller's stream: wait for it before
            # reading it from another (on an asynchronous backend the copy to
            # the host would otherwise race the computation, as on CUDA).
            caller.synchronize()
            torch.testing.assert_close(got.cpu(), (torch.arange(16, dtype=torch.float32) * 2 + 1))
            torch.accelerator.synchronize(index)
        check("DI-STREAM-001.2", torch.accelerator.current_stream(0) == before,
              f"with {label}, the compiled call changed device 0's current stream")


def compiled_consumer(dt, how: str):
    """A compiled function that makes the current stream wait for `producer`
    (by `how`) and then copies `produced` on it (a clone: PyTorch 2.13's
    AOTAutograd cannot yet compile a wait_stream followed by the mutation of
    an input, whatever the device)."""

    def consume(produced, producer):
        current = torch.accelerator.current_stream()
        if how == "Stream.wait_stream":
            current.wait_stream(producer)
        elif how == "Event.record/Event.wait":
            event = torch.Event(device=dt)
            event.record(producer)
            event.wait(current)
        else:
            current.wait_event(producer.record_event())
        return produced.clone()

    function = compiled(consume, f"a function that waits by {how}")

    def run(producer, consumer, consumed, produced):
        with consumer:
            return run_compiled(function, (produced, producer), f"a function that waits by {how}")

    return run


# decides DI-STREAM-001.3
@contract("DI-STREAM-001")
@pytest.mark.parametrize("how", ["Stream.wait_stream", "Event.record/Event.wait", "Stream.record_event/wait_event"])
@pytest.mark.parametrize("consumer_is_current", [False, True], ids=["new-consumer", "current-consumer"])
def test_compiled_waits_order_the_streams(dt, backend, how, consumer_is_current):
    """The compiled function runs once before the observation, so that
    tracing and compiling are not mistaken for the wait."""
    consume = compiled_consumer(dt, how)
    check_producer_consumer(dt, backend, None, consumer_is_current, "DI-STREAM-001.3",
                            f"a compiled function that waits by {how}", consume=consume)
