"""XLA-001 broken: with several optimizers, a real step defers its graph cut while another window is open.

Like an author who wants one graph per iteration (a GAN's generator and discriminator steps together) and skips
``torch_xla.sync()`` after a real step while another optimizer still accumulates, expecting that one to step and
cut soon: a real step taken while the other window only accumulates does not cut, and the other optimizer's later
real step cuts for both. Parameters stay right; a window no longer costs its own cut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA_F16, Mutant

MUTANT = Mutant(
    "XLA-001", ["test_each_window_is_reduced_once_and_a_skipped_step_cuts_once"], cells=XLA_F16, blind="batch 2"
)


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        if closure is not None:
            return super().inner_step(window, kwargs, closure)
        taken = self.parts.scaling.step(window.optimizer, window.optimizer.step, kwargs)
        if not any(other.length for other in self.windows if other is not window):
            self.parts.device.after_step()  # no other optimizer is mid-window: cut now
        return taken


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
