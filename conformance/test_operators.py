"""Operators on the device compared with the same operators on the CPU.

The recurrent cells: for PrivateUse1 inputs, as for CUDA, ATen's LSTM and
GRU cells do not decompose into elementwise operators but call the fused
kernels _thnn_fused_lstm_cell and _thnn_fused_gru_cell (and their
backward kernels), which have no CPU kernel a CPU fallback could run. A
backend has to implement them for nn.LSTM, nn.GRU, nn.LSTMCell and
nn.GRUCell to run at all (nn.RNN decomposes and needs nothing)."""

from __future__ import annotations

import pytest
import torch

from ._helpers import check, must

contract = pytest.mark.contract

# float32 on both sides; other summation orders and fused arithmetic stay
# well inside these.
ATOL, RTOL = 1e-5, 1e-4


def _outputs(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    flat: list[torch.Tensor] = []
    for item in result:
        flat.extend(_outputs(item))
    return flat


def _compare(clause: str, what: str, got: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    check(clause, len(got) == len(expected), f"{what}: {len(got)} results, on CPU {len(expected)}")
    for k, (g, e) in enumerate(zip(got, expected)):
        g = must(lambda: g.cpu(), f"{what}: .cpu() of result {k}")
        check(clause, g.shape == e.shape and g.dtype == e.dtype,
              f"{what}: result {k} is {g.dtype} {tuple(g.shape)}, on CPU {e.dtype} {tuple(e.shape)}")
        check(clause, torch.allclose(g, e, atol=ATOL, rtol=RTOL),
              lambda: f"{what}: result {k} differs from CPU by up to {(g - e).abs().max().item():.3g} "
                      f"(tolerance {ATOL} + {RTOL} * |CPU|)")


def _state(kind: str, batch: int, hidden: int, layers: int = 0):
    shape = (batch, hidden) if not layers else (layers, batch, hidden)
    h = torch.randn(shape)
    return (h, torch.randn(shape)) if kind == "lstm" else h


# name, module factory, input shape, state factory (None: no initial state)
CELLS = [
    ("LSTMCell", lambda: torch.nn.LSTMCell(5, 4), (3, 5), lambda: _state("lstm", 3, 4)),
    ("LSTMCell without bias or state", lambda: torch.nn.LSTMCell(5, 4, bias=False), (3, 5), None),
    ("GRUCell", lambda: torch.nn.GRUCell(5, 4), (3, 5), lambda: _state("gru", 3, 4)),
    ("GRUCell without bias or state", lambda: torch.nn.GRUCell(5, 4, bias=False), (3, 5), None),
]
LAYERS = [
    ("LSTM (2 layers, bidirectional)", lambda: torch.nn.LSTM(5, 4, num_layers=2, bidirectional=True),
     (6, 3, 5), lambda: _state("lstm", 3, 4, layers=4)),
    ("LSTM (batch_first, no bias)", lambda: torch.nn.LSTM(5, 4, batch_first=True, bias=False), (3, 6, 5), None),
    ("GRU (2 layers)", lambda: torch.nn.GRU(5, 4, num_layers=2), (6, 3, 5), lambda: _state("gru", 3, 4, layers=2)),
    ("GRU (bidirectional, batch_first)", lambda: torch.nn.GRU(5, 4, bidirectional=True, batch_first=True),
     (3, 6, 5), None),
]


def _run(make, shape, state, device, *, grad: bool):
    torch.manual_seed(0)
    module = make()
    x = torch.randn(shape)
    h = state() if state else None
    module = module.to(device)
    x = x.to(device).requires_grad_(grad)
    if h is not None:
        h = tuple(t.to(device).requires_grad_(grad) for t in h) if isinstance(h, tuple) else \
            h.to(device).requires_grad_(grad)
    out = module(x) if h is None else module(x, h)
    leaves = [x, *(h if isinstance(h, tuple) else [h] if h is not None else []), *module.parameters()]
    return out, leaves


def _forward(clause: str, name: str, make, shape, state, dt, n) -> None:
    device = torch.device(dt, n - 1)
    expected = [t.detach() for t in _outputs(_run(make, shape, state, "cpu", grad=False)[0])]
    got = must(lambda: _run(make, shape, state, device, grad=False)[0], f"{name} on {device}")
    _compare(clause, f"{name} on {device}", [t.detach() for t in _outputs(got)], expected)
    with torch.inference_mode():
        got = must(lambda: _run(make, shape, state, device, grad=False)[0],
                   f"{name} on {device} under torch.inference_mode")
        _compare(clause, f"{name} on {device} under torch.inference_mode", _outputs(got), expected)


# decides OP-RNN-001.1
@contract("OP-RNN-001")
@pytest.mark.parametrize("name,make,shape,state", CELLS, ids=[c[0] for c in CELLS])
def test_rnn_cells_forward(name, make, shape, state, dt, n):
    _forward("OP-RNN-001.1", name, make, shape, state, dt, n)


# decides OP-RNN-001.2
@contract("OP-RNN-001")
@pytest.mark.parametrize("name,make,shape,state", LAYERS, ids=[c[0] for c in LAYERS])
def test_rnn_layers_forward(name, make, shape, state, dt, n):
    _forward("OP-RNN-001.2", name, make, shape, state, dt, n)


# decides OP-RNN-001.3
@contract("OP-RNN-001")
@pytest.mark.parametrize("name,make,shape,state", CELLS + LAYERS, ids=[c[0] for c in CELLS + LAYERS])
def test_rnn_gradients(name, make, shape, state, dt, n):
    device = torch.device(dt, n - 1)

    def gradients(where):
        out, leaves = _run(make, shape, state, where, grad=True)
        outputs = _outputs(out)
        torch.manual_seed(1)
        weights = [torch.randn(t.shape).to(where) for t in outputs]  # every output counts, unequally
        loss = sum((t * w).sum() for t, w in zip(outputs, weights))
        return torch.autograd.grad(loss, leaves, allow_unused=True)

    expected = [g if g is not None else None for g in gradients("cpu")]
    got = must(lambda: gradients(device), f"the backward pass of {name} on {device}")
    missing = [k for k, (g, e) in enumerate(zip(got, expected)) if (g is None) != (e is None)]
    check("OP-RNN-001.3", not missing, f"{name} on {device}: gradients {missing} are missing (or extra) vs CPU")
    pairs = [(g, e) for g, e in zip(got, expected) if e is not None]
    _compare("OP-RNN-001.3", f"the gradients of {name} on {device} (input, initial state, parameters)",
             [g for g, _ in pairs], [e for _, e in pairs])
