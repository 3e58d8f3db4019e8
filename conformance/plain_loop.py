"""The plain PyTorch training loop that every oracle of the suite builds on.

Written from PyTorch's documentation alone (never from an implementation): a bare ``torch.optim`` optimizer, plain
``torch.autocast`` and, under 16-mixed, a plain ``torch.amp.GradScaler`` used as torch's AMP recipe uses it with
gradient accumulation. One window of micro-steps is:

- each micro-step's backward, under 16-mixed ``scaler.scale(loss / accumulate_grad_batches).backward()``
  [AMP-007] (:func:`scaled_backward`);
- the real step: the window's mean [ACC-001] (:func:`window_mean`), a data-parallel reduction where the caller
  has one, under 16-mixed ``scaler.unscale_`` once [AMP-002], clipping [CLIP-001], then ``optimizer.step()`` or
  ``scaler.step`` (which skips a step whose unscaled gradients are not finite [AMP-004]) and
  ``zero_grad(set_to_none=True)`` (:func:`real_step`);
- at the end of the iteration, the scaler's one update [AMP-003], every gradient a window still holds brought to
  the new scale [AMP-006] (:func:`update_scaler`);
- on XLA, the graph cut after each step (``oracle_step_done``).

With ``zero_grad_after_step=False`` (ZERO-003 to ZERO-007) a taken step's gradients stay where the step left them
until the user's ``zero_grad()``; the next window takes them aside as its carried part (:func:`take_gradients`),
accumulates its own micro-steps from none, and its real step adds the carried part back after the mean and
``unscale_``, before clipping (:func:`add_carried`, ``real_step(carried=...)``): the carried part is not divided,
unscaled or rescaled again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.harness import (
    LOSS_FACTOR,
    Batch,
    cell_device,
    cell_dtype,
    mse,
    oracle_autocast,
    oracle_step_done,
)
from lightning_optimizer.spec import Cell, GradScalerSettings

__all__ = [
    "LOSS_FACTOR",
    "Carried",
    "ClipFunction",
    "PlainWindows",
    "PrepareHook",
    "add_carried",
    "clipper",
    "oracle_loss",
    "params_of",
    "plain_scaler",
    "real_step",
    "rescale_grads",
    "scaled_backward",
    "take_gradients",
    "train_windows",
    "unscaled_finite",
    "update_scaler",
    "window_mean",
]

ClipFunction = Callable[[list[torch.Tensor]], object]
"""Clips a list of parameters' gradients in place."""
PrepareHook = Callable[[list[torch.Tensor]], object]
"""Sees the parameters of a real step right before ``step``: their gradients unscaled and clipped."""
Carried = dict[torch.Tensor, torch.Tensor]
"""``zero_grad_after_step=False``: the gradients a window took from its optimizer's last taken step, per parameter."""


