"""AMP-002 broken: whether a window has gradients to unscale is judged by the optimizer's first parameter.

``if params[0].grad is not None: scaler.unscale_(optimizer)``: an optimizer whose first parameter got no gradient
(an embedding the batch did not use, a frozen layer, a parameter listed first but unused) steps on gradients still
multiplied by the loss scale.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.preparation import Unscaling
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("AMP-002", [ORACLE_PROPERTY], cells=F16)


class _FirstParameterDecides(Unscaling):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if window.params()[0].grad is not None:
            super().__call__(context, window)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        steps = tuple(_FirstParameterDecides() if isinstance(step, Unscaling) else step for step in preparation.steps)
        self.parts.preparation = dataclasses.replace(preparation, steps=steps)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
