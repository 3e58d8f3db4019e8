"""CTX-002 broken: a negative ``gradient_clip_val`` is taken by its magnitude instead of being refused.

A framework that "normalises" the setting with ``abs()`` before its positivity check: ``-0.5`` clips at ``0.5``
and ``-inf`` becomes ``inf`` (never clips), where the contract asks for a ``ValueError``.
"""

from __future__ import annotations

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import ClipValueContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "CTX-002",
    [
        "test_invalid_gradient_clip_val[norm--0.5]",
        "test_invalid_gradient_clip_val[norm--inf]",
        "test_invalid_gradient_clip_val[value--0.5]",
        "test_invalid_gradient_clip_val[value--inf]",
    ],
)


class Context(ClipValueContext):
    @override
    def clip_value(self, value: float) -> float | None:
        value = abs(value)
        if not value > 0:
            raise ValueError(f"gradient_clip_val must not be 0, got {value!r}")
        return float(value)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
