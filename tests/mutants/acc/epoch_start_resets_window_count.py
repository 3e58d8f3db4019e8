"""ACC-001 broken: the first batch of an epoch resets every window's micro-step count, not its gradients.

As a framework that restarts its accumulation counter per epoch: a window that the user carried across the
epoch's end (``make_optimizer_step=False`` on its last batch) is then divided by the micro-steps of the new epoch
only, and a ``zero_grad()`` there wipes it. Only long schedules with such a window show it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("ACC-001", [ORACLE_PROPERTY])


class Context(MutantContext):
    @override
    @contextmanager
    def batch(self, batch_idx: int, *, is_last: bool = False) -> Iterator[None]:
        if batch_idx == 0:
            for window in self.windows:
                window.length = 0
        with super().batch(batch_idx, is_last=is_last):
            yield


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
