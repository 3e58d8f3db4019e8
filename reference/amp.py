"""Loss scaling: ``torch.amp.GradScaler`` driven by the contract's rules, and its no-scaling twin.

The context holds one :class:`LossScaling`: :class:`GradScaling` under 16-mixed, :class:`NoLossScaling` in every
other precision, so it never branches on the precision. Every call receives the inner optimizer (the scaler keys
its state by the optimizer's identity). A backward propagates the recipe's ``scaler.scale(loss / N)`` for windows of
``N = accumulate_grad_batches`` [AMP-007], and one that wrote gradients without going through it inside a step's
closure is refused [AMP-008]. Gradients are unscaled once per real step; the scaler is updated once per training
iteration, after every optimizer that stepped in it; a window still open when the scale changes is rescaled to the
new scale. The reads of GradScaler's private fields are in :mod:`.torch_compat`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.reference.window import Window, WindowStage

if TYPE_CHECKING:
    from lightning_optimizer.reference.parallel import DataParallel

__all__ = ["GradScaling", "LossScaling", "NoLossScaling", "check_grad_scaler", "loss_scaling"]

_NOTHING = nullcontext()

_SCALER_KEYS = {"scale": float, "growth_factor": float, "backoff_factor": float, "growth_interval": int}


def optimizer_gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients the optimizer's parameters hold (``None`` ones left out), every group in order."""
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


