"""Tensors on OpenReg devices (contracts TP-*, HK-CTX-002, MM-COPY-001, MM-ZERO-001,
and the fallback's error contract)."""

from __future__ import annotations

import threading

import pytest
import torch

from _support import N, error_text

SUPPORTED_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.complex128,
]


def sample(dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor with dtype-specific edge values."""
    if dtype == torch.bool:
        return torch.tensor([True, False, True, True, False])
    if dtype.is_complex:
        return torch.tensor([0, 1 + 2j, -3.5 - 0.25j, 1e10 + 1e-10j], dtype=dtype)
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        return torch.tensor([0.0, -0.0, 1.5, -2.25, info.max, info.min, info.tiny,
                             float("inf"), float("-inf")], dtype=dtype)
    info = torch.iinfo(dtype)
    return torch.tensor([0, 1, info.max, info.min, info.max - 1], dtype=dtype)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_round_trip_is_exact(n_devices, dtype):
    """TP-RT-001: torch.tensor(x, device=...).cpu() is exact for every supported dtype."""
    x = sample(dtype)
    for i in range(n_devices):
        d = torch.tensor(x.tolist(), dtype=dtype, device=f"openreg:{i}")
        assert d.device == torch.device("openreg", i) and d.dtype == dtype
        back = d.cpu()
        assert back.dtype == dtype and torch.equal(back, x), (
            f"{dtype} round trip through openreg:{i} changed values: {x} -> {back}")
        again = x.to(f"openreg:{i}").to("cpu")
        assert torch.equal(again, x), f"{dtype} .to() round trip through openreg:{i} changed values"


def test_round_trip_nan_survives():
    x = torch.tensor([float("nan"), 1.0])
    back = x.to("openreg").cpu()
    assert torch.isnan(back[0]) and back[1] == 1.0


def test_device_to_device_copies_keep_values_and_land_on_target(two_devices):
    """TP-D2D-001."""
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    for src in range(N):
        for dst in range(N):
            s = x.to(f"openreg:{src}")
            for what, moved in {
                "to": s.to(f"openreg:{dst}"),
                "to(dtype)": s.to(f"openreg:{dst}", dtype=torch.float64),
                "transposed": s.t().to(f"openreg:{dst}"),
                "copy_": torch.empty(3, 4, device=f"openreg:{dst}").copy_(s),
                "copy_ into view": torch.zeros(4, 3, device=f"openreg:{dst}").t().copy_(s),
            }.items():
                assert moved.device == torch.device("openreg", dst), (
                    f"{what} openreg:{src} -> openreg:{dst} landed on {moved.device}")
                expected = x.t() if what == "transposed" else x
                assert torch.equal(moved.cpu().to(torch.float32), expected), (
                    f"{what} openreg:{src} -> openreg:{dst} changed values")
    assert torch.openreg.current_device() == 0, "a cross-device copy changed the current device"


def test_views_share_storage():
    """TP-VIEW-001: view / slicing / transpose write through to the base."""
    x = torch.arange(6, dtype=torch.float32, device="openreg")
    v = x.view(2, 3)
    assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    v[1, 2] = 100.0
    x[1:3].mul_(10)
    v.t()[0, 0] = -1.0
    assert x.cpu().tolist() == [-1.0, 10.0, 20.0, 3.0, 4.0, 100.0]


def test_as_strided_and_storage_offset():
    """TP-VIEW-001: as_strided with a storage offset aliases the same memory as on CPU."""
    cpu = torch.arange(10, dtype=torch.int64)
    dev = cpu.to("openreg")
    for size, stride, offset in (((3,), (2,), 1), ((2, 2), (1, 3), 4), ((0,), (1,), 9)):
        a_cpu = cpu.as_strided(size, stride, offset)
        a_dev = dev.as_strided(size, stride, offset)
        assert a_dev.storage_offset() == offset
        assert a_dev.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()
        assert torch.equal(a_dev.cpu(), a_cpu), f"as_strided{size, stride, offset} differs from CPU"
    dev.as_strided((2,), (3,), 2).fill_(-7)
    cpu.as_strided((2,), (3,), 2).fill_(-7)
    assert torch.equal(dev.cpu(), cpu), "writing through as_strided did not reach the base"


def test_set_shares_storage():
    """TP-VIEW-001: set_ points a tensor at another tensor's storage and offset."""
    base = torch.arange(8, dtype=torch.float32, device="openreg")
    t = torch.empty(0, device="openreg")
    t.set_(base.untyped_storage(), 2, (3,), (2,))
    assert t.storage_offset() == 2 and t.shape == (3,)
    assert t.cpu().tolist() == [2.0, 4.0, 6.0]
    t.fill_(0)
    assert base.cpu().tolist() == [0.0, 1.0, 0.0, 3.0, 0.0, 5.0, 0.0, 7.0]
    u = torch.empty(0, device="openreg").set_(base)
    u[0] = 42
    assert base[0].item() == 42, "set_(tensor) does not share storage"


def test_generated_methods_use_current_device(two_devices):
    """TP-GEN-001: t.openreg(), t.is_openreg, Module.openreg() exist and use the current device."""
    cpu = torch.ones(3)
    assert cpu.is_openreg is False
    torch.openreg.set_device(1)
    t = cpu.openreg()
    assert t.is_openreg is True and t.device == torch.device("openreg", 1), (
        f"t.openreg() on current device 1 gave {t.device}")
    assert cpu.openreg(0).device == torch.device("openreg", 0)
    m = torch.nn.Linear(3, 2).openreg()
    assert all(p.device == torch.device("openreg", 1) for p in m.parameters()), (
        "Module.openreg() did not move the parameters to the current device 1")
    out = m(t)
    assert out.device == torch.device("openreg", 1) and out.shape == (2,)
    storage = torch.ones(2).untyped_storage().openreg()
    assert storage.device == torch.device("openreg", 1) and storage.is_openreg


def test_item_and_print():
    """TP-ITEM-001."""
    t = torch.tensor([1.5, 2.5], device="openreg")
    assert t.sum().item() == 4.0
    assert torch.tensor(7, device="openreg").item() == 7
    assert torch.tensor(True, device="openreg").item() is True
    text = str(t)
    assert "1.5000" in text and "2.5000" in text and "device='openreg:0'" in text, text
    assert "openreg" in repr(torch.zeros(2, 2, dtype=torch.int32, device="openreg"))


def test_zero_size_tensors():
    """MM-ZERO-001: zero-size tensors work (create, copy, reduce, view, print)."""
    for shape in ((0,), (0, 3), (2, 0, 4)):
        t = torch.empty(shape, device="openreg")
        assert t.shape == shape and t.numel() == 0
        assert t.cpu().shape == shape
        assert torch.zeros(shape).to("openreg").shape == shape
        assert t.sum().item() == 0.0
        assert "openreg" in str(t)
    z = torch.zeros(0, 3, device="openreg")
    assert z.reshape(3, 0).shape == (3, 0)
    assert torch.cat([z, torch.ones(1, 3, device="openreg")]).cpu().tolist() == [[1.0, 1.0, 1.0]]


def test_backward_on_device():
    """HK-CTX-002: autograd works on device tensors (it asks hasPrimaryContext for every index)."""
    w = torch.tensor([1.0, -2.0, 3.0], device="openreg", requires_grad=True)
    x = torch.tensor([0.5, 0.25, 2.0], device="openreg")
    loss = ((w * x).sum() ** 2)
    loss.backward()
    assert w.grad is not None and w.grad.device == w.device
    expected = 2 * (w.detach().cpu() * x.cpu()).sum() * x.cpu()
    assert torch.allclose(w.grad.cpu(), expected), f"grad {w.grad.cpu()} != {expected}"


def test_backward_on_second_device(two_devices):
    w = torch.randn(4, 3, device="openreg:1", requires_grad=True)
    w.sum().backward()
    assert w.grad.device == torch.device("openreg", 1)
    assert torch.equal(w.grad.cpu(), torch.ones(4, 3))


def test_non_blocking_copies_are_correct_after_synchronize(two_devices):
    """MM-COPY-001: non_blocking H2D / D2H copies equal blocking ones once synchronized."""
    src = torch.arange(1 << 16, dtype=torch.float32).pin_memory()
    dev = src.to("openreg:1", non_blocking=True)
    host = torch.empty_like(src).pin_memory()
    host.copy_(dev, non_blocking=True)
    torch.openreg.synchronize(1)
    assert torch.equal(host, src), "non_blocking round trip differs after synchronize"
    blocking = dev.to("cpu")
    assert torch.equal(blocking, src)
    pageable = torch.arange(100, dtype=torch.int32).to("openreg", non_blocking=True)
    torch.accelerator.synchronize()
    assert torch.equal(pageable.cpu(), torch.arange(100, dtype=torch.int32))


def test_mixing_devices_in_an_op_raises(two_devices):
    """Fallback contract: openreg:0 and openreg:1 tensors in one op is an error."""
    a = torch.ones(3, device="openreg:0")
    b = torch.ones(3, device="openreg:1")
    for op in (lambda: a + b, lambda: torch.mul(b, a), lambda: torch.stack([a, b])):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            op()
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3)  # a non-scalar CPU tensor


