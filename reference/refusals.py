"""Every refusal of a call, in one place: checked before anything changes, each naming what to call instead.

A refused call changes nothing, under either failure policy [FAIL-002]: bad arguments [ERR-001, ERR-002, ERR-007,
ERR-008, ERR-009], a ``step()`` re-entered from a closure [REENT-001], a stage that forbids the call [CLIP-002],
an optimizer that cannot accumulate [CLOS-002], wrapping twice [ERR-004, ERR-010], a state or copy taken
mid-preparation [CKPT-004].
"""

from __future__ import annotations

import inspect
import weakref
from typing import TYPE_CHECKING, Any

import torch

from lightning_optimizer.reference.window import Window, WindowStage

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

__all__ = ["WRAPPED_BY", "Refusals", "check_flag", "check_optimizer_state", "record_wrap"]

WRAPPED_BY: weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.ref[Any]] = weakref.WeakKeyDictionary()
"""Which context wraps each optimizer: a second context may not (their windows and scalers would conflict)."""


class Refusals:
    """The checks that refuse a call before it changes anything."""

    def check_step(
        self, context: TrainingContext, window: Window, closure: object, make_optimizer_step: object, kwargs: Any
    ) -> None:
        """Bad arguments, and a ``step()`` re-entered from a closure [ERR-001, ERR-002, ERR-008, REENT-001]."""
        if context.windows.call is not None:
            raise RuntimeError(
                "step() was called while another step() of this training context is running (from inside a "
                "closure): call each wrapper's step() from the training loop, one after the other"
            )
        if closure is not None and not callable(closure):
            raise TypeError(f"closure must be callable or None, got {type(closure).__name__}")
        if make_optimizer_step is not None and not isinstance(make_optimizer_step, bool):
            raise TypeError(
                f"make_optimizer_step must be True, False or None, got {make_optimizer_step!r} "
                f"({type(make_optimizer_step).__name__}); pass bool(...) if you mean a truth value"
            )
        if kwargs:
            _check_step_kwargs(window.optimizer, kwargs)

    def check_transition(self, window: Window, real: bool, closure: object) -> None:
        """A step the window's stage forbids [CLIP-002], or a closure evaluator asked to accumulate [CLOS-002]."""
        name = type(window.optimizer).__name__
        if window.stage is WindowStage.PREPARED and not real:
            raise RuntimeError(
                "unscale_gradients() prepared this window for its real step, but this step() does not close the "
                "window: call step(make_optimizer_step=True), or call unscale_gradients() only before that step"
            )
        if window.evaluates_closure and not real:
            raise ValueError(f"{name} evaluates its closure several times per step and cannot accumulate")
        if window.evaluates_closure and closure is None:
            raise TypeError(f"{name} needs a closure: call step(closure)")

    def check_backward(self, context: TrainingContext, loss: object) -> None:
        """A loss that is not a tensor, or a backward into a prepared window [CLIP-002]."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backward expects the loss tensor, got {type(loss).__name__}")
        if self.prepared_for_backward(context):
            raise RuntimeError(
                "backward() after unscale_gradients() would add scaled gradients to a prepared window: run every "
                "backward of the window first, then unscale_gradients(), then the step that closes the window"
            )

    def prepared_for_backward(self, context: TrainingContext) -> bool:
        """Whether a backward now would add scaled gradients to a prepared window (not an evaluation's own)."""
        return context.windows.prepared_for_backward()

    def check_zero_grad(self, context: TrainingContext, window: Window) -> None:
        """A ``zero_grad()`` of a prepared window [CLIP-002]."""
        if context.windows.prepared(window):
            raise RuntimeError(
                "zero_grad() after unscale_gradients() would discard gradients that cannot be prepared again in this "
                "iteration; take the step that closes the window first, or call zero_grad() before the backward"
            )

    def check_unscale(self, window: Window) -> None:
        """``unscale_gradients()`` inside the closure of a step that does not close the window [CLIP-002]."""
        if window.stage is WindowStage.ACCUMULATING:
            raise RuntimeError(
                "unscale_gradients() was called in the closure of a step() that does not close the window; call it "
                "in the closure of the closing step, or between the window's last backward and that step"
            )

    def check_parameter(self, context: TrainingContext, param: torch.Tensor) -> None:
        """A parameter off the context's device or in another dtype than the precision's [ERR-007]."""
        context.parts.precision.check_parameter(param)
        if param.device != context.device:
            raise ValueError(
                f"the optimizer holds a parameter on {param.device}, but this context runs on {context.device}: "
                "call context.prepare_module(model) before building the optimizer on its parameters"
            )

    def check_wrap(self, context: TrainingContext, optimizer: object) -> None:
        """A wrapper, a non-optimizer, an optimizer wrapped already [ERR-004, ERR-010], or one that cannot run here."""
        from lightning_optimizer.reference.wrapper import WrappedOptimizer

        if isinstance(optimizer, WrappedOptimizer):
            raise TypeError(
                f"{type(optimizer).__name__} is already a wrapper; pass its inner optimizer (wrapper.optimizer)"
            )
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"wrap expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
        name = type(optimizer).__name__
        owner = WRAPPED_BY.get(optimizer)
        if context.windows.wraps(optimizer):
            raise ValueError(f"this {name} is already wrapped by this context")
        if owner is not None and owner() is not None:
            raise ValueError(
                f"this {name} is already wrapped by another training context; wrap each optimizer in one context "
                "(build a new optimizer for a new context)"
            )
        window = Window(optimizer)
        if window.evaluates_closure and context.parts.scaling.changes_gradients:
            raise TypeError(
                f"{name} evaluates its closure itself, which loss scaling cannot follow: use 16-mixed with a "
                "first-order optimizer, or LBFGS with 32-true or 64-true"
            )
        if window.evaluates_closure and context.accumulate_grad_batches > 1:
            raise ValueError(
                f"{name} evaluates its closure several times per step and cannot accumulate gradients; use "
                f"accumulate_grad_batches=1 (got {context.accumulate_grad_batches})"
            )
        for param in window.params():
            self.check_parameter(context, param)

    def check_accumulation_change(self, context: TrainingContext, value: int) -> None:
        """A new ``accumulate_grad_batches`` while a window is open or prepared, or for a closure evaluator."""
        self.check_between_calls(context, "changing accumulate_grad_batches")
        if context.holds_open_window():
            raise RuntimeError(
                f"accumulate_grad_batches cannot change from {context.accumulate_grad_batches} to {value} while a "
                "window holds accumulated micro-steps: change it after the window's real step"
            )
        if value > 1 and any(window.evaluates_closure for window in context.windows):
            raise ValueError(
                "an optimizer of this context evaluates its closure several times per step and cannot accumulate "
                f"gradients; accumulate_grad_batches must stay 1 (got {value})"
            )

    def check_param_group(self, context: TrainingContext, window: Window, param_group: object) -> list[object]:
        """A group that is not a dict, added mid-call, or with tensors ``wrap`` would refuse [ERR-007]; a window open.

        The arguments are checked first, then the window: with one open the group is refused [WIN-001].
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"add_param_group expects a dict with a 'params' entry, got {type(param_group).__name__}")
        if window.stage is not WindowStage.READY:
            raise RuntimeError("add_param_group() while a step() runs or a window is prepared: call it between steps")
        params = param_group.get("params")
        if isinstance(params, torch.Tensor):
            candidates: list[object] = [params]
        elif params is None or isinstance(params, set | frozenset):
            candidates = []  # torch refuses a missing or unordered 'params' itself, before it changes anything
        else:
            candidates = list(params)
        for param in candidates:
            if isinstance(param, torch.Tensor):
                self.check_parameter(context, param)
        if window.length:
            raise RuntimeError(
                f"add_param_group() while the window of {type(window.optimizer).__name__} is open ({window.length} "
                "micro-step(s) accumulated): the new parameters would join the window's mean part of the way. Add "
                "the group after the window's real step, or call context.discard(wrapper) to drop the window first"
            )
        return candidates

    def check_discard(self, context: TrainingContext, wrapper: object) -> Window:
        """``discard()`` of something but a wrapper of this context, or while a ``step()`` runs [FAIL-009]."""
        from lightning_optimizer.reference.wrapper import WrappedOptimizer

        if not isinstance(wrapper, WrappedOptimizer) or wrapper.training_context is not context:
            raise ValueError(
                f"discard() takes a wrapper of this training context (what its wrap() returned), got "
                f"{type(wrapper).__name__}"
            )
        if context.windows.call is not None:
            raise RuntimeError(
                "discard() while a step() of this training context runs (from inside a closure): raise from the "
                "closure to fail the call instead (the failure policy then leaves its window), or discard after it"
            )
        return context.windows.all[wrapper.window_index]

    def check_between_calls(self, context: TrainingContext, what: str) -> None:
        """A state or copy taken while a ``step()`` runs, or after ``unscale_gradients()`` [CKPT-004]."""
        if not context.windows.between_calls():
            raise RuntimeError(
                f"{what} while a step() runs or after unscale_gradients() before its closing step: the window is "
                "mid-preparation; take it between step() calls"
            )

    def check_flag(self, name: str, value: object) -> None:
        """A ``sync_grad`` or ``is_last`` that is not a ``bool`` [ERR-009]."""
        check_flag(name, value)


def check_flag(name: str, value: object) -> None:
    """Refuse a flag (``sync_grad``, ``is_last``) that is not a ``bool`` [ERR-009]."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{name} must be True or False, got {value!r} ({type(value).__name__}); pass bool(...) if you mean a "
            "truth value"
        )


