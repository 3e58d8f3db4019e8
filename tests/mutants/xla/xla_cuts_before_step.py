"""XLA-001 broken: the real step cuts the lazy graph after the reduction but before the inner optimizer steps.

A ``torch_xla.sync()`` in the pre-step hook (where a precision plugin finishes the closure's work), and none after
``optimizer.step()``: the update is only recorded, and runs with the next window's graph, or whenever something
reads the parameters. One cut per window, as counted, but in the wrong place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.preparation import PreparationStep, Reduction
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA, Mutant

MUTANT = Mutant(
    "XLA-001",
    ["test_one_reduction_per_window_after_its_last_backward", "test_one_reduction_per_window_then_clipping"],
    cells=XLA,
)


class ReductionThenCut(Reduction):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        super().__call__(context, window)
        context.parts.device.after_step()  # torch_xla.sync() on XLA


def _cut_after(step: PreparationStep) -> PreparationStep:
    return ReductionThenCut() if isinstance(step, Reduction) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = dataclasses.replace(
            preparation,
            steps=tuple(map(_cut_after, preparation.steps)),
            evaluation=tuple(map(_cut_after, preparation.evaluation)),
        )

    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        if closure is not None:
            step: Callable[..., Any] = window.optimizer.step
            return step(closure, **kwargs)
        return self.parts.scaling.step(window.optimizer, window.optimizer.step, kwargs)  # no graph cut after the step


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
