"""SURFACE-002 broken: the context calls its schedule ``gradient_accumulation_steps`` (Accelerate's name).

The behaviour is the reference's; the contract's ``accumulate_grad_batches`` member is missing.
"""

from __future__ import annotations

import sys

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("SURFACE-002", ["test_context_surface"])

_OWN_CODE = "lightning_optimizer.reference"
"""The implementation's own modules: they read the schedule under its old name, as its internals would."""


class Context(MutantContext):
    @property  # type: ignore[misc]  # the mutant hides the member, the reference's setter with it
    @override
    def accumulate_grad_batches(self) -> int:
        if str(sys._getframe(1).f_globals.get("__name__", "")).startswith(_OWN_CODE):
            return self.gradient_accumulation_steps  # the collaborators' reads: the behaviour is the reference's
        raise AttributeError(f"{type(self).__name__} has no accumulate_grad_batches; see gradient_accumulation_steps")

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-steps per window when ``make_optimizer_step`` is ``None``."""
        return self.parts.accumulation.accumulate_grad_batches


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
