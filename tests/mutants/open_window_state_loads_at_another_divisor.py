"""AMP-007 broken for checkpoints: a 16-mixed state with a window open loads into a context of another
``accumulate_grad_batches``.

Its gradients carry the loss divisor of the run that saved it; the resumed window mixes them with micro-steps
divided otherwise, and its real step applies neither run's mean.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _validated_entries(self, state_dict: object) -> list[dict[str, Any]]:
        if isinstance(state_dict, dict) and "window_divisor" in state_dict:
            state_dict = {**state_dict, "window_divisor": self._window_divisor()}
        return super()._validated_entries(state_dict)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
