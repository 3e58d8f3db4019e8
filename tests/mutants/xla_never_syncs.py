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
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        slot = self._slots[index]
        if closure is not None:
            return slot.optimizer.step(closure, **kwargs)
        slot.skipped = not self._scaling.step(slot.optimizer, slot.optimizer.step, kwargs)
        return None  # no graph cut after the step


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
