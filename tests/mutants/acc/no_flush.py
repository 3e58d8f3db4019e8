"""ACC-003 broken: the last partial window of an epoch is not flushed (``is_last`` is ignored).

The leftover micro-steps wait for the next epoch, where the batch-index schedule closes a longer window.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("ACC-003", ["test_schedule_flushes_last_partial_window", ORACLE_PROPERTY])


class Context(MutantContext):
    @override
    @contextmanager
    def batch(self, batch_idx: int, *, is_last: bool = False) -> Iterator[None]:
        with super().batch(batch_idx):
            yield


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
