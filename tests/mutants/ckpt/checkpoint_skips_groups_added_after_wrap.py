"""CKPT-002 broken: the context's checkpoint keeps the open-window gradients of the parameters held at wrap only.

The checkpoint code walks a parameter list made when the optimizer was wrapped: a group added later with
``add_param_group`` is saved without its accumulated gradients, so a resume mid-window loses that part of the
window.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import RESUME_PROPERTY, Mutant

MUTANT = Mutant("CKPT-002", [RESUME_PROPERTY, "test_resume_two_wrappers_with_a_growing_scale"])

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class Context(MutantContext):
    @override
    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        wrapper = super().wrap(optimizer)
        vars(self.windows[-1])["at_wrap"] = {id(param) for param in self.windows[-1].params()}
        return wrapper

    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        for window, entry in zip(self.windows, state["optimizers"], strict=True):
            at_wrap: set[int] = vars(window)["at_wrap"]
            entry["grads"] = [
                grad if id(param) in at_wrap else None
                for param, grad in zip(window.params(), entry["grads"], strict=True)
            ]
        return state


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
