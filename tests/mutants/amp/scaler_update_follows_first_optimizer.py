"""AMP-003 broken: the iteration's scaler update runs only when the first optimizer stepped in it.

The end of the iteration asks the first wrapper, not every one, whether it stepped: when only another optimizer
steps (and overflows), the scale does not back off, and the next iterations keep scaling losses by a scale that
PyTorch's rule would have halved. Only schedules where the first optimizer accumulates while another steps
show it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.reference.parallel import DataParallel
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant("AMP-003", [ORACLE_PROPERTY], cells=F16)


class _AsksTheFirstOptimizer(GradScaling):
    _stepped: frozenset[int] = frozenset()
    """The optimizers that stepped (or skipped) in this iteration."""

    @override
    def step(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
        taken = super().step(optimizer, step, kwargs)
        self._stepped = self._stepped | {id(optimizer)}
        return taken

    @override
    def forget(self, optimizer: torch.optim.Optimizer) -> None:
        super().forget(optimizer)
        self._stepped = self._stepped - {id(optimizer)}

    @override
    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        if not (windows and id(windows[0].optimizer) in self._stepped):
            self.stepped_since_update = False
        self._stepped = frozenset()
        super().end_iteration(windows, parallel)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scaler is not None:
            self.parts.scaling = _AsksTheFirstOptimizer(self.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
