"""ACC-002 broken: Lightning-style loss scaling in ``backward`` instead of normalising the window.

``w.backward(loss)`` backpropagates ``loss / accumulate_grad_batches`` and the real step divides nothing, so a
closure calling ``loss.backward()`` directly applies the window's sum.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.preparation import WindowMean
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ACC-002", ["test_plain_backward_gives_the_same_mean"])


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = type(preparation)(
            steps=tuple(step for step in preparation.steps if not isinstance(step, WindowMean)),
            evaluation=preparation.evaluation,
        )

    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        super().backward(wrapper, loss / self.accumulate_grad_batches, *args, **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
