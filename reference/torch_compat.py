"""Every private field of torch that the reference reads or writes, in one place.

``torch.amp.GradScaler`` keeps per-optimizer stages and found-inf tensors that its public API does not expose, and
an LR scheduler marks the optimizer it patched, and an optimizer that takes the scaler's found-inf into its own
``step`` (the fused ones) says so in a private flag. FSDP2 keeps the gradients that micro-steps without sync
accumulate on its unsharded parameters, which only its private parameter records reach. ``tests/test_bad_inputs.py``
and ``tests/test_fsdp.py`` pin each of these against the torch that runs, so a release that changes them fails
loudly there, not silently in a training run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler, OptState

__all__ = [
    "fsdp_unsharded_params",
    "forget_optimizer",
    "forget_pending",
    "found_inf",
    "has_unscaled",
    "mark_stepped_for_scheduler",
    "plant_found_inf",
    "recorded_found_inf",
    "scaler_device",
    "start_scale",
    "steps_through_inf",
    "version_counter",
    "version_counters",
]


def version_counter(tensor: torch.Tensor) -> int:
    """How many times ``tensor`` was written in place (autograd's version counter, ``Tensor._version``).

    The failure policy tells a call that wrote into a window (a backward accumulating in place) from one that did
    not by it [FAIL-002].
    """
    version: int = tensor._version
    return version


def version_counters(grads: Sequence[torch.Tensor | None]) -> list[int | None]:
    """:func:`version_counter` of each of ``grads`` (``None`` for a missing one), in one call per window."""
    return [None if grad is None else grad._version for grad in grads]


def has_unscaled(scaler: GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``scaler`` already unscaled (or stepped) ``optimizer`` in this iteration."""
    return scaler._per_optimizer_states[id(optimizer)]["stage"] is not OptState.READY


def found_inf(scaler: GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Whether the unscaling of ``optimizer`` in this iteration found non-finite gradients (a device sync)."""
    per_device = scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
    return any(bool(value.item()) for value in per_device.values())


def forget_optimizer(scaler: GradScaler, optimizer: torch.optim.Optimizer) -> None:
    """Drop what ``scaler`` recorded of ``optimizer`` in this iteration (its stage back to ``READY``)."""
    scaler._per_optimizer_states.pop(id(optimizer), None)


def forget_pending(scaler: GradScaler) -> None:
    """Drop everything ``scaler`` recorded in this iteration, as its own ``update()`` does."""
    scaler._per_optimizer_states.clear()


def recorded_found_inf(scaler: GradScaler) -> bool | None:
    """Whether any optimizer's unscaling in this iteration found non-finite gradients; ``None`` if none recorded."""
    values = [
        bool(value.item())
        for state in scaler._per_optimizer_states.values()
        for value in state["found_inf_per_device"].values()
    ]
    return any(values) if values else None


def plant_found_inf(scaler: GradScaler, found: bool, device: torch.device) -> None:
    """Record a found-inf for this iteration's ``update()`` as an unscaling would (a restored iteration's)."""
    state = scaler._per_optimizer_states[id(plant_found_inf)]  # a key no optimizer can have
    state["stage"] = OptState.STEPPED
    state["found_inf_per_device"][device] = torch.full((), 1.0 if found else 0.0, device=device)


def scaler_device(scaler: GradScaler) -> torch.device:
    """The device ``scaler`` was built for."""
    return torch.device(scaler._device)


def start_scale(scaler: GradScaler, device: torch.device) -> None:
    """Create the scale tensor, which an unpickled or freshly loaded ``GradScaler`` makes only in ``scale()``."""
    if scaler._scale is None:
        scaler._lazy_init_scale_growth_tracker(device)


def mark_stepped_for_scheduler(optimizer: torch.optim.Optimizer) -> None:
    """Tell an LR scheduler built on ``optimizer`` that it stepped, when the step was skipped for non-finite grads."""
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        optimizer._opt_called = True  # type: ignore[attr-defined]


def steps_through_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``GradScaler.step`` calls this optimizer's ``step`` even on non-finite gradients (fused optimizers).

    Such an optimizer gets the found-inf and skips its update inside its kernels, but its ``step`` (and so the step
    hooks around it) runs.
    """
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def fsdp_unsharded_params(module: torch.nn.Module) -> dict[torch.Tensor, torch.Tensor]:
    """For each sharded parameter that ``module`` (an ``FSDPModule``, not recursive) manages, its unsharded parameter.

    Autograd accumulates a backward without gradient sync into the unsharded parameter's ``.grad``; FSDP2 creates
    the unsharded parameter at the first all-gather, so a parameter not gathered yet has none here. A mixed
    precision policy whose reduce dtype differs from the parameter dtype keeps that sum elsewhere
    (``unsharded_accumulated_grad``): :func:`fsdp_accumulates_elsewhere` says so.
    """
    group = module._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
    if group is None:
        return {}
    found: dict[torch.Tensor, torch.Tensor] = {}
    for record in group.fsdp_params:
        unsharded: Any = getattr(record, "_unsharded_param", None)
        if unsharded is not None:
            found[record.sharded_param] = unsharded
    return found


def fsdp_accumulates_elsewhere(module: torch.nn.Module) -> bool:
    """Whether ``module``'s FSDP2 policy accumulates unsynced gradients outside the unsharded ``.grad``."""
    group = module._get_fsdp_state()._fsdp_param_group  # type: ignore[operator]
    if group is None:
        return False
    policy = group.mp_policy
    if policy.reduce_dtype is None:
        return False
    records = group.fsdp_params
    return any(policy.reduce_dtype != (policy.param_dtype or record.sharded_param.dtype) for record in records)