def params_of(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every parameter of the optimizer, group by group."""
    return [param for group in optimizer.param_groups for param in group["params"]]


def plain_scaler(cell: Cell, settings: GradScalerSettings | None = None) -> GradScaler | None:
    """Under 16-mixed a fresh ``torch.amp.GradScaler`` with ``settings`` (default ones without), else ``None``."""
    if cell.precision != "16-mixed":
        return None
    device = cell_device(cell).type
    return GradScaler(device) if settings is None else GradScaler(device, **settings.as_kwargs())


def clipper(algorithm: str, value: float) -> ClipFunction:
    """``clip_grad_norm_`` (``"norm"``: the total norm over the given parameters) or ``clip_grad_value_``."""

    def clip(params: list[torch.Tensor]) -> None:
        with_grads = [param for param in params if param.grad is not None]
        if algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(with_grads, value)
        else:
            torch.nn.utils.clip_grad_value_(with_grads, value)

    return clip


def oracle_loss(
    model: torch.nn.Module, batch: Batch, cell: Cell, blow_up: bool = False, factor: float = LOSS_FACTOR
) -> torch.Tensor:
    """``factor`` times the model's MSE on ``batch`` under the cell's plain autocast; infinite with ``blow_up``."""
    with oracle_autocast(cell):
        loss = mse(model, batch, cell_device(cell), cell_dtype(cell)) * factor
    return loss * float("inf") if blow_up else loss


def scaled_backward(
    loss: torch.Tensor, scaler: GradScaler | None, accumulate: int = 1, *, scales: list[float] | None = None
) -> None:
    """A micro-step's backward as torch's AMP recipe runs it: under 16-mixed ``scaler.scale(loss / N)`` [AMP-007].

    Call it outside the forward's autocast region [BWD-002]. ``scales`` receives, under 16-mixed only, the factor
    the loss is backpropagated by (the gradient reaching it).
    """
    if scales is not None and scaler is not None:
        loss.register_hook(lambda grad: scales.append(float(grad)))
    if scaler is None:
        loss.backward()
    else:
        scaler.scale(loss / accumulate).backward()


def window_mean(
    params: Iterable[torch.Tensor], window_length: int, scaler: GradScaler | None, accumulate: int = 1
) -> None:
    """The window's mean [ACC-001] from the sum that :func:`scaled_backward` accumulated, in place.

    Under 16-mixed each micro-step was divided by ``accumulate`` already: the sum is multiplied by
    ``accumulate / window_length``; otherwise it is divided by ``window_length``.
    """
    divided_by = 1 if scaler is None else accumulate
    if window_length == divided_by:
        return
    with torch.no_grad():
        for param in params:
            if param.grad is not None:
                if divided_by == 1:
                    param.grad /= window_length
                else:
                    param.grad *= divided_by / window_length


def take_gradients(params: Iterable[torch.Tensor]) -> Carried:
    """What a window takes from the last taken step [ZERO-005]: each gradient moved aside, its ``.grad`` ``None``."""
    carried: Carried = {}
    for param in params:
        if param.grad is not None:
            carried[param] = param.grad
            param.grad = None
    return carried


def add_carried(carried: Carried | None) -> None:
    """Add the carried gradients back onto the parameters' (as they are: after the mean and ``unscale_``) [ZERO-005]."""
    with torch.no_grad():
        for param, grad in (carried or {}).items():
            if param.grad is None:
                param.grad = grad.clone()
            else:
                param.grad.add_(grad)


def unscaled_finite(params: Iterable[torch.Tensor]) -> bool:
    """Whether every present gradient is finite (read after ``unscale_``: whether ``scaler.step`` steps)."""
    return all(bool(torch.isfinite(param.grad).all()) for param in params if param.grad is not None)


def real_step(
    optimizer: torch.optim.Optimizer,
    window_length: int,
    scaler: GradScaler | None,
    accumulate: int = 1,
    *,
    reduce: PrepareHook | None = None,
    clip: ClipFunction | None = None,
    after_prepare: PrepareHook | None = None,
    check_finite: bool = False,
    prepared: bool = False,
    carried: Carried | None = None,
    clear: bool = True,
) -> bool:
    """The documented loop's real step: the window's mean, ``reduce``, ``unscale_``, clip, (inspect), step, zero.

    ``reduce`` stands for a data-parallel reduction of the mean; ``prepared``: the mean was taken and unscaled
    already (as ``unscale_gradients()`` prepares a window). ``carried``: what the window took from the last step,
    added after ``unscale_`` and before clipping; ``clear=False`` (``zero_grad_after_step=False``): a taken step
    leaves its gradients, a skipped one (16-mixed) clears them all the same. Returns whether the unscaled
    gradients were finite (read only with ``check_finite``; ``True`` otherwise).
    """
    params = params_of(optimizer)
    if not prepared:
        window_mean(params, window_length, scaler, accumulate)
        if reduce is not None:
            reduce(params)
        if scaler is not None:
            scaler.unscale_(optimizer)
        add_carried(carried)
    finite = not check_finite or unscaled_finite(params)
    if clip is not None:
        clip(params)
    if after_prepare is not None:
        after_prepare(params)
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
    if clear or not finite:
        optimizer.zero_grad(set_to_none=True)
    return finite


def rescale_grads(params: Iterable[torch.Tensor], factor: float) -> None:
    """An open window brought to a new loss scale: every present gradient multiplied by ``factor``, in place."""
    with torch.no_grad():
        for param in params:
            if param.grad is not None:
                param.grad.mul_(factor)


def update_scaler(scaler: GradScaler | None, open_windows: Iterable[torch.Tensor] = ()) -> float:
    """The end of an iteration in which an optimizer stepped: one ``update`` [AMP-003]; windows follow [AMP-006].

    Returns the scale's factor of change (new over old; 1.0 without a scaler).
    """
    if scaler is None:
        return 1.0
    old = scaler.get_scale()
    scaler.update()
    new = scaler.get_scale()
    if new != old:
        rescale_grads(open_windows, new / old)
    return new / old


class PlainWindows:
    """Optimizers of the plain loop sharing one scaler, each with its own window, closed when the caller says.

    ``lengths`` counts each window's backward passes since its last real step; ``scales`` receives the factor of
    every backward pass (16-mixed); ``prepared`` holds the windows that :meth:`prepare` readied for their step.
    """

    def __init__(
        self,
        cell: Cell,
        optimizers: Sequence[torch.optim.Optimizer],
        scaler: GradScaler | None,
        accumulate: int = 1,
    ) -> None:
        self.cell, self.optimizers, self.scaler, self.accumulate = cell, list(optimizers), scaler, accumulate
        self.lengths = [0] * len(self.optimizers)
        self.scales: list[float] = []
        self.prepared: set[int] = set()
        self.stepped = False

    def backward(self, index: int, loss: torch.Tensor) -> None:
        """A micro-step of window ``index``: :func:`scaled_backward` of ``loss``."""
        scaled_backward(loss, self.scaler, self.accumulate, scales=self.scales)
        self.lengths[index] += 1

    def prepare(self, index: int) -> None:
        """What ``unscale_gradients()`` does to window ``index``: its mean now, under 16-mixed ``scaler.unscale_``.

        Its real step (:meth:`step`) takes the prepared gradients as they are.
        """
        optimizer = self.optimizers[index]
        window_mean(params_of(optimizer), self.lengths[index], self.scaler, self.accumulate)
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        self.prepared.add(index)

    def step(self, index: int, clip: ClipFunction | None = None, after_prepare: PrepareHook | None = None) -> bool:
        """Window ``index``'s :func:`real_step` over its length; returns whether its unscaled gradients were finite."""
        optimizer, length = self.optimizers[index], self.lengths[index]
        finite = real_step(
            optimizer,
            length,
            self.scaler,
            self.accumulate,
            clip=clip,
            after_prepare=after_prepare,
            check_finite=True,
            prepared=index in self.prepared,
        )
        self.lengths[index], self.stepped = 0, True
        self.prepared.discard(index)
        return finite

    def update(self) -> float:
        """The end of an iteration: :func:`update_scaler` of the open windows if one stepped, then the XLA graph cut."""
        held = [p for length, opt in zip(self.lengths, self.optimizers, strict=True) if length for p in params_of(opt)]
        change = update_scaler(self.scaler, held) if self.stepped else 1.0
        self.stepped = False
        oracle_step_done(self.cell)
        return change


def train_windows(
    cell: Cell,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[Batch],
    windows: Sequence[Sequence[int]],
    scaler: GradScaler | None,
    *,
    accumulate: int = 1,
    factor: float = LOSS_FACTOR,
    clip: ClipFunction | None = None,
    after_prepare: PrepareHook | None = None,
    blow_up: frozenset[int] = frozenset(),
    scales: list[float] | None = None,
) -> list[bool]:
    """One optimizer, one real step per window, each an iteration; returns whether each stepped (no back-off).

    ``windows`` are indices into ``batches``; ``accumulate`` is the implementation's ``accumulate_grad_batches``
    (the recipe divides each 16-mixed loss by it); the batches in ``blow_up`` have an infinite loss; ``scales``
    receives the factor of each backward pass (16-mixed).
    """
    stepped = []
    for window in windows:
        for batch_idx in window:
            loss = oracle_loss(model, batches[batch_idx], cell, batch_idx in blow_up, factor)
            scaled_backward(loss, scaler, accumulate, scales=scales)
        real_step(optimizer, len(window), scaler, accumulate, clip=clip, after_prepare=after_prepare)
        stepped.append(update_scaler(scaler) >= 1.0)
        oracle_step_done(cell)
    return stepped
