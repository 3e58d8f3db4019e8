"""XLA-001 broken: a real step reduces every optimizer's gradients, other optimizers' open windows included.

As a strategy that runs ``xm.reduce_gradients`` over all of the model's optimizers whenever one of them steps:
a window left open while another optimizer steps is reduced there, then again at its own real step.
"""

from __future__ import annotations

from lightning_optimizer.reference.call import Call
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _prepare(self, call: Call) -> None:
        if not call.prepared:
            for window in self._windows:
                if window is not call.window and window.pending:
                    self.parts.device.reduce_gradients(window.optimizer)
        super()._prepare(call)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
