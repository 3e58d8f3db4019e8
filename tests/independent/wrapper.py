"""The wrapper: a subclass of the inner optimizer's own class that proxies it and decides what each step does."""

from __future__ import annotations

import copy
import inspect
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

import torch
from torch.amp.grad_scaler import GradScaler, OptState

from independent import devices
from independent.window import Window
from lightning_optimizer.spec import StepOutcome

if TYPE_CHECKING:
    from independent.context import Context

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)
T = TypeVar("T")

_OWN = frozenset(
    {"_inner", "_context", "_window", "_outcome", "_closing", "_left", "_carried", "_indexed", "_known", "_had_grad"}
)
_NOT_PICKLED = frozenset({"_inner", "_closing", "_left", "_carried", "_indexed"})
_CLASSES: dict[type[torch.optim.Optimizer], type[Wrapper[Any]]] = {}


def is_wrapper(obj: object) -> bool:
    """Whether ``obj`` is a wrapper of this implementation."""
    return isinstance(obj, Wrapper)


def evaluates_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer calls its closure itself, as often as it needs: LBFGS, or one that declares it."""
    return isinstance(optimizer, torch.optim.LBFGS) or getattr(optimizer, "evaluates_closure", False) is True


def takes_closure(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's ``step`` can be given a ``closure`` keyword."""
    try:
        parameters = inspect.signature(optimizer.step).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "closure" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


