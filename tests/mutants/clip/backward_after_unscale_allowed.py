"""CLIP-002 broken: ``backward()`` after ``unscale_gradients()`` and before the closing step is not refused.

Its scaled gradients are added to the prepared (averaged, unscaled) window, which the closing step then applies as
it is: the mean is wrong, and under 16-mixed the new gradients are never unscaled.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLIP-002", ["test_backward_after_unscale_gradients_is_refused"])


class BackwardAfterUnscaleAllowed(Refusals):
    @override
    def check_backward(self, context: TrainingContext, loss: object) -> None:
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backward expects the loss tensor, got {type(loss).__name__}")


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = BackwardAfterUnscaleAllowed()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
