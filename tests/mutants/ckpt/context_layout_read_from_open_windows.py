"""CKPT-003 broken: a context state's layout is judged by the gradients its open windows saved, and nothing else.

The checkpoint records the accumulated gradients only, so a state saved after every window had stepped carries no
shape at all and loads into a model of other shapes without complaint (the checks of parameter counts still pass).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.state import StateFormat
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("CKPT-003", ["test_state_of_other_shapes_is_refused_with_its_windows_closed"])


class GradientsOnlyFormat(StateFormat):
    @override
    def check_layout(self, context: TrainingContext, index: int, window: Window, entry: dict[str, Any]) -> None:
        params, grads = window.params(), entry.get("grads")
        if not isinstance(grads, list) or len(grads) != len(params):
            raise ValueError(f"optimizer {index}: the state's gradients do not match its {len(params)} parameters")
        for param, grad in zip(params, grads, strict=True):
            if grad is not None and (not isinstance(grad, torch.Tensor) or grad.shape != param.shape):
                raise ValueError(f"optimizer {index}: a saved gradient does not fit its parameter")


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.state = GradientsOnlyFormat()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
