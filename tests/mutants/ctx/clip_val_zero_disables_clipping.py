"""CTX-002 broken: ``gradient_clip_val=0`` means "no clipping" instead of being refused.

Lightning's ``Trainer`` reads 0 as clipping off; the contract refuses it, since a clip at norm 0 would zero every
gradient and a silent "off" hides the typo.
"""

from __future__ import annotations

from typing_extensions import override

from lightning_optimizer.reference.clipping import check_clipping
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import ClipValueContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "CTX-002",
    [
        "test_invalid_gradient_clip_val[norm-0]",
        "test_invalid_gradient_clip_val[norm-0.0]",
        "test_invalid_gradient_clip_val[value-0]",
        "test_invalid_gradient_clip_val[value-0.0]",
    ],
)


class Context(ClipValueContext):
    @override
    def clip_value(self, value: float) -> float | None:
        return None if value == 0 else check_clipping(value, "norm")[0]


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
