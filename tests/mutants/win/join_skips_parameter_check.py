"""WIN-001 broken: a parameter that joins between windows is not checked as ``wrap`` checks it (ERR-007).

With no micro-step accumulated, the outside check lets the parameters added to ``param_groups`` join the next window
without the device and dtype check that ``wrap`` and ``add_param_group`` make: the join is taken for a bookkeeping
update ("the window now knows these parameters"), and the check for it is left where the other entry points have it.
A float32 parameter appended under 64-true (or one on another device) is then stepped by the inner optimizer instead
of being refused with ``ValueError``.

Plausible: ERR-007's checks live in ``wrap`` and ``add_param_group``, the two entry points the wrapper sees; the
appended parameter never passes through either, and the spec's "checked as ERR-007 checks wrap's" is one clause of a
long sentence about joining.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.outside import OutsideChanges
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

MUTANT = Mutant(
    "WIN-001",
    [
        "test_a_parameter_joining_between_windows_is_checked_as_wrap_checks",
    ],
    cells=F16,
    blind="batch 5",
)


class UncheckedJoin(OutsideChanges):
    @override
    def parameters_changed(self, context: TrainingContext, window: Window, params: list[torch.Tensor]) -> None:
        if window.length or window.stage is WindowStage.PREPARED:
            super().parameters_changed(context, window, params)  # refused as the reference refuses it
            return
        window.known = tuple(params)  # the defect: joined without ERR-007's device and dtype check


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.outside = UncheckedJoin()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "WIN-001: a parameter joining between windows skips ERR-007's check")
