"""CLIP-002 broken: ``backward()`` is refused after ``unscale_gradients()`` only inside the closing step's closure.

Between calls (the backward-then-step form), a backward of any wrapper after another's ``unscale_gradients()`` adds
scaled gradients to the prepared window.
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


class BackwardCheckedInClosuresOnly(Refusals):
    @override
    def check_backward(self, context: TrainingContext, loss: object) -> None:
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backward expects the loss tensor, got {type(loss).__name__}")
        call = context.windows.call
        if call is not None and call.prepared:
            raise RuntimeError("backward() after unscale_gradients() in the closure of the closing step")


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = BackwardCheckedInClosuresOnly()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