class Wrapper(Generic[OptimizerT]):
    """An optimizer that does the right thing for its context; ``Wrapper.around`` makes one."""

    _inner: OptimizerT
    _context: Context
    _window: Window
    _outcome: StepOutcome | None
    _closing: bool | None
    _left: dict[int, tuple[weakref.ref[torch.Tensor], int]]
    """``zero_grad_after_step=False``: the gradients the last taken real step left, by parameter index, as the
    tensor and its version counter then; no window has taken them yet (ZERO-004, ZERO-005)."""
    _carried: dict[int, torch.Tensor]
    """The carried part the open window took, by parameter index, kept apart from its own gradients (ZERO-005)."""
    _indexed: list[torch.Tensor]
    """The parameters that the indices of ``_left`` and ``_carried`` count: ``parameters()`` re-keys both by
    identity when the inner optimizer's parameters changed since."""
    _known: list[torch.Tensor]
    """The window's parameters: those of the inner optimizer when the wrapper last took its parameters in (WIN-001).
    A parameter added or removed from outside is found against them by the next ``step()`` or
    ``unscale_gradients()``."""
    _had_grad: list[bool]
    """For each of ``_known``: whether it had a gradient when the last call of the context's wrappers returned
    (WIN-002)."""

    @staticmethod
    def around(optimizer: OptimizerT, context: Context) -> Wrapper[OptimizerT]:
        """A wrapper of ``optimizer`` whose class derives from the optimizer's own class."""
        wrapper = cast("Wrapper[OptimizerT]", object.__new__(_class_for(type(optimizer))))
        wrapper.__setstate__(
            {"_inner": optimizer, "_context": context, "_window": Window(), "_outcome": None, "_carried": {}}
        )
        return wrapper

    # -- proxying ---------------------------------------------------------------------------------------

    @property
    def optimizer(self) -> OptimizerT:
        """The inner optimizer."""
        return self._inner

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's ``param_groups`` list."""
        return self._inner.param_groups

    @property
    def state(self) -> Any:
        """The inner optimizer's ``state`` mapping."""
        return self._inner.state

    @property
    def defaults(self) -> dict[str, Any]:
        """The inner optimizer's ``defaults``."""
        return self._inner.defaults

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in _OWN:
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # A method of the wrapper (an LR scheduler patching ``step``) is replaced where calls reach it: here.
        if name in _OWN or callable(getattr(Wrapper, name, None)):
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)

    def __delattr__(self, name: str) -> None:
        if name in vars(self):
            object.__delattr__(self, name)
        else:
            delattr(self._inner, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r})"

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # Pickling a parameter drops its gradient: the open window's gradients travel beside it, and so do those
        # that the last real step left, which the copy finds on its parameters as its window's own: no step of the
        # copy's left them (ZERO-005). The carried part a window took travels with it (ZERO-007).
        grads = [None if p.grad is None else p.grad.detach().clone() for p in self.parameters()]
        own = {name: getattr(self, name) for name in _OWN if name not in _NOT_PICKLED}
        carried = {index: grad.detach() for index, grad in self._carried.items()}
        return (_rebuild, (self._inner,), own | {"_carried": carried, "grads": grads})

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            if name != "grads":
                object.__setattr__(self, name, value)
        object.__setattr__(self, "_closing", None)
        object.__setattr__(self, "_left", {})
        object.__setattr__(self, "_indexed", self._listed())
        if "grads" in state:
            for param, grad in zip(self.parameters(), state["grads"], strict=True):
                param.grad = grad
        if "_known" not in state:
            object.__setattr__(self, "_known", self.parameters())
        if "_had_grad" not in state:
            object.__setattr__(self, "_had_grad", [param.grad is not None for param in self._known])

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state dict, unchanged in format."""
        return self._inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the inner optimizer; a state dict for another parameter layout raises ``ValueError``."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"an optimizer state dict is a dict, got {type(state_dict).__name__}")
        problem = _layout_problem(self._inner, state_dict)
        if problem is not None:
            raise ValueError(f"cannot load this optimizer state dict: {problem}")
        # A load that raises halfway leaves the inner optimizer's state and param_groups as they were (FAIL-008).
        with _InnerBefore(self._inner):
            self._inner.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the inner optimizer, once its parameters suit the context.

        Refused with a window open (WIN-001): its parameters change only between windows. One that fails leaves
        the inner optimizer's ``param_groups`` and ``state`` as they were (FAIL-008).
        """
        given: object = param_group
        params = param_group.get("params") if isinstance(given, dict) else None
        listed: list[Any] | None = None
        if isinstance(params, torch.Tensor):
            self._context.check_parameters([params])
        elif params is not None and not isinstance(params, set | frozenset):
            listed = list(params)
            self._context.check_parameters([p for p in listed if isinstance(p, torch.Tensor)])
        # Its arguments are checked first; then the open window refuses it, before anything changes (WIN-001).
        if self._window_open():
            raise RuntimeError(self._mid_window_message("add_param_group() would add parameters"))
        if listed is not None:
            param_group["params"] = listed
        groups = len(self._inner.param_groups)
        with _InnerBefore(self._inner):
            self._inner.add_param_group(param_group)
        # The new group's parameters join the window's; any changed from outside are still found by the next call.
        known = {id(param) for param in self._known}
        added = [p for group in self._inner.param_groups[groups:] for p in group["params"] if id(p) not in known]
        self._known = [*self._known, *added]
        self._had_grad = [*self._had_grad, *(param.grad is not None for param in added)]

    def register_step_pre_hook(self, hook: Any) -> Any:
        """Register a hook on the inner optimizer, called before each of its real steps."""
        return self._inner.register_step_pre_hook(hook)

    def register_step_post_hook(self, hook: Any) -> Any:
        """Register a hook on the inner optimizer, called after each of its real steps."""
        return self._inner.register_step_post_hook(hook)

    # -- the contract -----------------------------------------------------------------------------------

    @property
    def last_outcome(self) -> StepOutcome | None:
        """What the last ``step()`` call did; ``None`` before the first call."""
        return self._outcome

    def parameters(self) -> list[torch.Tensor]:
        """The inner optimizer's parameters, in the order of its groups.

        Where they changed since the indices of ``_left`` and ``_carried`` were taken (WIN-001), both are re-keyed
        by identity first; a parameter that left takes its entries with it.
        """
        current = self._listed()
        indexed = self._indexed
        if len(indexed) != len(current) or any(a is not b for a, b in zip(indexed, current, strict=True)):
            position = {id(param): index for index, param in enumerate(current)}
            moved = {old: position[id(param)] for old, param in enumerate(indexed) if id(param) in position}
            self._left = {moved[old]: entry for old, entry in self._left.items() if old in moved}
            self._carried = {moved[old]: grad for old, grad in self._carried.items() if old in moved}
            self._indexed = current
        return current

    def _listed(self) -> list[torch.Tensor]:
        return [param for group in self._inner.param_groups for param in group["params"]]

    @overload
    def step(self, closure: None = None, make_optimizer_step: bool | None = None, **kwargs: Any) -> None: ...

    @overload
    def step(self, closure: Callable[[], T], make_optimizer_step: bool | None = None, **kwargs: Any) -> T: ...

    def step(
        self, closure: Callable[[], T] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> T | None:
        """One micro-step: the closure, then a real step when this call closes the window, else accumulation."""
        if closure is not None and not callable(closure):
            raise TypeError(f"closure must be callable or None, got {type(closure).__name__}")
        if make_optimizer_step is not None and not isinstance(make_optimizer_step, bool):
            raise TypeError(f"make_optimizer_step must be True, False or None, got {make_optimizer_step!r}")
        context = self._context
        if context.stepping:
            raise RuntimeError("step() was called from inside a running step() of the same context: call it after")
        if kwargs:
            _check_step_kwargs(self._inner, kwargs)
        if evaluates_closure(self._inner):
            if context.precision == "16-mixed":
                raise TypeError(f"{type(self._inner).__name__} evaluates its closure itself: not usable in 16-mixed")
            if context.accumulate_grad_batches > 1 or make_optimizer_step is False:
                raise ValueError(f"{type(self._inner).__name__} evaluates its closure itself and cannot accumulate")
            self.take_in_parameters()
            with context.noting_gradients():
                with context.running_step():
                    evaluated = cast("T | None", self._evaluating_step(closure, kwargs))
                context.run_hooks("after_step", self, self._outcome)
            return evaluated
        closes = self._closes(make_optimizer_step)
        if self._window.prepared and not closes:
            raise RuntimeError("unscale_gradients() prepared this window: the next step() must close it")
        # What changed from outside since the last call is found before anything changes (WIN-001, WIN-002).
        self.take_in_parameters()
        self.check_cleared()
        self.check_left()
        with context.noting_gradients():
            return self._micro_step(closure, closes, kwargs)

    def _micro_step(self, closure: Callable[[], T] | None, closes: bool, kwargs: dict[str, Any]) -> T | None:
        context = self._context
        # The window takes what the last real step left before the closure runs (ZERO-005). A call that fails
        # leaves the window as the context's failure policy says (FAIL-002 to FAIL-004): as it was when nothing of
        # the call reached it (taken or not, ZERO-007), else discarded ("discard") or put back exactly ("restore",
        # the only policy that pays for a copy of the window's gradients).
        left, carried = dict(self._left), dict(self._carried)
        taken = self.take_left()
        before = _WindowBefore(
            self, copy_gradients=context.on_failure == "restore", left=left, carried=carried, taken=taken
        )
        stepping = False
        try:
            with context.running_step():
                result = None if closure is None else self._run_closure(closure, closes)
                self._window.micro_steps += 1
                if closes:
                    stepping = True
                    self._real_step(kwargs, None if closure is None else (closure, result))
                else:
                    self._outcome = StepOutcome.ACCUMULATED
        except BaseException as error:
            if context.on_failure == "discard" and (stepping or before.written()):
                self._discard(error, before.micro_steps + 1)
            else:
                before.restore()
            raise
        context.run_hooks("after_step", self, self._outcome)
        return result

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward(*args, **kwargs)`` outside autocast, under 16-mixed of ``scaler.scale(loss / N)``."""
        context = self._context
        if any(wrapper._window.prepared for wrapper in context.wrappers):
            # It would add scaled gradients to a window whose gradients are averaged and unscaled already.
            raise RuntimeError("backward() after unscale_gradients(): take the step that closes that window first")
        direct = not context.stepping
        if direct:
            # Outside step() it may add to any window of the context: none may have lost gradients (WIN-002).
            for wrapper in context.wrappers:
                wrapper.check_cleared()
        # A backward reaching the gradients a real step left would add to them: every window that it can reach
        # (one of its parameters requires grad) takes them first, as its carried part (ZERO-005).
        reached = [w for w in context.wrappers if w._left and any(p.requires_grad for p in w.parameters())]
        for wrapper in reached:
            wrapper.check_left()
        with context.noting_gradients():
            if not direct:  # inside a step(), whose own transaction covers its window (FAIL-002 to FAIL-004)
                for wrapper in reached:
                    wrapper.take_left()
                self._autograd(loss, args, kwargs)
                return
            # Outside step() a failure follows the policy over every window it wrote into (FAIL-008).
            kept = {id(w): (dict(w._left), dict(w._carried)) for w in context.wrappers}
            taken = {id(w): w.take_left() for w in reached}
            restore = context.on_failure == "restore"
            befores = [
                _WindowBefore(
                    w, copy_gradients=restore, left=kept[id(w)][0], carried=kept[id(w)][1], taken=taken.get(id(w), {})
                )
                for w in context.wrappers
            ]
            try:
                self._autograd(loss, args, kwargs)
            except BaseException as error:
                written = [before for before in befores if before.written()]
                for before in befores:
                    if before not in written:
                        before.restore(gradients=False, scaler=False)  # untouched, what it took put back
                    elif restore:
                        before.restore(scaler=False)
                if written and not restore:
                    _discard_after_backward(error, written)
                raise

    def _autograd(self, loss: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        context = self._context
        device_type = context.device.type
        # Autograd and the hooks around it run as torch's recipe runs them: outside autocast, wherever this is called.
        outside: AbstractContextManager[Any] = (
            torch.autocast(device_type, enabled=False) if torch.is_autocast_enabled(device_type) else nullcontext()
        )
        with outside:
            context.run_hooks("before_backward", self, loss)
            scaler = context.scaler
            if scaler is None:
                loss.backward(*args, **kwargs)
            else:
                # The recipe's micro-step loss (AMP-007): divided by the window's nominal length, then scaled.
                every = context.accumulate_grad_batches
                scaled = scaler.scale(loss if every == 1 else loss / every)
                context.scaled_backwards += 1
                try:
                    scaled.backward(*args, **kwargs)
                finally:
                    context.scaled_backwards -= 1
            context.run_hooks("after_backward", self, loss)

    def unscale_gradients(self) -> None:
        """Make the open window's gradients what its real step will apply, so that the user can clip them."""
        if evaluates_closure(self._inner):
            raise RuntimeError(f"{type(self._inner).__name__} evaluates its closure itself: nothing to prepare")
        if self._closing is False:
            raise RuntimeError("this step() does not close its window: unscale_gradients() must wait for one that does")
        if not self._window.prepared:
            # What changed from outside since the last call is found before anything changes (WIN-001, WIN-002).
            self.take_in_parameters()
            self.check_cleared()
            self.check_left()
            with self._context.noting_gradients():
                self._prepare_now()

    def _prepare_now(self) -> None:
        # The preparation writes into the window from its first step: a failure follows the policy as a failed
        # step() does (FAIL-007), the window discarded or put back as it was (with what it carried).
        left, carried = dict(self._left), dict(self._carried)
        taken = self.take_left()
        restore = self._context.on_failure == "restore"
        before = _WindowBefore(self, copy_gradients=restore, left=left, carried=carried, taken=taken)
        try:
            self._prepare(self._window.micro_steps + 1)
        except BaseException as error:
            if restore:
                before.restore()
            else:
                self._discard(error, before.micro_steps + 1, "unscale_gradients()")
            raise
        self._window.prepared = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The inner optimizer's ``zero_grad``, except while a window is open; refused on a prepared window.

        With no window open it clears the carried part too, taken or not (ZERO-005): ``set_to_none=False`` leaves
        zeros where the carried gradients were, as the inner optimizer leaves them in place, and they carry nothing.
        """
        if self._window.prepared:
            # Its gradients are unscaled already (the scaler unscales once per iteration): only a step may follow.
            raise RuntimeError(
                "unscale_gradients() prepared this window for its real step: call step() before zero_grad()"
            )
        if self._window.micro_steps == 0:
            params = self.parameters()
            for index, grad in self._carried.items():
                if params[index].grad is None and not set_to_none:
                    # Zeros where the carried gradient was, as the inner optimizer would leave it; the carried tensor
                    # itself stays as it was, for a failed call to put back (ZERO-007).
                    params[index].grad = torch.zeros_like(grad)
            self._carried, self._left = {}, {}
            self._inner.zero_grad(set_to_none)

    def toggle_model(self, sync_grad: bool = True) -> AbstractContextManager[None]:
        """Only this wrapper's parameters require grad inside; ``sync_grad=False`` suppresses DDP's sync."""
        if not isinstance(sync_grad, bool):
            raise TypeError(f"sync_grad must be a bool, got {sync_grad!r}")
        return self._region(sync=sync_grad, autocast=False)

    # -- what changed from outside since the last call (WIN-001, WIN-002) --------------------------------

    def _window_open(self) -> bool:
        """Whether a micro-step accumulated in the window, or ``unscale_gradients()`` prepared it."""
        return self._window.micro_steps > 0 or self._window.prepared

    def _mid_window_message(self, what: str) -> str:
        micro_steps = self._window.micro_steps
        plural = "" if micro_steps == 1 else "s"
        return (
            f"{what} of {type(self._inner).__name__} (optimizer {self._index()} of the context) while its window is "
            f"open ({micro_steps} micro-step{plural} accumulated): an optimizer's parameters change only between its "
            "windows. Change them after the window's real step, or drop the window with context.discard(wrapper); "
            "nothing was changed"
        )

    def _index(self) -> int:
        return next(i for i, wrapper in enumerate(self._context.wrappers) if wrapper is self)

    def take_in_parameters(self) -> None:
        """Find parameters added to or removed from the inner optimizer from outside (WIN-001).

        With the window open the call is refused; otherwise added parameters are checked as ``wrap`` checks them
        (ERR-007) and then join the window. Nothing changes when either refuses.
        """
        current = self.parameters()
        known = self._known
        if len(current) == len(known) and all(a is b for a, b in zip(current, known, strict=True)):
            return
        current_ids, known_ids = {id(p) for p in current}, {id(p) for p in known}
        added = [param for param in current if id(param) not in known_ids]
        removed = [param for param in known if id(param) not in current_ids]
        if (added or removed) and self._window_open():
            raise RuntimeError(
                self._mid_window_message(
                    f"{len(added)} parameter{'' if len(added) == 1 else 's'} added and {len(removed)} removed from "
                    "outside add_param_group()"
                )
            )
        self._context.check_parameters(added)
        had = {id(param): flag for param, flag in zip(known, self._had_grad, strict=True)}
        self._known = current
        self._had_grad = [had.get(id(param), param.grad is not None) for param in current]

    def check_cleared(self) -> None:
        """Refuse to use or add to an open window whose gradients were cleared from outside since the last call
        of the context's wrappers returned (WIN-002)."""
        if self._window.micro_steps < 1:
            return
        cleared = [
            index
            for index, (param, had) in enumerate(zip(self._known, self._had_grad, strict=True))
            if had and param.grad is None
        ]
        if cleared:
            micro_steps = self._window.micro_steps
            raise RuntimeError(
                f"the gradients of {len(cleared)} parameter{'' if len(cleared) == 1 else 's'} of "
                f"{type(self._inner).__name__}'s open window (optimizer {self._index()} of the context, "
                f"{micro_steps} micro-step{'' if micro_steps == 1 else 's'} accumulated) were cleared outside its "
                "wrapper (model.zero_grad(), the inner optimizer's zero_grad(), p.grad = None): the window's mean "
                "would be wrong. Clear them with the wrapper's zero_grad(), or drop the window with "
                "context.discard(wrapper); nothing was changed"
            )

    def note_gradients(self) -> None:
        """Note which of the window's parameters have a gradient now, as a call returns (WIN-002)."""
        self._had_grad = [param.grad is not None for param in self._known]

    # -- what a step does -------------------------------------------------------------------------------

    def _closes(self, make_optimizer_step: bool | None) -> bool:
        if make_optimizer_step is not None:
            return make_optimizer_step
        every = self._context.accumulate_grad_batches
        position = self._context.position
        if position is None:
            return self._window.micro_steps + 1 >= every
        batch_idx, is_last = position
        return (batch_idx + 1) % every == 0 or is_last

    @contextmanager
    def _region(self, *, sync: bool, autocast: bool) -> Iterator[None]:
        with ExitStack() as stack:
            stack.enter_context(self._context.toggled(self))
            stack.enter_context(self._context.no_sync(keep=self if sync else None))
            if autocast:
                stack.enter_context(self._context.autocast())
            yield

    def _run_closure(self, closure: Callable[[], T], closes: bool) -> T:
        object.__setattr__(self, "_closing", closes)
        try:
            with self._region(sync=closes, autocast=True), self._unscaled_writes() as unscaled:
                result = closure()
            if unscaled:
                raise RuntimeError(
                    f"under 16-mixed the closure's backward wrote gradients of {len(unscaled)} of this optimizer's "
                    "parameters without the loss scaler (loss.backward() or torch.autograd.backward): the step would "
                    "unscale gradients that were never scaled; call opt.backward(loss) in the closure instead"
                )
            return result
        finally:
            object.__setattr__(self, "_closing", None)

    @contextmanager
    def _unscaled_writes(self) -> Iterator[set[int]]:
        """Under 16-mixed: the parameters whose gradients autograd accumulated outside any wrapper's backward."""
        context = self._context
        written: set[int] = set()
        if context.scaler is None:
            yield written
            return

        def accumulated(param: torch.Tensor) -> None:
            if context.scaled_backwards == 0:
                written.add(id(param))

        watched = [p for p in self.parameters() if p.requires_grad and p.grad_fn is None]
        handles = [param.register_post_accumulate_grad_hook(accumulated) for param in watched]
        try:
            yield written
        finally:
            for handle in handles:
                handle.remove()

    def _prepare(self, micro_steps: int, *, carry: bool = True) -> None:
        """Window mean, reduction across XLA replicas, unscaling, the carried part added, clipping: once per step.

        The carried part (ZERO-005) is what the last real step applied: it joins the window's own gradients after
        they are averaged, reduced and unscaled, and is clipped with them. A fresh evaluation of the closure by the
        inner optimizer (``carry=False``) is its own backward's alone (CLOS-004, CLOS-005).
        """
        context = self._context
        params = [p for p in self.parameters() if p.grad is not None]
        every = context.accumulate_grad_batches
        if context.scaler is not None:
            # Each backward divided its loss by N already (AMP-007): the sum times N / k is the window's mean.
            if micro_steps != every:
                for param in params:
                    cast(torch.Tensor, param.grad).mul_(every / micro_steps)
        elif micro_steps > 1:
            for param in params:
                cast(torch.Tensor, param.grad).div_(micro_steps)
        if context.on_xla:
            devices.reduce_across_replicas(self._inner)
        if context.scaler is not None and params:
            # The scaler sets its scale up on its first scale() call, which a plain loss.backward() never made.
            context.scaler.scale(torch.zeros((), device=context.device))
            context.scaler.unscale_(self._inner)
        if carry and self._carried:
            every_param = self.parameters()
            for index, carried in self._carried.items():
                param = every_param[index]
                if param.grad is None:
                    param.grad = carried.clone()  # the carried tensor stays as it was, for a failed step to restore
                else:
                    param.grad.add_(carried)
            params = [p for p in every_param if p.grad is not None]
        if context.clip_value is not None and params:
            if context.clip_algorithm == "norm":
                torch.nn.utils.clip_grad_norm_(params, context.clip_value)
            else:
                torch.nn.utils.clip_grad_value_(params, context.clip_value)

    def _real_step(self, kwargs: dict[str, Any], ran: tuple[Callable[[], Any], Any] | None = None) -> None:
        context = self._context
        if not self._window.prepared:
            self._prepare(self._window.micro_steps)
            self._window.prepared = True
        if ran is not None and context.precision != "16-mixed" and takes_closure(self._inner):
            kwargs = {**kwargs, "closure": self._again(*ran)}
        # Without any gradient of its own the window was not unscaled, and the scaler has nothing to check (it
        # refuses to step): the inner optimizer steps, on the carried part if there is one.
        scaler = context.scaler if context.scaler is not None and _unscaled(context.scaler, self._inner) else None
        context.run_hooks("before_optimizer_step", self)
        inner_step: Callable[..., Any] = self._inner.step
        skipped = scaler is not None and sum(v.item() for v in scaler._found_inf_per_device(self._inner).values()) > 0
        if scaler is None:
            inner_step(**kwargs)
        elif not skipped:  # on a skip not even a fused optimizer's step runs: its step hooks must not fire
            scaler.step(self._inner, **kwargs)
        if context.on_xla:
            devices.cut_graph()
        if scaler is not None:
            context.found_inf = context.found_inf or skipped
        if skipped and hasattr(inner_step, "_wrapped_by_lr_sched"):
            # The LR scheduler on the inner optimizer counts calls to its step; a skip is a step taken for it.
            self._inner._opt_called = True  # type: ignore[attr-defined]
        self._finish(StepOutcome.SKIPPED_NON_FINITE if skipped else StepOutcome.STEPPED)
        if scaler is not None:
            context.scaler_stepped = True
            if context.position is None:
                context.end_iteration()

    def _again(self, closure: Callable[[], T], result: T) -> Callable[[], T]:
        """What the inner optimizer gets as its closure: the result it had, then fresh evaluations."""
        evaluations = 0

        def closure_again() -> T:
            nonlocal evaluations
            evaluations += 1
            if evaluations == 1:
                return result  # the closure ran already; its gradients are the window's, prepared
            self._inner.zero_grad(set_to_none=True)
            self._window.prepared = False  # a fresh evaluation: its backward adds to nothing
            try:
                again = self._run_closure(closure, closes=True)
                self._prepare(1, carry=False)
            finally:
                self._window.prepared = True
            return again

        return closure_again

    def _evaluating_step(self, closure: Callable[[], T] | None, kwargs: dict[str, Any]) -> Any:
        results: list[T | None] = []

        def evaluate() -> T | None:
            self._inner.zero_grad(set_to_none=True)  # each evaluation's gradient is its own backward alone
            result = None if closure is None else self._run_closure(closure, closes=True)
            if result is None:  # the optimizer reads the loss; say so rather than let it fail on None (CLOS-002)
                raise TypeError(f"{type(self._inner).__name__}'s closure must return the loss, it returned None")
            self._prepare(1, carry=False)
            results.append(result)
            return result

        inner_step: Callable[..., Any] = self._inner.step
        before = _Before(self._inner, self.parameters())
        try:
            self._context.run_hooks("before_optimizer_step", self)
            inner_step(evaluate, **kwargs)
        except BaseException:
            before.restore()
            raise
        if self._context.on_xla:
            devices.cut_graph()
        self._finish(StepOutcome.STEPPED)
        return results[0] if results else None  # the first evaluation's result, whatever the step returned

    def drop(self, *, forget_unscaling: bool) -> bool:
        """Drop the window (FAIL-003, FAIL-009): every gradient of its parameters ``None``, those that left it while
        it was open included, its length 0, its carried part gone, ``last_outcome`` ``DISCARDED``; the step count
        stays. ``forget_unscaling``: the scaler's record of this optimizer's unscaling goes with it, so that the
        next window unscales anew. Returns whether the window carried gradients of the last real step."""
        for param in [*self.parameters(), *self._known]:
            param.grad = None
        carried = bool(self._carried)
        self._carried, self._left = {}, {}
        self._window.micro_steps, self._window.prepared = 0, False
        scaler = self._context.scaler
        if scaler is not None and forget_unscaling:
            states = scaler._per_optimizer_states
            if id(self._inner) in states and states[id(self._inner)]["stage"] is OptState.UNSCALED:
                del states[id(self._inner)]
        self._outcome = StepOutcome.DISCARDED
        return carried

    def _discard(self, error: BaseException, micro_steps: int, call: str = "step()") -> None:
        """Drop the window a failed call wrote into (FAIL-003), and say so on the exception that propagates."""
        carried = self.drop(forget_unscaling=True)
        index = self._index()
        plural = "" if micro_steps == 1 else "s"
        with_carried = (
            ", with the gradients it carried from the last real step (zero_grad_after_step=False)" if carried else ""
        )
        note = (
            f"{type(self._inner).__name__} (optimizer {index} of the context): the failed {call} discarded this "
            f"optimizer's window of {micro_steps} micro-step{plural}{with_carried} (its gradients are None, its step "
            'count is unchanged); build the context with on_failure="restore" to keep a failed call\'s window as it '
            "was before the call"
        )
        add_note = getattr(error, "add_note", None)  # Python 3.11 and later
        if add_note is not None:
            add_note(note)

    def _finish(self, outcome: StepOutcome) -> None:
        """Close the window: its gradients cleared (ZERO-001), or, when the context leaves a taken step's to the
        user (ZERO-004), left as the step applied them and noted, so that the next window can carry them."""
        taken = outcome is StepOutcome.STEPPED
        leave = taken and not self._context.zero_grad_after_step
        if not leave:
            self._inner.zero_grad(set_to_none=True)
        self._carried, self._left = {}, {}
        if leave and not evaluates_closure(self._inner):  # such an optimizer carries nothing (CLOS-004)
            self._record_left()
        self._window.close(taken=taken)
        self._outcome = outcome

    # -- what a taken real step leaves (zero_grad_after_step=False) -------------------------------------

    def _record_left(self) -> None:
        """Note the gradients as this wrapper's real step left them: each tensor and its version counter."""
        self._left = {
            index: (weakref.ref(param.grad), param.grad._version)
            for index, param in enumerate(self.parameters())
            if param.grad is not None
        }

    def _is_left(self, index: int, grad: torch.Tensor | None) -> bool:
        """Whether ``grad``, the gradient of parameter ``index``, is the tensor the last real step left there."""
        return grad is not None and index in self._left and self._left[index][0]() is grad

    def _left_indices(self) -> list[int]:
        """The parameters that still hold, as their gradient, the tensor the last real step left."""
        params = self.parameters()
        return [index for index in self._left if index < len(params) and self._is_left(index, params[index].grad)]

    def check_left(self) -> None:
        """Refuse to take gradients a real step left that were changed in place since (ZERO-006)."""
        params = self.parameters()
        changed = [
            index
            for index in self._left_indices()
            if cast(torch.Tensor, params[index].grad)._version != self._left[index][1]
        ]
        if changed:
            raise RuntimeError(
                f"the gradients that the last real step of {type(self._inner).__name__} left (zero_grad_after_step="
                f"False) changed in place before this window took them ({len(changed)} of its parameters: a "
                "backward outside step() and opt.backward(), such as loss.backward() before step(), or an in-place "
                "zero_grad(set_to_none=False) of the module or the inner optimizer): they cannot be told from the "
                "carried part. Call opt.zero_grad() before the window's first backward to clear them, or "
                "opt.backward(loss) to keep them; nothing was changed"
            )

    def take_left(self) -> dict[int, torch.Tensor]:
        """Set the gradients the last real step left aside as the window's carried part (ZERO-005).

        Gradients replaced or set to ``None`` since carry nothing; the caller checked that none changed in place.
        Returns what it took, by parameter index.
        """
        params = self.parameters()
        taken = {index: cast(torch.Tensor, params[index].grad) for index in self._left_indices()}
        for index in taken:
            params[index].grad = None
        self._left = {}
        # A view (into a DDP bucket, which the next reduction overwrites) is copied; a tensor of its own is kept.
        self._carried = self._carried | {i: g.clone() if g._base is not None else g for i, g in taken.items()}
        return taken

    # -- the context's checkpoints ----------------------------------------------------------------------

    def rescale_open_window(self, factor: float) -> None:
        """Bring an open window's scaled gradients to a new loss scale; unscaled carried gradients stay (AMP-006)."""
        if not self._window.prepared:  # micro-steps, or a backward not stepped yet: gradients at the old scale
            for index, param in enumerate(self.parameters()):
                if param.grad is not None and not self._is_left(index, param.grad):
                    param.grad.mul_(factor)

    def window_state(self) -> dict[str, Any]:
        """This wrapper's window, gradients, carried part and counts, as plain data.

        Gradients that the last real step left and no window took are the user's, not the window's (ZERO-007): the
        state holds only which parameters have them (``left``), whose gradients a load leaves as the resumed run has
        them.
        """
        params = self.parameters()
        left = set(self._left_indices())
        grads = [None if p.grad is None or i in left else p.grad.detach().clone() for i, p in enumerate(params)]
        carried = [None if i not in self._carried else self._carried[i].detach().clone() for i in range(len(params))]
        return self._window.state() | {
            "grads": grads,
            "carried": carried,
            "left": [i in left for i in range(len(params))],
            "shapes": [tuple(p.shape) for p in params],
        }

    def window_state_problem(self, state: object) -> str | None:
        """Why ``state`` cannot be loaded into this wrapper, or ``None``."""
        if not isinstance(state, dict):
            return "not a dict"
        problem = Window.state_problem(state)
        if problem is not None:
            return problem
        params, grads = self.parameters(), state.get("grads")
        if not isinstance(grads, list) or len(grads) != len(params):
            return f"{len(grads) if isinstance(grads, list) else 'no'} gradients for {len(params)} parameters"
        if state.get("shapes") != [tuple(p.shape) for p in params]:
            return f"it was saved for parameters of shapes {state.get('shapes')}"
        carried, left = state.get("carried"), state.get("left")
        if not isinstance(carried, list) or len(carried) != len(params):
            return "its carried gradients are not a list of one entry per parameter"
        if not isinstance(left, list) or len(left) != len(params) or not all(isinstance(f, bool) for f in left):
            return "its 'left' is not a list of one bool per parameter"
        for index, (param, grad, carry) in enumerate(zip(params, grads, carried, strict=True)):
            if grad is not None and (not isinstance(grad, torch.Tensor) or grad.shape != param.shape):
                return f"the gradient of parameter {index} does not have its shape {tuple(param.shape)}"
            if carry is not None and (not isinstance(carry, torch.Tensor) or carry.shape != param.shape):
                return f"the carried gradient of parameter {index} does not have its shape {tuple(param.shape)}"
        return None

    def load_window_state(self, state: dict[str, Any]) -> None:
        """Restore what ``window_state`` saved (checked by ``window_state_problem``).

        Where the state says the last real step left a gradient that no window took, the parameter keeps the
        gradient it has here: the user's (ZERO-007), which this context finds as its window's own, since no step of
        its own left it (ZERO-005).
        """
        params = self.parameters()
        for param, grad, left in zip(params, state["grads"], state["left"], strict=True):
            if not left:
                param.grad = None if grad is None else grad.detach().clone().to(param.device)
        self._carried = {
            index: carry.detach().clone().to(params[index].device)
            for index, carry in enumerate(state["carried"])
            if carry is not None
        }
        self._left = {}
        self._known = params  # the state was taken for these parameters (CKPT-003)
        self._window.load(state)


class _WindowBefore:
    """A window as it was before a ``step()`` call: its length, whether it was prepared, and its gradients.

    The gradients are copied only when asked (``on_failure="restore"``); otherwise only which tensor each parameter
    held and its version counter are noted (no reference that would keep it alive), enough to tell whether
    anything wrote into the window since: a gradient replaced, set, or changed in place.
    """

    def __init__(
        self,
        wrapper: Wrapper[Any],
        *,
        copy_gradients: bool,
        left: dict[int, tuple[weakref.ref[torch.Tensor], int]],
        carried: dict[int, torch.Tensor],
        taken: dict[int, torch.Tensor],
    ) -> None:
        self.wrapper = wrapper
        # What the window carried or could take before the call, and what the call took (ZERO-007).
        self.left, self.carried, self.taken = left, carried, taken
        self.params = wrapper.parameters()
        self.marks = [None if p.grad is None else (weakref.ref(p.grad), p.grad._version) for p in self.params]
        self.grads = (
            [None if p.grad is None else p.grad.detach().clone() for p in self.params] if copy_gradients else None
        )
        self.micro_steps, self.prepared = wrapper._window.micro_steps, wrapper._window.prepared

    def written(self) -> bool:
        """Whether a gradient of the window is not the tensor it was before the call, or was changed in place."""
        for param, mark in zip(self.params, self.marks, strict=True):
            if mark is None:
                if param.grad is not None:
                    return True
                continue
            held, version = mark
            grad = param.grad
            if grad is None or grad is not held() or grad._version != version:
                return True
        return False

    def restore(self, *, gradients: bool = True, scaler: bool = True) -> None:
        """Put the window back: its length and preparation, its gradients when they were copied (and ``gradients``),
        what the call took of the last step's gradients, and, with ``scaler``, the scaler's record."""
        wrapper = self.wrapper
        if self.grads is not None and gradients:
            for param, grad in zip(self.params, self.grads, strict=True):
                param.grad = grad
        for index, grad in self.taken.items():
            self.params[index].grad = grad  # untaken again: the tensor and version that the last step left
        wrapper._left, wrapper._carried = self.left, self.carried
        wrapper._window.micro_steps, wrapper._window.prepared = self.micro_steps, self.prepared
        grad_scaler = wrapper._context.scaler
        if grad_scaler is not None and scaler and not self.prepared:
            # This call unscaled the window (the scaler records that once per iteration): the retry unscales again.
            states = grad_scaler._per_optimizer_states
            if id(wrapper._inner) in states and states[id(wrapper._inner)]["stage"] is OptState.UNSCALED:
                del states[id(wrapper._inner)]


class _InnerBefore:
    """The inner optimizer's ``param_groups`` and ``state`` before a call that may change them halfway: the same
    objects with the same entries are put back when the call raises (FAIL-008)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.groups = optimizer.param_groups
        self.group_list = list(self.groups)
        self.group_entries = [dict(group) for group in self.group_list]
        self.params = [
            (group["params"], list(group["params"])) if isinstance(group.get("params"), list) else None
            for group in self.group_list
        ]
        self.state = optimizer.state
        self.state_entries = dict(self.state)
        self.per_param = {key: dict(value) for key, value in self.state_entries.items() if isinstance(value, dict)}

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: Any) -> None:
        if error is None:
            return
        optimizer = self.optimizer
        optimizer.param_groups = self.groups  # a load may have replaced the objects themselves
        optimizer.state = self.state
        self.groups[:] = self.group_list
        for group, entries, params in zip(self.group_list, self.group_entries, self.params, strict=True):
            group.clear()
            group.update(entries)
            if params is not None:
                params[0][:] = params[1]
        self.state.clear()
        self.state.update(self.state_entries)
        for key, entries in self.per_param.items():
            value = self.state_entries[key]
            value.clear()
            value.update(entries)


def _discard_after_backward(error: BaseException, written: list[_WindowBefore]) -> None:
    """Under "discard": drop every window a failed ``backward()`` outside ``step()`` wrote into (FAIL-008), and name
    them in a note on the exception that propagates."""
    named = []
    for before in written:
        wrapper = before.wrapper
        carried = wrapper.drop(forget_unscaling=False)
        with_carried = ", with the gradients it carried from the last real step" if carried else ""
        plural = "" if before.micro_steps == 1 else "s"
        named.append(
            f"{type(wrapper._inner).__name__} (optimizer {wrapper._index()} of the context: {before.micro_steps} "
            f"micro-step{plural} and the failed backward's gradients{with_carried})"
        )
    note = (
        f"the failed backward() discarded the window{'' if len(named) == 1 else 's'} it wrote into: "
        f"{'; '.join(named)} (gradients None, step counts unchanged); build the context with "
        'on_failure="restore" to keep a failed call\'s windows as they were before the call'
    )
    add_note = getattr(error, "add_note", None)  # Python 3.11 and later
    if add_note is not None:
        add_note(note)


class _Before:
    """An optimizer's parameters, gradients and state before a step that may fail, to put back."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
        self.optimizer, self.params = optimizer, params
        self.values = [param.detach().clone() for param in params]
        self.grads = [None if param.grad is None else param.grad.detach().clone() for param in params]
        self.state = copy.deepcopy(optimizer.state_dict())

    def restore(self) -> None:
        with torch.no_grad():
            for param, value, grad in zip(self.params, self.values, self.grads, strict=True):
                param.copy_(value)
                param.grad = grad
        self.optimizer.state.clear()
        self.optimizer.load_state_dict(self.state)


def _unscaled(scaler: GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Whether the scaler unscaled the optimizer's gradients in this iteration (it then checked them)."""
    states = scaler._per_optimizer_states
    return id(optimizer) in states and states[id(optimizer)]["stage"] is OptState.UNSCALED


def _check_step_kwargs(optimizer: torch.optim.Optimizer, kwargs: dict[str, Any]) -> None:
    """Refuse keyword arguments that the inner optimizer's ``step`` does not take."""
    try:
        signature = inspect.signature(optimizer.step)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        raise TypeError(f"{type(optimizer).__name__}.step does not take {sorted(kwargs)}: {error}") from None


def _class_for(optimizer_class: type[torch.optim.Optimizer]) -> type[Wrapper[Any]]:
    if optimizer_class not in _CLASSES:
        name = f"Wrapped{optimizer_class.__name__}"
        _CLASSES[optimizer_class] = type(name, (Wrapper, optimizer_class), {"__module__": __name__})
    return _CLASSES[optimizer_class]


def _rebuild(optimizer: torch.optim.Optimizer) -> Wrapper[Any]:
    """A wrapper shell around ``optimizer``, for pickle and deepcopy, whose state comes next."""
    wrapper = object.__new__(_class_for(type(optimizer)))
    object.__setattr__(wrapper, "_inner", optimizer)
    return wrapper


def _layout_problem(optimizer: torch.optim.Optimizer, state_dict: object) -> str | None:
    """Why ``state_dict`` is not for ``optimizer``'s parameter layout, or ``None``."""
    if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= state_dict.keys():
        return "it is not a dict with 'state' and 'param_groups'"
    groups = state_dict["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        return f"it has {len(groups)} parameter groups, the optimizer {len(optimizer.param_groups)}"
    for index, (saved, group) in enumerate(zip(groups, optimizer.param_groups, strict=True)):
        if not isinstance(saved, dict) or len(saved.get("params", ())) != len(group["params"]):
            return f"parameter group {index} has another number of parameters"
    if not isinstance(state_dict["state"], dict):
        return "its 'state' is not a dict"
    return None
