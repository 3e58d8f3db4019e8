"""The context's own checkpoint: its format, the whole state checked before any of it loads [CKPT-002, CKPT-003].

A state holds the format, the precision, the world size, the failure policy [FAIL-006], the zeroing setting
[ZERO-007], the loss divisor of open 16-mixed windows [AMP-007], the loss scaler (its pending update too, CKPT-004)
and, per optimizer, its counts, its parameters' shapes, its open window's gradients in the data parallelism's own
layout (:mod:`.parallel`) and the gradients its window carries from the last real step (this rank's part).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from lightning_optimizer.reference.parallel import as_shard_of, distributed_world_size, local_shard
from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.windows import check_count

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

__all__ = ["STATE_FORMAT", "StateFormat", "copy_state", "restore_copy"]

STATE_FORMAT = 7


class StateFormat:
    """Saves a context's state, and loads one after checking all of it."""

    def save(self, context: TrainingContext) -> dict[str, Any]:
        """Window positions, step counts, the open windows' gradients, the loss scaler, the policy."""
        parts = context.parts
        return {
            "format": STATE_FORMAT,
            "precision": context.precision,
            "world_size": distributed_world_size(),
            "on_failure": context.on_failure,
            "zero_grad_after_step": context.zero_grad_after_step,
            "window_divisor": context.parts.scaling.window_divisor(context.accumulate_grad_batches),
            "scaler": parts.scaling.state_dict(),
            "optimizers": [
                {"pending": window.length, "steps": window.steps, "shapes": [list(p.shape) for p in window.params()]}
                | parts.parallel.open_window_state(window)
                | {"carried": _carried_state(window)}
                for window in context.windows.all
            ],
        }

    def load(self, context: TrainingContext, state: object) -> None:
        """Restore what :meth:`save` saved; every entry is checked before anything changes."""
        entries = self.check(context, state)
        assert isinstance(state, dict)
        context.parts.scaling.load_state_dict(state["scaler"])
        for window, entry in zip(context.windows.all, entries, strict=True):
            window.length, window.steps = entry["pending"], entry["steps"]  # last_outcome is not state [STEP-004]
            _load_carried(window, entry["carried"])
        context.parts.parallel.load_windows(context.windows.all, entries)

    def check(self, context: TrainingContext, state: object) -> list[dict[str, Any]]:
        """Raise ``ValueError`` unless ``state`` loads into ``context``; each optimizer's entry otherwise."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            found = state.get("format") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a training-context state of format {STATE_FORMAT} (got {found!r})")
        if state.get("precision") != context.precision:
            saved = state.get("precision")
            raise ValueError(f"the state was saved under precision {saved!r}, this context runs {context.precision!r}")
        if state.get("on_failure") != context.on_failure:
            raise ValueError(
                f"the state was saved by a context with on_failure={state.get('on_failure')!r}, this one has "
                f"on_failure={context.on_failure!r}: load it into a context built with the same policy"
            )
        if state.get("zero_grad_after_step") is not context.zero_grad_after_step:
            raise ValueError(
                f"the state was saved by a context with zero_grad_after_step={state.get('zero_grad_after_step')!r}, "
                f"this one has zero_grad_after_step={context.zero_grad_after_step!r}: load it into a context built "
                "with the same setting"
            )
        context.parts.scaling.check_state(state.get("scaler"))
        _check_world_size(state)
        _check_window_divisor(state, context.parts.scaling.window_divisor(context.accumulate_grad_batches))
        entries = state.get("optimizers")
        windows = context.windows.all
        if not isinstance(entries, list) or len(entries) != len(windows):
            count = len(entries) if isinstance(entries, list) else "no"
            raise ValueError(
                f"the state holds {count} optimizers, this context wraps {len(windows)}: wrap the same "
                "optimizers, in the same order, before loading"
            )
        for i, (window, entry) in enumerate(zip(windows, entries, strict=True)):
            if not isinstance(entry, dict):
                raise ValueError(f"optimizer {i}: the state's entry is a {type(entry).__name__}, not a dict")
            self.check_layout(context, i, window, entry)
            for key in ("pending", "steps"):
                check_count(f"optimizer {i}: {key!r}", entry.get(key))
        return entries

    def check_layout(self, context: TrainingContext, index: int, window: Window, entry: dict[str, Any]) -> None:
        """Refuse an optimizer's saved entry for other parameters: their count and shapes, open window or not."""
        params = window.params()
        shapes, grads = entry.get("shapes"), entry.get("grads")
        if not isinstance(shapes, list) or not isinstance(grads, list) or len(shapes) != len(params):
            count = len(shapes) if isinstance(shapes, list) else "no"
            raise ValueError(f"optimizer {index}: the state holds {count} parameter shapes, it has {len(params)}")
        if len(grads) != len(params):
            raise ValueError(f"optimizer {index}: the state's gradients do not match its {len(params)} parameters")
        context.parts.parallel.check_window_state(index, params, entry)
        _check_carried(index, params, entry.get("carried"))
        for j, (param, shape, grad) in enumerate(zip(params, shapes, grads, strict=True)):
            if shape != list(param.shape):
                raise ValueError(
                    f"optimizer {index}, parameter {j}: saved for shape {shape}, this one is {list(param.shape)}"
                )
            if grad is not None and (not isinstance(grad, torch.Tensor) or grad.shape != param.shape):
                what = getattr(grad, "shape", type(grad).__name__)
                raise ValueError(f"optimizer {index}, parameter {j}: saved gradient {what} for a {param.shape} param")


