"""XLA-001 broken: the window mean is taken after the reduction, in place through ``grad.detach()``, which undoes it.

The gradients are reduced first, then divided by the window's length with ``param.grad.detach().div_(n)`` (the
in-place idiom of clipping code, torch_xla's own ``clip_grad_norm_`` among it). torch_xla's in-place all-reduce of
gradients that autograd accumulated in place is not seen through a fresh ``detach()`` alias: the division reads the
pre-reduction values and writes them back, so a window of two or more micro-steps is stepped on each replica's own
gradients. With one replica there is nothing to lose.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _prepare_gradients(self, slot: Slot) -> None:
        if slot.prepared:
            return
        self._reduce_gradients(slot)
        if slot.pending:
            for param in slot.params():
                if param.grad is not None:
                    param.grad.detach().div_(slot.pending + 1)
        self._unscale(slot)
        self._clip(slot)
        slot.prepared = True


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