class LossScaling:
    """What a precision does to losses and gradients around the real step; this base class does nothing."""

    changes_gradients = False
    """Whether :meth:`unscale` changes gradients in place."""

    @property
    def scaler(self) -> GradScaler | None:
        """The ``GradScaler``, where there is one."""
        return None

    def scale(self, loss: torch.Tensor, window: int) -> torch.Tensor:
        """The loss to backpropagate in a window of ``window`` micro-steps (``accumulate_grad_batches``)."""
        return loss

    def window_divisor(self, window: int) -> int:
        """What :meth:`scale` divided each micro-step's loss by: the window's sum is its mean times this."""
        return 1

    def backward(self) -> AbstractContextManager[None]:
        """Around autograd of a loss that :meth:`scale` made (the wrappers' and the framework's backward)."""
        return _NOTHING

    def watch(self, tensors: Sequence[torch.Tensor]) -> AbstractContextManager[None]:
        """Around a step's closure: refuse, when it returns, a backward into ``tensors`` that :meth:`scale` missed."""
        return _NOTHING

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale the optimizer's gradients, unless that was done already in this iteration."""

    def step(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
        """Run ``step(**kwargs)`` (the inner optimizer's step); ``False`` when it was skipped for non-finite grads."""
        step(**kwargs)
        return True

    def forget(self, optimizer: torch.optim.Optimizer) -> None:
        """Undo what this iteration recorded of ``optimizer`` (its real step failed)."""

    def update(self, open_windows: Iterable[torch.Tensor]) -> None:
        """End of an iteration: update the scale if any optimizer stepped; rescale the open windows' gradients."""

    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        """The iteration's update [AMP-003], unless a prepared window still waits for its real step.

        A prepared window's gradients are unscaled, and the scaler's record of that must survive until its step: the
        update then follows that step. Every other window that holds gradients (micro-steps, or a backward not yet
        stepped) holds them at the old scale, and the update rescales them [AMP-006].
        """
        for window in windows:  # every iteration asks: a loop, not a generator
            if window.stage is WindowStage.PREPARED:
                return
        # What a real step left and no window took yet (zero_grad_after_step=False) is unscaled already [ZERO-005].
        self.update(
            tensor for window in windows for tensor in parallel.window_tensors(window) if not window.holds_left(tensor)
        )

    def state_dict(self) -> dict[str, Any] | None:
        """What a checkpoint holds of the scaling (``None``: nothing)."""
        return None

    def check_state(self, state: object) -> None:
        """Raise ``ValueError`` unless ``load_state_dict(state)`` would succeed; change nothing."""
        if state is not None:
            raise ValueError("the state holds a loss-scaler state, but this context's precision does not scale losses")

    def load_state_dict(self, state: Any) -> None:
        """Restore what :meth:`state_dict` saved (checked by :meth:`check_state` first)."""


class NoLossScaling(LossScaling):
    """The precisions that do not scale losses (every one but 16-mixed)."""

    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        """Nothing to update: no scale."""


class GradScaling(LossScaling):
    """16-mixed: the context's ``GradScaler`` and what the contract adds around it."""

    changes_gradients = True

    def __init__(self, scaler: GradScaler) -> None:
        self._scaler = scaler
        self.stepped_since_update = False
        """An optimizer stepped since the scale's last update: the update at the iteration's end is due [AMP-003]."""
        self.backwards = RunningBackwards()

    @property
    def scaler(self) -> GradScaler:
        """The context's ``GradScaler``."""
        return self._scaler

    def scale(self, loss: torch.Tensor, window: int) -> torch.Tensor:
        """The recipe's ``scaler.scale(loss / window)``: no closer to float16's range than the recipe [AMP-007]."""
        scaled: torch.Tensor = self._scaler.scale(loss if window == 1 else loss / window)
        return scaled

    def window_divisor(self, window: int) -> int:
        """Each micro-step's loss was divided by the window's nominal length ``window``."""
        return window

    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        """The iteration's update, if an optimizer stepped since the last one (:meth:`LossScaling.end_iteration`)."""
        if self.stepped_since_update:
            super().end_iteration(windows, parallel)

    def backward(self) -> AbstractContextManager[None]:
        """Mark autograd as running on a scaled loss: what :meth:`watch` lets through."""
        return self.backwards

    def watch(self, tensors: Sequence[torch.Tensor]) -> AbstractContextManager[None]:
        """Watch the gradients a closure writes into ``tensors``: each must come from a scaled backward [AMP-008]."""
        return UnscaledBackwardGuard(self.backwards, tensors)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale the optimizer's gradients once per iteration (not again after the user's unscale)."""
        grads = optimizer_gradients(optimizer)
        if grads and not torch_compat.has_unscaled(self._scaler, optimizer):
            # A window restored from a copy or checkpoint reaches its real step before any scale() made the scale.
            torch_compat.start_scale(self._scaler, grads[0].device)
            self._scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
        """The scaler's step of ``optimizer``; ``False`` when it skipped the step for non-finite gradients."""
        if not torch_compat.has_unscaled(self._scaler, optimizer):
            # Nothing was scaled in the window (no gradient when it was unscaled; what it carries from the last step
            # is unscaled already): nothing to find non-finite, and GradScaler.step would unscale the carried part.
            step(**kwargs)
            return True
        if torch_compat.steps_through_inf(optimizer) and torch_compat.found_inf(self._scaler, optimizer):
            self.stepped_since_update = True
            return False  # a fused step would run, and its step hooks fire, for an update it then skips [PROXY-004]
        self._scaler.step(optimizer, **kwargs)
        self.stepped_since_update = True
        return not torch_compat.found_inf(self._scaler, optimizer)

    def forget(self, optimizer: torch.optim.Optimizer) -> None:
        """Drop the scaler's record of ``optimizer`` in this iteration (its stage back to ready)."""
        torch_compat.forget_optimizer(self._scaler, optimizer)

    def update(self, open_windows: Iterable[torch.Tensor]) -> None:
        """Update the scale once if any optimizer stepped, and keep open windows consistent.

        ``open_windows`` are the parameters whose gradients belong to windows that stay open: they were scaled
        with the old scale and are rescaled to the new one (scales are powers of two, so this is exact).
        """
        if not self.stepped_since_update:
            return
        self.stepped_since_update = False
        grads = [param.grad for param in open_windows if param.grad is not None]
        if not grads:
            self._scaler.update()  # nothing to rescale, so no need to read the scale (a device sync each time)
            return
        old = self._scaler.get_scale()
        self._scaler.update()
        new = self._scaler.get_scale()
        if new != old:
            with torch.no_grad():
                for grad in grads:
                    grad.mul_(new / old)

    def state_dict(self) -> dict[str, Any]:
        """The scaler's own state dict, and the iteration's pending update (a checkpoint inside ``batch()``)."""
        state = dict(self._scaler.state_dict())
        found = torch_compat.recorded_found_inf(self._scaler) if self.stepped_since_update else None
        state["pending_update"] = None if found is None else {"found_inf": found}
        return state

    def check_state(self, state: object) -> None:
        """Refuse a malformed scaler entry: every field of ``GradScaler.state_dict()``, and the pending update."""
        if not isinstance(state, dict):
            raise ValueError(f"the state's loss-scaler entry is a {type(state).__name__}, a 16-mixed context needs one")
        for key, kind in _SCALER_KEYS.items():
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"the state's loss-scaler entry {key!r} must be a positive {kind.__name__}: {value!r}")
        tracker = state.get("_growth_tracker")
        if isinstance(tracker, bool) or not isinstance(tracker, int) or tracker < 0:
            raise ValueError(f"the state's loss-scaler entry '_growth_tracker' must be a non-negative int: {tracker!r}")
        pending = state.get("pending_update")
        if pending is not None and not (isinstance(pending, dict) and isinstance(pending.get("found_inf"), bool)):
            raise ValueError(
                f"the state's pending loss-scaler update must be None or {{'found_inf': bool}}: {pending!r}"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load the scaler's state, and record the pending update of a checkpoint taken mid-iteration."""
        pending = state.get("pending_update")
        self._scaler.load_state_dict({key: value for key, value in state.items() if key != "pending_update"})
        torch_compat.forget_pending(self._scaler)
        self.stepped_since_update = pending is not None
        if pending is not None:
            device = torch_compat.scaler_device(self._scaler)
            torch_compat.start_scale(self._scaler, device)  # update() may come before any scale() of this scaler
            torch_compat.plant_found_inf(self._scaler, pending["found_inf"], device)

    # -- copies: GradScaler refuses to pickle mid-iteration, so a copy carries the state dict ----------

    def __getstate__(self) -> dict[str, Any]:
        return {
            "device": torch_compat.scaler_device(self._scaler).type,
            "enabled": self._scaler.is_enabled(),
            **self.state_dict(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        device, enabled = state.pop("device"), state.pop("enabled")
        self._scaler = GradScaler(device, enabled=enabled)
        self.stepped_since_update = False
        self.backwards = RunningBackwards()
        self.load_state_dict(state)


class RunningBackwards(AbstractContextManager[None]):
    """How many backwards of a scaled loss are running (reentrant: a backward hook may run one of its own)."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> None:
        self.count += 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.count -= 1


class UnscaledBackwardGuard(AbstractContextManager[None]):
    """Around a 16-mixed closure: a gradient that autograd accumulates while no scaled backward runs is refused.

    The gradients tell: a post-accumulate-grad hook on each watched tensor sees every backward that writes to it,
    whatever the closure called (``loss.backward()``, ``torch.autograd.backward``); ``torch.autograd.grad`` writes
    none and is not refused.
    """

    def __init__(self, backwards: RunningBackwards, tensors: Sequence[torch.Tensor]) -> None:
        self.backwards = backwards
        self.tensors = tensors
        self.unscaled = False

    def accumulated(self, tensor: torch.Tensor) -> None:
        if not self.backwards.count:
            self.unscaled = True

    def __enter__(self) -> None:
        self.handles = [t.register_post_accumulate_grad_hook(self.accumulated) for t in self.tensors if t.requires_grad]

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for handle in self.handles:
            handle.remove()
        if exc_type is None and self.unscaled:
            raise RuntimeError(
                "under 16-mixed the closure ran a backward that did not go through the wrapper (loss.backward() or "
                "torch.autograd.backward): its gradients are not scaled, and unscaling would divide them by the loss "
                "scale. Call opt.backward(loss) in the closure instead"
            )


def check_grad_scaler(scaler: object, device: torch.device) -> GradScaler:
    """Refuse a scaler that would not scale 16-mixed losses on ``device`` (not a GradScaler, disabled, elsewhere)."""
    if not isinstance(scaler, GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
    if not scaler.is_enabled():
        raise ValueError("scaler is disabled (enabled=False), so 16-mixed would not scale losses: pass an enabled one")
    built_for = torch_compat.scaler_device(scaler).type
    if built_for != device.type:
        raise ValueError(
            f"scaler was built for device {built_for!r}, this context runs on {device.type!r}: "
            f"pass torch.amp.GradScaler({device.type!r}, ...)"
        )
    return scaler


def loss_scaling(plugin: PrecisionPlugin, scaler: GradScaler | None, device: torch.device) -> LossScaling:
    """The loss scaling of a precision: ``scaler`` (checked) or a default ``GradScaler`` under 16-mixed, else none."""
    if not plugin.scales_loss:
        if scaler is not None:
            raise ValueError(f"precision {plugin.name!r} does not scale losses: pass a GradScaler only with 16-mixed")
        return NoLossScaling()
    return GradScaling(GradScaler(device.type) if scaler is None else check_grad_scaler(scaler, device))
