"""XLA-001 broken: a real step skipped for non-finite gradients (16-mixed) does not cut the lazy graph.

As a loop that calls ``torch_xla.sync()`` only after an optimizer step that was taken: the skipped window's work
stays pending in the graph, which grows into the next window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA_F16, Mutant

MUTANT = Mutant("XLA-001", ["test_each_window_is_reduced_once_and_a_skipped_step_cuts_once"], cells=XLA_F16)


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        if closure is not None:
            return super().inner_step(window, kwargs, closure)
        taken = self.parts.scaling.step(window.optimizer, window.optimizer.step, kwargs)
        if taken:
            self.parts.device.after_step()
        return taken


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
