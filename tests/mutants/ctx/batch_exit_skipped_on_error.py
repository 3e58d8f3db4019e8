"""CTX-003 broken: leaving ``batch()`` by an exception neither updates the loss scaler nor releases the position.

``batch()`` is written as a ``@contextmanager`` generator whose code after ``yield`` (release the position, end the
iteration) has no ``try/finally``: every normal exit is right, but an exception raised in the block skips it.
The next ``batch()`` is then refused as nested, and the iteration's scaler update is lost.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from typing_extensions import override

from lightning_optimizer.reference.windows import Batch
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CTX-003", ["test_a_batch_left_by_an_exception_ends_its_iteration"], blind="batch 1")


class Context(MutantContext):
    @override
    def batch(self, batch_idx: int, *, is_last: bool = False) -> AbstractContextManager[None]:
        return self._batch(batch_idx, is_last)

    @contextmanager
    def _batch(self, batch_idx: int, is_last: bool) -> Iterator[None]:
        Batch(self.windows, batch_idx, is_last, self.end_iteration).__enter__()  # the checks and the position
        yield
        self.windows.position = None
        self.end_iteration()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
