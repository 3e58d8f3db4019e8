"""The reference training context: the composition of its collaborators, and the step as named transitions."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal, TypeVar

import torch
from torch.amp.grad_scaler import GradScaler
from torch.utils.hooks import RemovableHandle

from lightning_optimizer.reference.accumulation import Accumulation, check_accumulate_grad_batches
from lightning_optimizer.reference.amp import loss_scaling
from lightning_optimizer.reference.call import Call, CallStage
from lightning_optimizer.reference.clipping import ClipAlgorithm, check_clipping
from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.reference.devices import resolve_device
from lightning_optimizer.reference.failure import (
    NOTHING_TO_UNDO,
    OptimizerSnapshot,
    Transaction,
    discard_note,
    failure_policy,
)
from lightning_optimizer.reference.hooks import Hooks
from lightning_optimizer.reference.outside import OutsideChanges
from lightning_optimizer.reference.parallel import data_parallel
from lightning_optimizer.reference.precision import NO_AUTOCAST, outside_autocast, resolve_precision
from lightning_optimizer.reference.preparation import preparation
from lightning_optimizer.reference.refusals import Refusals, check_optimizer_state, record_wrap
from lightning_optimizer.reference.stages import Parts
from lightning_optimizer.reference.state import StateFormat, copy_state, restore_copy
from lightning_optimizer.reference.toggling import Toggling
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.reference.windows import Batch, Windows
from lightning_optimizer.reference.wrapper import WrappedOptimizer, wrapper_class
from lightning_optimizer.reference.zeroing import Taking, zeroing
from lightning_optimizer.spec.context import BackwardHook, OptimizerStepHook, StepHook
from lightning_optimizer.spec.types import DeviceKind, FailurePolicy, Precision
from lightning_optimizer.spec.wrapper import OptimizerWrapper

__all__ = ["TrainingContext"]

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)
T = TypeVar("T")

_NOTHING = nullcontext()


class TrainingContext:
    """The reference :class:`~lightning_optimizer.spec.TrainingContext`.

    Typical use in a plain loop::

        ctx = TrainingContext(precision="16-mixed", device="cpu", accumulate_grad_batches=2)
        model = ctx.prepare_module(model)
        opt = ctx.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
        for batch_idx, (x, y) in enumerate(loader):
            with ctx.batch(batch_idx, is_last=batch_idx == len(loader) - 1):
                def closure() -> torch.Tensor:
                    with ctx.autocast():
                        loss = loss_fn(model(x), y)
                    opt.backward(loss)
                    return loss
                opt.step(closure)

    Each ``step()`` is one :class:`~.call.Call` through its stages, in a transaction of the failure policy
    (:mod:`.failure`). Leaving ``batch()`` ends the iteration: the loss scaler updates once there; outside any
    ``batch()`` it updates after each real step. The collaborators are in :attr:`parts`; ``run_closure``,
    ``inner_step``, ``backward`` and ``new_wrapper`` are the stages a variant may replace (:mod:`.stages`).
    """

    def __init__(
        self,
        precision: Precision = "32-true",
        device: DeviceKind = "cpu",
        accumulate_grad_batches: int = 1,
        *,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: ClipAlgorithm = "norm",
        scaler: GradScaler | None = None,
        strategy: Literal["ddp", "fsdp"] = "ddp",
        on_failure: FailurePolicy = "discard",
        zero_grad_after_step: bool = True,
    ) -> None:
        plugin = resolve_precision(precision)
        clip_val, clip_algorithm = check_clipping(gradient_clip_val, gradient_clip_algorithm)
        resolved = resolve_device(device)
        self.parts = Parts(
            precision=plugin,
            scaling=loss_scaling(plugin, scaler, resolved.torch_device),
            device=resolved,
            accumulation=Accumulation(accumulate_grad_batches),
            preparation=preparation(clip_val, clip_algorithm),
            parallel=data_parallel(strategy),
            failure=failure_policy(on_failure),
            zeroing=zeroing(zero_grad_after_step),
            toggling=Toggling(),
            closures=Closures(),
            hooks=Hooks(),
            refusals=Refusals(),
            state=StateFormat(),
            outside=OutsideChanges(),
        )
        self.windows = Windows()
        """Every optimizer's window, the ``step()`` running now and the loop position (:mod:`.windows`)."""

    # -- configuration ---------------------------------------------------------------------------------

    @property
    def precision(self) -> Precision:
        """The precision this context applies."""
        return self.parts.precision.name

    @property
    def device(self) -> torch.device:
        """The device the model and optimizer state live on."""
        return self.parts.device.torch_device

    @property
    def on_failure(self) -> FailurePolicy:
        """What a failed ``step()`` leaves of its window [FAIL-001]."""
        return self.parts.failure.name

    @property
    def zero_grad_after_step(self) -> bool:
        """Whether a real step clears its gradients (``False``: the user's ``zero_grad()`` does) [ZERO-003]."""
        return self.parts.zeroing.clears_after_step

    @property
    def accumulate_grad_batches(self) -> int:
        """Micro-steps per window when ``make_optimizer_step`` is ``None``.

        Settable between windows (no window open, none prepared, no ``step()`` running), as a schedule that
        changes it per epoch needs (Lightning's ``GradientAccumulationScheduler``).
        """
        return self.parts.accumulation.accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        value = check_accumulate_grad_batches(value)
        if value != self.parts.accumulation.accumulate_grad_batches:
            self.parts.refusals.check_accumulation_change(self, value)
            self.parts.accumulation.accumulate_grad_batches = value

    @property
    def scaler(self) -> GradScaler | None:
        """The ``torch.amp.GradScaler`` under 16-mixed, ``None`` otherwise."""
        return self.parts.scaling.scaler

    def holds_open_window(self) -> bool:
        """Whether any window holds accumulated micro-steps that its real step has not applied yet."""
        return self.windows.holds_open_window()

    def prepare_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast ``module`` as the precision does and move it to the device (in place); wrap it for DDP or shard it.

        The cast comes first, as in Lightning: a module the precision refuses (PREC-002) is left as it was.
        """
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"prepare_module expects a torch.nn.Module, got {type(module).__name__}")
        module = self.parts.precision.convert_module(module).to(self.device)
        module, self.parts.parallel = self.parts.parallel.prepare(module, self.device)
        return module

    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        """Wrap an optimizer built on the prepared module's parameters."""
        self.parts.refusals.check_wrap(self, optimizer)
        index = self.windows.add(optimizer)
        record_wrap(optimizer, self)
        return self.new_wrapper(index)

    # -- the loop --------------------------------------------------------------------------------------

    def autocast(self) -> AbstractContextManager[None]:
        """The autocast region for forward passes in this context's precision (weight cache off, PREC-004)."""
        return self.parts.precision.autocast(self.parts.device.torch_device)

    def batch(self, batch_idx: int, *, is_last: bool = False) -> AbstractContextManager[None]:
        """Mark one training iteration: batch ``batch_idx`` of the epoch, the last one when ``is_last``."""
        return Batch(self.windows, batch_idx, is_last, self.end_iteration)

    def end_iteration(self) -> None:
        """The end of a training iteration: the loss scaler's update [AMP-003, AMP-006].

        Leaving a ``batch()`` block calls it; outside any block a real step does.
        """
        self.parts.scaling.end_iteration(self.windows.all, self.parts.parallel)

    # -- the step: one call through its stages ------------------------------------------------------------

    def step_window(
        self,
        index: int,
        closure: Callable[[], T] | None,
        make_optimizer_step: bool | None,
        kwargs: dict[str, Any],
        wrapper: WrappedOptimizer[Any],
    ) -> T | None:
        """``wrapper.step(closure, make_optimizer_step, **kwargs)`` of optimizer ``index``: one call through its stages.

        Refused before anything changes, or run in a transaction of the failure policy [FAIL-001].
        """
        parts, windows = self.parts, self.windows
        window = windows.all[index]
        parts.refusals.check_step(self, window, closure, make_optimizer_step, kwargs)
        real = parts.accumulation.closes(make_optimizer_step, window.length, windows.position)
        parts.refusals.check_transition(window, real, closure)
        parts.outside.check_call(self, window)  # parameters or gradients changed from outside [WIN-001, WIN-002]
        taking = None if window.left is None else parts.zeroing.take(window)  # the window's first micro-step [ZERO-005]
        call = windows.begin_call(window, real=real)
        call.taking = taking
        try:
            call.transaction = self._begin(call, closure)
        except BaseException:  # nothing ran yet (a copy for the transaction failed): the window as it was
            windows.end_call()
            if taking is not None:
                parts.zeroing.untake(window, taking)
            window.move(call.stage_before)
            raise
        try:
            result = self._run(call, index, closure, kwargs, wrapper)
        except BaseException as error:
            self._fail(call, error)
            raise
        finally:
            windows.end_call()
        call.transaction.commit()
        self._finish(call)
        if parts.hooks.after_step:
            parts.hooks.run_after_step(wrapper, window.last_outcome)  # type: ignore[arg-type]
        return result

    def _begin(self, call: Call, closure: object) -> Transaction:
        if closure is None and not call.real:
            return NOTHING_TO_UNDO  # no closure runs and the window does not close: the call writes nothing
        window, parallel = call.window, self.parts.parallel
        # A closing backward that reduces the window itself (DDP) must see it: it cannot be set aside.
        stash = closure is not None and not (call.real and window.length and parallel.syncs_in_backward)
        tensors = parallel.window_tensors(window)
        return self.parts.failure.begin(call, tensors, stash=stash, in_place=self.parts.device.accumulates_in_place)

    def _run(
        self,
        call: Call,
        index: int,
        closure: Callable[[], T] | None,
        kwargs: dict[str, Any],
        wrapper: WrappedOptimizer[Any],
    ) -> T | None:
        window, parts = call.window, self.parts
        if window.evaluates_closure and call.real:
            assert closure is not None
            call.advance(CallStage.STEPPING)
            if parts.hooks.before_optimizer_step:
                parts.hooks.run_before_optimizer_step(wrapper)  # [HOOK-002]
            results: list[T] = []

            def evaluate() -> T:
                results.append(parts.closures.evaluate(self, call, index, closure))
                return results[-1]

            self.inner_step(window, kwargs, evaluate)
            return results[0] if results else None  # the first evaluation's, whatever the step returns [STEP-006]
        if closure is not None:
            call.transaction.before_in_place(call)  # a backward into an unstashed window changes it in place
        result = None if closure is None else self.run_closure(call, index, closure)
        call.transaction.after_closure(call)
        if not call.real:
            return result
        parts.parallel.check_synced(window)
        self._prepare(call)
        if closure is not None and window.takes_closure and not parts.scaling.changes_gradients:
            kwargs = {**kwargs, "closure": parts.closures.replay(self, call, index, closure, result)}
        call.advance(CallStage.STEPPING)
        if parts.hooks.before_optimizer_step:
            parts.hooks.run_before_optimizer_step(wrapper)  # the window prepared [HOOK-002]
        call.skipped = not self.inner_step(window, kwargs)
        return result

    def _prepare(self, call: Call) -> None:
        """Prepare the window for its real step, once (not again after ``unscale_gradients()``) [CLIP-002]."""
        if call.prepared:
            return
        if self.parts.preparation.changes(self, call.window):
            call.transaction.before_in_place(call)
        self.parts.preparation.prepare(self, call.window)
        call.advance(CallStage.PREPARED)

    def _fail(self, call: Call, error: BaseException) -> None:
        """A call that raised: the failure policy keeps or discards its window [FAIL-002 to FAIL-005]."""
        window, scaling = call.window, self.parts.scaling
        prepared, prepared_here = call.prepared, call.prepared_here
        discarded = call.transaction.fail(call)
        call.advance(CallStage.FAILED)
        if discarded:
            if prepared:
                scaling.forget(window.optimizer)  # the window it unscaled is gone: the next one unscales anew
            error.add_note(discard_note(window, carried=bool(window.carried)))
            self.parts.zeroing.drop(window)  # the carried part goes with the window [ZERO-007]
            self.parts.accumulation.discarded(window)
            return
        if prepared_here:
            scaling.forget(window.optimizer)  # this call's unscaling is undone with the window
        if call.taking is not None:
            self.parts.zeroing.untake(window, call.taking)  # the carried part as before the call [ZERO-007]
        window.move(call.stage_before)

    def _finish(self, call: Call) -> None:
        """Outcome, counts, zeroing, and the loss scaler's update outside a ``batch()``."""
        call.advance(CallStage.DONE)
        if not call.real:
            self.parts.accumulation.accumulated(call.window)
            self.parts.outside.accumulated(call.window)
            return
        self.parts.accumulation.closed(call.window, skipped=call.skipped)
        self.parts.zeroing.after_step(call.window, skipped=call.skipped)  # cleared, or left to the user [ZERO-001]
        if self.windows.position is None:
            self.end_iteration()

    # -- the stages a variant may replace ---------------------------------------------------------------

    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        """Run the user's closure for ``call`` [TOGGLE-001, DDP-001, FSDP-002, CLOS-001, AMP-008].

        Toggled; without gradient sync unless the call closes the window; inside the autocast region; under 16-mixed
        a backward that missed the loss scaling is refused when the closure returns.
        """
        parts, scaling = self.parts, self.parts.scaling
        region = parts.toggling.region(self, index, sync_grad=call.real)
        watch = scaling.watch(parts.parallel.window_tensors(call.window)) if scaling.changes_gradients else _NOTHING
        autocast = self.autocast()
        if type(region) is type(watch) is type(autocast) is nullcontext:
            return closure()  # one optimizer, no autocast, no loss scaling: nothing to enter
        with region, watch, autocast:
            return closure()

    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        """The inner optimizer's step through the loss scaler, then the device's end of a step [AMP-004, XLA-001].

        Without ``closure``: ``False`` when the loss scaler skipped the step for non-finite gradients. With one (an
        optimizer that evaluates it): the optimizer's own return.
        """
        if closure is None:
            taken = self.parts.scaling.step(window.optimizer, window.optimizer.step, kwargs)
            self.parts.device.after_step()
            return taken
        step: Callable[..., Any] = window.optimizer.step
        result = step(closure, **kwargs)
        self.parts.device.after_step()
        return result

    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        """The wrapper object of optimizer ``index`` (a subclass of the reference wrapper and the inner's class)."""
        return wrapper_class(type(self.windows.all[index].optimizer))(self, index)

    # -- what the wrappers call besides step ------------------------------------------------------------

    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``wrapper.backward(loss, ...)`` [BWD-001, BWD-002, HOOK-001, AMP-007].

        Outside autocast, between the backward hooks, the loss scaled as the precision says, the arguments
        forwarded to autograd.
        """
        region = outside_autocast(self.parts.device.torch_device)
        if region is NO_AUTOCAST:  # the direct form's backward: no region to leave
            self._backward(wrapper, loss, args, kwargs)
            return
        with region:
            self._backward(wrapper, loss, args, kwargs)

    def _backward(
        self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        parts = self.parts
        parts.refusals.check_backward(self, loss)
        if self.windows.call is None:  # the direct form: the backward is a call of its own [FAIL-008]
            self._backward_between_calls(wrapper, loss, args, kwargs)
            return
        for window in self.windows.all:
            if window.left is not None:
                self._take_carried()
                break
        self._autograd(wrapper, loss, args, kwargs)

    def _backward_between_calls(
        self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """A wrapper's backward outside ``step()``, in a transaction of the policy over every window [FAIL-008].

        Autograd may write into any window the loss reaches: a failure discards those it wrote into, or puts every
        window back exactly.
        """
        parts, windows = self.parts, self.windows.all
        parts.outside.check_backward(self)  # windows cleared from outside [WIN-002]
        takings: list[tuple[Window, Taking]] = []
        for window in windows:
            if window.left is not None:
                takings = self._take_carried()
                break
        try:
            transaction = parts.failure.begin_backward([parts.parallel.window_tensors(window) for window in windows])
        except BaseException:  # nothing ran yet (a copy for the transaction failed): the windows as they were
            self._untake(takings)
            raise
        try:
            self._autograd(wrapper, loss, args, kwargs)
        except BaseException as error:
            discarded = transaction.fail()
            for index in discarded:
                window = windows[index]
                error.add_note(discard_note(window, carried=bool(window.carried)))
                parts.zeroing.drop(window)  # the carried part goes with the window [ZERO-007]
                parts.accumulation.discarded(window)
            gone = {id(windows[index]) for index in discarded}
            self._untake([(window, taking) for window, taking in takings if id(window) not in gone])
            raise
        transaction.commit()

    def _untake(self, takings: list[tuple[Window, Taking]]) -> None:
        for window, taking in takings:
            self.parts.zeroing.untake(window, taking)  # the carried part as before the call [ZERO-007]

    def _autograd(
        self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """Autograd on the scaled loss, between the backward hooks [HOOK-001, AMP-007]."""
        parts = self.parts
        hooks, scaling = parts.hooks, parts.scaling
        if hooks.before_backward:
            hooks.run_backward(hooks.before_backward, wrapper, loss)
        backward: Callable[..., None] = scaling.scale(loss, parts.accumulation.accumulate_grad_batches).backward
        if scaling.changes_gradients:
            with scaling.backward():
                backward(*args, **kwargs)
        else:  # no loss scaler: nothing to enter around autograd
            backward(*args, **kwargs)
        if hooks.after_backward:
            hooks.run_backward(hooks.after_backward, wrapper, loss)

    def _take_carried(self) -> list[tuple[Window, Taking]]:
        """A wrapper's backward: the windows that carry what their last step left take it now [ZERO-005, ZERO-006].

        Those that hold a parameter requiring grad (not toggled off), which the backward may reach; each is checked
        before any takes. Called only when a window carries (never with ``zero_grad_after_step=True``). Returns what
        each held before, for a failed backward to put back.
        """
        carrying = [
            window
            for window in self.windows.all
            if window.left is not None and any(param.requires_grad for param in window.left)
        ]
        zeroing = self.parts.zeroing
        for window in carrying:
            zeroing.check_take(window)
        takings = []
        for window in carrying:
            taking = zeroing.take(window)
            if taking is not None:
                takings.append((window, taking))
        return takings

    def unscale_window(self, index: int) -> None:
        """``wrapper.unscale_gradients()``: prepare the window of optimizer ``index`` now [CLIP-002]."""
        windows = self.windows
        window, call = windows.all[index], windows.call
        self.parts.refusals.check_unscale(window)
        if call is None:  # between calls; a step's own call checked its window when it began
            self.parts.outside.check_call(self, window)  # [WIN-001, WIN-002]
        if windows.prepared(window):
            return
        # The window's preparation begins: it carries what was left [ZERO-005].
        taking = None if window.left is None else self.parts.zeroing.take(window)
        if call is not None and call.window is window and call.stage is CallStage.REEVALUATING:
            return  # the inner optimizer's own evaluation: the context prepares it [CLOS-005]
        if call is not None and call.window is window:  # in the closure of the closing step
            call.transaction.after_closure(call)
            self._prepare(call)
            return
        self._prepare_between_calls(window, taking)

    def _prepare_between_calls(self, window: Window, taking: Taking | None) -> None:
        """``unscale_gradients()`` outside a ``step()``: the preparation in a transaction of the policy [FAIL-007]."""
        parts = self.parts
        try:
            changes = parts.preparation.changes(self, window)
            transaction = parts.failure.begin_preparation(parts.parallel.window_tensors(window), changes=changes)
        except BaseException:  # nothing was prepared (a copy for the transaction failed): the window as it was
            if taking is not None:
                parts.zeroing.untake(window, taking)
            raise
        try:
            parts.preparation.prepare(self, window)
        except BaseException as error:
            parts.scaling.forget(window.optimizer)  # what the unscaling recorded goes with the preparation
            if transaction.fail():
                error.add_note(discard_note(window, carried=bool(window.carried)))
                parts.zeroing.drop(window)  # the carried part goes with the window [ZERO-007]
                parts.accumulation.discarded(window)
            elif taking is not None:
                parts.zeroing.untake(window, taking)  # the carried part as before the call [ZERO-007]
            raise
        transaction.commit()
        window.move(WindowStage.PREPARED)

    def zero_grad_window(self, index: int, set_to_none: bool) -> None:
        """``wrapper.zero_grad()``: clear optimizer ``index``'s gradients unless its window is open [ZERO-002]."""
        window, call = self.windows.all[index], self.windows.call
        self.parts.refusals.check_zero_grad(self, window)
        if not self.parts.accumulation.zero_grad_clears(window):
            return
        if call is not None and call.window is window:
            call.transaction.cleared(set_to_none)
        self.parts.zeroing.clear(window, set_to_none)  # what the window carries goes too [ZERO-005]
        window.optimizer.zero_grad(set_to_none=set_to_none)
        self.parts.parallel.clear_unsynced(window)

    def toggle_window(self, index: int, sync_grad: object) -> AbstractContextManager[None]:
        """``wrapper.toggle_model()``: optimizer ``index``'s region [TOGGLE-003, ERR-009]."""
        self.parts.refusals.check_flag("sync_grad", sync_grad)
        return self.parts.toggling.region(self, index, sync_grad=bool(sync_grad))

    def add_param_group_to_window(self, index: int, param_group: dict[str, Any]) -> None:
        """``wrapper.add_param_group()``: a group for optimizer ``index``, its parameters checked first [ERR-007]."""
        window = self.windows.all[index]
        candidates = self.parts.refusals.check_param_group(self, window, param_group)
        if not isinstance(param_group["params"], list | tuple | torch.Tensor | set | frozenset):
            param_group["params"] = candidates  # a one-shot iterable: what torch would have made of it
        snapshot = OptimizerSnapshot(window.optimizer)
        try:
            window.optimizer.add_param_group(param_group)
        except BaseException:
            snapshot.restore()  # the groups as before the call [FAIL-008]
            raise
        self.parts.outside.joined(window)

    def load_optimizer_state(self, index: int, state_dict: dict[str, Any]) -> None:
        """``wrapper.load_state_dict()``: the inner optimizer's state, all of it or none of it [ERR-005, FAIL-008]."""
        optimizer = self.windows.all[index].optimizer
        check_optimizer_state(optimizer, state_dict)
        snapshot = OptimizerSnapshot(optimizer)
        try:
            optimizer.load_state_dict(state_dict)
        except BaseException:
            snapshot.restore()  # the state and groups as before the call [FAIL-008]
            raise

    def discard(self, wrapper: OptimizerWrapper[Any]) -> None:
        """Drop ``wrapper``'s window, whatever the policy, as a discarding failure does [FAIL-009].

        Its gradients go (those of parameters that left the optimizer mid-window too), with its carried part and,
        for a prepared window, the loss scaler's record of its unscaling; its length is 0, its outcome ``DISCARDED``.
        """
        window = self.parts.refusals.check_discard(self, wrapper)
        parts = self.parts
        for tensor in (*parts.parallel.window_tensors(window), *window.known):
            tensor.grad = None
        if self.windows.prepared(window):  # its unscaling goes with it; a real step's record stays for the update
            parts.scaling.forget(window.optimizer)
        parts.zeroing.drop(window)
        parts.accumulation.discarded(window)
        window.holding = []

    # -- hooks, checkpoints, copies -----------------------------------------------------------------------

    def register_hooks(
        self,
        *,
        before_backward: BackwardHook | None = None,
        after_backward: BackwardHook | None = None,
        before_optimizer_step: OptimizerStepHook | None = None,
        after_step: StepHook | None = None,
    ) -> RemovableHandle:
        """Call these around every wrapper's ``backward`` and ``step`` [HOOK-001 to HOOK-004].

        ``remove()`` on the handle stops them. A copy of the context (pickle, deepcopy) carries none.
        """
        return self.parts.hooks.register(
            before_backward=before_backward,
            after_backward=after_backward,
            before_optimizer_step=before_optimizer_step,
            after_step=after_step,
        )

    def state_dict(self) -> dict[str, Any]:
        """Window positions, step counts, open windows' gradients, the loss scaler (its pending update), the policy."""
        self.parts.refusals.check_between_calls(self, "state_dict()")
        return self.parts.state.save(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved; validate all of it before changing anything."""
        self.parts.refusals.check_between_calls(self, "load_state_dict()")
        self.parts.state.load(self, state_dict)

    def __getstate__(self) -> dict[str, Any]:
        self.parts.refusals.check_between_calls(self, "a copy")
        return copy_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        restore_copy(self, state)
