"""``requires_grad`` toggling: only one optimizer's parameters take gradients inside its closure."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

_NOTHING = nullcontext()

__all__ = ["Toggling", "only_these_require_grad"]


def only_these_require_grad(
    own: Sequence[torch.Tensor], others: Sequence[torch.Tensor]
) -> AbstractContextManager[None]:
    """Inside the block, parameters in ``others`` but not in ``own`` have ``requires_grad=False``.

    Every flag that is changed is restored exactly on exit, also when the block raises; ``own`` parameters
    are never touched, so a parameter the user froze stays frozen.
    """
    return _RequiresGradToggle(own, others)


class _RequiresGradToggle(AbstractContextManager[None]):
    # A class rather than a generator: it runs around every closure, and with one optimizer it has nothing to do.

    def __init__(self, own: Sequence[torch.Tensor], others: Sequence[torch.Tensor]) -> None:
        self._own, self._others = own, others
        self._switched: list[torch.Tensor] = []

    def __enter__(self) -> None:
        if not self._others:
            return
        own_ids = {id(param) for param in self._own}
        try:
            for param in self._others:
                if id(param) not in own_ids and param.requires_grad:
                    param.requires_grad_(False)
                    self._switched.append(param)
        except BaseException:
            self._restore()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        for param in self._switched:
            param.requires_grad_(True)
        self._switched.clear()


class Toggling:
    """The region a wrapper's closure or ``toggle_model()`` block runs in [TOGGLE-001 to TOGGLE-003]."""

    def region(self, context: TrainingContext, index: int, *, sync_grad: bool) -> AbstractContextManager[None]:
        """Only optimizer ``index``'s parameters require grad inside; ``sync_grad=False`` adds no gradient sync."""
        windows, parallel = context.windows.all, context.parts.parallel
        if len(windows) == 1:  # one optimizer: nothing to toggle; a micro-step that does not close runs without sync
            return _NOTHING if sync_grad else parallel.without_sync()
        own = windows[index].params()
        others = [param for i, window in enumerate(windows) if i != index for param in window.params()]
        toggle = only_these_require_grad(own, others) if others else _NOTHING
        no_sync = parallel.without_sync_of_others(own) if sync_grad else parallel.without_sync()
        return toggle if isinstance(no_sync, nullcontext) else _without_sync(toggle, no_sync)


@contextmanager
def _without_sync(toggle: AbstractContextManager[None], no_sync: AbstractContextManager[None]) -> Iterator[None]:
    with toggle, no_sync:
        yield
