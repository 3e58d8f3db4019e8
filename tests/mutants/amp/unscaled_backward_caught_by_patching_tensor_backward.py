"""AMP-008 broken: an unscaled backward is detected by patching ``torch.Tensor.backward`` while the closure runs.

The framework catches the common mistake at the call: during a 16-mixed closure ``Tensor.backward`` is replaced by
a shim that flags any call made outside a scaled backward. That is told from what the closure calls, not from the
gradients: ``loss.backward()`` is refused, but ``torch.autograd.backward(loss)`` (what ``Tensor.backward`` calls
itself, and what some helper libraries call directly) writes unscaled gradients unseen; and a ``loss.backward()`` of
a loss that touches none of the wrapper's parameters is refused although it wrote none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "AMP-008",
    [
        "test_unscaled_backward_in_a_closure_is_refused[discard-torch.autograd.backward-closing]",
        "test_unscaled_backward_in_a_closure_is_refused[restore-torch.autograd.backward-closing]",
    ],
    cells=F16,
    blind="contract 2026.12.5",
)


class _PatchedTensorBackward(AbstractContextManager[None]):
    """While the closure runs, ``Tensor.backward`` is a shim that flags a call made outside a scaled backward."""

    def __init__(self, backwards: Any) -> None:
        self.backwards = backwards
        self.unscaled = False

    @override
    def __enter__(self) -> None:
        running = self.backwards
        original = self._original = torch.Tensor.backward

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            if not running.count:
                self.unscaled = True
            original(tensor, *args, **kwargs)  # type: ignore[no-untyped-call]

        torch.Tensor.backward = backward  # type: ignore[method-assign,assignment]

    @override
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        torch.Tensor.backward = self._original  # type: ignore[method-assign]
        if exc_type is None and self.unscaled:
            raise RuntimeError(
                "under 16-mixed the closure called loss.backward(), whose gradients are not scaled: call "
                "opt.backward(loss) instead"
            )


class _Scaling(GradScaling):
    @override
    def watch(self, tensors: Sequence[torch.Tensor]) -> AbstractContextManager[None]:
        return _PatchedTensorBackward(self.backwards)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scaler is not None:
            self.parts.scaling = _Scaling(self.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
