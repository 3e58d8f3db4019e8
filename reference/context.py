"""The reference training context: one place that decides what each wrapper's ``step`` does."""

from __future__ import annotations

import copy
import inspect
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType
from typing import Any, Literal, TypeVar

import torch
from torch.amp.grad_scaler import GradScaler
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.accumulation import (
    LoopPosition,
    check_accumulate_grad_batches,
    closes_window,
    normalise_window,
)
from lightning_optimizer.reference.amp import LossScaling, loss_scaling
from lightning_optimizer.reference.clipping import ClipAlgorithm, check_clipping, clip_gradients
from lightning_optimizer.reference.devices import Device, resolve_device
from lightning_optimizer.reference.distributed import (
    distributed_world_size,
    no_sync,
    prepare_for_ranks,
    syncs_in_backward,
)
from lightning_optimizer.reference.fsdp import fsdp_modules, gather_for_load, unsharded_by_param, unsynced_gradients
from lightning_optimizer.reference.hooks import Hooks
from lightning_optimizer.reference.precision import PrecisionPlugin, outside_autocast, resolve_precision
from lightning_optimizer.reference.toggling import only_these_require_grad
from lightning_optimizer.reference.window import StepCall, Window, WindowStage
from lightning_optimizer.reference.wrapper import WrappedOptimizer, wrapper_class
from lightning_optimizer.spec.context import BackwardHook, OptimizerStepHook, StepHook
from lightning_optimizer.spec.types import DeviceKind, Precision, StepOutcome

__all__ = ["TrainingContext"]

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)
T = TypeVar("T")

_STATE_FORMAT = 5
_NOTHING_TO_TOGGLE = nullcontext()
"""The toggle of the only optimizer (no other parameters to switch off); ``nullcontext`` is reusable."""

