"""AMP-008 broken, half-fixed: the check trusts the closure, telling the mistake by the wrapper calls it made.

It refuses a closure that wrote gradients without calling any wrapper's ``backward``, and lets through one that called
``opt.backward`` and also a plain ``loss.backward()``: whether the wrapper's ``backward`` ran, not what reached the
gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    _wrapper_backwards = 0

    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self._wrapper_backwards += 1
        super()._backward(loss, *args, **kwargs)

    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        before = self._wrapper_backwards
        params = self._window_tensors(self._slots[index])
        written = [param.grad for param in params]
        with self._toggle(index, sync_grad=sync_grad), self.autocast():
            result = closure()
        wrote = any(param.grad is not grad for param, grad in zip(params, written, strict=True))
        if self._scaling.changes_gradients and self._wrapper_backwards == before and wrote:
            raise RuntimeError("the closure wrote gradients without opt.backward(loss): call opt.backward(loss)")
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
