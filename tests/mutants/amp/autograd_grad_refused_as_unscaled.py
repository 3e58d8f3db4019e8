"""AMP-008 broken: the guard hooks the parameters' gradient computation, so ``torch.autograd.grad`` is refused too.

The framework watches each parameter with ``register_hook`` (the hook that sees a gradient as autograd computes it)
rather than a post-accumulate hook (the one that sees it written into ``.grad``). Every unscaled backward is caught,
but so is ``torch.autograd.grad(loss, params, create_graph=True)`` of a gradient penalty, which writes no gradient:
a closure that computes the penalty and then calls ``opt.backward(loss + penalty)`` is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling, UnscaledBackwardGuard
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "AMP-008",
    ["test_a_gradient_penalty_through_autograd_grad_is_not_refused[parameters]"],
    cells=F16,
    blind="contract 2026.12.5",
)


class _ComputedGradientGuard(UnscaledBackwardGuard):
    """The reference's guard, hooked on each gradient as autograd computes it rather than as it is accumulated."""

    @override
    def __enter__(self) -> None:
        self.handles = [t.register_hook(self.accumulated) for t in self.tensors if t.requires_grad]


class _Scaling(GradScaling):
    @override
    def watch(self, tensors: Sequence[torch.Tensor]) -> AbstractContextManager[None]:
        return _ComputedGradientGuard(self.backwards, tensors)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scaler is not None:
            self.parts.scaling = _Scaling(self.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
