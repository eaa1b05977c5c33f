"""OpenReg's process group beyond what the conformance suite asks of any
backend: coalesced calls of several tensors (the suite's DTensor checks use
one), and their argument checks."""

from __future__ import annotations

import torch

from kit_support import OPENREG_RANKS, SCENARIO_ENV
from privateuse1_conformance.conformance._distributed import Raised, run_ranks


def test_coalesced_calls_run_every_tensor_and_refuse_bad_pairs_before_queuing():
    outcomes = run_ranks(OPENREG_RANKS, "orccl", "coalesced", module="openreg_pg_scenarios", budget=120,
                         env=SCENARIO_ENV)
    a = [torch.full((2, 3), float(r + 1)) for r in range(2)]
    b = [torch.arange(4.0) * (r + 1) for r in range(2)]
    x_sum = sum(torch.arange(8.0).reshape(4, 2) * (r + 1) for r in range(2))
    y_sum = sum(torch.arange(6.0) * (r + 1) for r in range(2))
    for rank, outcome in enumerate(outcomes):
        assert outcome.ok, outcome.describe()
        seen = outcome.observed
        for name in ("all_gather", "reduce_scatter", "all_reduce", "work", "after"):
            assert not isinstance(seen[name], Raised), (name, seen[name].message)
        assert torch.equal(seen["all_gather"][0], torch.cat(a)) and torch.equal(seen["all_gather"][1], torch.cat(b))
        assert torch.equal(seen["work"][0], torch.cat(a)) and torch.equal(seen["work"][1], torch.cat(b))
        # AVG over two ranks, block `rank` of each.
        assert torch.equal(seen["reduce_scatter"][0], (x_sum / 2).chunk(2)[rank])
        assert torch.equal(seen["reduce_scatter"][1], (y_sum / 2).chunk(2)[rank])
        assert torch.equal(seen["all_reduce"][0], a[0] + a[1]) and torch.equal(seen["all_reduce"][1], b[0] + b[1])
        assert isinstance(seen["unpaired"], Raised) and "one output per input" in seen["unpaired"].message
        assert isinstance(seen["wrong_size"], Raised) and "world size x input elements" in seen["wrong_size"].message
        assert torch.equal(seen["after"], torch.full((3,), 3.0))
