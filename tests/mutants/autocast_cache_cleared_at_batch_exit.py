"""PREC-004 broken, half-fixed: the weight cache stays on, and the context clears it when a ``batch()`` block ends.

A framework that noticed stale casts across iterations and clears autocast's cache at each iteration's end: a
forward after a real step inside the same iteration's region still uses the casts made before the step.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def autocast(self) -> AbstractContextManager[None]:
        dtype = self._plugin.autocast_dtype
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def _end_iteration(self) -> None:
        torch.clear_autocast_cache()
        super()._end_iteration()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
