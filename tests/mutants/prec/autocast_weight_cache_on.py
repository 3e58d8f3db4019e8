"""PREC-004 broken: the context's autocast region keeps autocast's weight cache on (torch's default).

The reference until contract 2026.12.5, and any wrapper that opens ``torch.autocast(device, dtype)`` as written in
torch's examples: inside one region each parameter is cast once, so a forward after a real step in the same region
(Lightning's GAN steps the generator, then runs it again for the discriminator) uses the weights before the step.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant("PREC-004", ["test_gan_iteration_in_one_autocast_region"], cells=BF16_MIXED)


class Context(MutantContext):
    @override
    def autocast(self) -> AbstractContextManager[None]:
        dtype = self.parts.precision.autocast_dtype
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