_WRAPPED_BY: weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.ref[TrainingContext]] = (
    weakref.WeakKeyDictionary()
)
"""Which context wraps each optimizer: a second context may not (their windows and scalers would conflict)."""


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

    Each ``step()`` runs as one transaction over its window (:mod:`.window`: the stages, and how a failed call
    puts the window back without copying it), through the stages that :class:`.stages.StepStages` declares.
    Leaving ``batch()`` ends the iteration: the loss scaler updates once there; outside any ``batch()`` it updates
    after each real step.

    With several ranks, ``prepare_module`` wraps the module in DDP (``strategy="ddp"``) or shards it with FSDP2's
    ``fully_shard`` (``strategy="fsdp"``, :func:`.fsdp.shard_module` gives the policy); micro-steps that do not
    close a window run without gradient sync either way.
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
    ) -> None:
        if strategy not in ("ddp", "fsdp"):
            raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {strategy!r}")
        if strategy == "fsdp" and not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise ValueError(
                "strategy='fsdp' shards the model over a process group: call torch.distributed.init_process_group "
                "before building the context"
            )
        self._shards = strategy == "fsdp"
        self._plugin: PrecisionPlugin = resolve_precision(precision)
        self._accumulate_grad_batches = check_accumulate_grad_batches(accumulate_grad_batches)
        self._clip_val, self._clip_algorithm = check_clipping(gradient_clip_val, gradient_clip_algorithm)
        self._device: Device = resolve_device(device)
        self._scaling: LossScaling = loss_scaling(self._plugin, scaler, self._device.torch_device)
        self._slots: list[Window] = []
        self._modules: list[torch.nn.Module] = []
        self._units: list[torch.nn.Module] = []
        """The FSDP units among the prepared modules (sharded by ``prepare_module`` or by the user)."""
        self._position: LoopPosition | None = None
        self._call: StepCall | None = None
        """The ``step()`` running now (its closure or inner step), if any."""
        self._hooks = Hooks()

    # -- configuration ---------------------------------------------------------------------------------

    @property
    def precision(self) -> Precision:
        """The precision this context applies."""
        return self._plugin.name

    @property
    def device(self) -> torch.device:
        """The device the model and optimizer state live on."""
        return self._device.torch_device

    @property
    def accumulate_grad_batches(self) -> int:
        """Micro-steps per window when ``make_optimizer_step`` is ``None``.

        Settable between windows (no window open, none prepared, no ``step()`` running), as a schedule that
        changes it per epoch needs (Lightning's ``GradientAccumulationScheduler``); the same check as at
        construction applies.
        """
        return self._accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        value = check_accumulate_grad_batches(value)
        if value == self._accumulate_grad_batches:
            return
        self._check_between_calls("changing accumulate_grad_batches")
        if self.holds_open_window():
            raise RuntimeError(
                f"accumulate_grad_batches cannot change from {self._accumulate_grad_batches} to {value} while a "
                "window holds accumulated micro-steps: change it after the window's real step"
            )
        if value > 1 and any(slot.evaluates_closure for slot in self._slots):
            raise ValueError(
                "an optimizer of this context evaluates its closure several times per step and cannot accumulate "
                f"gradients; accumulate_grad_batches must stay 1 (got {value})"
            )
        self._accumulate_grad_batches = value

    def holds_open_window(self) -> bool:
        """Whether any window holds accumulated micro-steps that its real step has not applied yet."""
        return any(slot.pending for slot in self._slots)

    @property
    def scaler(self) -> GradScaler | None:
        """The ``torch.amp.GradScaler`` under 16-mixed, ``None`` otherwise."""
        return self._scaling.scaler

    def prepare_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move ``module`` to the device and cast it to the precision (in place); wrap it for DDP or shard it.

        Under ``strategy="fsdp"`` the module is sharded with ``fully_shard`` (one unit per submodule that holds
        parameters, then the root), unless it is an ``FSDPModule`` already.
        """
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"prepare_module expects a torch.nn.Module, got {type(module).__name__}")
        module = self._plugin.convert_module(module.to(self.device))
        module = prepare_for_ranks(module, self.device, shard=self._shards)
        self._modules.append(module)
        self._units = fsdp_modules(self._modules)
        return module

    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        """Wrap an optimizer built on the prepared module's parameters."""
        if isinstance(optimizer, WrappedOptimizer):
            raise TypeError(
                f"{type(optimizer).__name__} is already a wrapper; pass its inner optimizer (wrapper.optimizer)"
            )
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"wrap expects a torch.optim.Optimizer, got {type(optimizer).__name__}")
        name = type(optimizer).__name__
        owner = _WRAPPED_BY.get(optimizer)
        if any(slot.optimizer is optimizer for slot in self._slots):
            raise ValueError(f"this {name} is already wrapped by this context")
        if owner is not None and owner() is not None:
            raise ValueError(
                f"this {name} is already wrapped by another training context; wrap each optimizer in one context "
                "(build a new optimizer for a new context)"
            )
        slot = Window(optimizer)
        if slot.evaluates_closure and self._scaling.changes_gradients:
            raise TypeError(
                f"{name} evaluates its closure itself, which loss scaling cannot follow: use 16-mixed with a "
                "first-order optimizer, or LBFGS with 32-true or 64-true"
            )
        if slot.evaluates_closure and self._accumulate_grad_batches > 1:
            raise ValueError(
                f"{name} evaluates its closure several times per step and cannot accumulate gradients; use "
                f"accumulate_grad_batches=1 (got {self._accumulate_grad_batches})"
            )
        for param in slot.params():
            self._check_parameter(param)
        self._slots.append(slot)
        _WRAPPED_BY[optimizer] = weakref.ref(self)
        return self._new_wrapper(len(self._slots) - 1)

    def _check_parameter(self, param: torch.Tensor) -> None:
        """Refuse a parameter off the context's device or in another dtype than the precision's."""
        self._plugin.check_parameter(param)
        if param.device != self.device:
            raise ValueError(
                f"the optimizer holds a parameter on {param.device}, but this context runs on {self.device}: "
                "call context.prepare_module(model) before building the optimizer on its parameters"
            )

    def _new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_class(type(self._slots[index].optimizer))(self, index)

    def _slot(self, index: int) -> Window:
        return self._slots[index]

    # -- the loop --------------------------------------------------------------------------------------

    def autocast(self) -> AbstractContextManager[None]:
        """The autocast region for forward passes in this context's precision."""
        return self._plugin.autocast(self._device.torch_device)

    def batch(self, batch_idx: int, *, is_last: bool = False) -> AbstractContextManager[None]:
        """Mark one training iteration: batch ``batch_idx`` of the epoch, the last one when ``is_last``."""
        return _Batch(self, batch_idx, is_last)

    def _end_iteration(self) -> None:
        """The iteration's scaler update [AMP-003], unless a prepared window still waits for its real step.

        A prepared window's gradients are unscaled, and the scaler's record of that unscaling must survive until
        its step: the update then follows that step. Every other window that holds gradients (micro-steps, or a
        backward not yet stepped) holds them at the old scale, and the update rescales them [AMP-006].
        """
        if any(slot.stage is WindowStage.PREPARED for slot in self._slots):
            return
        self._scaling.update(param for slot in self._slots for param in self._window_tensors(slot))

    # -- the step: one transaction through the stages ---------------------------------------------------

    def _step(
        self,
        index: int,
        closure: Callable[[], T] | None,
        make_optimizer_step: bool | None,
        kwargs: dict[str, Any],
        wrapper: WrappedOptimizer[Any] | None = None,
    ) -> T | None:
        result = self._run_step(index, closure, make_optimizer_step, kwargs, wrapper)
        if self._hooks.after_step:
            self._after_step(index, wrapper)
        return result

    def _run_step(
        self,
        index: int,
        closure: Callable[[], T] | None,
        make_optimizer_step: bool | None,
        kwargs: dict[str, Any],
        wrapper: WrappedOptimizer[Any] | None,
    ) -> T | None:
        slot = self._slots[index]
        self._check_step_arguments(index, closure, make_optimizer_step, kwargs)
        real = self._closes_window(slot, make_optimizer_step)
        self._check_transition(slot, real, closure)
        stash = closure is not None and not (real and slot.pending and self._syncs_in_backward())
        call = self._call = StepCall(
            slot,
            real=real,
            stash=stash,
            in_place=self._device.accumulates_in_place,
            unsynced=self._unsynced(slot) if self._units else (),
        )
        try:
            if slot.evaluates_closure and real:
                assert closure is not None
                with self._step_rollback(slot):
                    self._before_optimizer_step(index, wrapper)
                    result: Any = self._inner_step(index, lambda: self._evaluate_closure(index, closure), kwargs)
                self._finish_real_step(slot)
                return result  # type: ignore[no-any-return]
            if closure is not None and not stash:
                call.protect()  # the closure's backward adds into the window itself
            result = None if closure is None else self._run_closure(index, closure, sync_grad=real)
            call.merge()
            if not real:
                call.commit()
                self._finish_accumulation(slot)
                return result  # type: ignore[no-any-return]
            if self._units:
                self._check_synced(slot)
            if not call.prepared:
                self._protect_for_preparation(slot, call)
                self._prepare_gradients(slot)
                call.prepared = call.unscaled_here = True
            if closure is not None and slot.takes_closure and not self._scaling.changes_gradients:
                kwargs = {**kwargs, "closure": self._replay(index, closure, result)}
            self._before_optimizer_step(index, wrapper)
            self._inner_step(index, None, kwargs)
        except BaseException:
            self._abort(slot, call)
            raise
        finally:
            self._call = None
        self._finish_real_step(slot)
        return result  # type: ignore[no-any-return]

    def _check_step_arguments(
        self, index: int, closure: object, make_optimizer_step: object, kwargs: dict[str, Any]
    ) -> None:
        if self._call is not None:
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
            _check_step_kwargs(self._slots[index].optimizer, kwargs)

    def _check_transition(self, slot: Window, real: bool, closure: object) -> None:
        name = type(slot.optimizer).__name__
        if slot.stage is WindowStage.PREPARED and not real:
            raise RuntimeError(
                "unscale_gradients() prepared this window for its real step, but this step() does not close the "
                "window: call step(make_optimizer_step=True), or call unscale_gradients() only before that step"
            )
        if slot.evaluates_closure and not real:
            raise ValueError(f"{name} evaluates its closure several times per step and cannot accumulate")
        if slot.evaluates_closure and closure is None:
            raise TypeError(f"{name} needs a closure: call step(closure)")

    def _closes_window(self, slot: Window, make_optimizer_step: bool | None) -> bool:
        return closes_window(
            make_optimizer_step,
            pending=slot.pending,
            accumulate_grad_batches=self._accumulate_grad_batches,
            position=self._position,
        )

    def _syncs_in_backward(self) -> bool:
        """Whether the closing backward reduces the window itself (DDP, or FSDP units anywhere in the modules)."""
        return bool(self._units) or syncs_in_backward(self._modules)

    def _unsynced(self, slot: Window) -> list[torch.Tensor]:
        """The FSDP unsharded parameters of ``slot``'s parameters (their ``.grad``: what no sync reduced yet)."""
        return unsynced_gradients(self._units, slot.params())

    def _window_tensors(self, slot: Window) -> list[torch.Tensor]:
        """Every tensor whose ``.grad`` holds part of ``slot``'s window: its parameters, and under FSDP theirs."""
        params = slot.params()
        return params + self._unsynced(slot) if self._units else params

    def _check_synced(self, slot: Window) -> None:
        """Refuse a real step of a window whose gradients no backward reduce-scattered [FSDP-005]."""
        if any(tensor.grad is not None for tensor in self._unsynced(slot)):
            raise RuntimeError(
                f"the window of {type(slot.optimizer).__name__} holds gradients that no backward synced (its last "
                "backward ran inside toggle_model(sync_grad=False)), so they never reached the shards: run the "
                "backward of the micro-step that closes the window with sync_grad=True"
            )

    def _protect_for_preparation(self, slot: Window, call: StepCall) -> None:
        """Copy the window before it is prepared in place, unless preparing it changes nothing."""
        if (
            slot.pending
            or self._clip_val is not None
            or self._device.reduces_gradients
            or self._scaling.changes_gradients
        ):
            call.protect()

    def _abort(self, slot: Window, call: StepCall) -> None:
        """A failed call: the window, and what the loss scaler recorded of it in this call, as before the call."""
        call.rollback()
        if call.unscaled_here:
            self._scaling.forget(slot.optimizer)

    def _normalise_window(self, slot: Window) -> None:
        # Under 16-mixed each micro-step's loss was divided by accumulate_grad_batches already [AMP-007].
        normalise_window(slot.params(), slot.pending + 1, divided_by=self._window_divisor())

    def _prepare_gradients(self, slot: Window) -> None:
        """Once per window, before its real step: mean, cross-replica reduction, unscaling, clipping."""
        self._normalise_window(slot)
        self._reduce_gradients(slot)
        self._unscale(slot)
        self._clip(slot)

    def _reduce_gradients(self, slot: Window) -> None:
        self._device.reduce_gradients(slot.optimizer)

    def _unscale(self, slot: Window) -> None:
        self._scaling.unscale(slot.optimizer)

    def _clip(self, slot: Window) -> None:
        if self._clip_val is not None:
            clip_gradients(slot.params(), self._clip_val, self._clip_algorithm)

    def _before_optimizer_step(self, index: int, wrapper: WrappedOptimizer[Any] | None) -> None:
        """The registered ``before_optimizer_step`` hooks [HOOK-002] (inside the call's transaction)."""
        if self._hooks.before_optimizer_step:
            self._hooks.run_before_optimizer_step(wrapper or self._new_wrapper(index))

    def _after_step(self, index: int, wrapper: WrappedOptimizer[Any] | None) -> None:
        """The registered ``after_step`` hooks, with the call's outcome [HOOK-003]."""
        outcome = self._slots[index].last_outcome
        assert outcome is not None
        self._hooks.run_after_step(wrapper or self._new_wrapper(index), outcome)

    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        """The inner optimizer's step (through the loss scaler), then the device's end of a step."""
        slot = self._slots[index]
        if closure is None:
            slot.skipped = not self._scaling.step(slot.optimizer, slot.optimizer.step, kwargs)
            result = None
        else:
            step: Callable[..., Any] = slot.optimizer.step
            result = step(closure, **kwargs)
        self._device.after_step()
        return result

    def _replay(self, index: int, closure: Callable[[], T], result: T) -> Callable[[], T]:
        """The closure a real step hands the inner optimizer [CLOS-005].

        Its first call returns what the call's closure returned (the window holds its gradients, prepared); each
        later call evaluates the closure anew, as an optimizer that re-evaluates (a two-pass one) needs.
        """
        calls = 0

        def evaluate() -> T:
            nonlocal calls
            calls += 1
            call = self._call
            if calls == 1 or call is None:
                return result
            call.reevaluating = True  # its backward starts from cleared gradients: nothing prepared to add to
            try:
                return self._evaluate_closure(index, closure)
            finally:
                call.reevaluating = False

        return evaluate

    def _evaluate_closure(self, index: int, closure: Callable[[], T]) -> T:
        """One evaluation of a closure-evaluating optimizer's closure: zeroed, toggled, reduced, clipped [CLOS-004]."""
        self._slots[index].optimizer.zero_grad(set_to_none=True)
        loss = self._run_closure(index, closure, sync_grad=True)
        self._reduce_gradients(self._slots[index])
        self._clip(self._slots[index])
        return loss

    def _step_rollback(self, slot: Window) -> AbstractContextManager[None]:
        """What undoes a failed step of a closure-evaluating optimizer (which moves parameters between evaluations)."""
        return _StepRollback(slot.optimizer)

    def _finish_accumulation(self, slot: Window) -> None:
        slot.pending += 1
        slot.last_outcome = StepOutcome.ACCUMULATED

    def _finish_real_step(self, slot: Window) -> None:
        if slot.skipped:
            slot.last_outcome = StepOutcome.SKIPPED_NON_FINITE
            # A scheduler built on the inner optimizer would otherwise warn that it stepped first.
            torch_compat.mark_stepped_for_scheduler(slot.optimizer)
        else:
            slot.steps += 1
            slot.last_outcome = StepOutcome.STEPPED
        slot.optimizer.zero_grad(set_to_none=True)
        slot.pending = 0
        slot.skipped = False
        slot.stage = WindowStage.READY
        if self._position is None:
            self._end_iteration()

    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        watch = (
            self._scaling.watch(self._window_tensors(self._slots[index])) if self._scaling.changes_gradients else None
        )
        with self._toggle(index, sync_grad=sync_grad), watch or _NOTHING_TO_TOGGLE, self.autocast():
            return closure()

    # -- what the wrappers call besides step ------------------------------------------------------------

    def _wrapper_backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """A wrapper's ``backward``: outside autocast [BWD-002], between the backward hooks once its checks pass."""
        hooks = self._hooks
        with outside_autocast(self._device.torch_device):
            if not hooks.before_backward and not hooks.after_backward:
                self._backward(loss, *args, **kwargs)
                return
            self._check_backward(loss)
            hooks.run_backward(hooks.before_backward, wrapper, loss)
            self._backward(loss, *args, **kwargs)
            hooks.run_backward(hooks.after_backward, wrapper, loss)

    def _check_backward(self, loss: object) -> None:
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"backward expects the loss tensor, got {type(loss).__name__}")
        call = self._call
        if (call is not None and call.prepared and not call.reevaluating) or self._any_prepared():
            raise RuntimeError(
                "backward() after unscale_gradients() would add scaled gradients to a prepared window: run every "
                "backward of the window first, then unscale_gradients(), then the step that closes the window"
            )

    def _backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self._check_backward(loss)
        backward: Callable[..., None] = self._scaled_loss(loss).backward
        with self._scaling.backward():
            backward(*args, **kwargs)

    def _scaled_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """What a backward of this context propagates: under 16-mixed ``scaler.scale(loss / N)`` [AMP-007]."""
        return self._scaling.scale(loss, self._accumulate_grad_batches)

    @contextmanager
    def _framework_backward(self, *, leave_autocast: bool) -> Iterator[None]:
        """Around a framework's own backward of a :meth:`_scaled_loss` (Lightning's ``strategy.backward``).

        It counts as a scaled backward [AMP-008]; ``leave_autocast`` runs it outside autocast [BWD-002].
        """
        with outside_autocast(self.device) if leave_autocast else nullcontext(), self._scaling.backward():
            yield

    def _any_prepared(self) -> bool:
        for slot in self._slots:  # noqa: SIM110 (a plain loop: it runs on every backward, a generator costs more)
            if slot.stage is WindowStage.PREPARED:
                return True
        return False

    def _unscale_gradients(self, index: int) -> None:
        slot = self._slots[index]
        call = self._call
        if slot.stage is WindowStage.ACCUMULATING:
            raise RuntimeError(
                "unscale_gradients() was called in the closure of a step() that does not close the window; call it "
                "in the closure of the closing step, or between the window's last backward and that step"
            )
        if slot.stage is WindowStage.PREPARED or (call is not None and call.window is slot and call.prepared):
            return
        if slot.stage is WindowStage.CLOSING:
            assert call is not None
            call.merge()
            self._protect_for_preparation(slot, call)
            self._prepare_gradients(slot)
            call.prepared = call.unscaled_here = True
            return
        self._prepare_gradients(slot)
        slot.stage = WindowStage.PREPARED

    def _add_param_group(self, index: int, param_group: dict[str, Any]) -> None:
        if not isinstance(param_group, dict):
            raise TypeError(f"add_param_group expects a dict with a 'params' entry, got {type(param_group).__name__}")
        if self._slots[index].stage is not WindowStage.READY:
            raise RuntimeError("add_param_group() while a step() runs or a window is prepared: call it between steps")
        params = param_group.get("params")
        if isinstance(params, torch.Tensor):
            candidates: list[object] = [params]
        elif params is None or isinstance(params, set | frozenset):
            candidates = []  # torch refuses a missing or unordered 'params' itself, before it changes anything
        else:
            candidates = list(params)
            if not isinstance(params, list | tuple):
                param_group["params"] = candidates  # a one-shot iterable: what torch would have made of it
        for param in candidates:
            if isinstance(param, torch.Tensor):
                self._check_parameter(param)
        self._slots[index].optimizer.add_param_group(param_group)

    def _zero_grad(self, index: int, set_to_none: bool) -> None:
        slot = self._slots[index]
        if slot.stage is WindowStage.PREPARED or (
            self._call is not None and self._call.window is slot and self._call.prepared
        ):
            raise RuntimeError(
                "zero_grad() after unscale_gradients() would discard gradients that cannot be prepared again in this "
                "iteration; take the step that closes the window first, or call zero_grad() before the backward"
            )
        if slot.pending == 0:
            if self._call is not None and self._call.window is slot:
                self._call.clear(set_to_none)
            slot.optimizer.zero_grad(set_to_none=set_to_none)
            for unsharded in self._unsynced(slot) if self._units else ():
                unsharded.grad = None  # a backward without sync that no step followed

    def _toggle(self, index: int, *, sync_grad: bool) -> AbstractContextManager[None]:
        if sync_grad and len(self._slots) == 1:
            return _NOTHING_TO_TOGGLE  # one optimizer, and DDP may sync: the common case, nothing to do
        others = [param for i, slot in enumerate(self._slots) if i != index for param in slot.params()]
        toggle = only_these_require_grad(self._slots[index].params(), others) if others else _NOTHING_TO_TOGGLE
        return toggle if sync_grad else _without_sync(toggle, self._modules, self._units)

    def _toggle_model(self, index: int, sync_grad: object) -> AbstractContextManager[None]:
        if not isinstance(sync_grad, bool):
            raise TypeError(f"sync_grad must be True or False, got {sync_grad!r} ({type(sync_grad).__name__})")
        return self._toggle(index, sync_grad=sync_grad)

    # -- copies --------------------------------------------------------------------------------------

    def _check_between_calls(self, what: str) -> None:
        if self._call is not None or any(slot.stage is not WindowStage.READY for slot in self._slots):
            raise RuntimeError(
                f"{what} while a step() runs or after unscale_gradients() before its closing step: the window is "
                "mid-preparation; take it between step() calls"
            )

    def __getstate__(self) -> dict[str, Any]:
        # Gradients are not part of a pickled tensor: carry those of open windows explicitly.
        self._check_between_calls("a copy")
        state = self.__dict__.copy()
        state["_position"] = None  # the copy resumes in a batch() of its own, as a loaded checkpoint does
        state["_hooks"] = Hooks()  # hooks are the framework's that registered them, not the copy's
        state["_open_window_grads"] = [
            [None if slot.pending == 0 or p.grad is None else p.grad.detach() for p in slot.params()]
            for slot in self._slots
        ]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        grads = state.pop("_open_window_grads")
        self.__dict__.update(state)
        for slot, slot_grads in zip(self._slots, grads, strict=True):
            _WRAPPED_BY[slot.optimizer] = weakref.ref(self)
            for param, grad in zip(slot.params(), slot_grads, strict=True):
                if grad is not None:
                    param.grad = grad.clone()

    # -- checkpoints -----------------------------------------------------------------------------------

    # -- hooks ----------------------------------------------------------------------------------------

    def register_hooks(
        self,
        *,
        before_backward: BackwardHook | None = None,
        after_backward: BackwardHook | None = None,
        before_optimizer_step: OptimizerStepHook | None = None,
        after_step: StepHook | None = None,
    ) -> RemovableHandle:
        """Call these around every wrapper's ``backward`` and ``step`` (HOOK-001 to HOOK-004 of the spec).

        ``before_backward(wrapper, loss)`` and ``after_backward(wrapper, loss)`` around autograd;
        ``before_optimizer_step(wrapper)`` on a real step, the window prepared, before the inner step;
        ``after_step(wrapper, outcome)`` after each ``step()`` that returns. ``remove()`` on the handle stops them.
        A copy of the context (pickle, deepcopy) carries none.
        """
        return self._hooks.register(
            before_backward=before_backward,
            after_backward=after_backward,
            before_optimizer_step=before_optimizer_step,
            after_step=after_step,
        )

    def state_dict(self) -> dict[str, Any]:
        """Window positions, step counts, the open windows' gradients, the loss scaler (its pending update too)."""
        self._check_between_calls("state_dict()")
        return {
            "format": _STATE_FORMAT,
            "precision": self.precision,
            "world_size": distributed_world_size(),
            "window_divisor": self._window_divisor(),
            "scaler": self._scaling.state_dict(),
            "optimizers": [
                {"pending": slot.pending, "steps": slot.steps, "shapes": [list(p.shape) for p in slot.params()]}
                | self._open_window_state(slot)
                for slot in self._slots
            ],
        }

    def _open_window_state(self, slot: Window) -> dict[str, list[torch.Tensor | None]]:
        """An open window's gradients, this rank's: ``grads`` per parameter, and under FSDP ``sharded_grads`` too.

        Under FSDP ``grads`` are the unsynced sums on the unsharded parameters (full size, this rank's batches only)
        and ``sharded_grads`` the local shards of what synced backwards reduced; otherwise ``grads`` are the
        parameters' gradients.
        """
        params = slot.params()
        if slot.pending == 0:
            empty: list[torch.Tensor | None] = [None] * len(params)
            return {"grads": empty} | ({"sharded_grads": list(empty)} if self._units else {})
        if not self._units:
            return {"grads": [None if p.grad is None else p.grad.detach().clone() for p in params]}
        unsynced = unsharded_by_param(self._units)
        grads: list[torch.Tensor | None] = []
        for param in params:
            full = unsynced.get(id(param))
            grads.append(None if full is None or full.grad is None else full.grad.detach().clone())
        sharded: list[torch.Tensor | None] = [
            None if p.grad is None else _local_shard(p.grad).detach().clone() for p in params
        ]
        return {"grads": grads, "sharded_grads": sharded}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved; validate all of it before changing anything."""
        self._check_between_calls("load_state_dict()")
        entries = self._validated_entries(state_dict)
        self._scaling.load_state_dict(state_dict["scaler"])
        if self._units:
            self._load_sharded_windows(entries)
            return
        for slot, entry in zip(self._slots, entries, strict=True):
            slot.pending = entry["pending"]
            slot.steps = entry["steps"]
            slot.last_outcome = None
            slot.skipped = False
            with torch.no_grad():
                for param, grad in zip(slot.params(), entry["grads"], strict=True):
                    param.grad = None if grad is None else grad.to(device=param.device, dtype=param.dtype).clone()

    def _load_sharded_windows(self, entries: list[dict[str, Any]]) -> None:
        """Under FSDP: the unsynced sums back on the unsharded parameters (gathered for that), the shards' own."""
        units = gather_for_load(self._units) if any(entry["pending"] for entry in entries) else []
        try:
            unsynced = unsharded_by_param(self._units)
            for slot, entry in zip(self._slots, entries, strict=True):
                slot.pending, slot.steps = entry["pending"], entry["steps"]
                slot.last_outcome, slot.skipped = None, False
                with torch.no_grad():
                    for param, grad, shard in zip(slot.params(), entry["grads"], entry["sharded_grads"], strict=True):
                        full = unsynced.get(id(param))
                        if full is not None:
                            full.grad = None if grad is None else grad.to(device=full.device, dtype=full.dtype).clone()
                        param.grad = None if shard is None else _as_shard_of(param, shard)
        finally:
            for unit in units:
                unit.reshard()

    def _validated_entries(self, state_dict: object) -> list[dict[str, Any]]:
        if not isinstance(state_dict, dict) or state_dict.get("format") != _STATE_FORMAT:
            found = state_dict.get("format") if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"not a training-context state of format {_STATE_FORMAT} (got {found!r})")
        if state_dict.get("precision") != self.precision:
            raise ValueError(
                f"the state was saved under precision {state_dict.get('precision')!r}, this context runs "
                f"{self.precision!r}"
            )
        self._scaling.check_state(state_dict.get("scaler"))
        self._check_world_size(state_dict)
        self._check_window_divisor(state_dict)
        entries = state_dict.get("optimizers")
        if not isinstance(entries, list) or len(entries) != len(self._slots):
            count = len(entries) if isinstance(entries, list) else "no"
            raise ValueError(
                f"the state holds {count} optimizers, this context wraps {len(self._slots)}: wrap the same "
                "optimizers, in the same order, before loading"
            )
        for i, (slot, entry) in enumerate(zip(self._slots, entries, strict=True)):
            if not isinstance(entry, dict):
                raise ValueError(f"optimizer {i}: the state's entry is a {type(entry).__name__}, not a dict")
            self._check_layout(i, slot.params(), entry)
            for key in ("pending", "steps"):
                _check_count(f"optimizer {i}: {key!r}", entry.get(key))
        return entries

    def _check_world_size(self, state_dict: dict[str, Any]) -> None:
        """Refuse open windows saved at another world size: each rank's part is its own batches' [FSDP-006]."""
        saved, now = state_dict.get("world_size"), distributed_world_size()
        if not isinstance(saved, int) or isinstance(saved, bool) or saved < 1:
            raise ValueError(f"the state's world_size must be a positive int, got {saved!r}")
        entries = state_dict.get("optimizers")
        open_window = isinstance(entries, list) and any(isinstance(e, dict) and e.get("pending") for e in entries)
        if saved != now and open_window:
            raise ValueError(
                f"the state was saved at world size {saved} with a window open; this run has {now} ranks. Each rank's "
                f"part of an open window is its own batches' gradient: resume at world size {saved}, or save after "
                "a real step closed every window"
            )

    def _window_divisor(self) -> int:
        """What each micro-step's loss is divided by before its backward: N under 16-mixed [AMP-007], else 1."""
        return self._scaling.window_divisor(self._accumulate_grad_batches)

    def _check_window_divisor(self, state_dict: dict[str, Any]) -> None:
        """Refuse open windows whose gradients carry another loss divisor (16-mixed, another N) [AMP-007]."""
        saved, now = state_dict.get("window_divisor"), self._window_divisor()
        if not isinstance(saved, int) or isinstance(saved, bool) or saved < 1:
            raise ValueError(f"the state's window_divisor must be a positive int, got {saved!r}")
        entries = state_dict.get("optimizers")
        open_window = isinstance(entries, list) and any(isinstance(e, dict) and e.get("pending") for e in entries)
        if saved != now and open_window:
            raise ValueError(
                f"the state was saved with a window open whose 16-mixed losses were divided by "
                f"accumulate_grad_batches={saved}; this context divides by {now}: resume with "
                f"accumulate_grad_batches={saved}, or save after a real step closed every window"
            )

    def _check_layout(self, index: int, params: list[torch.Tensor], entry: dict[str, Any]) -> None:
        """Refuse an optimizer's saved entry for other parameters: their count and shapes, open window or not."""
        shapes, grads = entry.get("shapes"), entry.get("grads")
        if not isinstance(shapes, list) or not isinstance(grads, list) or len(shapes) != len(params):
            count = len(shapes) if isinstance(shapes, list) else "no"
            raise ValueError(f"optimizer {index}: the state holds {count} parameter shapes, it has {len(params)}")
        if len(grads) != len(params):
            raise ValueError(f"optimizer {index}: the state's gradients do not match its {len(params)} parameters")
        if self._units:
            self._check_shards(index, params, entry.get("sharded_grads"))
        for j, (param, shape, grad) in enumerate(zip(params, shapes, grads, strict=True)):
            if shape != list(param.shape):
                raise ValueError(
                    f"optimizer {index}, parameter {j}: saved for shape {shape}, this one is {list(param.shape)}"
                )
            if grad is not None and (not isinstance(grad, torch.Tensor) or grad.shape != param.shape):
                what = getattr(grad, "shape", type(grad).__name__)
                raise ValueError(f"optimizer {index}, parameter {j}: saved gradient {what} for a {param.shape} param")

    def _check_shards(self, index: int, params: list[torch.Tensor], shards: object) -> None:
        if not isinstance(shards, list) or len(shards) != len(params):
            raise ValueError(
                f"optimizer {index}: the state holds no sharded gradients for its {len(params)} parameters; it was "
                "saved by a context without FSDP"
            )
        for j, (param, shard) in enumerate(zip(params, shards, strict=True)):
            local = _local_shard(param)
            if shard is not None and (not isinstance(shard, torch.Tensor) or shard.shape != local.shape):
                what = getattr(shard, "shape", type(shard).__name__)
                raise ValueError(
                    f"optimizer {index}, parameter {j}: saved gradient shard {what}, this rank's shard is {local.shape}"
                )


