"""WIN-001 broken: a parameter added mid-window joins the open window; only a removal is refused.

The outside check reads the rationale's second half as the whole rule: a parameter that *leaves* an open window keeps
an accumulated gradient the step never applies, so a removal is refused; a parameter that is only *added* is checked
as ``wrap`` checks it and joins, as it would between windows ("it just starts accumulating now"). The window's real
step then divides the newcomer's gradient, accumulated over fewer micro-steps, by the whole window's length, and the
call that should have raised ``RuntimeError`` steps.

Plausible: appending a freshly unfrozen layer's parameters to ``param_groups[0]["params"]`` mid-epoch is a common
fine-tuning trick, and a removal looks like the only change that loses anything.
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
        "test_parameters_changed_mid_window_are_refused[group appended to param_groups-step(closure)-discard()-1-held]",
        "test_parameters_changed_mid_window_are_refused[group appended to param_groups-step(closure)-discard()-2-held]",
        "test_parameters_changed_mid_window_are_refused[group appended to param_groups-unscale_gradients()-change "
        "undone-1-held]",
        "test_parameters_changed_mid_window_are_refused[group appended to param_groups-unscale_gradients()-change "
        "undone-2-held]",
        "test_parameters_changed_mid_window_are_refused[parameter appended to a group-step(closure)-change "
        "undone-1-held]",
        "test_parameters_changed_mid_window_are_refused[parameter appended to a group-step(closure)-change "
        "undone-2-held]",
        "test_parameters_changed_mid_window_are_refused[parameter appended to a "
        "group-unscale_gradients()-discard()-1-held]",
        "test_parameters_changed_mid_window_are_refused[parameter appended to a "
        "group-unscale_gradients()-discard()-2-held]",
    ],
    blind="batch 5",
)


class AdditionsJoin(OutsideChanges):
    @override
    def parameters_changed(self, context: TrainingContext, window: Window, params: list[torch.Tensor]) -> None:
        now_ids = {id(param) for param in params}
        removed = any(id(param) not in now_ids for param in window.known)
        if removed:
            super().parameters_changed(context, window, params)
            return
        known_ids = {id(param) for param in window.known}
        for param in params:  # the defect: added parameters join an open window too
            if id(param) not in known_ids:
                context.parts.refusals.check_parameter(context, param)
        window.known = tuple(params)


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.outside = AdditionsJoin()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "WIN-001: a parameter added mid-window joins the open window")
