"""The checks' shared assertions: gradients, parameter values, snapshots, state dicts, outcomes.

A check reads an implementation from outside: it copies what it needs (:func:`grads`, :func:`param_values`,
:func:`snapshot`) and later compares a copy with what is there now or with an oracle's. Comparisons that say
"unchanged" are bit for bit, dtype included, a NaN matching a NaN (an overflowed window's gradients are not
finite); comparisons with an oracle are within the cell's tolerance.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_optimizer.conformance.harness import REORDERED_TOLERANCES, Tolerance, tolerance_for
from lightning_optimizer.spec import Cell, StepOutcome

__all__ = [
    "Snapshot",
    "assert_grads_close",
    "assert_same_grads",
    "assert_same_values",
    "assert_state_close",
    "assert_unchanged",
    "cloned",
    "grad_scaler_states",
    "grads",
    "identical",
    "last_outcome",
    "optimizer_states",
    "outcome_names",
    "param_values",
    "requires_grad_flags",
    "snapshot",
    "state_diff",
]


def _copy(tensor: torch.Tensor, to_cpu: bool) -> torch.Tensor:
    tensor = tensor.detach()
    return tensor.cpu().clone() if to_cpu else tensor.clone()


def grads(params: Iterable[torch.Tensor], *, to_cpu: bool = False) -> list[torch.Tensor | None]:
    """A copy of each parameter's gradient (``None`` where it has none), on its device or on the CPU."""
    return [None if param.grad is None else _copy(param.grad, to_cpu) for param in params]


def param_values(params: Iterable[torch.Tensor], *, to_cpu: bool = False) -> list[torch.Tensor]:
    """A copy of each parameter's value, on its device or on the CPU."""
    return [_copy(param, to_cpu) for param in params]


