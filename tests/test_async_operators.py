"""Asynchronous operators (the default; switched on here for each test, in
case the environment turned them off): the first call of an operator with
new arguments' metadata runs synchronously (the CPU kernel's checks raise
at the call), later ones return with their results allocated and their kernel
queued on the current stream, as on a real accelerator, random ones
included; only operators whose results' size depends on the data (or that
return host values) wait (docs/reference-backend/streams-and-events.md).

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


def warm(fn, *args):
    """One unheld call: the first call with new arguments' metadata runs
    synchronously, so that the CPU kernel's host-side checks raise at the
    call; later calls with that metadata queue."""
    fn(*args)
    torch.openreg.synchronize()


@pytest.mark.parametrize("case", list(ASYNC))
def test_operators_return_while_their_stream_is_held(case):
    cpu, dev = inputs()
    expected = ASYNC[case](cpu)
    s = Stream()
    warm(ASYNC[case], inputs()[1])
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

    def chain():
        x = dev["a"]
        for _ in range(10):
            x = torch.tanh(x @ dev["b"])
        return x
    warm(chain)
    with Gate(s) as gate:
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
    warm(lambda: (y.mul_(2), y * 10))
    y.fill_(1)
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
    warm(lambda: dev["a"].index_select(0, torch.tensor([0, 1], device="openreg")))  # the same metadata
    s = Stream()
    with torch.openreg.stream(s):
        dev["a"].index_select(0, bad)  # the index is checked by the kernel, on the device
        with pytest.raises(RuntimeError, match="index out of range"):
            s.synchronize()
        # The error is reported once; the stream goes on working.
        assert torch.equal((dev["a"] + 0).cpu(), dev["a"].cpu())


def test_the_first_call_with_new_metadata_waits_and_later_ones_queue():
    _, dev = inputs()
    x = torch.ones(37, 3, device="openreg")  # a shape no other test uses
    torch.openreg.synchronize()
    s = Stream()
    with Gate(s) as gate:
        first = on(s, lambda: x * 7)
        assert still_blocked(first), "the first call with new metadata returned while its stream was held"
        gate.open()
        first.value(timeout=10)
    with Gate(s) as gate:
        on(s, lambda: x * 7).value(timeout=10)  # the same metadata: queued
        assert not s.query()
        gate.open()
    s.synchronize()


def _random_draws(generator=None):
    """Random operators of several kinds: factories, in-place fills, a
    dropout mask, sampling, one with an explicit generator."""
    ones = torch.ones(300, device="openreg")
    return [
        torch.randn(40, device="openreg"),
        torch.empty(50, device="openreg").uniform_(-2, 3),
        torch.nn.functional.dropout(ones, 0.5),
        torch.multinomial(ones[:20], 5),
        torch.randint(0, 1000, (30,), device="openreg"),
        torch.bernoulli(ones * 0.3),
        torch.empty(30, device="openreg").normal_(generator=generator),
    ]


def _reference_draws(seed: int, generator_seed: int):
    """The draws of _random_draws, unheld, after seeding."""
    torch.manual_seed(seed)
    g = torch.Generator(device="openreg").manual_seed(generator_seed)
    draws = [t.cpu() for t in _random_draws(g)]
    return draws, torch.openreg.get_rng_state(), g.get_state()


def test_random_operators_queue_and_launch_order_alone_decides_their_numbers():
    """Random operators return while their stream is held, as on CUDA: the
    host takes each kernel's numbers from the generator at the launch, so
    reading the generator's state does not wait, and the values are those
    of the same launches made without a held stream."""
    s = Stream()
    with torch.openreg.stream(s):
        _reference_draws(0, 0)  # the first calls with these metadata run synchronously
        expected, state, g_state = _reference_draws(3, 4)
    launches = openreg._C._async_operator_launches()
    with Gate(s) as gate:
        def held():
            torch.manual_seed(3)
            g = torch.Generator(device="openreg").manual_seed(4)
            return _random_draws(g), torch.openreg.get_rng_state(), g.get_state()
        draws, held_state, held_g_state = on(s, held).value(timeout=10)
        assert not s.query(), "the stream is idle although its random kernels are held"
        assert openreg._C._async_operator_launches() - launches >= len(expected)
        assert torch.equal(held_state, state), "the generator's state read before the kernels ran differs"
        assert torch.equal(held_g_state, g_state)
        gate.open()
        s.synchronize()
    for e, d in zip(expected, draws):
        assert torch.equal(d.cpu(), e), "a queued random operator drew other numbers than unheld"


def test_random_numbers_do_not_depend_on_which_stream_runs_first():
    """Two streams draw from one generator; the first launched is held while
    the second runs. Each gets the numbers of its place in launch order."""
    a, b = Stream(), Stream()
    for st in (a, b):
        with torch.openreg.stream(st):
            torch.randn(64, device="openreg")
    torch.openreg.synchronize()
    torch.manual_seed(8)
    first, second = torch.randn(64, device="openreg").cpu(), torch.randn(64, device="openreg").cpu()
    torch.manual_seed(8)
    with Gate(a) as gate:
        x = on(a, lambda: torch.randn(64, device="openreg")).value(timeout=10)
        y = on(b, lambda: torch.randn(64, device="openreg")).value(timeout=10)
        b.synchronize()  # runs while a's kernel is still held
        gate.open()
        a.synchronize()
    assert torch.equal(x.cpu(), first) and torch.equal(y.cpu(), second)


def test_random_numbers_are_the_same_with_asynchronous_operators_off():
    torch.openreg.synchronize()
    on_draws, on_state, _ = _reference_draws(5, 6)
    openreg._C._set_async_operators(False)
    off_draws, off_state, _ = _reference_draws(5, 6)
    for x, y in zip(on_draws, off_draws):
        assert torch.equal(x, y)
    assert torch.equal(on_state, off_state)


def test_errors_only_the_cpu_kernel_checks_are_raised_at_the_call():
    """gelu's Meta kernel does not check approximate=, its CPU kernel does:
    the first call with that argument runs synchronously and raises, also
    after the same call with a valid argument has been queued."""
    x = torch.ones(23, device="openreg")
    warm(lambda: torch.nn.functional.gelu(x, approximate="tanh"))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="approximate"):
            torch.nn.functional.gelu(x, approximate="asdf")
    torch.openreg.synchronize()  # nothing was queued, nothing is raised here


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


def test_operators_wait_for_their_stream_when_asynchronous_operators_are_off():
    """OPENREG_ASYNC_OPERATORS=0: the fallback waits."""
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


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", True), (None, True)])
def test_the_environment_variable_sets_the_mode_at_load(value, on):
    """Unset or empty: asynchronous operators (the default)."""
    env = {} if value is None else {"OPENREG_ASYNC_OPERATORS": value}
    rc, out, err = run_python("print(openreg._C._async_operators())", env=env)
    assert rc == 0, err
    assert out.strip().splitlines()[-1] == str(on)


@pytest.mark.parametrize("name, overload", [
    ("aten::add", "out"), ("aten::add_", "Tensor"), ("aten::mm", "out"), ("aten::sum", "IntList_out"),
    ("aten::cat", "out"), ("aten::max_pool2d_with_indices", "out"), ("aten::_softmax", "out"),
])
def test_hot_operators_ask_pytorchs_cpp_meta_kernels(name, overload):
    """The asynchronous path asks libtorch's C++ Meta kernels (generated table,
    MetaKernels.h) before the registered, mostly Python, ones: a table that
    came out empty or lost these would make every cache miss slow."""
    assert openreg._C._cxx_meta_kernel_count() > 500
    assert openreg._C._has_cxx_meta_kernel(name, overload)
    assert not openreg._C._has_cxx_meta_kernel("aten::nonzero", "")  # no C++ Meta kernel: data-dependent


def test_cpp_meta_kernels_give_the_cpus_geometry_and_errors():
    """Through the C++ Meta kernels, results have the CPU's shapes, strides
    and dtypes (type promotion, broadcasting, reductions, pooling), and the
    CPU's argument errors are raised at the call."""
    base = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8) / 100
    cases = [
        lambda t: t + t.to(torch.float64),
        lambda t: t.permute(0, 2, 3, 1) * 2,
        lambda t: t[:, :1] - t,
        lambda t: t.sum(dim=(1, 3), keepdim=True),
        lambda t: torch.nn.functional.max_pool2d(t, 3, stride=2, padding=1, return_indices=True),
        lambda t: torch.nn.functional.avg_pool2d(t, 2),
        lambda t: t.softmax(1),
        lambda t: t.flatten(1) @ t.flatten(1).t(),
        lambda t: torch.cat([t, t.permute(0, 1, 3, 2)], dim=1),
    ]
    dev = base.to("openreg")
    for k, case in enumerate(cases):
        expected, got = case(base), case(dev)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        for e, g in zip(expected, got):
            assert (g.shape, g.stride(), g.dtype) == (e.shape, e.stride(), e.dtype), k
            torch.testing.assert_close(g.cpu(), e, msg=f"case {k}")
    with pytest.raises(RuntimeError, match="must match the size"):
        dev + dev[:, :, :3]
    with pytest.raises(RuntimeError, match="cannot be multiplied|shapes cannot"):
        dev.flatten(1) @ dev.flatten(1)


