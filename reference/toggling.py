"""``requires_grad`` toggling: only one optimizer's parameters take gradients inside its closure."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import TracebackType

import torch

__all__ = ["only_these_require_grad"]


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
