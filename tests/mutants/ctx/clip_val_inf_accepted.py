"""CTX-002 broken: ``gradient_clip_val`` is checked to be positive only, so ``inf`` constructs.

``inf > 0`` holds: a context "clips" at an infinite norm, which never clips (and ``clip_grad_norm_`` returns the
norm as if it had), instead of refusing the value.
"""

from __future__ import annotations

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import ClipValueContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CTX-002", ["test_invalid_gradient_clip_val[norm-inf]", "test_invalid_gradient_clip_val[value-inf]"])


class Context(ClipValueContext):
    @override
    def clip_value(self, value: float) -> float | None:
        if not value > 0:
            raise ValueError(f"gradient_clip_val must be positive, got {value!r}")
        return float(value)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