def test_op_without_cpu_kernel_names_op_and_device(two_devices):
    """Fallback contract: an operator with neither an OpenReg nor a CPU kernel fails with an
    error naming the operator and the device (aten::q_scale is quantized-only)."""
    t = torch.ones(3, device="openreg:1")
    with pytest.raises(RuntimeError) as excinfo:
        torch.ops.aten.q_scale(t)
    message = error_text(excinfo)
    assert "q_scale" in message and "openreg:1" in message, (
        f"error does not name the operator and the device: {message!r}")
    assert t.sum().item() == 3.0, "the device is unusable after the failed op"


@pytest.mark.parametrize("op", ["to_sparse", "to_sparse_csr"])
def test_op_with_unsupported_result_layout_names_op_and_device(op):
    """Fallback contract: an operator whose CPU kernel returns a non-strided (sparse)
    tensor fails with an error naming the operator and the device."""
    t = torch.ones(2, 2, device="openreg:0")
    with pytest.raises(RuntimeError) as excinfo:
        getattr(t, op)()
    message = error_text(excinfo)
    assert op in message and "openreg:0" in message, (
        f"error does not name the operator and the device: {message!r}")


def test_fallback_computes_like_cpu():
    """A few fallback ops give CPU's answers (the fallback is the backend's compute path)."""
    a_cpu = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    b_cpu = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    a, b = a_cpu.to("openreg"), b_cpu.to("openreg")
    assert torch.allclose((a @ b).cpu(), a_cpu @ b_cpu)
    assert torch.equal(a.argmax(dim=1).cpu(), a_cpu.argmax(dim=1))
    assert torch.equal(torch.sort(a, dim=0).values.cpu(), torch.sort(a_cpu, dim=0).values)
    out = torch.empty(0, device="openreg")
    torch.add(a, 1, out=out)
    assert out.shape == (5, 4) and torch.equal(out.cpu(), a_cpu + 1)


