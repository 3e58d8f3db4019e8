"""CLIP-002 broken: ``unscale_gradients()`` accepted in the closure of a step that does not close the window.

The window is then prepared (its mean taken) one micro-step early, and the closing step applies the wrong mean.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("CLIP-002", ["test_manual_clip_after_unscale_gradients"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def unscale_gradients(self) -> None:
        context = self.training_context
        context.parts.preparation.prepare(context, context.windows[self.window_index])  # no check, nothing remembered


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
