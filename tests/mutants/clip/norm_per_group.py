"""CLIP-001 broken: clipping by norm clips each parameter group to ``gradient_clip_val`` on its own.

Many training scripts clip per parameter group (``for g in opt.param_groups: clip_grad_norm_(g["params"], v)``),
since groups often get their own hyper-parameters; an implementer who copies that loop gets the same result as
the total norm for a single group, which is what most tests use. CLIP-001 asks for one total 2-norm over every
group of the optimizer.
"""

from __future__ import annotations

from collections.abc import Sequence

from typing_extensions import override

from lightning_optimizer.reference.clipping import clip_gradients
from lightning_optimizer.reference.preparation import Clipping, Preparation, PreparationStep
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLIP-001", ["test_configured_clipping_spans_groups_and_spares_other_windows"], blind="batch 1")


class _PerGroupClipping(Clipping):
    @override
    def __call__(self, context, window) -> None:  # type: ignore[no-untyped-def]
        for group in window.optimizer.param_groups:
            clip_gradients(group["params"], self.value, self.algorithm)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        prep = self.parts.preparation

        def swap(steps: Sequence[PreparationStep]) -> tuple[PreparationStep, ...]:
            return tuple(_PerGroupClipping(s.value, s.algorithm) if isinstance(s, Clipping) else s for s in steps)

        self.parts.preparation = Preparation(steps=swap(prep.steps), evaluation=swap(prep.evaluation))


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
