"""CLIP-002 broken: ``unscale_gradients()`` unscales the gradients of every wrapped optimizer, not only its own.

Accelerate's ``accelerator.unscale_gradients(optimizer=None)`` (which its ``clip_grad_norm_`` calls) unscales every
prepared optimizer. Another optimizer's open window is unscaled in the middle of its accumulation: the micro-steps
it adds afterwards are scaled, the earlier ones are not, and its real step unscales them again (or, in the same
iteration, not at all), so it applies a wrong mean.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _unscale_gradients(self, index: int) -> None:
        super()._unscale_gradients(index)
        for other, slot in enumerate(self._slots):
            if other != index and slot.has_gradients():
                self._scaling.unscale(slot.optimizer)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
