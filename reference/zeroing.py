"""What a real step leaves of its gradients: cleared, or left to the user's ``zero_grad()`` and carried on.

``TrainingContext(zero_grad_after_step=True)``, the default, clears a window's gradients after its real step
(:class:`ClearAfterStep`, ZERO-001). ``False`` (:class:`LeaveToUser`, ZERO-003 to ZERO-007), Lightning's automatic
loop's convention, leaves those of a taken step where they are and notes each tensor it left, with its version
counter (:attr:`Window.left <.window.Window.left>`). The next window *takes* them at its wrapper's first ``step()``
or ``unscale_gradients()``, or at the first ``backward()`` of any wrapper of the context that can reach them: they
move aside (:attr:`Window.carried <.window.Window.carried>`, no copy), the window accumulates its own gradients
from none, and its preparation adds the carried part back after the mean, the reduction and the unscaling, before
clipping (:class:`~.preparation.AddCarried`). So the carried part is applied as it was: not divided by the window's
length, not unscaled or reduced a second time. The user's ``zero_grad()`` before the window's first micro-step
accumulated clears it, taken or not.

Gradients left by a step that changed in place before they were taken (``loss.backward()`` outside ``step()`` and
the wrappers' ``backward()``, an in-place ``zero_()``) cannot be told from the carried part: taking them is refused
before anything changes (ZERO-006). The version counter is autograd's record of in-place writes
(:func:`.torch_compat.version_counter`); a gradient that was replaced or set to ``None`` carries nothing.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.window import Window

__all__ = ["ClearAfterStep", "LeaveToUser", "Taking", "Zeroing", "zeroing"]


@dataclass(frozen=True)
class Taking:
    """What a window held before a call took its carried part: what a failed call that keeps the window restores."""

    left: dict[torch.Tensor, tuple[weakref.ref[torch.Tensor], int]]
    carried: dict[torch.Tensor, torch.Tensor] | None


class Zeroing:
    """``zero_grad_after_step=True``: a real step clears its window's gradients (taken or skipped) [ZERO-001].

    The base class of the two settings; nothing is ever left, so nothing is ever taken or carried.
    """

    clears_after_step: bool = True
    """The setting, as ``context.zero_grad_after_step`` reads it."""

    def after_step(self, window: Window, *, skipped: bool) -> None:
        """The real step of ``window`` returned (``skipped``: for non-finite gradients): clear its gradients."""
        window.clear_gradients()
        window.carried = None

    def check_take(self, window: Window) -> None:
        """Refuse to take gradients that changed in place since the step left them [ZERO-006]."""

    def take(self, window: Window) -> Taking | None:
        """The window's first micro-step: move what the last step left aside, as the carried part [ZERO-005].

        Returns what the window held before, for a failed call to put back (``None``: nothing was left).
        """
        return None

    def untake(self, window: Window, taking: Taking) -> None:
        """Undo :meth:`take`: a failed call that keeps its window puts the left gradients back [FAIL-002, FAIL-004]."""

    def clear(self, window: Window, set_to_none: bool) -> None:
        """The user's ``zero_grad()`` with no window open: the carried part goes with the gradients [ZERO-005].

        Called before the inner optimizer's ``zero_grad(set_to_none)``, which clears what is on the parameters.
        """

    def drop(self, window: Window) -> None:
        """A failed call discarded the window: the carried part goes with it [ZERO-007, FAIL-003]."""
        window.left = None
        window.carried = None


class ClearAfterStep(Zeroing):
    """``zero_grad_after_step=True`` (the default): every real step clears the gradients it applied [ZERO-001]."""


class LeaveToUser(Zeroing):
    """``zero_grad_after_step=False``: a taken step leaves its gradients to the user, and the next window carries them.

    The price, while a window carries: the carried gradients beside the window's own (one extra gradient set).
    """

    clears_after_step: bool = False

    def after_step(self, window: Window, *, skipped: bool) -> None:
        """A taken step leaves its gradients (noted, to be taken); a skipped one clears them [ZERO-004].

        An optimizer that evaluates its closure itself clears its gradients before each evaluation (CLOS-004), so
        what it leaves is never carried.
        """
        window.carried = None
        if skipped:
            window.clear_gradients()
            window.left = None
            return
        if window.evaluates_closure:
            window.left = None
            return
        window.left = {
            param: (weakref.ref(param.grad), torch_compat.version_counter(param.grad))
            for param in window.params()
            if param.grad is not None
        } or None

    def check_take(self, window: Window) -> None:
        """Refuse to take gradients that changed in place since the step left them [ZERO-006]."""
        left = window.left
        if left is None:
            return
        for param, (ref, version) in left.items():
            grad = param.grad
            if grad is not None and grad is ref() and torch_compat.version_counter(grad) != version:
                raise RuntimeError(
                    f"zero_grad_after_step=False: the gradients that the last real step of "
                    f"{type(window.optimizer).__name__} left were changed in place before this window took them (a "
                    "backward outside step() and opt.backward(), such as loss.backward() before step(), or an in-place "
                    "zero_grad(set_to_none=False) of the module or the inner optimizer), so the window cannot tell "
                    "them from its own. Call opt.zero_grad() before the window's first backward (or run that backward "
                    "through opt.backward(loss) or inside step())"
                )

    def take(self, window: Window) -> Taking | None:
        """Move the left gradients aside as the window's carried part (no copy); refuse changed ones first."""
        left = window.left
        if left is None:
            return None
        self.check_take(window)
        taking = Taking(left, window.carried)
        carried = dict(window.carried or {})
        for param, (ref, _) in left.items():
            grad = param.grad
            if grad is not None and grad is ref():
                # A view (DDP's gradient_as_bucket_view) would be overwritten by the next reduction: keep a copy.
                carried[param] = grad if grad._base is None else grad.clone()
                param.grad = None
        window.left = None
        window.carried = carried or None
        return taking

    def untake(self, window: Window, taking: Taking) -> None:
        """Put the gradients taken back on the parameters, as the step left them."""
        now = window.carried or {}
        before = taking.carried or {}
        for param, grad in now.items():
            if param not in before and param.grad is None:
                param.grad = grad
        window.left = taking.left
        window.carried = taking.carried

    def clear(self, window: Window, set_to_none: bool) -> None:
        """Drop the carried part; ``set_to_none=False`` puts it back first, so that it is zeroed as torch zeroes."""
        carried, window.carried, window.left = window.carried, None, None
        if carried and not set_to_none:
            for param, grad in carried.items():
                if param.grad is None:
                    param.grad = grad


def zeroing(zero_grad_after_step: object) -> Zeroing:
    """The setting ``zero_grad_after_step``: a ``bool``, or a ``TypeError`` that says what it must be [ZERO-003]."""
    if not isinstance(zero_grad_after_step, bool):
        raise TypeError(
            f"zero_grad_after_step must be True or False, got {zero_grad_after_step!r} "
            f"({type(zero_grad_after_step).__name__}): True clears a real step's gradients, False leaves them to "
            "zero_grad()"
        )
    return ClearAfterStep() if zero_grad_after_step else LeaveToUser()
