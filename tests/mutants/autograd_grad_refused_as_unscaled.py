"""AMP-008 broken: the guard hooks the parameters' gradient computation, so ``torch.autograd.grad`` is refused too.

The framework watches each parameter with ``register_hook`` (the hook that sees a gradient as autograd computes it)
rather than a post-accumulate hook (the one that sees it written into ``.grad``). Every unscaled backward is caught,
but so is ``torch.autograd.grad(loss, params, create_graph=True)`` of a gradient penalty, which writes no gradient:
a closure that computes the penalty and then calls ``opt.backward(loss + penalty)`` is refused.
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
        unscaled = False

        def computed(grad: torch.Tensor) -> None:
            nonlocal unscaled
            if not running.count:
                unscaled = True

        with self._toggle(index, sync_grad=sync_grad):
            handles = [t.register_hook(computed) for t in self._window_tensors(self._slots[index]) if t.requires_grad]
            try:
                with self.autocast():
                    result = closure()
            finally:
                for handle in handles:
                    handle.remove()
        if unscaled:
            raise RuntimeError(
                "under 16-mixed the closure ran a backward outside the wrapper: call opt.backward(loss) instead"
            )
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
