"""CKPT-003 broken: a context state's layout is judged by the gradients its open windows saved, and nothing else.

The checkpoint records the accumulated gradients only, so a state saved after every window had stepped carries no
shape at all and loads into a model of other shapes without complaint (the checks of parameter counts still pass).
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _check_layout(self, index: int, params: list[torch.Tensor], entry: dict[str, Any]) -> None:
        grads = entry.get("grads")
        if not isinstance(grads, list) or len(grads) != len(params):
            raise ValueError(f"optimizer {index}: the state's gradients do not match its {len(params)} parameters")
        for param, grad in zip(params, grads, strict=True):
            if grad is not None and (not isinstance(grad, torch.Tensor) or grad.shape != param.shape):
                raise ValueError(f"optimizer {index}: a saved gradient does not fit its parameter")


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
