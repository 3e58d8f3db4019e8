"""CLIP-002 broken: ``unscale_gradients()`` unscales the gradients of every wrapped optimizer, not only its own.

Accelerate's ``accelerator.unscale_gradients(optimizer=None)`` (which its ``clip_grad_norm_`` calls) unscales every
prepared optimizer. Another optimizer's open window is unscaled in the middle of its accumulation: the micro-steps
it adds afterwards are scaled, the earlier ones are not, and its real step unscales them again (or, in the same
iteration, not at all), so it applies a wrong mean.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import F16, Mutant

MUTANT = Mutant("CLIP-002", ["test_unscale_gradients_prepares_only_its_own_window"], cells=F16)


class Wrapper(WrappedOptimizer[Any]):
    @override
    def unscale_gradients(self) -> None:
        super().unscale_gradients()
        context = self.training_context
        for other, window in enumerate(context.windows):
            if other != self.window_index and window.has_gradients():
                context.parts.scaling.unscale(window.optimizer)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
