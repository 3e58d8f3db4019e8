"""ERR-007 broken: ``wrap`` (and ``add_param_group``) check only the parameters that require grad.

A frozen parameter gets no gradient and is never updated, so the implementer skips it when checking device and
dtype (it is common to keep a frozen embedding or backbone in another dtype). ERR-007 checks frozen ones too,
since they may be unfrozen later and would then train in the wrong dtype or on the wrong device.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "ERR-007",
    [
        "test_wrap_refuses_a_frozen_parameter_of_another_dtype",
        "test_wrap_takes_exactly_the_dtypes_the_precision_trains",
    ],
    cells=F16,
    blind="batch 1",
)


class _TrainableOnlyRefusals(Refusals):
    @override
    def check_parameter(self, context, param: torch.Tensor) -> None:  # type: ignore[no-untyped-def]
        if param.requires_grad:
            super().check_parameter(context, param)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.parts.refusals = _TrainableOnlyRefusals()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
