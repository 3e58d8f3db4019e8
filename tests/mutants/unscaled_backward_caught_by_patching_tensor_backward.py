"""AMP-008 broken: an unscaled backward is detected by patching ``torch.Tensor.backward`` while the closure runs.

The framework catches the common mistake at the call: during a 16-mixed closure ``Tensor.backward`` is replaced by
a shim that flags any call made outside a scaled backward. That is told from what the closure calls, not from the
gradients: ``loss.backward()`` is refused, but ``torch.autograd.backward(loss)`` (what ``Tensor.backward`` calls
itself, and what some helper libraries call directly) writes unscaled gradients unseen; and a ``loss.backward()`` of
a loss that touches none of the wrapper's parameters is refused although it wrote none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        if not self._scaling.changes_gradients:
            return super()._run_closure(index, closure, sync_grad)
        running: Any = self._scaling._backwards  # type: ignore[attr-defined]
        original = torch.Tensor.backward
        unscaled = False

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            nonlocal unscaled
            if not running.count:
                unscaled = True
            original(tensor, *args, **kwargs)  # type: ignore[no-untyped-call]

        with self._toggle(index, sync_grad=sync_grad), self.autocast():
            torch.Tensor.backward = backward  # type: ignore[method-assign,assignment]
            try:
                result = closure()
            finally:
                torch.Tensor.backward = original  # type: ignore[method-assign]
        if unscaled:
            raise RuntimeError(
                "under 16-mixed the closure called loss.backward(), whose gradients are not scaled: call "
                "opt.backward(loss) instead"
            )
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
