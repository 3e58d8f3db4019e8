"""STEP-004 broken: an LBFGS step does not record its outcome; ``last_outcome`` keeps what it was (``None``).

The closure-evaluating path returns LBFGS's result straight after its step and never sets the outcome that the
first-order path sets, so a user (or a framework's logging) reads ``None`` after every LBFGS step.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("STEP-004", ["test_lbfgs_beside_another_optimizer"])


class EvaluatorOutcomeUnrecorded(Accumulation):
    @override
    def closed(self, window: Window, *, skipped: bool) -> None:
        before = window.last_outcome
        super().closed(window, skipped=skipped)
        if window.evaluates_closure:
            window.last_outcome = before


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = EvaluatorOutcomeUnrecorded(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
