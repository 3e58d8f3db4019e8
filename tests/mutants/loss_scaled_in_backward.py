"""ACC-002 broken: Lightning-style loss scaling in ``backward`` instead of normalising the window.

``w.backward(loss)`` backpropagates ``loss / accumulate_grad_batches`` and the real step divides nothing, so a
closure calling ``loss.backward()`` directly applies the window's sum.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        super()._backward(loss / self._accumulate_grad_batches, *args, **kwargs)

    def _normalise_window(self, slot: Slot) -> None:
        pass


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
