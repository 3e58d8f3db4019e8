"""PREC-001 broken: ``context.autocast()`` enables bfloat16 autocast whatever the precision.

A framework that turns mixed precision on by default: 32-true forward passes silently compute in bfloat16.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("PREC-001", ["test_true_precision_has_no_autocast"])


class Context(MutantContext):
    @override
    def autocast(self) -> AbstractContextManager[None]:
        return torch.autocast(self.device.type, dtype=torch.bfloat16)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
