"""HOOK-002 broken: ``before_optimizer_step`` runs before the window's preparation, not after it.

As a framework hook fired at the top of the optimizer step: a gradient-norm or NaN check sees the window's sum,
still scaled under 16-mixed, instead of the unscaled mean the step applies.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.hooks import Hooks
from lightning_optimizer.reference.preparation import Preparation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo, OptimizerWrapper
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("HOOK-002", ["test_hooks_follow_every_backward_and_step"])


@dataclasses.dataclass(frozen=True)
class HooksFirst(Preparation):
    @override
    def prepare(self, context: TrainingContext, window: Window) -> None:
        hooks = context.parts.hooks
        if hooks.before_optimizer_step:
            index = next(i for i, each in enumerate(context.windows) if each is window)
            wrapper = context.new_wrapper(index)
            for hook in list(hooks.before_optimizer_step.values()):
                hook(wrapper)
        super().prepare(context, window)


class NotBeforeTheInnerStep(Hooks):
    @override
    def run_before_optimizer_step(self, wrapper: OptimizerWrapper[Any]) -> None:
        return  # they ran before the preparation


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = HooksFirst(steps=preparation.steps, evaluation=preparation.evaluation)
        self.parts.hooks = NotBeforeTheInnerStep()

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.parts.hooks = NotBeforeTheInnerStep()  # a copy carries no hooks, and runs them as this one does


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
