"""TOGGLE-001 broken: a closure switches off the parameters of one other optimizer only, the next one.

Right for two optimizers, as in a GAN; with three, the parameters of the third keep ``requires_grad=True`` in
the closure, so its loss leaks gradients into that optimizer's window. Only schedules with three optimizers
show it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lightning_optimizer.reference.distributed import no_sync
from lightning_optimizer.reference.toggling import only_these_require_grad
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    @contextmanager
    def _toggle(self, index: int, *, sync_grad: bool) -> Iterator[None]:
        own = self._slots[index].params()
        following = self._slots[(index + 1) % len(self._slots)]
        others = [] if len(self._slots) == 1 else following.params()
        with only_these_require_grad(own, others), no_sync(self._modules if not sync_grad else ()):
            yield


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