# ----------------------------------------------- errors raised where they happen

BAD_COPIES = {
    "shape": (lambda d: torch.zeros(3, device=d), lambda d: torch.arange(4, device=d), "size of tensor"),
    "shape-converting": (lambda d: torch.zeros(3, 2, device=d),
                         lambda d: torch.ones(2, 3, dtype=torch.int32, device=d), "size of tensor"),
    "shape-strided": (lambda d: torch.zeros(4, 4, device=d).t(), lambda d: torch.arange(5.0, device=d),
                      "size of tensor"),
    "empty-destination": (lambda d: torch.zeros(0, device=d), lambda d: torch.arange(4.0, device=d),
                          "size of tensor"),
    "overlapping-destination": (lambda d: torch.zeros(1, device=d).expand(3),
                                lambda d: torch.arange(3.0, device=d), "more than one element"),
    "no-conversion": (lambda d: torch.zeros(4, device=d),
                      lambda d: torch.zeros(4, dtype=torch.uint8).view(torch.bits8).to(d), "Bits8"),
    "sub-byte-strided": (lambda d: torch.zeros(4, 4, dtype=torch.uint8, device=d).view(torch.int4).t(),
                         lambda d: torch.zeros(4, 4, dtype=torch.uint8, device=d).view(torch.int4),
                         "Int4"),
}


@pytest.mark.parametrize("case", BAD_COPIES, ids=str)
def test_bad_copies_raise_at_the_call_in_the_calling_thread(case):
    """An invalid copy_ raises where it is made (the audit found a bad same-device
    copy returning normally and failing at the next synchronization, possibly
    another thread's). The destination is unchanged and nothing is deferred."""
    make_dst, make_src, fragment = BAD_COPIES[case]
    d = torch.device("openreg", 0)
    dst, src = make_dst(d), make_src(d)
    before = dst.cpu() if dst.dtype != torch.int4 else None
    torch.openreg.synchronize()
    outcome: dict = {}

    def copy() -> None:
        try:
            dst.copy_(src)
            outcome["raised"] = None
        except RuntimeError as e:
            outcome["raised"] = str(e)

    worker = threading.Thread(target=copy)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "copy_ did not return"
    assert outcome["raised"] is not None and fragment in outcome["raised"], (
        f"{case}: copy_ {'returned normally' if outcome['raised'] is None else 'raised ' + outcome['raised']}")
    torch.openreg.synchronize()  # nothing deferred: must not raise
    if before is not None:
        assert torch.equal(dst.cpu(), before)
    assert torch.equal((torch.ones(2, device=d) + 1).cpu(), torch.full((2,), 2.0))


