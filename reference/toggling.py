"""``requires_grad`` toggling: only one optimizer's parameters take gradients inside its closure."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch

__all__ = ["only_these_require_grad"]


@contextmanager
def only_these_require_grad(own: Iterable[torch.Tensor], others: Iterable[torch.Tensor]) -> Iterator[None]:
    """Inside the block, parameters in ``others`` but not in ``own`` have ``requires_grad=False``.

    Every flag that is changed is restored exactly on exit, also when the block raises; ``own`` parameters
    are never touched, so a parameter the user froze stays frozen.
    """
    own_ids = {id(param) for param in own}
    switched: list[torch.Tensor] = []
    try:
        for param in others:
            if id(param) not in own_ids and param.requires_grad:
                param.requires_grad_(False)
                switched.append(param)
        yield
    finally:
        for param in switched:
            param.requires_grad_(True)
