"""The inner optimizers the checks wrap to see how ``step`` calls them, and the closures they hand to ``step``.

Each optimizer stands for one way an optimizer's ``step`` can treat its closure: torch's first-order optimizers
(call it once, :class:`RecordingSGD`), a two-pass optimizer (:class:`TwoPassSAM`), one that evaluates it several
times or returns something else (:class:`EvaluatingSGD`), and ``step`` signatures without a ``closure`` parameter.
:func:`frozen` is the toggling an oracle of several optimizers does by hand; :func:`toggled_closure` the closure such an
oracle hands a bare optimizer that evaluates it itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from lightning_optimizer.conformance.harness import Batch, cell_device, cell_dtype, mse
from lightning_optimizer.conformance.plain_loop import ClipFunction
from lightning_optimizer.spec import Cell, OptimizerWrapper, TrainingContext

__all__ = [
    "FIRST_RESULT",
    "DeclaredEvaluatingSGD",
    "EvaluatingSGD",
    "KeywordsOnlySGD",
    "NoClosureSGD",
    "RecordingSGD",
    "TwoPassSAM",
    "closure_of",
    "frozen",
    "toggled_closure",
]

_UNSET: Any = object()
FIRST_RESULT: Any = object()
"""What :class:`EvaluatingSGD` returns by default: its first evaluation's result."""


def closure_of(
    context: TrainingContext,
    wrapper: OptimizerWrapper[Any],
    model: torch.nn.Module,
    batch: Batch,
    cell: Cell,
    blow_up: bool = False,
) -> Callable[[], torch.Tensor]:
    """The closure form's closure: ``model``'s MSE on ``batch`` under ``context.autocast()``, ``wrapper.backward``.

    With ``blow_up`` the loss is infinite (a planted overflow). The closure returns the loss.
    """

    def closure() -> torch.Tensor:
        with context.autocast():
            loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
        loss = loss * float("inf") if blow_up else loss
        wrapper.backward(loss)
        return loss

    return closure


@contextmanager
def frozen(params: Iterable[torch.Tensor]) -> Iterator[None]:
    """``requires_grad`` off for ``params`` in the block, on again after it: another optimizer toggled off by hand."""
    held = list(params)
    for param in held:
        param.requires_grad_(False)
    try:
        yield
    finally:
        for param in held:
            param.requires_grad_(True)


def toggled_closure(
    optimizer: torch.optim.Optimizer,
    loss_of: Callable[[], torch.Tensor],
    others: Iterable[torch.Tensor] = (),
    clip: ClipFunction | None = None,
) -> Callable[[], torch.Tensor]:
    """A bare closure-evaluating optimizer's closure, doing by hand what the rules do to each evaluation.

    Each evaluation zeroes ``optimizer``'s gradients (to ``None``), computes ``loss_of()`` and its backward with
    ``others`` (another optimizer's parameters) toggled off by :func:`frozen`, then clips ``optimizer``'s parameters
    with ``clip``; it returns the loss.
    """
    held = list(others)

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with frozen(held):
            loss = loss_of()
            loss.backward()
        if clip is not None:
            clip([param for group in optimizer.param_groups for param in group["params"]])
        return loss

    return closure


class RecordingSGD(torch.optim.SGD):
    """torch's SGD, recording each ``step`` call.

    Whether a ``closure`` argument was given (``given``), whether it was a callable (``received``), and the other
    keyword arguments (``calls``).
    """

    def __init__(self, params: Any, **hyper: Any) -> None:
        super().__init__(params, **hyper)
        self.given: list[bool] = []
        self.received: list[bool] = []
        self.calls: list[dict[str, Any]] = []

    def step(self, closure: Any = _UNSET, **kwargs: Any) -> Any:
        """SGD's step (which calls the closure once, first), after recording the call."""
        self.given.append(closure is not _UNSET)
        self.received.append(callable(closure))
        self.calls.append(kwargs)
        return super().step(None if closure is _UNSET else closure)


class TwoPassSAM(torch.optim.Optimizer):
    """Sharpness-aware minimisation, torch's closure convention; it needs its closure and raises without one.

    The closure's gradient ``g`` at ``w``, the closure again at ``w + rho * g / |g|``, then an SGD step from ``w``
    with the second gradient.
    """

    def __init__(self, params: Any, lr: float = 0.1, rho: float = 0.05) -> None:
        super().__init__(params, {"lr": lr, "rho": rho})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Two evaluations of the closure, one update."""
        if closure is None:
            raise RuntimeError("TwoPassSAM.step needs its closure")
        with torch.enable_grad():
            loss = closure()
        held = [(group, p) for group in self.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for _, p in held]))
        moves = [(p, (p.grad.float() * (group["rho"] / (norm + 1e-12))).to(p.dtype)) for group, p in held]
        for p, move in moves:
            p.add_(move)
        with torch.enable_grad():
            closure()
        for (group, p), (_, move) in zip(held, moves, strict=True):
            p.sub_(move)
            p.add_(p.grad, alpha=-group["lr"])
        return loss


class EvaluatingSGD(torch.optim.SGD):
    """An SGD whose ``step`` calls the closure it gets ``evaluations`` times, then steps on the last gradients.

    It returns its first evaluation's result (``None`` without a closure), or ``returns`` where that is given;
    ``declares`` sets ``evaluates_closure = True`` on the instance.
    """

    def __init__(
        self, params: Any, evaluations: int = 1, returns: Any = FIRST_RESULT, declares: bool = False, **hyper: Any
    ) -> None:
        super().__init__(params, **hyper)
        self.evaluations, self.returns = evaluations, returns
        if declares:
            self.evaluates_closure = True

    def step(self, closure: Any = None) -> Any:
        """``evaluations`` calls of the closure, SGD's step, the result."""
        results = [] if closure is None else [closure() for _ in range(self.evaluations)]
        super().step()
        if self.returns is FIRST_RESULT:
            return results[0] if results else None
        return self.returns


class DeclaredEvaluatingSGD(EvaluatingSGD):
    """An :class:`EvaluatingSGD` declaring ``evaluates_closure = True`` on its class."""

    evaluates_closure = True


class KeywordsOnlySGD(torch.optim.SGD):
    """An SGD whose ``step`` takes only ``**kwargs``; it calls a ``closure`` it gets, appending the result."""

    def __init__(self, params: Any, **hyper: Any) -> None:
        super().__init__(params, **hyper)
        self.results: list[Any] = []

    def step(self, **kwargs: Any) -> Any:  # type: ignore[override]
        """The closure's result recorded (``None`` without one), then SGD's step."""
        closure = kwargs.get("closure")
        self.results.append(None if closure is None else closure())
        return torch.optim.SGD.step(self)


class NoClosureSGD(torch.optim.SGD):
    """An SGD whose ``step`` takes no argument at all; ``calls`` counts its steps."""

    calls = 0

    def step(self) -> None:  # type: ignore[override]
        """SGD's step, counted."""
        self.calls += 1
        torch.optim.SGD.step(self)
