"""Automatic mixed precision on OpenReg: the cast policy registered for
AutocastPrivateUse1 (reference_backend/csrc/Autocast.cpp), GradScaler, and the
issue's acceptance training loops (CPU parity, dropout reproducibility,
autocast + GradScaler).

The lower-precision kernels are PyTorch's CPU kernels (run through the CPU
fallback); they support float16 and bfloat16 for the whole matmul family and
for conv1d/conv2d, so every operator below is checked in both dtypes.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

DEV = "openreg"
LOWER = [torch.float16, torch.bfloat16]


def operands() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"a": (8, 16), "b": (16, 4), "c": (8, 4), "w": (4, 16), "bias": (4,),
              "ba": (3, 8, 16), "bb": (3, 16, 4), "bc": (3, 8, 4),
              "x1": (2, 3, 12), "k1": (4, 3, 3), "x2": (2, 3, 7, 7), "k2": (4, 3, 3, 3)}
    return {k: torch.randn(*s, generator=g) for k, s in shapes.items()}


LOWER_PRECISION_OPS = {
    "mm": lambda t: torch.mm(t["a"], t["b"]),
    "bmm": lambda t: torch.bmm(t["ba"], t["bb"]),
    "addmm": lambda t: torch.addmm(t["c"], t["a"], t["b"]),
    "matmul": lambda t: torch.matmul(t["ba"], t["b"]),
    "linear": lambda t: F.linear(t["a"], t["w"], t["bias"]),
    "baddbmm": lambda t: torch.baddbmm(t["bc"], t["ba"], t["bb"]),
    "conv1d": lambda t: F.conv1d(t["x1"], t["k1"], padding=1),
    "conv2d": lambda t: F.conv2d(t["x2"], t["k2"], stride=2),
}

FP32_OPS = {
    "softmax": lambda h: torch.softmax(h, -1),
    "log_softmax": lambda h: F.log_softmax(h, -1),
    "mse_loss": lambda h: F.mse_loss(h, h.flip(0)),
    "smooth_l1_loss": lambda h: F.smooth_l1_loss(h, h.flip(0)),
    "pow": lambda h: torch.pow(h, 2),
    "exp": lambda h: torch.exp(h),
    "sum": lambda h: h.sum(),
    "cumsum": lambda h: h.cumsum(0),
    "layer_norm": lambda h: F.layer_norm(h, h.shape[-1:]),
    "logsumexp": lambda h: torch.logsumexp(h, 0),
}


def test_supported_dtypes_are_float16_and_bfloat16():
    assert torch.openreg.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.get_autocast_dtype(DEV) in torch.openreg.get_amp_supported_dtype()


@pytest.mark.parametrize("op", list(LOWER_PRECISION_OPS))
@pytest.mark.parametrize("dtype", LOWER, ids=str)
def test_matmul_family_and_convolutions_run_in_the_lower_precision(dtype, op):
    cpu = operands()
    expected = LOWER_PRECISION_OPS[op](cpu)
    on_device = {k: v.to(DEV) for k, v in cpu.items()}
    with torch.autocast(DEV, dtype=dtype):
        out = LOWER_PRECISION_OPS[op](on_device)
    assert out.device.type == DEV and out.dtype == dtype, f"{op} under autocast({dtype}) gave {out.dtype}"
    tolerance = 16 * torch.finfo(dtype).eps
    torch.testing.assert_close(out.float().cpu(), expected, rtol=tolerance,
                               atol=tolerance * expected.abs().max().item())
    assert LOWER_PRECISION_OPS[op](on_device).dtype == torch.float32, "autocast leaked out of its block"


@pytest.mark.parametrize("op", list(FP32_OPS))
@pytest.mark.parametrize("dtype", LOWER, ids=str)
def test_fp32_policy_ops_run_in_float32(dtype, op, capfd):
    h = torch.randn(6, 5, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.autocast(DEV, dtype=dtype):
        out = FP32_OPS[op](h.to(DEV))
    assert out.dtype == torch.float32, f"{op} of {dtype} inputs under autocast gave {out.dtype}"
    torch.testing.assert_close(out.cpu(), FP32_OPS[op](h.float()), rtol=1e-5, atol=1e-5)
    # PyTorch's CPU kernels run on the stream worker; their warnings go to stderr.
    assert "resized" not in capfd.readouterr().err, f"{op} warned about resizing its output"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_unsupported_dtype_warns_and_disables_autocast(dtype):
    t = {k: v.to(DEV) for k, v in operands().items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(DEV, dtype=dtype):
            enabled = torch.is_autocast_enabled(DEV)
            out = torch.mm(t["a"], t["b"])
    assert not enabled and out.dtype == torch.float32
    assert any("not supported" in str(w.message) and DEV in str(w.message) for w in caught), (
        [str(w.message) for w in caught])


def test_backward_through_autocast_convolution_and_linear():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 5 * 5, 2))
    x = torch.randn(2, 3, 7, 7)
    reference = [p.clone() for p in model.parameters()]
    model(x).float().square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    device_model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(),
                                       torch.nn.Linear(4 * 5 * 5, 2)).to(DEV)
    with torch.no_grad():
        for p, r in zip(device_model.parameters(), reference):
            p.copy_(r)
    with torch.autocast(DEV, dtype=torch.bfloat16):
        out = device_model(x.to(DEV))
        assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    for p, e in zip(device_model.parameters(), expected):
        assert p.grad.dtype == torch.float32 and p.grad.device.type == DEV
        torch.testing.assert_close(p.grad.cpu(), e, rtol=0.05, atol=0.05 * e.abs().max().item())


# ------------------------------------------------------------- GradScaler


def small_model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)


def test_grad_scaler_updates_the_scale_and_skips_steps_with_inf_gradients():
    model = small_model(DEV)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(DEV, init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5,
                                  growth_interval=2)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(32, 8, generator=g).to(DEV), torch.randn(32, 1, generator=g).to(DEV)
    scales = []
    for step in range(5):
        optimizer.zero_grad()
        with torch.autocast(DEV, dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if step == 3:
            model[0].weight.grad[0, 0] = float("inf")
        before = [p.detach().cpu().clone() for p in model.parameters()]
        scaler.step(optimizer)
        scaler.update()
        after = [p.detach().cpu() for p in model.parameters()]
        unchanged = all(torch.equal(a, b) for a, b in zip(before, after))
        assert unchanged == (step == 3), (
            f"step {step}: the weights {'did not change' if unchanged else 'changed'}")
        scales.append(scaler.get_scale())
    # Grows after every 2 finite steps, halves on the inf step.
    assert scales == [1024.0, 2048.0, 2048.0, 1024.0, 1024.0], scales


# ---------------------------------------------------------- training loops


def mlp_losses(device: str, *, steps: int = 20, dropout: float = 0.0, autocast: bool = False,
               seed: int = 0) -> list[float]:
    """A two-layer MLP trained with SGD; parameters and data come from a CPU
    generator, so every device starts from the same numbers."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                                torch.nn.Linear(32, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    model = model.to(device)
    x = torch.randn(64, 10, generator=g).to(device)
    y = (x[:, :1] * 2 - x[:, 1:2]).detach()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device.split(":")[0], enabled=autocast)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        with torch.autocast(device.split(":")[0], dtype=torch.float16, enabled=autocast):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    return losses


def test_mlp_on_second_device_follows_the_cpu_loss_trajectory(two_devices):
    cpu = mlp_losses("cpu")
    device = mlp_losses("openreg:1")
    torch.testing.assert_close(torch.tensor(device), torch.tensor(cpu), rtol=1e-5, atol=1e-6)
    assert cpu[-1] < cpu[0] / 2, "the reference loop does not learn"


def test_mlp_with_dropout_is_reproducible_run_to_run():
    first = mlp_losses(DEV, dropout=0.3)
    again = mlp_losses(DEV, dropout=0.3)
    other_seed = mlp_losses(DEV, dropout=0.3, seed=1)
    assert first == again, "the same seed gave a different dropout trajectory"
    assert first != other_seed, "dropout did not draw from the seeded device generator"


def test_mlp_with_autocast_and_grad_scaler_learns():
    losses = mlp_losses(DEV, autocast=True)
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0] / 2, f"the loss did not fall: {losses[0]} -> {losses[-1]}"
