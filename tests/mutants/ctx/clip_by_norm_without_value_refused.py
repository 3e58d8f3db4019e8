"""CTX-002 broken: any ``gradient_clip_algorithm`` given without ``gradient_clip_val`` is refused, ``"norm"`` included.

The constructor takes ``gradient_clip_algorithm=None`` as "not chosen" (meaning ``"norm"``) and generalises the new
rule: an algorithm chosen without a value "would clip nothing", so it raises ``ValueError``. The bare default still
works, but ``gradient_clip_algorithm="norm"`` passed with ``gradient_clip_val=None`` (what configuration code and the
suite's factory pass for "no clipping") is refused, though ``"norm"`` is the default and clipping nothing with it is
exactly what the default does.

Plausible: "an algorithm without a value clips nothing" is equally true of ``"norm"``, and an implementer who reads
the rationale rather than the rule refuses both.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CTX-002", ["test_clipping_by_value_needs_a_value"], blind="batch 4")


class Context(MutantContext):
    @override
    def __init__(
        self,
        precision: Any = "32-true",
        device: Any = "cpu",
        accumulate_grad_batches: int = 1,
        *,
        gradient_clip_val: Any = None,
        gradient_clip_algorithm: Any = None,
        **kwargs: Any,
    ) -> None:
        if gradient_clip_algorithm is not None and gradient_clip_val is None:
            raise ValueError(  # the defect: "norm" chosen explicitly is refused too
                f"gradient_clip_algorithm={gradient_clip_algorithm!r} without gradient_clip_val would clip nothing: "
                "pass gradient_clip_val, or leave gradient_clip_algorithm out"
            )
        super().__init__(
            precision,
            device,
            accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm="norm" if gradient_clip_algorithm is None else gradient_clip_algorithm,
            **kwargs,
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "CTX-002: gradient_clip_algorithm='norm' without a value is refused")