def test_a_bad_value_of_the_environment_variable_is_an_error_naming_it():
    rc, out, err = run_python("pass", env={"OPENREG_ASYNC_OPERATORS": "yes"})
    assert rc != 0
    assert "ValueError: OPENREG_ASYNC_OPERATORS='yes': expected 1" in err


def _default_opinfos():
    from torch.testing._internal.common_methods_invocations import op_db

    from privateuse1_conformance.harness.operators import DEFAULT_OPERATORS
    names = set(DEFAULT_OPERATORS)
    return [op for op in op_db if (f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name) in names
            or op.name in names]


def test_queued_calls_give_the_cpus_results_across_the_default_operators():
    """The asynchronous path over PyTorch's OpInfo samples of the kit's
    default operators (float32, three samples each): the conformance suite's
    operators area calls most samples once, so it sees the synchronous first
    call of each key; here each sample is called twice on the device, and
    the second call (queued, from the cached answer) must give the CPU's
    results too. Most operators must have queued."""
    from torch.utils._pytree import tree_map

    def to(device):
        return lambda v: v.to(device) if isinstance(v, torch.Tensor) else v

    def flat(result):
        return [t for t in torch.utils._pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]

    launches = openreg._C._async_operator_launches()
    checked, queued_ops = [], 0
    for op in _default_opinfos():
        if "dropout" in op.name or torch.float32 not in op.supported_dtypes("cpu"):
            continue  # random: two calls differ on the CPU too
        before = openreg._C._async_operator_launches()
        for sample in list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:3]:
            if sample.kwargs.get("dropout_p", 0) > 0:
                continue  # random: the device's numbers are not the CPU's (docs/reference-backend/rng.md)
            cpu = [sample.input, *sample.args]
            expected = flat(op(*cpu, **sample.kwargs))
            for call in range(2):
                dev_args = tree_map(to("openreg"), cpu)
                dev_kwargs = tree_map(to("openreg"), sample.kwargs)
                got = flat(op(*dev_args, **dev_kwargs))
                torch.openreg.synchronize()
                assert len(got) == len(expected), op.name
                for g, e in zip(got, expected):
                    assert (g.shape, g.dtype) == (e.shape, e.dtype), (op.name, call)
                    torch.testing.assert_close(g.cpu(), e, rtol=1e-3, atol=1e-3, equal_nan=True,
                                               msg=lambda m: f"{op.name}, call {call}: {m}")
        checked.append(op.name)
        queued_ops += openreg._C._async_operator_launches() > before
    assert len(checked) > 100
    assert openreg._C._async_operator_launches() > launches
    assert queued_ops > len(checked) // 2, f"only {queued_ops} of {len(checked)} operators ever queued"


