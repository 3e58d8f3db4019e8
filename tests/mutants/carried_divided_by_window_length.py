"""ZERO-005 broken: the carried part is divided by the window's length, as if it were one of its micro-steps.

``c / k + (g_1 + ... + g_k) / k`` instead of ``c + (g_1 + ... + g_k) / k``: what an implementation applies that
leaves the last step's gradients in ``.grad`` for the window to accumulate onto.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.preparation import AddCarried
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class AddCarriedOverLength(AddCarried):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        length = window.length + 1
        with torch.no_grad():
            for param, grad in (window.carried or {}).items():
                if param.grad is None:
                    param.grad = grad / length
                else:
                    param.grad.add_(grad / length)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        steps = tuple(
            AddCarriedOverLength() if isinstance(step, AddCarried) else step for step in self.parts.preparation.steps
        )
        self.parts.preparation = dataclasses.replace(self.parts.preparation, steps=steps)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
