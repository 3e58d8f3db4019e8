"""What changed a window from outside the wrappers: its parameters [WIN-001], its cleared gradients [WIN-002].

The context does not see ``optimizer.param_groups[0]["params"].append(p)`` or ``model.zero_grad()``; it finds
their effect at the next call that would use the window, before that call changes anything:

- Each window knows the parameters it was built with (:attr:`Window.known <.window.Window.known>`), compared by
  identity at its ``step()`` and ``unscale_gradients()``. A change between windows joins once its new parameters
  pass ``wrap``'s checks [ERR-007]; a change while the window is open is refused, since no mean of torch's recipe
  covers a parameter that accumulated over part of the window.
- Each window notes which of its parameters held a gradient when its last accumulating call returned
  (:attr:`Window.holding <.window.Window.holding>`). One of them without a gradient at the window's next
  ``step()`` or ``unscale_gradients()``, or at any wrapper's ``backward()`` outside ``step()``, was cleared from
  outside: the window's sum is gone while its length still counts it.

Under FSDP the accumulating gradients live on unsharded parameters that the closing backward empties itself, so
the note reads the parameters the optimizer holds, whose gradients a window's micro-steps leave alone: a clearing
there is found, one of the unsharded sums is not.
"""

from __future__ import annotations

import operator
from itertools import repeat
from typing import TYPE_CHECKING

import torch

from lightning_optimizer.reference.window import Window, WindowStage

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

__all__ = ["OutsideChanges"]


class OutsideChanges:
    """The checks of what changed a window behind its wrapper's back, and the notes they compare against."""

    def check_call(self, context: TrainingContext, window: Window) -> None:
        """The window's ``step()`` or ``unscale_gradients()``: its parameters [WIN-001], its gradients [WIN-002].

        The parameters are compared by identity (``id`` of each, while :attr:`Window.known` keeps them alive), and
        a gradient by ``is None``: no tensor comparison, no Python call per parameter.
        """
        params = window.params()
        if list(map(id, params)) != window.known_ids:
            self.parameters_changed(context, window, params)
        if window.length:
            self.check_cleared(window)

    def parameters_changed(self, context: TrainingContext, window: Window, params: list[torch.Tensor]) -> None:
        """Refuse a change of an open window's parameters; let a checked one join a window with nothing in it.

        The same parameters in another order are the same window.
        """
        known_ids = {id(param) for param in window.known}
        now_ids = {id(param) for param in params}
        added = [param for param in params if id(param) not in known_ids]
        removed = sum(1 for param in window.known if id(param) not in now_ids)
        if (added or removed) and (window.length or window.stage is WindowStage.PREPARED):
            raise RuntimeError(
                f"the parameters of {type(window.optimizer).__name__} changed while its window was open "
                f"({len(added)} added, {removed} removed outside wrapper.add_param_group(), with "
                f"{window.length} micro-step(s) accumulated): change an optimizer's parameters only after its "
                "window's real step, or call context.discard(wrapper) to drop the window first"
            )
        for param in added:
            context.parts.refusals.check_parameter(context, param)  # as wrap() checks them [ERR-007]
        window.know(params)

    def check_cleared(self, window: Window) -> None:
        """A parameter that held part of the open window has no gradient now [WIN-002]."""
        grads = list(map(_GRAD, window.holding))
        if any(map(operator.is_, grads, repeat(None))):
            cleared = sum(map(operator.is_, grads, repeat(None)))
            raise RuntimeError(
                f"the gradients of {type(window.optimizer).__name__}'s open window ({window.length} micro-step(s)) "
                f"were cleared outside its wrapper ({cleared} parameter(s) lost theirs: model.zero_grad(), the inner "
                "optimizer's zero_grad() or p.grad = None): clear gradients with the wrapper's zero_grad(), which "
                "keeps an open window, or call context.discard(wrapper) to drop the window and start a new one"
            )

    def check_backward(self, context: TrainingContext) -> None:
        """A wrapper's ``backward()`` outside ``step()`` would add to windows whose gradients were cleared [WIN-002]."""
        for window in context.windows.all:
            if window.length:
                self.check_cleared(window)

    def accumulated(self, window: Window) -> None:
        """An accumulating call returned: note which parameters hold part of the window now."""
        window.holding = [param for param in window.params() if param.grad is not None]

    def joined(self, window: Window) -> None:
        """The wrapper's ``add_param_group`` added checked parameters: the window knows them."""
        window.know(window.params())


_GRAD = operator.attrgetter("grad")
