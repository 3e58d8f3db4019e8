"""WIN-001 broken: a refused change of an open window's parameters is refused once, then accepted.

When the outside check finds the parameters changed mid-window it records the parameters it saw (so that it reports
each change once) and raises ``RuntimeError``. The next ``step()`` of the same wrapper compares against what was
recorded, finds nothing new and goes on: the window's real step applies a mean over parameters it did not hold for
the whole window, although nothing was put back and nothing was discarded.

Plausible: "report a change once" is how most change detectors avoid repeating themselves (a warning filter, a
``last_seen`` snapshot); WIN-001's "every later call of that wrapper does the same until the parameters are as the
window knew them or the window is discarded" is the one sentence that forbids it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.outside import OutsideChanges
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

MUTANT = Mutant(
    "WIN-001",
    [
        "test_parameters_changed_mid_window_are_refused",
    ],
    blind="batch 5",
)


class ReportOnce(OutsideChanges):
    @override
    def parameters_changed(self, context: TrainingContext, window: Window, params: list[torch.Tensor]) -> None:
        try:
            super().parameters_changed(context, window, params)
        except RuntimeError:
            window.known = tuple(params)  # the defect: the refused change is recorded as seen
            raise


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.outside = ReportOnce()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "WIN-001: a refused mid-window parameter change is accepted on the next call")