def _carried_state(window: Window) -> list[torch.Tensor | None]:
    """What the window carries from the last real step, per parameter (this rank's part) [ZERO-007]."""
    carried = window.carried or {}
    return [None if (grad := carried.get(p)) is None else local_shard(grad).detach().clone() for p in window.params()]


def _check_carried(index: int, params: list[torch.Tensor], carried: object) -> None:
    """Refuse a carried part that is not one tensor or ``None`` per parameter, each of this rank's shape."""
    if not isinstance(carried, list) or len(carried) != len(params):
        count = len(carried) if isinstance(carried, list) else type(carried).__name__
        raise ValueError(
            f"optimizer {index}: the state's carried gradients must be a list of {len(params)} entries, got {count}"
        )
    for j, (param, grad) in enumerate(zip(params, carried, strict=True)):
        local = local_shard(param)
        if grad is not None and (not isinstance(grad, torch.Tensor) or grad.shape != local.shape):
            what = getattr(grad, "shape", type(grad).__name__)
            raise ValueError(
                f"optimizer {index}, parameter {j}: saved carried gradient {what} for a {local.shape} part"
            )


def _load_carried(window: Window, carried: list[torch.Tensor | None]) -> None:
    """Give the window the carried part of the state (checked already); nothing of the last step is left now."""
    loaded = {
        param: as_shard_of(param, grad)
        for param, grad in zip(window.params(), carried, strict=True)
        if grad is not None
    }
    window.carried = loaded or None
    window.left = None


def _open(state: dict[str, Any]) -> bool:
    entries = state.get("optimizers")
    return isinstance(entries, list) and any(isinstance(e, dict) and e.get("pending") for e in entries)


def _check_world_size(state: dict[str, Any]) -> None:
    """Refuse open windows saved at another world size: each rank's part is its own batches' [FSDP-006]."""
    saved, now = state.get("world_size"), distributed_world_size()
    if not isinstance(saved, int) or isinstance(saved, bool) or saved < 1:
        raise ValueError(f"the state's world_size must be a positive int, got {saved!r}")
    if saved != now and _open(state):
        raise ValueError(
            f"the state was saved at world size {saved} with a window open; this run has {now} ranks. Each rank's "
            f"part of an open window is its own batches' gradient: resume at world size {saved}, or save after "
            "a real step closed every window"
        )


def _check_window_divisor(state: dict[str, Any], now: int) -> None:
    """Refuse open windows whose gradients carry another loss divisor (16-mixed, another N) [AMP-007]."""
    saved = state.get("window_divisor")
    if not isinstance(saved, int) or isinstance(saved, bool) or saved < 1:
        raise ValueError(f"the state's window_divisor must be a positive int, got {saved!r}")
    if saved != now and _open(state):
        raise ValueError(
            f"the state was saved with a window open whose 16-mixed losses were divided by accumulate_grad_batches="
            f"{saved}; this context divides by {now}: resume with accumulate_grad_batches={saved}, or save after a "
            "real step closed every window"
        )


def copy_state(context: TrainingContext) -> dict[str, Any]:
    """What a pickle or deepcopy of ``context`` carries [PICKLE-001]: all but the hooks and the loop position.

    Gradients are not part of a pickled tensor: those of open windows are carried explicitly. The copy resumes in a
    ``batch()`` of its own, as a loaded checkpoint does; hooks are the framework's that registered them.
    """
    from lightning_optimizer.reference.hooks import Hooks

    state = context.__dict__.copy()
    state["parts"] = dataclasses.replace(context.parts, hooks=Hooks())
    state["_open_window_grads"] = [
        [None if window.length == 0 or p.grad is None else p.grad.detach() for p in window.params()]
        for window in context.windows.all
    ]
    return state


def restore_copy(context: TrainingContext, state: dict[str, Any]) -> None:
    """Make ``context`` the copy that :func:`copy_state` described."""
    from lightning_optimizer.reference.refusals import record_wrap

    grads = state.pop("_open_window_grads")
    context.__dict__.update(state)
    for window, window_grads in zip(context.windows.all, grads, strict=True):
        record_wrap(window.optimizer, context)
        for param, grad in zip(window.params(), window_grads, strict=True):
            if grad is not None:
                param.grad = grad.clone()