_STATE_KEYS = ("state", "param_groups")


def check_optimizer_state(optimizer: torch.optim.Optimizer, state_dict: object) -> None:
    """Refuse an optimizer state that is not a dict with torch's two keys, naming what is missing [ERR-005].

    Only where ``optimizer`` loads as ``torch.optim.Optimizer`` does: an override of ``load_state_dict`` may read
    another format, and decides for itself.
    """
    if type(optimizer).load_state_dict is not torch.optim.Optimizer.load_state_dict:
        return
    name = type(optimizer).__name__
    if not isinstance(state_dict, dict):
        raise TypeError(
            f"{name}.load_state_dict expects the dict that {name}.state_dict() returns, got "
            f"{type(state_dict).__name__}; nothing was loaded"
        )
    missing = [key for key in _STATE_KEYS if key not in state_dict]
    if missing:
        raise ValueError(
            f"this is not an optimizer state: it lacks {' and '.join(map(repr, missing))} (an optimizer's "
            f"state_dict() holds 'state' and 'param_groups'; a TrainingContext's state is loaded by "
            f"context.load_state_dict); nothing was loaded into {name}"
        )


def record_wrap(optimizer: torch.optim.Optimizer, context: object) -> None:
    """``context`` wraps ``optimizer`` now (a second context may not, ERR-010)."""
    WRAPPED_BY[optimizer] = weakref.ref(context)


def _check_step_kwargs(optimizer: torch.optim.Optimizer, kwargs: dict[str, Any]) -> None:
    """Refuse keyword arguments that the inner optimizer's ``step`` cannot take, before anything runs [ERR-008]."""
    try:
        signature = inspect.signature(optimizer.step)
    except (TypeError, ValueError):  # no signature to check against: the inner step decides
        return
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        raise TypeError(
            f"{type(optimizer).__name__}.step{signature} does not take {', '.join(map(repr, kwargs))}: {error}; "
            "pass only arguments of the inner optimizer's step as step() keyword arguments"
        ) from None
