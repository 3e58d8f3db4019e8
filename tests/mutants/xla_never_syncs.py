"""XLA-001 broken: a real step never cuts the lazy graph (no ``torch_xla.sync()`` / ``mark_step``).

The optimizer's update is only recorded: the graph keeps growing across steps until something reads a tensor,
and nothing executes where the step ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> None:
        slot = self._slots[index]
        if self._scaler is not None and any(param.grad is not None for param in slot.params()):
            slot.skipped = not self._scaler.step(slot.optimizer, **kwargs)
        else:
            slot.optimizer.step(**kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
