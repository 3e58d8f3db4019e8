"""AMP-003 broken: the update after a real step runs even while another window is prepared by ``unscale_gradients()``.

The reference until the contract decided AMP-003 outside ``batch()``: ``A.backward(la); B.backward(lb);
B.unscale_gradients(); A.step(); B.step()`` updated the scaler after A's step, which wipes ``GradScaler``'s record
that B was unscaled (``update()`` resets its per-optimizer states): B's step unscales its already unscaled mean a
second time, and a scale change in between also multiplies the prepared (unscaled) gradients by new / old. It is what
an ``optimizer.step()`` that calls ``scaler.update()`` right after ``scaler.step()`` (Accelerate's, Fabric's) does to
another optimizer that the user unscaled first to clip it (``accelerator.clip_grad_norm_``).
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _end_iteration(self) -> None:
        self._scaling.update(param for slot in self._slots for param in slot.params())


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