def _local_shard(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _as_shard_of(param: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
    """A gradient for the sharded ``param`` whose local part is ``shard``."""
    local = shard.to(device=param.device, dtype=param.dtype).clone()
    if not isinstance(param, DTensor):
        return local
    return DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride())


class _Batch(AbstractContextManager[None]):
    """The block of :meth:`TrainingContext.batch` (a class rather than a generator: it runs every iteration)."""

    def __init__(self, context: TrainingContext, batch_idx: int, is_last: bool) -> None:
        self._context, self._batch_idx, self._is_last = context, batch_idx, is_last

    def __enter__(self) -> None:
        if type(self._batch_idx) is not int or self._batch_idx < 0:  # the usual plain int skips the full check
            _check_count("batch_idx", self._batch_idx)
        if self._context._position is not None:
            raise RuntimeError("context.batch() blocks do not nest: leave the current batch first")
        if not isinstance(self._is_last, bool):
            raise TypeError(
                f"is_last must be True or False, got {self._is_last!r} ({type(self._is_last).__name__}); "
                "pass bool(...) if you mean a truth value"
            )
        self._context._position = LoopPosition(self._batch_idx, self._is_last)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._context._position = None
        self._context._end_iteration()


class _StepRollback(AbstractContextManager[None]):
    """Around the step of an optimizer that evaluates its closure: if it raises, put back what it had changed.

    Parameters, gradients and the optimizer's per-parameter state are restored as they were before the step (LBFGS
    moves the parameters between evaluations, and creates its state before the first one).
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer
        self._params = [param for group in optimizer.param_groups for param in group["params"]]

    def __enter__(self) -> None:
        self._values = [param.detach().clone() for param in self._params]
        self._grads = [None if param.grad is None else param.grad.detach().clone() for param in self._params]
        self._state = {param: copy.deepcopy(entry) for param, entry in self._optimizer.state.items()}

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc_type is None:
            return
        with torch.no_grad():
            for param, value, grad in zip(self._params, self._values, self._grads, strict=True):
                param.copy_(value)
                param.grad = grad
        self._optimizer.state.clear()
        self._optimizer.state.update(self._state)


@contextmanager
def _without_sync(
    toggle: AbstractContextManager[None], modules: list[torch.nn.Module], units: list[torch.nn.Module]
) -> Iterator[None]:
    """``toggle`` without gradient sync (DDP's ``no_sync()``, every FSDP unit's): a micro-step that stays open."""
    with toggle, no_sync(modules, units):
        yield


def _check_step_kwargs(optimizer: torch.optim.Optimizer, kwargs: dict[str, Any]) -> None:
    """Refuse keyword arguments that the inner optimizer's ``step`` cannot take, before anything runs."""
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


def _check_count(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative int, got {value!r}")
