"""Asynchronous operators (OPENREG_ASYNC_OPERATORS=1, switched on here for
each test): operators return with their results allocated and their kernel
queued on the current stream, as on a real accelerator; only operators whose
results' size depends on the data (or that return host values, or draw
random numbers) wait (docs/reference-backend/streams-and-events.md).

Every observation is made behind a gate (a stream held at a point of its
queue), so nothing here depends on the machine's speed: while the gate is
closed, queued work certainly has not run.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import openreg
from _support import Background, Gate, run_python, still_blocked

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def asynchronous_operators():
    before = openreg._C._async_operators()
    openreg._C._set_async_operators(True)
    yield
    torch.openreg.synchronize()
    openreg._C._set_async_operators(before)

Stream = torch.openreg.Stream


def on(stream: torch.Stream, fn):
    """Runs fn() in a background thread with `stream` current there."""
    def body():
        with torch.openreg.stream(stream):
            return fn()
    return Background(body)


def inputs():
    torch.manual_seed(0)
    cpu = {"a": torch.randn(64, 64), "b": torch.randn(64, 64), "img": torch.randn(2, 3, 8, 8),
           "w": torch.randn(4, 3, 3, 3), "idx": torch.tensor([3, 1, 0])}
    dev = {k: v.to("openreg") for k, v in cpu.items()}
    torch.openreg.synchronize()
    return cpu, dev


# Operators that return at once while their stream is held; each computes
# from fresh inputs (a dict of tensors) and returns a tensor.
ASYNC = {
    "matmul chain": lambda t: ((t["a"] @ t["b"]) @ t["b"]) @ t["a"],
    "pointwise": lambda t: (t["a"] * 2 + t["b"]).sin(),
    "in place": lambda t: t["a"].clone().mul_(3).add_(t["b"]),
    "reduction": lambda t: t["a"].sum(dim=1),
    "softmax": lambda t: torch.softmax(t["a"], dim=-1),
    "cat": lambda t: torch.cat([t["a"], t["b"]]),
    "index_select": lambda t: t["a"].index_select(0, t["idx"]),
    "fill": lambda t: torch.empty_like(t["a"]).fill_(1.5),
    "zeros": lambda t: torch.zeros(5, 5, device=t["a"].device),
    "split (views)": lambda t: torch.stack(t["a"].split(16)),
}


@pytest.mark.parametrize("case", list(ASYNC))
def test_operators_return_while_their_stream_is_held(case):
    cpu, dev = inputs()
    expected = ASYNC[case](cpu)
    s = Stream()
    with Gate(s) as gate:
        result = on(s, lambda: ASYNC[case](dev)).value(timeout=10)  # returns: nothing waited for the gate
        assert result.shape == expected.shape and result.dtype == expected.dtype
        assert not s.query(), f"{case}: the stream is idle although its work is held"
        gate.open()
        s.synchronize()
    torch.testing.assert_close(result.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_a_chain_of_matmuls_leaves_query_false_until_it_completes():
    cpu, dev = inputs()
    s = Stream()
    with Gate(s) as gate:
        def chain():
            x = dev["a"]
            for _ in range(10):
                x = torch.tanh(x @ dev["b"])
            return x
        result = on(s, chain).value(timeout=10)
        assert not s.query()
        gate.open()
        s.synchronize()
    assert s.query()
    x = cpu["a"]
    for _ in range(10):
        x = torch.tanh(x @ cpu["b"])
    torch.testing.assert_close(result.cpu(), x, rtol=1e-4, atol=1e-4)


# Operators that must wait for their stream: their results' size depends on
# the data, or they return host values.
SYNCHRONOUS = {
    "nonzero": lambda t: torch.nonzero(t["a"] > 0),
    "masked_select": lambda t: t["a"].masked_select(t["a"] > 0),
    "item": lambda t: t["a"].sum().item(),
    "equal": lambda t: torch.equal(t["a"], t["b"]),
}


@pytest.mark.parametrize("case", list(SYNCHRONOUS))
def test_operators_whose_result_depends_on_the_data_wait_for_the_stream(case):
    _, dev = inputs()
    s = Stream()
    with Gate(s) as gate:
        call = on(s, lambda: SYNCHRONOUS[case](dev))
        assert still_blocked(call), f"{case}: returned while its stream was held"
        gate.open()
        call.value(timeout=10)


def _produce_and_consume(wait: bool) -> torch.Tensor:
    """The producer stream doubles y (held); the consumer computes y * 10,
    with or without waiting for the producer. A consumer that waits must
    still be running while the producer is held; one that does not must
    finish while it is held (bounded by a generous timeout, not a speed)."""
    y = torch.ones(1024, device="openreg")
    torch.openreg.synchronize()
    producer, consumer = Stream(), Stream()
    with Gate(producer) as gate:
        on(producer, lambda: y.mul_(2)).value(timeout=10)
        def consume():
            if wait:
                consumer.wait_stream(producer)
            return y * 10
        z = on(consumer, consume).value(timeout=10)
        consumer_done = Background(consumer.synchronize)
        if wait:
            assert still_blocked(consumer_done), "the consumer finished while the producer was held"
        else:
            consumer_done.value(timeout=60)  # nothing orders it after the held producer
        gate.open()
        consumer_done.value(timeout=10)
    return z.cpu()


def test_a_consumer_that_waits_for_the_producer_sees_its_result():
    assert torch.equal(_produce_and_consume(wait=True), torch.full((1024,), 20.0))


def test_a_missing_wait_stream_is_visible():
    """As on CUDA: without wait_stream the consumer reads the producer's
    input before the producer ran."""
    assert torch.equal(_produce_and_consume(wait=False), torch.full((1024,), 10.0))


def test_an_error_of_a_queued_kernel_is_raised_at_the_next_synchronization():
    _, dev = inputs()
    bad = torch.tensor([0, 1000], device="openreg")
    torch.openreg.synchronize()
    s = Stream()
    with torch.openreg.stream(s):
        dev["a"].index_select(0, bad)  # the index is checked by the kernel, on the device
        with pytest.raises(RuntimeError, match="index out of range"):
            s.synchronize()
        # The error is reported once; the stream goes on working.
        assert torch.equal((dev["a"] + 0).cpu(), dev["a"].cpu())


def test_shape_errors_are_raised_at_the_call():
    _, dev = inputs()
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        dev["a"] @ torch.ones(3, 3, device="openreg")
    torch.openreg.synchronize()  # nothing was queued, nothing is raised here


def test_an_out_argument_that_must_grow_warns_once():
    a = torch.arange(6.0, device="openreg")
    out = torch.empty(2, device="openreg")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.add(a, 1, out=out)
    assert len([w for w in caught if "resized" in str(w.message)]) == 1
    assert torch.equal(out.cpu(), torch.arange(6.0) + 1)


def test_operators_wait_for_their_stream_in_the_default_mode():
    """The default (OPENREG_ASYNC_OPERATORS unset): the fallback waits."""
    _, dev = inputs()
    openreg._C._set_async_operators(False)
    s = Stream()
    with Gate(s) as gate:
        call = on(s, lambda: dev["a"] @ dev["b"])
        assert still_blocked(call), "a matrix product returned while its stream was held"
        gate.open()
        call.value(timeout=10)


def test_meta_answers_are_reused_only_for_the_same_metadata():
    """The Meta kernel's answers are kept per operator and arguments'
    metadata: calls that differ in shape, strides, offset, dtype, aliasing or
    scalar values get their own answer, repeated calls reuse it."""
    base = torch.arange(64.0).reshape(8, 8)
    cases = [
        lambda t: t + 1,
        lambda t: t.t() + 1,
        lambda t: t[2:] * 2,
        lambda t: t[:, 1:3].sum(dim=0),
        lambda t: t.double() @ t.double().t(),
        lambda t: torch.cat([t, t[:3]]),
        lambda t: t.clone().add_(t.clone()),
        lambda t: (lambda c: c.add_(c))(t.clone()),
        lambda t: t.split(3),
    ]
    for _ in range(3):
        for n in (8, 5):
            cpu = base[:n, :n]
            dev = cpu.to("openreg")
            for k, case in enumerate(cases):
                expected, got = case(cpu), case(dev)
                if isinstance(expected, tuple):
                    assert [g.shape for g in got] == [e.shape for e in expected], k
                    expected, got = torch.cat(expected), torch.cat(got)
                assert got.shape == expected.shape and got.stride() == expected.stride(), k
                torch.testing.assert_close(got.cpu(), expected, msg=f"case {k}, n={n}")


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", False)])
def test_the_environment_variable_sets_the_mode_at_load(value, on):
    rc, out, err = run_python("print(openreg._C._async_operators())", env={"OPENREG_ASYNC_OPERATORS": value})
    assert rc == 0, err
    assert out.strip().splitlines()[-1] == str(on)


def test_a_bad_value_of_the_environment_variable_is_an_error_naming_it():
    rc, out, err = run_python("pass", env={"OPENREG_ASYNC_OPERATORS": "yes"})
    assert rc != 0
    assert "ValueError: OPENREG_ASYNC_OPERATORS='yes': expected 0" in err
