"""PREC-004 broken: ``autocast()`` turns the weight cache off, but a closure's region leaves it to torch's default.

The framework fixed the stale-weights report where users hit it, the public ``context.autocast()``, and passes
``cache_enabled=False`` there. The closure's region is built separately, in the step machinery, with a plain
``torch.autocast(device_type, dtype)``, whose cache setting is inherited from the enclosing region. As the outermost
region (leaving it clears the cache) or nested in ``context.autocast()`` (cache off) that is right; nested in a region
the user opened with torch's defaults around several steps, the closure caches its casts, they outlive the step, and
the next closure's forward runs on the weights before that step.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant(
    "PREC-004", ["test_closures_in_a_region_the_user_opened_cast_anew"], cells=BF16_MIXED, blind="contract 2026.12.5"
)

T = TypeVar("T")


class Context(MutantContext):
    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        parts = self.parts
        watch = (
            parts.scaling.watch(parts.parallel.window_tensors(call.window)) if parts.scaling.changes_gradients else None
        )
        dtype = parts.precision.autocast_dtype
        region = nullcontext() if dtype is None else torch.autocast(device_type=self.device.type, dtype=dtype)
        with parts.toggling.region(self, index, sync_grad=call.real), watch or nullcontext(), region:
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
