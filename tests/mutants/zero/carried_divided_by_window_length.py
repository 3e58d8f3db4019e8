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
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-005",
    [
        "test_a_window_applies_what_it_carries_plus_its_own_mean[windows 2, 4, flushed 1]",
        "test_a_window_applies_what_it_carries_plus_its_own_mean[windows 3, cut short 2, flushed 2]",
        "test_a_window_applies_what_it_carries_plus_its_own_mean[windows 4, flushed 3]",
        "test_unscale_gradients_makes_the_sum_the_user_clips",
        "test_a_failed_window_discards_or_restores_its_carried_part[later micro-step-restore]",
        "test_a_failed_window_discards_or_restores_its_carried_part[inner step-restore]",
        ORACLE_PROPERTY,
    ],
)


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
