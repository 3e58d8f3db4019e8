"""AMP-008 broken: under 16-mixed a closure's plain ``loss.backward()`` is accepted.

The reference until contract 2026.12.5: the window holds unscaled gradients, which the real step divides by the
loss scale (65536 at first), and trains on a gradient that small with nothing said.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("AMP-008", ["test_unscaled_backward_in_a_closure_is_refused"], cells=F16)


class _Scaling(GradScaling):
    @override
    def watch(self, tensors: Sequence[torch.Tensor]) -> AbstractContextManager[None]:
        return nullcontext()  # no guard around the closure


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scaler is not None:
            self.parts.scaling = _Scaling(self.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
