"""CKPT-003 broken: ``load_state_dict`` validates and loads the optimizers' entries one at a time.

A state whose second optimizer does not fit is refused with ``ValueError``, but only after the first optimizer's
window (its count and accumulated gradients) has been replaced by the state's.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CKPT-003", ["test_refused_load_after_an_overflow_changes_nothing"])


class Context(MutantContext):
    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        entries = state_dict.get("optimizers")
        if isinstance(entries, list) and len(entries) == len(self.windows):
            for i, (window, entry) in enumerate(zip(self.windows, entries, strict=True)):
                params, grads = window.params(), entry.get("grads")
                if not isinstance(grads, list) or len(grads) != len(params):
                    raise ValueError(f"optimizer {i}: the state's gradients do not match its {len(params)} parameters")
                for param, grad in zip(params, grads, strict=True):
                    if grad is not None and grad.shape != param.shape:
                        raise ValueError(f"optimizer {i}: a saved gradient of shape {grad.shape} for {param.shape}")
                window.length, window.steps = entry["pending"], entry["steps"]
                with torch.no_grad():
                    for param, grad in zip(params, grads, strict=True):
                        param.grad = None if grad is None else grad.to(device=param.device, dtype=param.dtype).clone()
        super().load_state_dict(state_dict)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
