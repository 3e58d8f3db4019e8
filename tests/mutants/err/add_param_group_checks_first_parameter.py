"""ERR-007 broken: ``add_param_group`` checks only the first parameter of the new group.

A sample check (``params[0].device``, ``params[0].dtype``), as frameworks do to infer a group's device: a group whose
first parameter fits and whose second does not is accepted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F64, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("ERR-007", ["test_parameters_off_the_context_device_or_dtype"], cells=F64)


class FirstParameterRefusals(Refusals):
    @override
    def check_param_group(self, context: TrainingContext, window: Window, param_group: object) -> list[object]:
        if not isinstance(param_group, dict):
            return super().check_param_group(context, window, param_group)
        params = param_group.get("params")
        if isinstance(params, torch.Tensor):
            candidates: list[object] = [params]
        elif params is None or isinstance(params, set | frozenset):
            candidates = []
        else:
            candidates = list(params)
        super().check_param_group(context, window, {**param_group, "params": candidates[:1]})  # the first one only
        return candidates


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = FirstParameterRefusals()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
