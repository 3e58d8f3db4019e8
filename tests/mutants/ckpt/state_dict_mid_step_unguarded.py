"""CKPT-004 broken: ``state_dict()`` is taken whenever asked, also while a ``step()`` runs or a window is prepared.

From a closure it saves the window half-way through the call (its gradients moved aside or half merged), and after
``unscale_gradients()`` a prepared window that a resumed context would average and unscale again.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CKPT-004", ["test_state_or_copy_mid_step_is_refused"])


class Context(MutantContext):
    @override
    def state_dict(self) -> dict[str, Any]:
        return self.parts.state.save(self)  # no check of where the windows are: the state of whatever is there


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
