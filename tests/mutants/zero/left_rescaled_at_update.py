"""ZERO-005 broken (16-mixed, with AMP-006): the scaler's update rescales the gradients a taken step left, too.

AMP-006 rescales every gradient a window holds when the loss scale changes; the implementer's update loop goes over
every gradient on the wrappers' parameters, and under ``zero_grad_after_step=False`` the gradients the step just
left are there too. They are unscaled already (what the step applied), so multiplying them by ``new / old`` makes the
next window carry ``2 c`` after a growth (or ``c / 2`` after a back-off). ZERO-005: the carried part is "not rescaled
when the loss scale changes (AMP-006)". (The implementer knows the left gradients are watched for in-place changes,
ZERO-006, and re-notes their version after its own rescaling.) Invisible while the scale stays put (the default growth
interval of 2000).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.reference.parallel import DataParallel
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "ZERO-005",
    [
        "test_a_window_applies_what_it_carries_plus_its_own_mean[windows 1, 1, 1, 1]",
        "test_a_window_applies_what_it_carries_plus_its_own_mean[windows 2, 4, flushed 1]",
    ],
    cells=F16,
    blind="batch 3",
)


class _RescalesEverything(GradScaling):
    @override
    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        if any(window.stage is WindowStage.PREPARED for window in windows):
            return
        self.update(tensor for window in windows for tensor in parallel.window_tensors(window))
        for window in windows:  # the context's own rescaling is not an in-place change of the user's [ZERO-006]
            if window.left is not None:
                renoted = {}
                for param, (ref, version) in window.left.items():
                    grad = ref()
                    renoted[param] = (ref, version if grad is None else torch_compat.version_counter(grad))
                window.left = renoted


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        old = self.parts.scaling
        if isinstance(old, GradScaling):
            self.parts.scaling = _RescalesEverything(old.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
