"""FSDP-004 broken: under 16-mixed each rank decides from its own shards whether the step is finite.

As a loop that checks ``torch.isfinite(grad.to_local())`` instead of the scaler's found-inf: a rank whose shards
are finite steps while the rank holding the overflow skips.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FSDP_F16, Mutant

MUTANT = Mutant("FSDP-004", ["test_overflow_on_one_rank_skips_everywhere"], cells=FSDP_F16)


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        if closure is not None or self.scaler is None:
            return super().inner_step(window, kwargs, closure)
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in window.params()]
        taken = all(bool(torch.isfinite(grad).all()) for grad in grads if grad is not None)
        if taken:
            window.optimizer.step(**kwargs)
        return taken


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
