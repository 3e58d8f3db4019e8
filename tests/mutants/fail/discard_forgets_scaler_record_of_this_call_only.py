"""FAIL-003 broken, half-fixed: the scaler forgets only an unscaling the failing call made itself.

The framework copied the restore rule ("this call's unscaling is undone with the window") into the discard: the
scaler forgets the optimizer when the failing call itself prepared the window, but a window that the user's
``unscale_gradients()`` prepared before its closing step failed in the inner step keeps the scaler's record
("that unscaling was the user's"). The gradients are discarded all the same, and the next window of that
optimizer is then never unscaled: its real step applies gradients still multiplied by the loss scale.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "FAIL-003",
    ["test_a_failed_window_leaves_no_found_inf_behind[discard-inner-step]"],
    cells=F16,
    blind="contract 2026.12.6",
)


class ThisCallOnlyScaling(GradScaling):
    def __init__(self, scaling: GradScaling, context: MutantContext) -> None:
        super().__init__(scaling.scaler)
        self._owner = context

    @override
    def forget(self, optimizer: torch.optim.Optimizer) -> None:
        call = self._owner.windows.call
        if call is not None and call.prepared_before:
            return  # prepared by the user's unscale_gradients(): "not ours to forget"
        super().forget(optimizer)

    @override
    def __getstate__(self) -> dict[str, Any]:
        return {"scaling": super().__getstate__(), "context": self._owner}

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state["scaling"])
        self._owner = state["context"]


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self.parts.scaling, GradScaling):
            self.parts.scaling = ThisCallOnlyScaling(self.parts.scaling, self)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
