"""ERR-005 broken: ``w.load_state_dict`` also refuses a state whose state tensors have other shapes than the parameters.

"Another parameter layout" is read as shapes too: the implementer compares each momentum/exp_avg tensor with its
parameter before loading, to fail early instead of at the next step. The decision (and ERR-005) is that the
wrapper loads whatever torch's own ``load_state_dict`` loads: a bare optimizer accepts such a state.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("ERR-005", ["test_a_state_torch_loads_the_wrapper_loads"], blind="batch 1")


class _ShapeCheckingWrapper(WrappedOptimizer[Any]):
    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        saved_ids = [i for group in state_dict.get("param_groups", []) for i in group["params"]]
        for param, key in zip(params, saved_ids, strict=False):
            for name, value in state_dict.get("state", {}).get(key, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
                    raise ValueError(f"state {name!r} has shape {tuple(value.shape)}, parameter {tuple(param.shape)}")
        super().load_state_dict(state_dict)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(_ShapeCheckingWrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
