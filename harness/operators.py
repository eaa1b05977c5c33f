"""The operators area: which OpInfo entries a run checks, and which of them
(and which dtypes) the backend claims.

Selection (``--operators``): ``default`` is the subset below, the operators
most models use; ``all`` is PyTorch's whole OpInfo database; anything else
is a comma-separated list of names or fnmatch patterns (``linalg.*``);
``none`` checks no operator (the area's contracts are then not run).

Claims (the manifest's ``[operators]`` table, docs/operators.md)::

    [operators]
    claim = ["*"]                       # patterns; absent: the default, derived (below)
    dtypes = ["float32", "float16"]     # absent: every dtype
    backward = true                     # gradients are claimed (default true)
    [operators.exclude]                 # not claimed, with the reason the report shows
    "sparse.*" = "strided tensors only"
    "nn.functional.conv2d" = { dtypes = ["complex64"], reason = "no complex convolution" }

Without ``claim`` the claim is derived from the dispatcher: every operator
is claimed, and one the device has no kernel for (the dispatcher says
"Could not run ... with arguments from the PrivateUse1 backend": nothing
registered and no fallback) is reported not-claimed instead of failed. With
``claim``, a claimed operator the backend cannot run fails.

This module imports no torch: the plugin parses the manifest before the
backend is imported; OpInfo names are matched as strings.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from privateuse1_conformance.reports.model import OperatorCell, OperatorResult, Verdict

# The operators most models use (OpInfo names; a name covers its variants):
# elementwise arithmetic and math, comparisons, activations, reductions,
# matrix products, convolution, pooling, normalization, losses, indexing,
# shape and memory operators, and attention.
DEFAULT_OPERATORS = (
    # elementwise arithmetic and math
    "abs", "add", "sub", "mul", "div", "neg", "reciprocal", "pow", "sqrt", "rsqrt", "exp", "exp2", "expm1",
    "log", "log1p", "log2", "sin", "cos", "tanh", "sigmoid", "erf", "floor", "ceil", "round", "trunc",
    "sign", "clamp", "clamp_min", "clamp_max", "lerp", "addcmul", "addcdiv", "fmod", "remainder",
    "floor_divide", "maximum", "minimum", "where", "masked_fill", "nan_to_num", "isnan", "isinf",
    "logical_not", "logical_and", "bitwise_and", "square",
    # comparisons
    "eq", "ne", "lt", "le", "gt", "ge",
    # activations
    "nn.functional.relu", "nn.functional.gelu", "nn.functional.silu", "nn.functional.leaky_relu",
    "nn.functional.elu", "nn.functional.hardtanh", "nn.functional.softplus", "nn.functional.mish",
    "nn.functional.hardswish", "softmax", "log_softmax", "nn.functional.softmin",
    # reductions
    "sum", "mean", "prod", "amax", "amin", "max.reduction_no_dim", "max.reduction_with_dim", "min.reduction_with_dim",
    "argmax", "argmin", "var", "std", "norm", "logsumexp", "cumsum", "all", "any", "topk", "sort", "argsort",
    # matrix products
    "matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "nn.functional.linear", "einsum", "outer", "dot",
    # convolution and pooling
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose2d",
    "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.interpolate", "nn.functional.pad",
    # normalization and dropout
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.group_norm",
    "nn.functional.rms_norm", "nn.functional.dropout", "nn.functional.normalize",
    # losses
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.binary_cross_entropy_with_logits", "nn.functional.l1_loss",
    "nn.functional.smooth_l1_loss",
    # indexing
    "index_select", "gather", "scatter", "scatter_add", "index_add", "index_put", "masked_select",
    "take_along_dim", "nn.functional.embedding", "nn.functional.one_hot", "nonzero",
    # shape and memory
    "cat", "stack", "split", "chunk", "view", "reshape", "permute", "transpose", "t", "squeeze",
    "unsqueeze", "flatten", "expand", "repeat", "flip", "roll", "narrow", "contiguous", "clone",
    "tril", "triu", "zeros_like", "ones_like", "full_like", "arange", "to", "type_as", "tile",
    # attention
    "nn.functional.scaled_dot_product_attention",
)


# The --operators values that select every operator a level asks for (docs/operators.md):
# any other value narrows the run.
COMPLETE_SELECTIONS = ("default", "all")

# The user properties an operators-area test (conformance/test_opinfo.py)
# reports through: each contract's outcome, which the plugin charges, and
# the operator's cells of the operator matrix: {"operator": its OpInfo key,
# "cells": {dtype: {check: [verdict, message, samples]}}}. While it runs,
# the test sends the same property as its progress (harness/evidence.py),
# with "at": [dtype, check] naming the check under way, so that a crash or
# a hang lands on the cell it happened in and the cells done before stay.
OUTCOMES_PROPERTY = "operator_outcomes"
CELLS_PROPERTY = "operator_cells"

# Each check of an operator and the clause of the statement it decides.
CHECK_CLAUSES = {
    "forward": "OP-INFO-001.1",
    "noncontiguous": "OP-INFO-001.2",
    "layout": "OP-INFO-001.4",
    "out": "OP-INFO-002.1",
    "out-device": "OP-INFO-002.3",
    "inplace": "OP-INFO-002.2",
    "backward": "OP-INFO-003.1",
    "errors": "OP-INFO-004.1",
}
ALL_DTYPES = "all"          # the cell of an operator the manifest excludes whole
MATRIX_MESSAGE_LIMIT = 300  # characters of a cell's message kept in the matrix


def operator_result(nodeid: str, cells: dict, verdict: Verdict, message: str,
                    contract_verdicts: dict[str, Verdict]) -> OperatorResult:
    """The matrix row of one operators-area test from its cells property.

    `verdict` and `message` are the test's own: a crash or a hang lands on
    the check the property says was under way ("at"). A failing check whose
    contract the expectations file expects to fail (`contract_verdicts`
    gives it xfail) is an xfail cell."""
    rows: dict[str, dict[str, list]] = {d: dict(c) for d, c in cells.get("cells", {}).items()}
    at = cells.get("at")
    if verdict in (Verdict.CRASH, Verdict.HANG) and at:
        dtype, check = at
        rows.setdefault(dtype, {})[check] = [verdict.value, message.splitlines()[0] if message else "", 0]
    result = OperatorResult(cells.get("operator", ""), nodeid)
    for dtype, checks in rows.items():
        cell = OperatorCell(dtype, {})
        for check, (name, text, *_) in checks.items():
            check_verdict = Verdict(name) if name else Verdict.SKIP  # (a check a crash cut short)
            contract = CHECK_CLAUSES.get(check, "").split(".")[0]
            if check_verdict.is_failure and contract_verdicts.get(contract) is Verdict.XFAIL:
                check_verdict = Verdict.XFAIL
            cell.checks[check] = check_verdict
            if check_verdict is not Verdict.PASS and text:
                cell.messages[check] = text if len(text) <= MATRIX_MESSAGE_LIMIT else \
                    text[: MATRIX_MESSAGE_LIMIT - 1] + "…"
        result.cells.append(cell)
    return result


def after_crash(cells: dict, message: str) -> dict:
    """An operators-area test's cells property (as its progress said it
    when its process crashed, with "at" naming the check under way), with
    that check recorded as a crash: where a fresh process of the test goes
    on from (harness/evidence.py's resumed). The crash's dtype is done."""
    rows = {d: dict(c) for d, c in cells.get("cells", {}).items()}
    dtype, check = cells["at"]
    rows.setdefault(dtype, {})[check] = ["crash", message.splitlines()[0] if message else "", 0]
    return {"operator": cells.get("operator", ""), "cells": rows}


def crash_outcomes(cells: dict, outcomes: dict | None) -> dict:
    """Each contract's outcome (OUTCOMES_PROPERTY) over an operator's cells
    when some of them crashed or hung: a contract with such a check gets
    that verdict (the first found), whatever its other checks found."""
    result = {c: list(o) for c, o in (outcomes or {}).items()}
    for checks in cells.get("cells", {}).values():
        for check, (verdict, message, *_) in checks.items():
            clause = CHECK_CLAUSES.get(check, "")
            contract = clause.split(".")[0]
            if verdict in ("crash", "hang") and contract and \
                    result.get(contract, [""])[0] not in ("crash", "hang"):
                result[contract] = [verdict, message, clause]
    return result


class OperatorsError(ValueError):
    """A manifest's [operators] table or an --operators value is invalid."""


@dataclass
class Exclusion:
    pattern: str
    reason: str
    dtypes: tuple[str, ...] = ()     # empty: the whole operator


@dataclass
class Claims:
    """What the backend claims in the operators area."""

    patterns: tuple[str, ...] | None = None      # None: derived from the dispatcher
    dtypes: tuple[str, ...] | None = None        # None: every dtype
    backward: bool = True
    exclusions: list[Exclusion] = field(default_factory=list)

    @property
    def derived(self) -> bool:
        return self.patterns is None

    @classmethod
    def from_table(cls, table: dict, where: str) -> Claims:
        keys = {"claim", "dtypes", "backward", "exclude"}
        unknown = set(table) - keys
        if unknown:
            raise OperatorsError(f"{where}: unknown keys {sorted(unknown)} in [operators]; expected "
                                 f"{', '.join(sorted(keys))}")
        patterns = table.get("claim")
        if patterns is not None and not _strings(patterns):
            raise OperatorsError(f"{where}: [operators] claim must be a list of operator names or patterns")
        dtypes = table.get("dtypes")
        if dtypes is not None and not _strings(dtypes):
            raise OperatorsError(f"{where}: [operators] dtypes must be a list of dtype names such as 'float32'")
        backward = table.get("backward", True)
        if not isinstance(backward, bool):
            raise OperatorsError(f"{where}: [operators] backward must be true or false")
        exclusions = []
        for pattern, value in table.get("exclude", {}).items():
            if isinstance(value, str):
                exclusions.append(Exclusion(pattern, value))
            elif isinstance(value, dict) and set(value) <= {"dtypes", "reason"} and isinstance(
                    value.get("reason", ""), str) and _strings(value.get("dtypes", [])):
                exclusions.append(Exclusion(pattern, value.get("reason", ""), tuple(value.get("dtypes", ()))))
            else:
                raise OperatorsError(
                    f"{where}: [operators.exclude] {pattern!r} must be a reason (a string) or a table "
                    "{ dtypes = [...], reason = \"...\" }")
        return cls(tuple(patterns) if patterns is not None else None,
                   tuple(dtypes) if dtypes is not None else None, backward, exclusions)

    def excluded(self, key: str, base: str, dtype: str | None = None) -> str | None:
        """Why the operator (dtype None) or one dtype of it is not claimed, or None."""
        if self.patterns is not None and not matches_any(key, base, self.patterns):
            return "not in the manifest's [operators] claim"
        if dtype is not None and self.dtypes is not None and dtype not in self.dtypes:
            return f"{dtype} is not among the manifest's [operators] dtypes"
        for exclusion in self.exclusions:
            # (an exclusion of some dtypes never excludes the whole operator)
            if matches(key, base, exclusion.pattern) and (not exclusion.dtypes or dtype in exclusion.dtypes):
                return exclusion.reason or "excluded by the manifest's [operators.exclude]"
        return None


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def matches(key: str, base: str, pattern: str) -> bool:
    """An OpInfo entry (its key, ``name`` or ``name.variant``, and its base
    name) against a name or fnmatch pattern: a base name covers its variants."""
    return fnmatch.fnmatchcase(key, pattern) or fnmatch.fnmatchcase(base, pattern)


def matches_any(key: str, base: str, patterns) -> bool:
    return any(matches(key, base, p) for p in patterns)


def in_default_set(key: str, base: str) -> bool:
    """Whether an OpInfo entry belongs to the default operator set, which a
    backend must claim to reach the operator contracts' level (docs/operators.md)."""
    return matches_any(key, base, DEFAULT_OPERATORS)


DEFAULT_SET_CLAUSE = "OP-INFO-001.3"


def default_set_refusal(key: str, reason: str) -> str:
    """The message of a default-set operator the backend does not claim."""
    return (f"{key} belongs to the default operator set (docs/operators.md), which the operator contracts' level "
            f"needs claimed, but the backend does not claim it: {reason}")


def select(entries: list[tuple[str, str]], selection: str) -> list[str]:
    """The keys of the OpInfo entries a run checks. `entries` are (key, base
    name) pairs; `selection` is the --operators value."""
    value = (selection or "default").strip()
    if value == "none":
        return []
    if value == "all":
        return [key for key, _ in entries]
    patterns = DEFAULT_OPERATORS if value == "default" else tuple(p.strip() for p in value.split(",") if p.strip())
    chosen = [key for key, base in entries if matches_any(key, base, patterns)]
    if value != "default":
        unmatched = [p for p in patterns if not any(matches(k, b, p) for k, b in entries)]
        if unmatched:
            raise OperatorsError(f"--operators: no OpInfo entry matches {', '.join(unmatched)}")
    return chosen
