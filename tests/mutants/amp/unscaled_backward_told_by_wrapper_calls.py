"""AMP-008 broken, half-fixed: the check trusts the closure, telling the mistake by the wrapper calls it made.

It refuses a closure that wrote gradients without calling any wrapper's ``backward``, and lets through one that called
``opt.backward`` and also a plain ``loss.backward()``: whether the wrapper's ``backward`` ran, not what reached the
gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer, torch_compat
from lightning_optimizer.reference.call import Call
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "AMP-008",
    [
        "test_unscaled_backward_in_a_closure_is_refused[discard-wrapper.backward, then loss.backward()-closing]",
        "test_unscaled_backward_in_a_closure_is_refused[discard-loss.backward(), then wrapper.backward-accumulating]",
        "test_unscaled_backward_in_a_closure_is_refused[restore-wrapper.backward, then loss.backward()-closing]",
        "test_unscaled_backward_in_a_closure_is_refused[restore-loss.backward(), then wrapper.backward-accumulating]",
    ],
    cells=F16,
)

T = TypeVar("T")


def _version(grad: torch.Tensor | None) -> int | None:
    """A gradient's version: a backward that accumulates into it in place moves it (the window is not set aside)."""
    return None if grad is None else torch_compat.version_counter(grad)


class Context(MutantContext):
    _wrapper_backwards = 0

    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self._wrapper_backwards += 1
        super().backward(wrapper, loss, *args, **kwargs)

    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        before = self._wrapper_backwards
        params = self.parts.parallel.window_tensors(call.window)
        written = [(param.grad, _version(param.grad)) for param in params]
        with self.parts.toggling.region(self, index, sync_grad=call.real), self.autocast():
            result = closure()
        wrote = any(
            param.grad is not grad or _version(grad) != version
            for param, (grad, version) in zip(params, written, strict=True)
        )
        if self.parts.scaling.changes_gradients and self._wrapper_backwards == before and wrote:
            raise RuntimeError("the closure wrote gradients without opt.backward(loss): call opt.backward(loss)")
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
