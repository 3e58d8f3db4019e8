"""The stages of the reference context: the one declared seam a variant of the reference overrides.

:class:`~lightning_optimizer.reference.TrainingContext` runs each ``step()`` as one transaction (see
:mod:`.window`) through the stages below, in this order; the other hooks are what the wrappers call besides
``step``. A variant (the project's mutants, a framework's subclass) overrides stages, never the transaction
around them: a failed call is then still put back as it was. ``tests/test_mutants.py`` holds every mutant to this
list.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

import torch

from lightning_optimizer.reference.window import StepCall, Window

__all__ = ["CONSTRUCTION_HOOKS", "STAGE_NAMES", "StepStages"]

T = TypeVar("T")


class StepStages(Protocol):
    """The stage hooks of a training context, in the order a real step runs them."""

    def _check_step_arguments(
        self, index: int, closure: object, make_optimizer_step: object, kwargs: dict[str, Any]
    ) -> None:
        """Refuse bad arguments (and a ``step()`` re-entered from a closure) before anything runs."""
        ...

    def _closes_window(self, slot: Window, make_optimizer_step: bool | None) -> bool:
        """Whether this micro-step takes the real step (the accumulation rule)."""
        ...

    def _check_transition(self, slot: Window, real: bool, closure: object) -> None:
        """Refuse a step the window's stage does not allow (accumulating a prepared window, LBFGS accumulating)."""
        ...

    def _unsynced(self, slot: Window) -> list[torch.Tensor]:
        """Under FSDP, the unsharded parameters whose ``.grad`` holds the window's unsynced part (its stash too)."""
        ...

    def _check_synced(self, slot: Window) -> None:
        """Under FSDP, before a real step's preparation: refuse a window that no backward synced [FSDP-005]."""
        ...

    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        """The user's closure, toggled and under autocast (and ``no_sync`` when it does not close the window)."""
        ...

    def _prepare_gradients(self, slot: Window) -> None:
        """Once per window, before its real step: the four stages below, in order."""
        ...

    def _normalise_window(self, slot: Window) -> None:
        """The window's summed gradients become their mean."""
        ...

    def _reduce_gradients(self, slot: Window) -> None:
        """The device's cross-replica reduction (XLA), where it is not done in backward."""
        ...

    def _unscale(self, slot: Window) -> None:
        """The loss scaler's unscaling (16-mixed)."""
        ...

    def _clip(self, slot: Window) -> None:
        """Gradient clipping, when the context clips."""
        ...

    def _replay(self, index: int, closure: Callable[[], T], result: T) -> Callable[[], T]:
        """The closure a real step hands the inner optimizer: the call's result first, fresh evaluations after."""
        ...

    def _before_optimizer_step(self, index: int, wrapper: Any) -> None:
        """The registered ``before_optimizer_step`` hooks, the window prepared, inside the call's transaction."""
        ...

    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        """The inner optimizer's step through the loss scaler (with the evaluation closure for LBFGS)."""
        ...

    def _evaluate_closure(self, index: int, closure: Callable[[], T]) -> T:
        """One evaluation of a closure-evaluating optimizer's closure: toggled, reduced, clipped."""
        ...

    def _step_rollback(self, slot: Window) -> AbstractContextManager[None]:
        """What puts back parameters and state of a closure-evaluating optimizer whose step failed."""
        ...

    def _finish_accumulation(self, slot: Window) -> None:
        """A micro-step that only accumulated: the window one longer, the outcome recorded."""
        ...

    def _abort(self, slot: Window, call: StepCall) -> None:
        """A call that raised: the window (and the loss scaler's record of it) put back as before the call."""
        ...

    def _finish_real_step(self, slot: Window) -> None:
        """Outcome, step count, zeroing, and the loss scaler's update outside a ``batch()``."""
        ...

    def _after_step(self, index: int, wrapper: Any) -> None:
        """The registered ``after_step`` hooks, once the call has returned its result."""
        ...

    def _end_iteration(self) -> None:
        """The end of a training iteration: the loss scaler's update."""
        ...

    def _toggle(self, index: int, *, sync_grad: bool) -> AbstractContextManager[None]:
        """Only this optimizer's parameters require grad inside; ``sync_grad=False`` adds DDP's ``no_sync``."""
        ...

    def _wrapper_backward(self, wrapper: Any, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``wrapper.backward``: the registered backward hooks around :meth:`_backward`."""
        ...

    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The loss scaled under 16-mixed, then its backward."""
        ...

    def _unscale_gradients(self, index: int) -> None:
        """``wrapper.unscale_gradients()``: prepare the window now."""
        ...

    def _zero_grad(self, index: int, set_to_none: bool) -> None:
        """``wrapper.zero_grad()``: clear gradients unless a window is open."""
        ...

    def _add_param_group(self, index: int, param_group: dict[str, Any]) -> None:
        """``wrapper.add_param_group()``: check the new parameters, then add the group."""
        ...

    def _check_parameter(self, param: torch.Tensor) -> None:
        """Refuse a parameter off the context's device or dtype."""
        ...

    def _validated_entries(self, state_dict: object) -> list[dict[str, Any]]:
        """``load_state_dict``: the whole state checked before anything loads; each optimizer's entry."""
        ...

    def _check_layout(self, index: int, params: list[torch.Tensor], entry: dict[str, Any]) -> None:
        """One optimizer's saved entry checked against its parameters (count and shapes)."""
        ...

    def _new_wrapper(self, index: int) -> Any:
        """The wrapper object of optimizer ``index``."""
        ...


STAGE_NAMES: frozenset[str] = frozenset(
    name for name, member in vars(StepStages).items() if inspect.isfunction(member) and not name.startswith("__")
)
"""The names a variant may override."""

CONSTRUCTION_HOOKS: frozenset[str] = frozenset({"__init__", "__getstate__", "__setstate__"})
"""Besides the stages and the public members, what a variant may replace: how it is built and copied."""
