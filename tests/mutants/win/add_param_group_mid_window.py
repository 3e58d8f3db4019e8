"""WIN-001 broken: the wrapper's ``add_param_group`` is accepted with a window open.

The refusal of ``add_param_group`` keeps ERR-007's checks and the stage check (not while a ``step()`` runs or a
window is prepared) but not the open-window one: the implementer reads WIN-001 as a rule about parameters changed
*from outside*, and the wrapper's own ``add_param_group`` as the sanctioned way to change them at any time, which
also tells the window about the new parameters. The new group joins the open window part of the way, and its
gradient is divided at the real step by micro-steps it never took part in.

Plausible: WIN-001's first sentences are about ``param_groups`` edited behind the wrapper's back ("other than by the
wrapper's add_param_group"); the clause about ``add_param_group`` itself comes last.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

MUTANT = Mutant(
    "WIN-001",
    [
        "test_add_param_group_with_a_window_open_is_refused",
    ],
    blind="batch 5",
)


class OpenWindowGroups(Refusals):
    @override
    def check_param_group(self, context: TrainingContext, window: Window, param_group: object) -> list[object]:
        if not isinstance(param_group, dict):
            raise TypeError(f"add_param_group expects a dict with a 'params' entry, got {type(param_group).__name__}")
        if window.stage is not WindowStage.READY:
            raise RuntimeError("add_param_group() while a step() runs or a window is prepared: call it between steps")
        # the defect: no refusal while the window holds accumulated micro-steps
        params = param_group.get("params")
        if isinstance(params, torch.Tensor):
            candidates: list[object] = [params]
        elif params is None or isinstance(params, set | frozenset):
            candidates = []
        else:
            candidates = list(params)
        for param in candidates:
            if isinstance(param, torch.Tensor):
                self.check_parameter(context, param)
        return candidates


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = OpenWindowGroups()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "WIN-001: add_param_group is accepted with a window open")
