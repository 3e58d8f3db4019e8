"""ERR-006 broken: device ``"xla"`` without torch_xla fails with an error that does not name torch_xla.

Lightning's "XLAAccelerator can not run on your system since the accelerator is not available": true, but it
does not say that the missing piece is the torch_xla package.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import WITHOUT_TORCH_XLA, Mutant

MUTANT = Mutant("ERR-006", ["test_xla_without_torch_xla_names_it"], cells=WITHOUT_TORCH_XLA)


class Context(MutantContext):
    def __init__(self, precision: Any = "32-true", device: Any = "cpu", *args: Any, **kwargs: Any) -> None:
        if device == "xla" and importlib.util.find_spec("torch_xla") is None:
            raise RuntimeError(
                "XLAAccelerator can not run on your system since the accelerator is not available. The following "
                "accelerator(s) is available and can be passed into `accelerator` argument of `Trainer`: ['cpu']"
            )
        super().__init__(precision, device, *args, **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
