"""CKPT-003 broken: the context's ``load_state_dict`` loads whatever lines up, without checking the layout.

A state saved with two optimizers loads its first entry into a context with one, wiping the open window.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CKPT-003", ["test_context_state_for_another_layout_is_refused"])


class Context(MutantContext):
    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for window, entry in zip(self.windows, state_dict["optimizers"], strict=False):
            window.length, window.steps, window.last_outcome = entry["pending"], entry["steps"], None
            for param, grad in zip(window.params(), entry["grads"], strict=False):
                param.grad = None if grad is None else grad.to(device=param.device, dtype=param.dtype).clone()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
