"""PREC-004 broken: the weight cache is off only under 16-mixed; bf16-mixed keeps torch's default (cache on).

The stale-weights report came from an fp16 GAN, and the fix went into the 16-mixed path next to the loss scaler
(``cache_enabled=False`` there). bf16-mixed, with no scaler and its own short branch, still opens
``torch.autocast(device, torch.bfloat16)`` with the cache on, so a region around several steps reuses the casts
made before the first of them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch
from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant("PREC-004", ["test_gan_iteration_in_one_autocast_region"], cells=BF16_MIXED, blind="contract 2026.12.5")


class Context(MutantContext):
    @override
    def autocast(self) -> AbstractContextManager[None]:
        if self.precision == "16-mixed":
            return super().autocast()  # cache_enabled=False, as the fp16 fix made it
        dtype = self.parts.precision.autocast_dtype
        if dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
