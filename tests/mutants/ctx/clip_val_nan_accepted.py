"""CTX-002 broken: ``gradient_clip_val`` is refused only when ``value <= 0``, so ``nan`` constructs.

``nan <= 0`` is false: the context is built, and its first clipped step turns every parameter into NaN
(``clip_grad_norm_`` scales by ``nan / norm``). The check as it stood before contract 2026.12.1.
"""

from __future__ import annotations

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import ClipValueContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CTX-002", ["test_invalid_gradient_clip_val[norm-nan]", "test_invalid_gradient_clip_val[value-nan]"])


class Context(ClipValueContext):
    @override
    def clip_value(self, value: float) -> float | None:
        if value <= 0:
            raise ValueError(f"gradient_clip_val must be positive, got {value!r}")
        return float(value)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
