"""CKPT-002 broken: the context's checkpoint keeps the loss scale as a number, not the scaler's growth tracker.

It saves ``get_scale()`` and, on load, rebuilds a ``GradScaler`` with that ``init_scale`` (and the context's own
factors and interval), as a framework that records the scale alone does: a run resumed between two growths counts
its successful iterations from zero again, so its scale grows later than the uninterrupted run's.
"""

from __future__ import annotations

from typing import Any

from torch.amp.grad_scaler import GradScaler
from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("CKPT-002", ["test_resume_two_wrappers_with_a_growing_scale"], cells=F16)


class Context(MutantContext):
    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.scaler is not None:
            state["scaler"] = {"scale": self.scaler.get_scale()}
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("scaler")
        if self.scaler is not None and isinstance(saved, dict) and "scale" in saved:
            live = self.scaler
            rebuilt = GradScaler(
                self.device.type,
                init_scale=saved["scale"],
                growth_factor=live.get_growth_factor(),
                backoff_factor=live.get_backoff_factor(),
                growth_interval=live.get_growth_interval(),
            )
            state_dict = {**state_dict, "scaler": {**rebuilt.state_dict(), "pending_update": None}}
        super().load_state_dict(state_dict)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
