"""The training context: precision, device, schedule, loss scaler and loop position shared by its wrappers."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, Literal, TypeVar

import torch
from torch.amp.grad_scaler import GradScaler
from torch.nn.parallel import DistributedDataParallel

from independent import devices
from independent.wrapper import Wrapper, evaluates_closure, is_wrapper
from lightning_optimizer.spec import (
    DEVICE_KINDS,
    FAILURE_POLICIES,
    PRECISIONS,
    FailurePolicy,
    GradScalerSettings,
    Precision,
)

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

_AUTOCAST_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}
_TRUE_DTYPES = {"64-true": torch.float64, "bf16-true": torch.bfloat16, "16-true": torch.float16}
"""The one floating-point dtype a true precision trains; 32-true and the mixed precisions take the module's own."""
_HALF_TRUE = ("bf16-true", "16-true")
"""The precisions that convert with ``module.to(dtype)``, which would make a complex tensor real."""
_STATE_FORMAT = "independent-context/1"
_OWNERS: weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.ref[Context]] = weakref.WeakKeyDictionary()
"""The live context that wraps each optimizer."""


class Context:
    """Precision, device, accumulation schedule and loop position for the wrappers of one model."""

    def __init__(
        self,
        precision: str,
        device: str,
        *,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
        scaler_settings: GradScalerSettings | None = None,
        on_failure: FailurePolicy = "discard",
        zero_grad_after_step: bool = True,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; valid precisions: {', '.join(PRECISIONS)}")
        if device not in DEVICE_KINDS:
            raise ValueError(f"unknown device {device!r}; valid devices: {', '.join(DEVICE_KINDS)}")
        if type(accumulate_grad_batches) is not int:
            raise TypeError(f"accumulate_grad_batches must be an int, got {accumulate_grad_batches!r}")
        if accumulate_grad_batches < 1:
            raise ValueError(f"accumulate_grad_batches must be at least 1, got {accumulate_grad_batches}")
        if gradient_clip_val is not None and not _positive_number(gradient_clip_val):
            raise ValueError(f"gradient_clip_val must be a positive number or None, got {gradient_clip_val!r}")
        if gradient_clip_algorithm not in ("norm", "value"):
            raise ValueError(f"gradient_clip_algorithm must be 'norm' or 'value', got {gradient_clip_algorithm!r}")
        if gradient_clip_algorithm == "value" and gradient_clip_val is None:
            raise ValueError("gradient_clip_algorithm='value' needs a gradient_clip_val (CTX-002)")
        policy: object = on_failure
        if not isinstance(policy, str) or policy not in FAILURE_POLICIES:
            raise ValueError(f"on_failure must be one of {', '.join(map(repr, FAILURE_POLICIES))}, got {policy!r}")
        self._on_failure: FailurePolicy = next(name for name in FAILURE_POLICIES if name == policy)
        setting: object = zero_grad_after_step
        if not isinstance(setting, bool):
            raise TypeError(f"zero_grad_after_step must be True or False, got {setting!r}")
        self._zero_grad_after_step = setting
        self._precision: Precision = next(name for name in PRECISIONS if name == precision)
        self._device = devices.resolve(device)
        self._accumulate_grad_batches = accumulate_grad_batches
        self.clip_value = None if gradient_clip_val is None else float(gradient_clip_val)
        self.clip_algorithm = gradient_clip_algorithm
        settings = scaler_settings or GradScalerSettings()
        self.scaler = GradScaler(self._device.type, **settings.as_kwargs()) if precision == "16-mixed" else None
        self.wrappers: list[Wrapper[Any]] = []
        self.distributed_modules: list[DistributedDataParallel] = []
        self.position: tuple[int, bool] | None = None
        self.scaler_stepped = False
        self.found_inf = False
        """Whether an optimizer that stepped in this iteration had non-finite gradients."""
        self.restored_found_inf: bool | None = None
        """The found-inf of the steps of this iteration that a loaded state or a copy took before it was made."""
        self.stepping = False
        self.scaled_backwards = 0
        """How many wrapper backwards (loss scaled, AMP-007) are running now: gradients written meanwhile are scaled."""
        self.hooks: dict[int, dict[str, Callable[..., None]]] = {}
        """The registered hooks by registration, in order: each registration's callables by kind."""

    @property
    def precision(self) -> Precision:
        """The precision this context applies."""
        return self._precision

    @property
    def device(self) -> torch.device:
        """The device the model and the optimizer state live on."""
        return self._device

    @property
    def accumulate_grad_batches(self) -> int:
        """Micro-steps per window when ``make_optimizer_step`` is ``None``."""
        return self._accumulate_grad_batches

    @property
    def on_failure(self) -> FailurePolicy:
        """What a failed ``step()`` leaves of its window: discarded, or restored exactly as it was before the call."""
        return self._on_failure

    @property
    def zero_grad_after_step(self) -> bool:
        """Whether a real step clears the gradients it applied, or leaves them to the user's ``zero_grad()``."""
        return self._zero_grad_after_step

    @property
    def on_xla(self) -> bool:
        """Whether the context runs on an XLA device."""
        return self._device.type == "xla"

    def prepare_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move and convert ``module`` as Lightning's precision plugins do; with several ranks, in DDP.

        64-true: ``module.double()`` (floating-point tensors only); bf16-true and 16-true: ``module.to(dtype)``, a
        module holding a complex tensor refused first; 32-true and the mixed precisions: no conversion.
        """
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"prepare_module needs a torch.nn.Module, got {type(module).__name__}")
        if self._precision in _HALF_TRUE:
            complex_tensors = [
                f"{kind} {name!r}"
                for kind, named in (("parameter", module.named_parameters()), ("buffer", module.named_buffers()))
                for name, tensor in named
                if tensor.is_complex()
            ]
            if complex_tensors:
                raise ValueError(
                    f"{self._precision} converts the module with module.to({_TRUE_DTYPES[self._precision]}), which "
                    f"would discard the imaginary part of its complex {', '.join(complex_tensors)}: keep complex "
                    "tensors out of the module, or train in 32-true or a mixed precision"
                )
        module = module.to(device=self._device)
        if self._precision == "64-true":
            module = module.double()
        elif self._precision in _HALF_TRUE:
            module = module.to(dtype=_TRUE_DTYPES[self._precision])
        if devices.distributed_world_size() > 1:
            device_ids = [self._device.index] if self._device.type == "cuda" else None
            ddp = DistributedDataParallel(module, device_ids=device_ids)
            self.distributed_modules.append(ddp)
            return ddp
        return module

    def wrap(self, optimizer: OptimizerT) -> Wrapper[OptimizerT]:
        """Wrap an optimizer built on the prepared module's parameters."""
        if is_wrapper(optimizer):
            raise TypeError(f"{type(optimizer).__name__} is already a wrapper; wrap the inner optimizer once")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"wrap needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if any(wrapper.optimizer is optimizer for wrapper in self.wrappers):
            raise ValueError(f"this {type(optimizer).__name__} is already wrapped in this context")
        if evaluates_closure(optimizer) and self._precision == "16-mixed":
            raise TypeError(f"{type(optimizer).__name__} evaluates its closure: loss scaling cannot follow it")
        if evaluates_closure(optimizer) and self._accumulate_grad_batches > 1:
            raise ValueError(f"{type(optimizer).__name__} evaluates its closure itself and cannot accumulate")
        owner = _OWNERS.get(optimizer)
        if owner is not None and owner() is not None:
            raise ValueError(f"this {type(optimizer).__name__} is already wrapped by another live context")
        for group in optimizer.param_groups:
            self.check_parameters(group["params"])
        wrapper = Wrapper.around(optimizer, self)
        self.wrappers.append(wrapper)
        _OWNERS[optimizer] = weakref.ref(self)
        return wrapper

    def check_parameters(self, params: list[torch.Tensor]) -> None:
        """Refuse parameters off the device or in a dtype this precision does not train (ERR-007).

        64-true, bf16-true and 16-true train their one dtype (what ``prepare_module`` gives); 16-mixed any
        floating-point dtype but float16, whose gradients the loss scaler cannot unscale; 32-true and bf16-mixed
        any. Complex parameters are checked for their device, and refused where ``prepare_module`` refuses them.
        """
        trained = _TRUE_DTYPES.get(self._precision)
        for param in params:
            if not (param.is_floating_point() or param.is_complex()):
                continue
            if param.device != self._device:
                raise ValueError(f"a parameter lives on {param.device}, this context on {self._device}: prepare first")
            if param.is_complex():
                if self._precision in _HALF_TRUE:
                    raise ValueError(
                        f"a parameter is {param.dtype}: {self._precision} trains no complex parameters "
                        "(prepare_module refuses them)"
                    )
                continue
            if trained is not None and param.dtype != trained:
                raise ValueError(
                    f"a parameter is {param.dtype}, but {self._precision} trains {trained} parameters: "
                    "prepare the module with the context first"
                )
            if self._precision == "16-mixed" and param.dtype == torch.float16:
                raise ValueError(
                    "a parameter is torch.float16: under 16-mixed the loss scaler cannot unscale float16 gradients; "
                    "keep the parameters in float32 (autocast runs the forward in float16) or train in 16-true"
                )

    def autocast(self) -> AbstractContextManager[None]:
        """Autocast for the mixed precisions; nothing for the true ones."""
        dtype = _AUTOCAST_DTYPES.get(self._precision)
        return nullcontext() if dtype is None else _autocast(self._device.type, dtype)

    @contextmanager
    def batch(self, batch_idx: int, *, is_last: bool = False) -> Iterator[None]:
        """One iteration of the loop; leaving it updates the loss scaler once if an optimizer stepped in it."""
        if not _index(batch_idx):
            raise ValueError(f"batch_idx must be a non-negative int, got {batch_idx!r}")
        if not isinstance(is_last, bool):
            raise TypeError(f"is_last must be a bool, got {is_last!r}")
        if self.position is not None:
            raise RuntimeError("batch() blocks do not nest: leave the current batch first")
        self.position = (batch_idx, is_last)
        try:
            yield
        finally:
            self.position = None
            self.end_iteration()

    def end_iteration(self) -> None:
        """Update the scaler once after the optimizers that stepped, rescaling the windows still open."""
        if self.scaler is None or not self.scaler_stepped:
            return
        if any(wrapper._window.prepared for wrapper in self.wrappers):
            return  # its unscaling must survive until its real step, which updates then
        if self.restored_found_inf is not None:
            # The steps taken before the state was saved are not in this scaler's records: add their found-inf.
            self.scaler.scale(torch.zeros((), device=self._device))  # a loaded scaler makes its scale tensor here
            found = torch.full((), float(self.restored_found_inf), device=self._device)
            self.scaler._per_optimizer_states[id(self)]["found_inf_per_device"][self._device] = found
        old_scale = self.scaler.get_scale()
        self.scaler.update()
        self.scaler_stepped, self.found_inf, self.restored_found_inf = False, False, None
        new_scale = self.scaler.get_scale()
        if new_scale != old_scale:
            for wrapper in self.wrappers:
                wrapper.rescale_open_window(new_scale / old_scale)

    @contextmanager
    def toggled(self, owner: Wrapper[Any]) -> Iterator[None]:
        """Only ``owner``'s parameters may require grad inside; every flag is put back afterwards."""
        own = {id(param) for param in owner.parameters()}
        others = {id(p): p for w in self.wrappers if w is not owner for p in w.parameters() if id(p) not in own}
        saved = [(param, param.requires_grad) for param in others.values()]
        try:
            for param, _ in saved:
                param.requires_grad_(False)
            yield
        finally:
            for param, flag in saved:
                param.requires_grad_(flag)

    def no_sync(self, keep: Any = None) -> AbstractContextManager[None]:
        """Gradient-sync suppression of every distributed module of the context but those holding ``keep``'s.

        ``keep``: the wrapper whose window a micro-step closes. A module toggled out of its backward must not run
        its forward under sync: DDP would wait for its gradients, and reduce them in a later backward.
        """
        own = set() if keep is None else {id(param) for param in keep.parameters()}
        stack = ExitStack()
        for module in self.distributed_modules:
            if not any(id(param) in own for param in module.parameters()):
                stack.enter_context(module.no_sync())
        return _closing(stack)

    @contextmanager
    def running_step(self) -> Iterator[None]:
        """Mark a ``step()`` of one of the wrappers as running."""
        self.stepping = True
        try:
            yield
        finally:
            self.stepping = False

    @contextmanager
    def noting_gradients(self) -> Iterator[None]:
        """Around a call of a wrapper: as it returns (or raises), note which parameters of every window have a
        gradient, so that the next call finds those cleared from outside meanwhile (WIN-002)."""
        try:
            yield
        finally:
            for wrapper in self.wrappers:
                wrapper.note_gradients()

    def discard(self, wrapper: object) -> None:
        """Drop ``wrapper``'s window, whatever the failure policy: gradients ``None``, length 0. [FAIL-009]

        Its carried part goes too, and the scaler's record of its optimizer's unscaling (the next window unscales
        anew); ``last_outcome`` becomes ``DISCARDED``, the step count stays. The parameters it knew stay known: any
        added from outside are checked and join at the wrapper's next call (WIN-001).
        """
        if self.stepping:
            raise RuntimeError("discard() while a step() of this context runs: call it after the step")
        if not any(own is wrapper for own in self.wrappers) or not isinstance(wrapper, Wrapper):
            raise ValueError(f"discard() takes a wrapper of this context, got {type(wrapper).__name__}")
        prepared = wrapper._window.prepared
        with self.noting_gradients():
            wrapper.drop(forget_unscaling=prepared)
        if prepared and self.position is None:
            self.end_iteration()  # the scaler update it postponed (AMP-003) has nothing to wait for now

    def _check_between_steps(self, what: str) -> None:
        if self.stepping or any(wrapper._window.prepared for wrapper in self.wrappers):
            raise RuntimeError(f"{what} while a step() runs or after unscale_gradients(): take it between steps")

    def _pending_update(self) -> dict[str, bool] | None:
        """The iteration's scaler update still to come (an optimizer stepped), with its found-inf."""
        if self.scaler is None or not self.scaler_stepped:
            return None
        return {"found_inf": self.found_inf or bool(self.restored_found_inf)}

    def register_hooks(
        self,
        *,
        before_backward: Callable[..., None] | None = None,
        after_backward: Callable[..., None] | None = None,
        before_optimizer_step: Callable[..., None] | None = None,
        after_step: Callable[..., None] | None = None,
    ) -> HookHandle:
        """Run these around the wrappers' backward and step."""
        given = {
            "before_backward": before_backward,
            "after_backward": after_backward,
            "before_optimizer_step": before_optimizer_step,
            "after_step": after_step,
        }
        for kind, hook in given.items():
            if hook is not None and not callable(hook):
                raise TypeError(f"{kind} is not callable: {hook!r}")
        key = max(self.hooks, default=0) + 1
        self.hooks[key] = {kind: hook for kind, hook in given.items() if hook is not None}
        return HookHandle(self.hooks, key)

    def run_hooks(self, kind: str, *args: Any) -> None:
        """Call the hooks of ``kind`` in registration order."""
        for registration in list(self.hooks.values()):
            hook = registration.get(kind)
            if hook is not None:
                hook(*args)

    def state_dict(self) -> dict[str, Any]:
        """The context's own state: scaler, the iteration's pending update, each wrapper's window and counts."""
        self._check_between_steps("state_dict()")
        return {
            "format": _STATE_FORMAT,
            "precision": self._precision,
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "pending_update": self._pending_update(),
            # Under 16-mixed an open window's gradients carry this divisor (AMP-007): it loads only where it is equal.
            "accumulate_grad_batches": self._accumulate_grad_batches,
            # A state loads only into a context of the same failure policy (FAIL-006) and zeroing (ZERO-007).
            "on_failure": self._on_failure,
            "zero_grad_after_step": self._zero_grad_after_step,
            "optimizers": [wrapper.window_state() for wrapper in self.wrappers],
        }

    def __getstate__(self) -> dict[str, Any]:
        # GradScaler refuses to be pickled mid-iteration: the copy carries its state dict and the pending update.
        self._check_between_steps("a copy")
        state = self.__dict__.copy()
        if self.scaler is not None:
            state["scaler"] = (self._device.type, self.scaler.state_dict())
            pending = self._pending_update()
            state["restored_found_inf"] = None if pending is None else pending["found_inf"]
            state["found_inf"] = False
        state["position"] = None  # the copy goes on in a batch() of its own
        state["hooks"] = {}  # the hooks belong to whoever registered them
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["scaler"] is not None:
            device_type, scaler_state = state["scaler"]
            state["scaler"] = GradScaler(device_type)
            state["scaler"].load_state_dict(scaler_state)
        self.__dict__.update(state)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state saved by ``state_dict``; one for another layout is refused before anything changes."""
        given: object = state_dict
        if not isinstance(given, dict) or given.get("format") != _STATE_FORMAT:
            raise ValueError("not a context state of this implementation (saved by Context.state_dict())")
        if state_dict.get("precision") != self._precision:
            raise ValueError(f"the state was saved under {state_dict.get('precision')!r}, not {self._precision!r}")
        saved_policy = state_dict.get("on_failure")
        if not isinstance(saved_policy, str) or saved_policy not in FAILURE_POLICIES:
            raise ValueError(f"the state's on_failure is malformed: {saved_policy!r}")
        if saved_policy != self._on_failure:
            raise ValueError(
                f"the state was saved by a context with on_failure={saved_policy!r}, this one has "
                f"on_failure={self._on_failure!r}: load it into a context of the same failure policy"
            )
        saved_zeroing = state_dict.get("zero_grad_after_step")
        if not isinstance(saved_zeroing, bool):
            raise ValueError(f"the state's zero_grad_after_step is malformed: {saved_zeroing!r}")
        if saved_zeroing != self._zero_grad_after_step:
            raise ValueError(
                f"the state was saved by a context with zero_grad_after_step={saved_zeroing}, this one has "
                f"zero_grad_after_step={self._zero_grad_after_step}: load it into a context of the same setting"
            )
        windows = state_dict.get("optimizers")
        if not isinstance(windows, list) or len(windows) != len(self.wrappers):
            count = len(windows) if isinstance(windows, list) else "no"
            raise ValueError(f"the state holds {count} optimizers, this context wraps {len(self.wrappers)}")
        for index, (wrapper, window) in enumerate(zip(self.wrappers, windows, strict=True)):
            problem = wrapper.window_state_problem(window)
            if problem is not None:
                raise ValueError(f"optimizer {index} of the state does not fit: {problem}")
        if (state_dict.get("scaler") is None) != (self.scaler is None):
            raise ValueError("the state's loss-scaler state does not match this context's precision")
        pending = state_dict.get("pending_update")
        if pending is not None and not (isinstance(pending, dict) and isinstance(pending.get("found_inf"), bool)):
            raise ValueError(f"the state's pending loss-scaler update is malformed: {pending!r}")
        saved_every = state_dict.get("accumulate_grad_batches")
        if type(saved_every) is not int or saved_every < 1:
            raise ValueError(f"the state's accumulate_grad_batches is malformed: {saved_every!r}")
        if self.scaler is not None and saved_every != self._accumulate_grad_batches:
            open_windows = [index for index, window in enumerate(windows) if _holds_gradients(window)]
            if open_windows:
                raise ValueError(
                    f"the state was saved with accumulate_grad_batches={saved_every} and windows open (optimizers "
                    f"{open_windows}): under 16-mixed their gradients are scaled by 1/{saved_every}, and this "
                    f"context divides by {self._accumulate_grad_batches}; load it with the same setting"
                )
        if self.scaler is not None:
            self.scaler.load_state_dict(state_dict["scaler"])
            self.scaler_stepped, self.found_inf = pending is not None, False
            self.restored_found_inf = None if pending is None else pending["found_inf"]
        with self.noting_gradients():
            for wrapper, window in zip(self.wrappers, windows, strict=True):
                wrapper.load_window_state(window)


def _positive_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _holds_gradients(window: dict[str, Any]) -> bool:
    """Whether a saved window is open: micro-steps accumulated, or gradients of a backward not stepped yet."""
    return window["micro_steps"] > 0 or any(grad is not None for grad in window["grads"])


@contextmanager
def _autocast(device_type: str, dtype: torch.dtype) -> Iterator[None]:
    # No weight cache: a forward after a real step in the same region casts the stepped parameters (PREC-004).
    with torch.autocast(device_type=device_type, dtype=dtype, cache_enabled=False):
        yield


@contextmanager
def _closing(stack: ExitStack) -> Iterator[None]:
    with stack:
        yield


class HookHandle:
    """Removes one registration's hooks."""

    def __init__(self, hooks: dict[int, dict[str, Callable[..., None]]], key: int) -> None:
        self._hooks, self._key = hooks, key

    def remove(self) -> None:
        """The hooks of this registration stop running."""
        self._hooks.pop(self._key, None)
