"""The wrapper object: a transparent proxy of the inner optimizer whose ``step`` follows its training context.

All behaviour lives in the context (:mod:`lightning_optimizer.reference.context`); this module only makes the
wrapper look like, and forward to, the inner optimizer.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

import torch

from lightning_optimizer.spec.types import StepOutcome

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

__all__ = ["WrappedOptimizer"]

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)
T = TypeVar("T")

# Attributes that live on the wrapper itself; every other attribute is the inner optimizer's.
_OWN_FIELDS = frozenset({"_context", "_index"})


class WrappedOptimizer(torch.optim.Optimizer, Generic[OptimizerT]):
    """The reference :class:`~lightning_optimizer.spec.OptimizerWrapper`.

    Instances are made by :meth:`TrainingContext.wrap`; each one is an instance of a subclass of both this
    class and the inner optimizer's class, so ``isinstance`` checks against either hold. The inner optimizer
    is never copied: reads, writes and method calls that are not the wrapper's own reach it directly.
    """

    _context: TrainingContext
    _index: int

    def __init__(self, context: TrainingContext, index: int) -> None:
        # torch.optim.Optimizer.__init__ is deliberately not called: the state is the inner optimizer's.
        object.__setattr__(self, "_context", context)
        object.__setattr__(self, "_index", index)

    # -- the contract --------------------------------------------------------------------------------

    @property
    def optimizer(self) -> OptimizerT:
        """The inner optimizer."""
        return cast(OptimizerT, self._context.windows.all[self._index].optimizer)

    @property
    def last_outcome(self) -> StepOutcome | None:
        """What the last ``step()`` call did; ``None`` before the first call."""
        return self._context.windows.all[self._index].last_outcome

    @property
    def training_context(self) -> TrainingContext:
        """The training context this wrapper steps in (the reference's, not part of the contract)."""
        return self._context

    @property
    def window_index(self) -> int:
        """The place of this wrapper among the context's windows: ``training_context.windows[window_index]``."""
        return self._index

    @overload
    def step(self, closure: None = None, make_optimizer_step: bool | None = None, **kwargs: Any) -> None: ...

    @overload
    def step(self, closure: Callable[[], T], make_optimizer_step: bool | None = None, **kwargs: Any) -> T: ...

    def step(
        self, closure: Callable[[], T] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> T | None:
        """Run one micro-step: the closure, then a real step or accumulation, as the context decides."""
        return self._context.step_window(self._index, closure, make_optimizer_step, kwargs, self)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backpropagate ``loss`` in the context's precision (forwarding ``retain_graph``, ``inputs``, ...)."""
        self._context.backward(self, loss, *args, **kwargs)

    def unscale_gradients(self) -> None:
        """Prepare the open window for the real step now (mean, reduction, unscaling, clipping), e.g. to clip."""
        self._context.unscale_window(self._index)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear this wrapper's gradients, unless an accumulation window is open."""
        self._context.zero_grad_window(self._index, set_to_none)

    def toggle_model(self, sync_grad: bool = True) -> AbstractContextManager[None]:
        """Only this wrapper's parameters require grad inside the block; ``sync_grad=False`` skips DDP sync."""
        return self._context.toggle_window(self._index, sync_grad)

    # -- the proxied optimizer surface ----------------------------------------------------------------

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's ``param_groups``."""
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self) -> Any:
        """The inner optimizer's ``state``."""
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        """The inner optimizer's ``defaults``."""
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict, in its own format."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the inner optimizer (torch validates the layout before it changes anything) [ERR-005].

        A state that is not a dict with torch's two keys is refused first, naming what is missing, where the inner
        optimizer loads as torch's base class does (an override may read another format). A load that fails leaves
        the inner optimizer as it was (FAIL-008).
        """
        self._context.load_optimizer_state(self._index, state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the inner optimizer, once its parameters suit the context's device and dtype.

        From then on the group is the wrapper's like the others (toggled, accumulated, clipped, zeroed).
        """
        self._context.add_param_group_to_window(self._index, param_group)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper does not have: they are the inner optimizer's.
        if name in _OWN_FIELDS:
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN_FIELDS or name in _WRAPPER_ATTRIBUTES:
            # ``step`` lands here when an LR scheduler patches it: it must stay on the wrapper.
            object.__setattr__(self, name, value)
        else:
            setattr(self.optimizer, name, value)

    def __delattr__(self, name: str) -> None:
        if name in _OWN_FIELDS or name in vars(self):
            object.__delattr__(self, name)
        else:
            delattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(optimizer={self.optimizer!r}, precision={self._context.precision!r})"

    def __reduce__(self) -> tuple[Callable[[TrainingContext, int], WrappedOptimizer[Any]], tuple[Any, ...]]:
        # Dynamic classes do not pickle by reference: rebuild the wrapper from its (picklable) context.
        return _rebuild, (self._context, self._index)


_WRAPPER_ATTRIBUTES = frozenset(vars(WrappedOptimizer))
_CLASS_CACHE: dict[type[torch.optim.Optimizer], type[WrappedOptimizer[Any]]] = {}


def _forwarder(name: str) -> Callable[..., Any]:
    def forward(self: WrappedOptimizer[Any], *args: Any, **kwargs: Any) -> Any:
        return getattr(self.optimizer, name)(*args, **kwargs)

    forward.__name__ = name
    return forward


def wrapper_class(optimizer_class: type[OptimizerT]) -> type[WrappedOptimizer[OptimizerT]]:
    """The wrapper class for ``optimizer_class``: a subclass of both, whose inherited methods forward."""
    cached = _CLASS_CACHE.get(optimizer_class)
    if cached is None:
        namespace: dict[str, Any] = {"__module__": __name__}
        for name in dir(optimizer_class):
            if name.startswith("__") or name in _WRAPPER_ATTRIBUTES:
                continue
            if inspect.isfunction(inspect.getattr_static(optimizer_class, name)):
                namespace[name] = _forwarder(name)
        cached = type(f"Wrapped{optimizer_class.__name__}", (WrappedOptimizer, optimizer_class), namespace)
        _CLASS_CACHE[optimizer_class] = cached
    return cached


def _rebuild(context: TrainingContext, index: int) -> WrappedOptimizer[Any]:
    return context.new_wrapper(index)
