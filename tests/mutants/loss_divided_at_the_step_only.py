"""AMP-007 broken: under 16-mixed each micro-step backpropagates the fully scaled loss; the step divides by k.

The reference until contract 2026.12.5: the window's mean is right, but each micro-step's scaled backward is
``accumulate_grad_batches`` times larger in float16 than the recipe's ``scaler.scale(loss / N)``, and overflows that
much sooner: windows that Lightning's loop and torch's examples apply are skipped.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self._check_backward(loss)
        with self._scaling.backward():
            self._scaling.scale(loss, 1).backward(*args, **kwargs)

    def _normalise_window(self, slot: Slot) -> None:
        normalise_window(slot.params(), slot.pending + 1)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