def claimed_dtypes() -> list[torch.dtype]:
    return sorted(torch.accelerator.get_device_capability(torch.device("openreg", 0))["supported_dtypes"],
                  key=str)


def test_capability_claims_no_dtype_without_kernels_or_conversions():
    """get_device_capability documents supported dtypes as allocatable and
    convertible to each other: the bits dtypes and float4 convert to nothing."""
    claimed = set(claimed_dtypes())
    sub_byte = {getattr(torch, f"{kind}{bits}") for kind in ("int", "uint") for bits in range(1, 8)}
    quantized = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
    unconvertible = {torch.bits1x8, torch.bits2x4, torch.bits4x2, torch.bits8, torch.bits16, torch.float4_e2m1fn_x2}
    wrong = claimed & (sub_byte | quantized | unconvertible)
    assert not wrong, sorted(map(str, wrong))
    assert {torch.float32, torch.float64, torch.bfloat16, torch.complex64, torch.bool} <= claimed


@pytest.mark.parametrize("dtype", claimed_dtypes(), ids=str)
def test_every_claimed_dtype_round_trips_contiguous_and_strided(dtype):
    """The capability query claims a dtype only if its tensors copy to the device,
    within it (strided, through a kernel) and back, bit for bit."""
    itemsize = dtype.itemsize
    host = (torch.arange(6 * 4 * itemsize, dtype=torch.int64) * 37 % 251).to(torch.uint8)
    host = host.view(6, 4 * itemsize).view(dtype)  # (6, 4) elements of `dtype`
    if dtype == torch.bool:
        host = host.view(torch.uint8).remainder(2).view(torch.bool)
    for i in range(N):
        d = torch.device("openreg", i)
        on_device = host.to(d)
        strided = on_device.t().contiguous()  # a kernel on the device
        assert on_device.dtype == dtype and strided.dtype == dtype
        back, back_t = on_device.cpu(), strided.cpu()
        torch.openreg.synchronize(i)
        assert torch.equal(back.view(torch.uint8), host.view(torch.uint8))
        assert torch.equal(back_t.view(torch.uint8), host.t().contiguous().view(torch.uint8))


# ------------------------------------------------ quantized tensors, attention


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_quantized_tensors_live_on_the_device_they_are_made_for():
    """new_qtensor allocates on the current device: OpenReg's kernels guard
    the device asked for (the kit's TP-QUANT-001 found this)."""
    last = N - 1
    x = torch.randn(3, 4)
    q = torch.quantize_per_tensor(x.to(f"openreg:{last}"), 0.1, 2, torch.qint8)
    assert q.device == torch.device("openreg", last) and torch.accelerator.current_device_index() == 0
    assert q.cpu().to(f"openreg:{last}").device == torch.device("openreg", last)
    assert torch.equal(q.int_repr().cpu(), torch.quantize_per_tensor(x, 0.1, 2, torch.qint8).int_repr())


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
@pytest.mark.parametrize("args,named", [((0.1, 0, torch.float32), "dtype"), ((0.0, 0, torch.qint8), "scale"),
                                        ((0.1, 300, torch.quint8), "zero_point")])
def test_quantize_per_tensor_rejects_bad_arguments(args, named):
    x = torch.randn(3).to("openreg")
    with pytest.raises(RuntimeError) as excinfo:
        torch.quantize_per_tensor(x, *args)
    assert named in error_text(excinfo)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_copying_between_quantized_and_float_tensors_is_refused():
    q = torch.quantize_per_tensor(torch.randn(3).to("openreg"), 0.1, 0, torch.qint8)
    with pytest.raises(RuntimeError):
        torch.empty(3, device="openreg").copy_(q)


def test_fused_attention_refuses_dropout_by_name():
    q = torch.randn(1, 2, 3, 4).to("openreg")
    with pytest.raises(RuntimeError) as excinfo:
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, q, q, None, 0.5)
    assert "dropout_p" in error_text(excinfo)


def test_attention_with_dropout_takes_the_math_path():
    from torch.nn.attention import SDPBackend

    q = torch.randn(1, 2, 3, 4).to("openreg")
    assert torch._fused_sdp_choice(q, q, q) == int(SDPBackend.OVERRIDEABLE)
    assert torch._fused_sdp_choice(q, q, q, dropout_p=0.5) == int(SDPBackend.MATH)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert out.shape == q.shape and out.device == q.device
