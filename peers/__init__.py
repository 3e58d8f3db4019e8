"""Adapters that hold the peer frameworks to the conformance suite: ``--impl=lightning_optimizer.peers.<name>``.

Each adapter (:mod:`~lightning_optimizer.peers.lightning`, :mod:`~lightning_optimizer.peers.fabric`,
:mod:`~lightning_optimizer.peers.accelerate`) builds its training context out of the peer's own objects and
translates every call of the contract into the code that a user of that peer writes, as the peer's documentation
shows it. An adapter adds no behaviour of its own and never patches the peer: where the peer differs from the
contract, the suite reports it. Each adapter module states its translations in ``TRANSLATIONS`` and what it does
not claim, and why, in ``NOT_CLAIMED``.

What the adapters share lives here: :class:`PeerOptimizer`, the object that a context's ``wrap`` returns. Its
contract-only members (``step(closure, make_optimizer_step)``, ``backward``, ``unscale_gradients``,
``toggle_model``, ``last_outcome``) are the context's translations; everything else (attribute reads and writes,
``isinstance``, ``repr``, step hooks, state dicts, copies) is the peer wrapper's own.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Generic, Protocol, TypeVar, cast, overload

import torch

from lightning_optimizer.spec import FAILURE_POLICIES, OptimizerWrapper, StepOutcome
from lightning_optimizer.spec import __version__ as __version__

__all__ = [
    "NoHooks",
    "PeerContext",
    "PeerOptimizer",
    "ZeroGradDiscard",
    "check_clears_after_step",
    "check_discard_only",
]

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)
T = TypeVar("T")


class NoHooks:
    """The contract's ``register_hooks`` for a peer that has none: each adapter declines the feature ``"hooks"``.

    Lightning, Fabric and Accelerate call their own hooks (Lightning's callbacks among them) from inside their
    loops; none offers a way to register a hook on its optimizer wrapper from outside one.
    """

    peer_name = "this peer"

    def register_hooks(
        self,
        *,
        before_backward: Callable[..., None] | None = None,
        after_backward: Callable[..., None] | None = None,
        before_optimizer_step: Callable[..., None] | None = None,
        after_step: Callable[..., None] | None = None,
    ) -> Any:
        """Refused: the peer has no hooks to register (the feature ``"hooks"`` is not claimed)."""
        raise NotImplementedError(
            f"{self.peer_name} offers no hooks to register around its optimizer wrapper's backward and step; the "
            "adapter does not claim the feature 'hooks'"
        )


class ZeroGradDiscard:
    """The contract's ``discard(wrapper)`` as a peer's user writes it: the peer wrapper's ``zero_grad()``.

    None of the peers has a call that drops a window: its user clears the gradients, and the peer's own count of
    micro-steps (Lightning's batch index, Accelerate's step counter) goes on, which the suite reports (FAIL-009).
    """

    def discard(self, wrapper: OptimizerWrapper[Any]) -> None:
        """Clear ``wrapper``'s gradients through the peer wrapper; ``last_outcome`` reads ``DISCARDED``."""
        if not isinstance(wrapper, PeerOptimizer) or wrapper._context is not cast(Any, self):
            raise ValueError(f"discard() takes a wrapper of this context, got {type(wrapper).__name__}")
        wrapper._peer.zero_grad(set_to_none=True)
        object.__setattr__(wrapper, "_outcome", StepOutcome.DISCARDED)


def check_discard_only(on_failure: object, peer_name: str) -> None:
    """FAIL-001 for an adapter: ``"discard"`` taken, ``"restore"`` refused (no adapter claims ``"exact_restore"``)."""
    if on_failure == "restore":
        raise ValueError(
            f"on_failure='restore' is refused: {peer_name} keeps no failed window (nothing copies a window to put back "
            "when a step() raises), and this adapter does not claim the feature 'exact_restore'; use "
            "on_failure='discard'"
        )
    if on_failure not in FAILURE_POLICIES:
        raise ValueError(f"on_failure must be one of {', '.join(map(repr, FAILURE_POLICIES))}, got {on_failure!r}")


def check_clears_after_step(zero_grad_after_step: object, peer_name: str) -> None:
    """ZERO-003 for an adapter: ``True`` taken, ``False`` refused (no adapter claims ``"user_zero_grad"``).

    Each adapter's step is the peer's documented loop, ``optimizer.step()`` then ``optimizer.zero_grad()``: the
    gradients of a real step are cleared, and nothing in the peer keeps what a window carries apart from its own
    micro-steps (ZERO-005), so ``False`` is refused with ``ValueError``, as ZERO-003 allows; a value that is not a
    bool is a ``TypeError``.
    """
    if zero_grad_after_step is True:
        return
    if zero_grad_after_step is False:
        raise ValueError(
            f"zero_grad_after_step=False is refused: this adapter translates step() as {peer_name}'s documented loop, "
            "which clears the gradients after each real step, and does not claim the feature 'user_zero_grad'; use "
            "zero_grad_after_step=True"
        )
    raise TypeError(f"zero_grad_after_step must be True or False, got {zero_grad_after_step!r}")


class PeerContext(Protocol):
    """What a :class:`PeerOptimizer` asks of its adapter context: the translation of each contract-only call."""

    def _peer_step(
        self,
        wrapper: PeerOptimizer[Any],
        closure: Callable[[], Any] | None,
        make_optimizer_step: object,
        kwargs: dict[str, Any],
    ) -> Any:
        """One ``step`` call of the contract, as the peer's user writes it; sets ``wrapper.last_outcome``."""
        ...

    def _peer_backward(
        self, wrapper: PeerOptimizer[Any], loss: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """The peer's backward call for ``loss``."""
        ...

    def _peer_unscale_gradients(self, wrapper: PeerOptimizer[Any]) -> None:
        """What the peer's user calls to unscale gradients by hand."""
        ...

    def _peer_toggle_model(self, wrapper: PeerOptimizer[Any], sync_grad: bool) -> AbstractContextManager[None]:
        """What the peer offers for ``toggle_model``."""
        ...


_OWN_FIELDS = frozenset({"_context", "_peer", "_outcome", "_micro_steps"})


class PeerOptimizer(Generic[OptimizerT]):
    """The contract's :class:`~lightning_optimizer.spec.OptimizerWrapper` over a peer's optimizer wrapper.

    ``peer`` is the peer's own wrapper (``LightningOptimizer``, Fabric's ``_FabricOptimizer``, Accelerate's
    ``AcceleratedOptimizer``). This object is transparent: ``isinstance`` sees the peer wrapper's class (through
    ``__class__``, as ``unittest.mock`` does), reads and writes of attributes that are not the contract's reach
    the peer wrapper, and ``repr`` is the peer wrapper's. Only what the contract adds is translated by the
    context. A copy (``pickle``, ``copy.deepcopy``) copies the peer wrapper, which is what the checks judge, and
    stays attached to the same training context (the user's trainer, loop and model), which a copy of the
    optimizer does not take along.
    """

    _context: PeerContext
    _peer: Any
    _outcome: StepOutcome | None
    _micro_steps: int

    def __init__(self, context: PeerContext, peer: object) -> None:
        """Prefer :meth:`adapt`, whose class bears the peer wrapper's class name (error messages name the peer)."""
        object.__setattr__(self, "_context", context)
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_outcome", None)
        object.__setattr__(self, "_micro_steps", 0)

    @staticmethod
    def adapt(context: PeerContext, peer: object) -> PeerOptimizer[Any]:
        """A wrapper over ``peer`` whose class is named as the peer wrapper's (a subclass of this one)."""
        peer_class = type(peer)
        adapter_class = _ADAPTER_CLASSES.get(peer_class)
        if adapter_class is None:
            namespace = {"__module__": __name__, "__qualname__": peer_class.__name__}
            adapter_class = _ADAPTER_CLASSES[peer_class] = type(peer_class.__name__, (PeerOptimizer,), namespace)
        return adapter_class(context, peer)

    # -- what the contract adds: translated by the context ---------------------------------------------------

    @property
    def peer(self) -> Any:
        """The peer's own optimizer wrapper."""
        return self._peer

    @property
    def optimizer(self) -> OptimizerT:
        """The inner optimizer, as the peer wrapper's ``optimizer`` gives it."""
        inner: OptimizerT = self._peer.optimizer
        return inner

    @property
    def last_outcome(self) -> StepOutcome | None:
        """What the last ``step()`` call did, as far as the peer lets its user tell; ``None`` before the first."""
        return self._outcome

    @property
    def micro_steps(self) -> int:
        """How many ``step()`` calls this wrapper has had (the count a user keeps for a schedule of their own)."""
        return self._micro_steps

    def record(self, outcome: StepOutcome) -> None:
        """Record what the ``step()`` call in progress did (called by the context's translation)."""
        object.__setattr__(self, "_outcome", outcome)
        object.__setattr__(self, "_micro_steps", self._micro_steps + 1)

    @overload
    def step(self, closure: None = None, make_optimizer_step: bool | None = None, **kwargs: Any) -> None: ...

    @overload
    def step(self, closure: Callable[[], T], make_optimizer_step: bool | None = None, **kwargs: Any) -> T: ...

    def step(
        self, closure: Callable[[], T] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> T | None:
        """One micro-step, written as the peer's user writes it (see the adapter's ``TRANSLATIONS``)."""
        result: T | None = self._context._peer_step(self, closure, make_optimizer_step, kwargs)
        return result

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The peer's backward call for ``loss``."""
        self._context._peer_backward(self, loss, args, kwargs)

    def unscale_gradients(self) -> None:
        """What the peer's user calls to unscale the gradients before clipping them by hand."""
        self._context._peer_unscale_gradients(self)

    def toggle_model(self, sync_grad: bool = True) -> AbstractContextManager[None]:
        """What the peer offers for toggling ``requires_grad`` and for skipping the gradient sync."""
        return self._context._peer_toggle_model(self, sync_grad)

    # -- the rest is the peer wrapper's own ------------------------------------------------------------------

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self._peer)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The peer wrapper's ``zero_grad``."""
        self._peer.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The peer wrapper's ``param_groups``."""
        groups: list[dict[str, Any]] = self._peer.param_groups
        return groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self._peer.param_groups = value

    @property
    def state(self) -> Any:
        """The peer wrapper's ``state``."""
        return self._peer.state

    @state.setter
    def state(self, value: Any) -> None:
        self._peer.state = value

    @property
    def defaults(self) -> dict[str, Any]:
        """The peer wrapper's ``defaults``."""
        defaults: dict[str, Any] = self._peer.defaults
        return defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self._peer.defaults = value

    def state_dict(self) -> dict[str, Any]:
        """The peer wrapper's ``state_dict()``."""
        state: dict[str, Any] = self._peer.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The peer wrapper's ``load_state_dict``."""
        self._peer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """The peer wrapper's ``add_param_group``."""
        self._peer.add_param_group(param_group)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this object does not have: they are the peer wrapper's.
        if name in _OWN_FIELDS or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._peer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN_FIELDS or name in _ADAPTER_ATTRIBUTES:
            # ``step`` lands here when an LR scheduler patches it: the patch must wrap the translated step.
            object.__setattr__(self, name, value)
        else:
            setattr(self._peer, name, value)

    def __delattr__(self, name: str) -> None:
        if name in vars(self):
            object.__delattr__(self, name)
        else:
            delattr(self._peer, name)

    def __repr__(self) -> str:
        return repr(self._peer)

    def __reduce__(self) -> tuple[Callable[..., PeerOptimizer[Any]], tuple[Any, ...]]:
        return _rebuild, (_context_key(self._context), self._peer, self._outcome, self._micro_steps)


_ADAPTER_ATTRIBUTES = frozenset(name for klass in PeerOptimizer.__mro__ for name in vars(klass))
_ADAPTER_CLASSES: weakref.WeakKeyDictionary[type, type[PeerOptimizer[Any]]] = weakref.WeakKeyDictionary()
_CONTEXTS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_KEYS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_NEXT_KEY = itertools.count()


def _context_key(context: PeerContext) -> int:
    """A key under which a copied wrapper finds its (live) training context in this process."""
    key = _KEYS.get(context)
    if key is None:
        key = _KEYS[context] = next(_NEXT_KEY)
        _CONTEXTS[key] = context
    return key


def _rebuild(key: int, peer: object, outcome: StepOutcome | None, micro_steps: int) -> PeerOptimizer[Any]:
    context = _CONTEXTS.get(key)
    if context is None:
        raise RuntimeError(
            "a copied peer wrapper is rebuilt only in the process where its training context lives (the peer's "
            "trainer or accelerator and the user's loop do not travel with a copy of the optimizer)"
        )
    wrapper = PeerOptimizer.adapt(context, peer)
    object.__setattr__(wrapper, "_outcome", outcome)
    object.__setattr__(wrapper, "_micro_steps", micro_steps)
    return wrapper
