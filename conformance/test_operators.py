"""Operators on the device compared with the same operators on the CPU.

The recurrent cells: for PrivateUse1 inputs, as for CUDA, ATen's LSTM and
GRU cells do not decompose into elementwise operators but call the fused
kernels _thnn_fused_lstm_cell and _thnn_fused_gru_cell (and their
backward kernels), which have no CPU kernel a CPU fallback could run. A
backend has to implement them for nn.LSTM, nn.GRU, nn.LSTMCell and
nn.GRUCell to run at all (nn.RNN decomposes and needs nothing).

Attention: F.scaled_dot_product_attention must compute on the device what
it computes on the CPU, whichever kernel the backend picks (OP-SDPA-001).
The optional feature sdpa-override is PyTorch's extension point for an
out-of-tree device's fused attention: the device's _fused_sdp_choice answers
SDPBackend.OVERRIDEABLE and attention.cpp calls
_scaled_dot_product_fused_attention_overrideable (OP-SDPA-002)."""

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
        check(clause, g.device.type not in ("cpu", "meta"),
              f"{what}: result {k} is on {g.device}, not on the device its inputs are on")
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


# ------------------------------------------------------- attention (SDPA)

# (name, query shape, key shape, value shape, keyword arguments). Keys
# outnumber queries so that the causal mask is not square; the boolean
# mask leaves every query at least one key (CPU's paths disagree about rows
# that see none).
def _sdpa_cases():
    torch.manual_seed(3)
    bool_mask = torch.rand(2, 1, 4, 5) > 0.4
    bool_mask[..., 0] = True
    return [
        ("plain", (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {}),
        ("causal", (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {"is_causal": True}),
        ("float-mask", (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {"attn_mask": torch.randn(4, 5)}),
        ("bool-mask", (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {"attn_mask": bool_mask}),
        ("scale", (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {"scale": 0.3}),
        ("3-d", (3, 4, 8), (3, 6, 8), (3, 6, 8), {}),
        ("head-transposed", (2, 4, 3, 8), (2, 5, 3, 8), (2, 5, 3, 8), {"transpose": True}),
        # values of another width than queries and keys: the default scale is
        # the query's (1 / sqrt(8)), the output has the value's width
        ("value-width", (2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6), {"is_causal": True}),
    ]


SDPA_CASES = _sdpa_cases()


def _sdpa_inputs(q_shape, k_shape, v_shape, kwargs, where, grad: bool):
    """The case's inputs on `where` (leaves when `grad`), from one seed;
    'transpose' makes (batch, sequence, heads, embedding) inputs into
    non-contiguous (batch, heads, sequence, embedding) views, as models do."""
    torch.manual_seed(4)
    kwargs = dict(kwargs)
    transpose = kwargs.pop("transpose", False)
    leaves = [torch.randn(s).to(where).requires_grad_(grad) for s in (q_shape, k_shape, v_shape)]
    qkv = [t.transpose(1, 2) if transpose else t for t in leaves]
    kwargs = {k: (v.to(where) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return leaves, qkv, kwargs


def _sdpa_run(case, where, grad: bool, attend=None):
    """The case's attention on `where` (by `attend`, default
    F.scaled_dot_product_attention) and, with `grad`, the gradients of a
    weighted sum of it with respect to query, key, value and a float mask."""
    _, q_shape, k_shape, v_shape, kwargs = case
    import torch.nn.functional as F

    leaves, (q, k, v), kwargs = _sdpa_inputs(q_shape, k_shape, v_shape, kwargs, where, grad)
    mask = kwargs.get("attn_mask")
    if grad and mask is not None and mask.dtype != torch.bool:
        mask = kwargs["attn_mask"] = mask.clone().requires_grad_()
        leaves.append(mask)
    out = (attend or F.scaled_dot_product_attention)(q, k, v, **kwargs)
    if not grad:
        return out, []
    torch.manual_seed(5)
    weight = torch.randn(out.shape).to(where)
    return out, torch.autograd.grad((out * weight).sum(), leaves)


# decides OP-SDPA-001.1
@contract("OP-SDPA-001")
@pytest.mark.parametrize("case", SDPA_CASES, ids=[c[0] for c in SDPA_CASES])
def test_sdpa_forward(case, dt, n):
    device = torch.device(dt, n - 1)
    expected, _ = _sdpa_run(case, "cpu", grad=False)
    got, _ = must(lambda: _sdpa_run(case, device, grad=False),
                  f"F.scaled_dot_product_attention ({case[0]}) on {device}")
    check("OP-SDPA-001.1", got.device == device, f"scaled_dot_product_attention on {device} returned a tensor on "
                                                 f"{got.device}")
    _compare("OP-SDPA-001.1", f"scaled_dot_product_attention ({case[0]}) on {device}", [got], [expected])
    with torch.inference_mode():
        got, _ = must(lambda: _sdpa_run(case, device, grad=False),
                      f"F.scaled_dot_product_attention ({case[0]}) on {device} under torch.inference_mode")
    _compare("OP-SDPA-001.1", f"scaled_dot_product_attention ({case[0]}) on {device} under torch.inference_mode",
             [got], [expected])


# decides OP-SDPA-001.2
@contract("OP-SDPA-001")
@pytest.mark.parametrize("case", SDPA_CASES, ids=[c[0] for c in SDPA_CASES])
def test_sdpa_gradients(case, dt, n):
    device = torch.device(dt, n - 1)
    _, expected = _sdpa_run(case, "cpu", grad=True)
    _, got = must(lambda: _sdpa_run(case, device, grad=True),
                  f"the backward pass of scaled_dot_product_attention ({case[0]}) on {device}")
    _compare("OP-SDPA-001.2", f"the gradients of scaled_dot_product_attention ({case[0]}) on {device} "
                              "(query, key, value, float mask)", list(got), list(expected))


# -- the extension point: _fused_sdp_choice -> OVERRIDEABLE

OVERRIDEABLE_OP = "aten._scaled_dot_product_fused_attention_overrideable.default"


def _ops_called(function) -> tuple[object, list[str]]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record() as record:
        result = function()
    return result, record.ops


# decides OP-SDPA-002.1
@contract("OP-SDPA-002")
def test_sdpa_chooses_the_overrideable_kernel(dt, n):
    from torch.nn.attention import SDPBackend
    import torch.nn.functional as F

    device = torch.device(dt, n - 1)
    _, (q, k, v), _ = _sdpa_inputs((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {}, device, grad=False)
    choice = must(lambda: torch._fused_sdp_choice(q, k, v), f"torch._fused_sdp_choice on {device} inputs")
    check("OP-SDPA-002.1", choice == int(SDPBackend.OVERRIDEABLE),
          f"torch._fused_sdp_choice(query, key, value) on float32 {device} inputs is {choice}, not "
          f"SDPBackend.OVERRIDEABLE ({int(SDPBackend.OVERRIDEABLE)}): register the device's choice with "
          "REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, ...) and a PrivateUse1 kernel for "
          "aten::_fused_sdp_choice")
    _, ops = _ops_called(lambda: F.scaled_dot_product_attention(q, k, v))
    check("OP-SDPA-002.1", OVERRIDEABLE_OP in ops,
          f"F.scaled_dot_product_attention on {device} did not call {OVERRIDEABLE_OP} (it called "
          f"{sorted(set(ops))})")


# decides OP-SDPA-002.2
@contract("OP-SDPA-002")
@pytest.mark.parametrize("case", [c for c in SDPA_CASES if c[0] in ("plain", "causal", "float-mask", "scale",
                                                                   "value-width")],
                         ids=["plain", "causal", "float-mask", "scale", "value-width"])
def test_overrideable_kernel_matches_cpu(case, dt, n):
    """The kernel called directly (as attention.cpp calls it, a float mask
    as attn_bias) against CPU's scaled_dot_product_attention, forward and
    through autograd's formula for it (the backward kernel)."""
    device = torch.device(dt, n - 1)
    name = case[0]
    op = torch.ops.aten._scaled_dot_product_fused_attention_overrideable

    def overrideable(q, k, v, attn_mask=None, is_causal=False, scale=None):
        return op(q, k, v, attn_mask, 0.0, is_causal, False, scale=scale)[0]

    expected, expected_grads = _sdpa_run(case, "cpu", grad=True)
    got, grads = must(lambda: _sdpa_run(case, device, grad=True, attend=overrideable),
                      f"{OVERRIDEABLE_OP} ({name}) on {device} and its backward")
    _compare("OP-SDPA-002.2", f"{OVERRIDEABLE_OP} ({name}) on {device}", [got], [expected])
    _compare("OP-SDPA-002.2", f"the gradients through {OVERRIDEABLE_OP} ({name}) on {device}", list(grads),
             list(expected_grads))


# decides OP-SDPA-002.3
@contract("OP-SDPA-002")
def test_sdpa_kernel_selection_is_respected(dt, n):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    device = torch.device(dt, n - 1)
    _, (q, k, v), _ = _sdpa_inputs((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {}, device, grad=False)
    _, (qc, kc, vc), _ = _sdpa_inputs((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {}, "cpu", grad=False)
    expected = F.scaled_dot_product_attention(qc, kc, vc)
    for allowed, wanted in (([SDPBackend.MATH], False), ([SDPBackend.OVERRIDEABLE], True)):
        label = f"sdpa_kernel([{', '.join(f'SDPBackend.{b.name}' for b in allowed)}])"
        with sdpa_kernel(allowed):
            got, ops = must(lambda: _ops_called(lambda: F.scaled_dot_product_attention(q, k, v)),
                            f"F.scaled_dot_product_attention on {device} under {label}")
        check("OP-SDPA-002.3", (OVERRIDEABLE_OP in ops) == wanted,
              f"under {label}, F.scaled_dot_product_attention on {device} "
              f"{'did not call' if wanted else 'called'} {OVERRIDEABLE_OP}: the device's _fused_sdp_choice must "
              "answer only a backend that torch.nn.attention.sdpa_kernel allows")
        _compare("OP-SDPA-002.3", f"scaled_dot_product_attention on {device} under {label}", [got], [expected])