def test_a_call_with_many_tensors_queues_and_gives_the_cpus_result():
    """A queued call whose description exceeds a kernel's parameter block (in
    process mode: 32 KiB, here 600 tensors) runs another way there (a host
    function over staged copies, docs/reference-backend/executor.md); it
    still queues, and its result is the same."""
    parts = [torch.full((3,), float(i)) for i in range(600)]
    on_device = [p.to("openreg") for p in parts]
    warm(torch.cat, on_device)  # the first call with this metadata runs synchronously
    s = Stream()
    with Gate(s) as gate:
        result = on(s, lambda: torch.cat(on_device)).value(timeout=10)
        assert not s.query(), "the stream is idle although its work is held"
        gate.open()
        s.synchronize()
    assert torch.equal(result.cpu(), torch.cat(parts))


@pytest.fixture
def custom_operator():
    """An operator of another namespace than aten, with a CPU kernel written
    in Python (the fallback runs it) and a Meta kernel (so calls queue)."""
    lib = torch.library.Library("openreg_test_async", "DEF")
    lib.define("scaled(Tensor x, float factor) -> Tensor")
    lib.impl("scaled", lambda x, factor: x * factor + 1, "CPU")
    lib.impl("scaled", lambda x, factor: torch.empty_like(x), "Meta")
    yield torch.ops.openreg_test_async.scaled
    lib._destroy()


