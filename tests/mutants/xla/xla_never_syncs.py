"""XLA-001 broken: a real step never cuts the lazy graph (no ``torch_xla.sync()`` / ``mark_step``).

The optimizer's update is only recorded: the graph keeps growing across steps until something reads a tensor,
and nothing executes where the step ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA, Mutant

MUTANT = Mutant("XLA-001", ["test_one_reduction_per_window_after_its_last_backward"], cells=XLA)


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        if closure is not None:
            step: Callable[..., Any] = window.optimizer.step
            return step(closure, **kwargs)
        return self.parts.scaling.step(window.optimizer, window.optimizer.step, kwargs)  # no graph cut after the step


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
