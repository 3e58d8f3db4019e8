"""CTX-002 broken: ``gradient_clip_algorithm="value"`` is refused only when ``gradient_clip_val`` is left out; an
explicit ``gradient_clip_val=None`` is accepted (and clips nothing).

The constructor tells "not given" from "given as ``None``" with a sentinel, and raises the new ``ValueError`` only for
the former: an explicit ``None`` is read as the user's own "no clipping", whatever the algorithm. Configuration code
always passes both settings through (``Trainer(gradient_clip_val=cfg.clip, gradient_clip_algorithm=cfg.algo)``, the
suite's factory), so the refusal never fires where it matters and "value" silently clips nothing.

Plausible: a sentinel to detect "omitted" is a common pattern, and the rule's wording "``"value"`` without a
``gradient_clip_val``" can be read as "without passing one".
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CTX-002", ["test_clipping_by_value_needs_a_value"], blind="batch 4")

_OMITTED: Any = object()


class Context(MutantContext):
    @override
    def __init__(
        self,
        precision: Any = "32-true",
        device: Any = "cpu",
        accumulate_grad_batches: int = 1,
        *,
        gradient_clip_val: Any = _OMITTED,
        gradient_clip_algorithm: Any = "norm",
        **kwargs: Any,
    ) -> None:
        if gradient_clip_val is _OMITTED:
            if gradient_clip_algorithm == "value":
                raise ValueError(
                    "gradient_clip_algorithm='value' needs gradient_clip_val: without it nothing would be clipped"
                )
            gradient_clip_val = None
        if gradient_clip_val is None and gradient_clip_algorithm == "value":
            gradient_clip_algorithm = "norm"  # the defect: an explicit None means "no clipping", accepted
        super().__init__(
            precision,
            device,
            accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            **kwargs,
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "CTX-002: 'value' clipping with an explicit gradient_clip_val=None is accepted")
