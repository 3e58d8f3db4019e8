"""TOGGLE-001 broken: no ``requires_grad`` toggling; a closure's backward also fills other optimizers' ``.grad``.

In a GAN the generator's loss then leaves gradients on the discriminator that its next step applies.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    @contextmanager
    def _toggle(self, index: int, *, sync_grad: bool) -> Iterator[None]:
        yield


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
