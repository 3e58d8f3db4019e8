"""ZERO-006 broken: gradients the last step left and the user set to ``None`` or replaced are refused too.

``model.zero_grad()`` (what Lightning's own ``optimizer_zero_grad`` calls) between steps makes the next window's
first backward raise, as if the gradients had been changed in place.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ZERO-006", ["test_gradients_set_to_none_or_replaced_carry_nothing"])


class RefusesCleared(LeaveToUser):
    @override
    def check_take(self, window: Window) -> None:
        for param, (ref, version) in (window.left or {}).items():
            grad = param.grad
            if grad is None or grad is not ref() or torch_compat.version_counter(grad) != version:
                raise RuntimeError(
                    "the gradients the last real step left were changed before this window took them: call "
                    "opt.zero_grad() first"
                )


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = RefusesCleared()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
