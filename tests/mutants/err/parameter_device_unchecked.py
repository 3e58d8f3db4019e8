"""ERR-007 broken: ``wrap`` and ``add_param_group`` check a parameter's dtype but not its device.

An optimizer built on the model's parameters before ``prepare_module`` moved them (a CPU parameter in an XLA or
CUDA context) is accepted when its dtype fits; the inner step then mixes devices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("ERR-007", ["test_parameters_off_the_context_device_or_dtype"], cells=XLA)


class DtypeOnlyRefusals(Refusals):
    @override
    def check_parameter(self, context: TrainingContext, param: torch.Tensor) -> None:
        context.parts.precision.check_parameter(param)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = DtypeOnlyRefusals()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
