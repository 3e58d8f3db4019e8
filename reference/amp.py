"""Loss scaling for 16-mixed: ``torch.amp.GradScaler`` driven by the contract's rules.

Every call receives the inner optimizer (the scaler keys its state by the optimizer's identity). Gradients are
unscaled once per real step; the scaler is updated once per training iteration, after every optimizer that
stepped in it; a window still open when the scale changes is rescaled to the new scale.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler, OptState

__all__ = ["LossScaler"]


def _gradient_device(optimizer: torch.optim.Optimizer) -> torch.device:
    grads: list[torch.Tensor] = [
        p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None
    ]
    return grads[0].device


class LossScaler:
    """The context's ``GradScaler`` and what the contract adds around it."""

    def __init__(self, scaler: GradScaler) -> None:
        self.scaler = scaler
        self._stepped_since_update = False

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss multiplied by the current scale."""
        scaled: torch.Tensor = self.scaler.scale(loss)
        return scaled

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale the optimizer's gradients, unless that was done already in this iteration (by the user too)."""
        if self.scaler._per_optimizer_states[id(optimizer)]["stage"] is OptState.READY:
            if self.scaler._scale is None:
                # An unpickled GradScaler creates its scale lazily in scale(); a window restored from a copy
                # reaches its real step without one.
                self.scaler._lazy_init_scale_growth_tracker(_gradient_device(optimizer))
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """The scaler's step of ``optimizer``; ``False`` when it skipped the step for non-finite gradients."""
        self._stepped_since_update = True
        self.scaler.step(optimizer, **kwargs)
        for found_inf in self.scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values():
            if found_inf.item():
                return False
        return True

    def update(self, open_windows: Iterable[torch.Tensor]) -> None:
        """End of an iteration: update the scale once if any optimizer stepped, and keep open windows consistent.

        ``open_windows`` are the parameters whose gradients belong to windows that stay open: they were scaled
        with the old scale and are rescaled to the new one (scales are powers of two, so this is exact).
        """
        if not self._stepped_since_update:
            return
        self._stepped_since_update = False
        grads = [param.grad for param in open_windows if param.grad is not None]
        if not grads:
            self.scaler.update()  # nothing to rescale, so no need to read the scale (a device sync each time)
            return
        old = self.scaler.get_scale()
        self.scaler.update()
        new = self.scaler.get_scale()
        if new != old:
            with torch.no_grad():
                for grad in grads:
                    grad.mul_(new / old)

    def state_dict(self) -> dict[str, Any]:
        """The scaler's own state dict."""
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the scaler's state."""
        self.scaler.load_state_dict(state)
