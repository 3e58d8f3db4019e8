"""PROXY-003 broken: ``add_param_group`` checks a one-shot iterable of parameters and forwards it exhausted.

The check iterates ``param_group["params"]`` as it is; a generator (``model.parameters()``, which torch accepts)
is empty by the time the inner optimizer reads it, so the group is added without its parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("PROXY-003", ["test_parameters_off_the_context_device_or_dtype"])


class ConsumingRefusals(Refusals):
    @override
    def check_param_group(self, context: TrainingContext, window: Window, param_group: object) -> list[object]:
        checked = super().check_param_group(context, window, param_group)  # iterates params as they are
        params = param_group.get("params") if isinstance(param_group, dict) else None
        if params is None or isinstance(params, list | tuple | torch.Tensor | set | frozenset):
            return checked
        return list(params)  # the one-shot iterable forwarded as it is now: exhausted


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = ConsumingRefusals()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
