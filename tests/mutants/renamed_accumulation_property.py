"""SURFACE-002 broken: the context calls its schedule ``gradient_accumulation_steps`` (Accelerate's name).

The behaviour is the reference's; the contract's ``accumulate_grad_batches`` member is missing.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    @property  # type: ignore[misc]  # the mutant hides the member, the reference's setter with it
    def accumulate_grad_batches(self) -> int:
        raise AttributeError(f"{type(self).__name__} has no accumulate_grad_batches; see gradient_accumulation_steps")

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-steps per window when ``make_optimizer_step`` is ``None``."""
        return self._accumulate_grad_batches


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