def test_an_operator_with_a_python_cpu_kernel_queues_and_gives_its_result(custom_operator):
    """In process mode the executor holds only libtorch's kernels: an
    operator whose CPU kernel lives in this process runs here (a host
    function over staged copies), still queued on the stream."""
    x = torch.arange(6.0)
    dev = x.to("openreg")
    warm(custom_operator, dev, 2.0)
    s = Stream()
    with Gate(s) as gate:
        result = on(s, lambda: custom_operator(dev, 2.0)).value(timeout=10)
        assert not s.query(), "the stream is idle although its work is held"
        gate.open()
        s.synchronize()
    assert torch.equal(result.cpu(), x * 2.0 + 1)


@pytest.fixture
def changed_settings():
    """PyTorch's process-wide settings that CPU kernels read, each moved off
    its default; restored afterwards."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory,
              torch._C._get_cpu_allow_fp16_reduced_precision_reduction(),
              torch.backends.cuda.flash_sdp_enabled(), torch.get_float32_matmul_precision())
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        torch._C._set_cpu_allow_fp16_reduced_precision_reduction(True)
    except RuntimeError:  # "Float16 arithmetic is not supported by the CPU"
        pass
    torch.backends.cuda.enable_flash_sdp(False)
    torch.set_float32_matmul_precision("medium")
    try:
        # (torch.testing's import allows oneDNN's flags only in this form.)
        with torch.backends.mkldnn.flags(enabled=False, deterministic=True, fp32_precision="tf32"):
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = before[2]
        torch._C._set_cpu_allow_fp16_reduced_precision_reduction(before[3])
        torch.backends.cuda.enable_flash_sdp(before[4])
        torch.set_float32_matmul_precision(before[5])


def test_queued_operators_run_under_the_hosts_process_wide_settings(changed_settings):
    """Deterministic algorithms, matmul precision, the oneDNN switches and
    the like are read by CPU kernels from process-wide state. In thread mode
    the stream workers share the host's; in process mode every queued
    operator carries the host's values to the executor, which takes them
    before it runs the kernel."""
    host = openreg._C._testing_host_settings()
    if openreg._C._process_mode():
        # The executor still holds what the last queued operator carried.
        assert openreg._C._testing_executor_settings(0) != host
    x = torch.ones(4, device="openreg")
    warm(torch.add, x, x)
    torch.add(x, x)  # queued: carries the settings
    torch.openreg.synchronize()
    assert openreg._C._testing_executor_settings(0) == host
