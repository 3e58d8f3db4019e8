"""WIN-001 broken: every change of an optimizer's parameters after ``wrap`` is refused, between windows too.

The window remembers the parameters ``wrap`` saw and nothing else: a parameter appended to a group, a group appended
to ``param_groups`` or one added by the wrapper's own ``add_param_group`` makes the next ``step()`` raise
``RuntimeError``, whether or not a window is open. Fine-tuning that unfreezes a layer and adds it to the optimizer
after the first epoch (Lightning's ``BaseFinetuning``) cannot go on.

Plausible: "an optimizer's parameters change only between its windows" read as a prohibition, and the refusal is
the simpler code: compare with what ``wrap`` saw, raise on any difference.
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
        "test_a_failed_optimizer_change_leaves_the_optimizer[Adam-add_param_group]",
        "test_a_failed_optimizer_change_leaves_the_optimizer[SGD momentum-add_param_group]",
        "test_parameters_added_between_windows_join_the_next",
    ],
)


class AnyChangeRefused(OutsideChanges):
    @override
    def parameters_changed(self, context: TrainingContext, window: Window, params: list[torch.Tensor]) -> None:
        known = {id(param) for param in window.known}
        if all(id(param) in known for param in params) and len(params) == len(known):
            window.know(params)  # the same parameters in another order
            return
        raise RuntimeError(  # the defect: between windows too
            f"the parameters of {type(window.optimizer).__name__} changed since wrap(): call context.discard(wrapper)"
        )

    @override
    def joined(self, window: Window) -> None:
        """The defect: the wrapper's own add_param_group is not remembered either."""


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.outside = AnyChangeRefused()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "WIN-001: a change of parameters is refused between windows too")