def optimizer_states(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each parameter's optimizer state, group by group (``{}`` where it has none), as it is now (not copied)."""
    return [dict(optimizer.state.get(param, {})) for group in optimizer.param_groups for param in group["params"]]


def requires_grad_flags(model: torch.nn.Module) -> dict[str, bool]:
    """Each named parameter's ``requires_grad``."""
    return {name: param.requires_grad for name, param in model.named_parameters()}


def last_outcome(wrapper: Any) -> StepOutcome | None:
    """A wrapper's ``last_outcome``, read now (typed, so that a check may compare it again after a call)."""
    outcome: StepOutcome | None = wrapper.last_outcome
    return outcome


def outcome_names(outcomes: Iterable[StepOutcome | None]) -> list[str | None]:
    """Each outcome's value (``None`` for none): outcomes as a report prints them."""
    return [None if outcome is None else outcome.value for outcome in outcomes]


def identical(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Bit for bit: same shape, dtype and elements, a NaN matching a NaN (compared on the CPU)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    a, b = got.detach().cpu(), want.detach().cpu()
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _max_change(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{tuple(want.shape)} {want.dtype} became {tuple(got.shape)} {got.dtype}"
    change = (got.detach().cpu().double() - want.detach().cpu().double()).abs().max().item()
    return f"max abs change {change:.3g}"


def assert_same_grads(got: Sequence[torch.Tensor | None], want: Sequence[torch.Tensor | None], what: str) -> None:
    """The same gradients, parameter by parameter: ``None`` where ``want`` has none, else :func:`identical`."""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if b is None:
            assert a is None, f"{what}: parameter {i} had no gradient and now has one"
            continue
        assert a is not None, f"{what}: the gradient of parameter {i} was removed"
        assert identical(a, b), f"{what}: the gradient of parameter {i} changed ({_max_change(a, b)})"


def assert_same_values(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], what: str) -> None:
    """The same parameter values, parameter by parameter (:func:`identical`)."""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert identical(a, b), f"{what}: parameter {i} changed ({_max_change(a, b)})"


def assert_grads_close(
    got: Iterable[torch.Tensor | None],
    expected: Sequence[torch.Tensor | None],
    cell: Cell,
    what: str,
    *,
    reordered: bool = False,
) -> None:
    """Every gradient present and within the cell's tolerance of the oracle's (which has every gradient).

    ``reordered``: the oracle reaches the same mean by other arithmetic (a division by the window's length, or a
    product with its inverse), and every defect the check targets is off by a factor. Then the tolerance is
    ``REORDERED_TOLERANCES``, its atol relative to the oracle's largest finite entry; a gradient may be missing
    where the oracle's is, and a NaN matches a NaN (an overflowed window's).
    """
    tol = REORDERED_TOLERANCES[cell.precision] if reordered else tolerance_for(cell)
    for i, (grad, want) in enumerate(zip(got, expected, strict=True)):
        if want is None:
            assert grad is None, f"{what}: parameter {i} has a gradient, the oracle's has none"
            assert reordered, "the oracle's window has a parameter without gradient"
            continue
        assert grad is not None, f"{what}: parameter {i} has no gradient"
        got_cpu, want_cpu = grad.detach().cpu().double(), want.detach().cpu().double()
        assert got_cpu.shape == want_cpu.shape, f"{what}: parameter {i}'s gradient has shape {tuple(got_cpu.shape)}"
        atol = tol.atol
        if reordered:  # relative to the oracle's size
            finite = want_cpu[want_cpu.isfinite()].abs()
            atol *= max(float(finite.max()) if finite.numel() else 0.0, 1e-30)
        if not torch.allclose(got_cpu, want_cpu, rtol=tol.rtol, atol=atol, equal_nan=reordered):
            ratio = (got_cpu.norm() / want_cpu.norm()).item()
            raise AssertionError(
                f"{what}: the gradient of parameter {i} differs from the oracle's on {cell.id} "
                f"(max abs diff {(got_cpu - want_cpu).abs().max().item():.3g}, norm {ratio:.4g} x the oracle's)"
            )


@dataclass(frozen=True)
class Snapshot:
    """Parameters' values, gradients and ``requires_grad`` flags, copied to the CPU."""

    values: list[torch.Tensor]
    grads: list[torch.Tensor | None]
    flags: list[bool]


def _to_cpu(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies on the CPU; tensors of one device and dtype in one transfer (one graph execution on XLA)."""
    if not tensors:
        return []
    first = tensors[0]
    if any(t.device != first.device or t.dtype != first.dtype for t in tensors):
        return [t.detach().cpu().clone() for t in tensors]
    flat = torch.cat([t.detach().flatten() for t in tensors]).cpu()
    sizes = [t.numel() for t in tensors]
    return [part.view(t.shape).clone() for part, t in zip(flat.split(sizes), tensors, strict=True)]


def snapshot(source: torch.nn.Module | Iterable[torch.Tensor]) -> Snapshot:
    """What a call that changes nothing must leave as it was: every parameter's value, gradient and flag."""
    params = list(source.parameters() if isinstance(source, torch.nn.Module) else source)
    present = [param.grad for param in params if param.grad is not None]
    copies = iter(_to_cpu([*params, *present]))
    values = [next(copies) for _ in params]
    return Snapshot(
        values,
        [None if param.grad is None else next(copies) for param in params],
        [param.requires_grad for param in params],
    )


def assert_unchanged(source: torch.nn.Module | Iterable[torch.Tensor] | Snapshot, before: Snapshot, what: str) -> None:
    """Values, gradients and flags as in ``before`` (bit for bit, a missing gradient still missing)."""
    now = source if isinstance(source, Snapshot) else snapshot(source)
    assert_same_values(now.values, before.values, what)
    assert_same_grads(now.grads, before.grads, f"{what}: the windows' gradients")
    assert now.flags == before.flags, f"{what} changed requires_grad flags: {now.flags}, before {before.flags}"


def cloned(state: object) -> object:
    """A deep copy of a (nested) state dict whose tensors are detached clones (tuples become lists)."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {key: cloned(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return [cloned(value) for value in state]
    return copy.deepcopy(state)


def _close(got: torch.Tensor, want: torch.Tensor, tolerance: Tolerance) -> bool:
    """Same shape and dtype, and every element within ``tolerance`` of ``want``'s (compared on the CPU)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    a, b = got.detach().cpu().double(), want.detach().cpu().double()
    return torch.allclose(a, b, rtol=tolerance.rtol, atol=tolerance.atol)


def state_diff(got: object, want: object, path: str = "state", *, tolerance: Tolerance | None = None) -> str | None:
    """Where two (nested) state dicts differ, or ``None``: tensors :func:`identical`, lists and tuples alike.

    With ``tolerance`` (``want`` an oracle's) tensors need only be within it, of the same shape and dtype.
    """
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{path} is {type(got).__name__}, was a tensor"
        if tolerance is not None:
            close = _close(got, want, tolerance)
            return None if close else f"{path} differs from the oracle's ({_max_change(got, want)}, {tolerance})"
        return None if identical(got, want) else f"{path} changed ({_max_change(got, want)})"
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            keys = sorted(map(str, got)) if isinstance(got, dict) else type(got).__name__
            return f"{path} has the keys {keys}, expected {sorted(map(str, want))}"
        for key, value in want.items():
            problem = state_diff(got[key], value, f"{path}[{key!r}]", tolerance=tolerance)
            if problem is not None:
                return problem
        return None
    if isinstance(want, list | tuple):
        if not isinstance(got, list | tuple) or len(got) != len(want):
            return f"{path} changed its length"
        for i, (mine, theirs) in enumerate(zip(got, want, strict=True)):
            problem = state_diff(mine, theirs, f"{path}[{i}]", tolerance=tolerance)
            if problem is not None:
                return problem
        return None
    return None if type(got) is type(want) and got == want else f"{path} changed from {want!r} to {got!r}"


def assert_state_close(got: object, want: object, cell: Cell, what: str) -> None:
    """A (nested) state, an optimizer's for one, as the oracle's: its structure, tensors within the cell's tolerance."""
    problem = state_diff(got, want, tolerance=tolerance_for(cell))
    assert problem is None, f"{what}: {problem}"


_GRAD_SCALER_KEYS = frozenset({"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"})


def grad_scaler_states(state: object) -> list[dict[str, Any]]:
    """Every ``GradScaler.state_dict()`` (recognised by its keys) nested in a context's state."""
    if isinstance(state, dict):
        if set(state) >= _GRAD_SCALER_KEYS:
            return [state]
        return [found for value in state.values() for found in grad_scaler_states(value)]
    if isinstance(state, list | tuple):
        return [found for value in state for found in grad_scaler_states(value)]
    return []
