"""Checks of where forward and backward passes run relative to autocast.

PREC-004: a forward after a real step inside the context's autocast region sees the parameters that step produced
(autocast's weight cache would hand it the casts made before the step). BWD-002: a wrapper's ``backward`` runs
autograd, and its hooks, with autocast off, wherever it is called. The oracles are the recipe that torch documents
and Lightning runs: plain ``torch.autocast(..., cache_enabled=False)`` around forward passes, backward passes
outside it, and under 16-mixed one plain ``GradScaler`` (``scaler.scale(loss / N)``, AMP-007).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
import torch

from lightning_optimizer.conformance.gan import LOW_DTYPES, assert_outside_autocast, check_gan_in_regions, probe
from lightning_optimizer.conformance.harness import (
    assert_params_close,
    cell_device,
    cell_dtype,
    oracle_autocast,
    oracle_scaler,
    oracle_step_done,
)
from lightning_optimizer.conformance.oracles import expected_outcomes, oracle_copy
from lightning_optimizer.conformance.plain_loop import real_step, scaled_backward, update_scaler
from lightning_optimizer.spec import Cell, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S = StepOutcome.ACCUMULATED, StepOutcome.STEPPED

# -- PREC-004: a GAN iteration in one autocast region -------------------------------------------------------------


GEN_CLOSES = (False, True, False, True, True)
"""The generator's ``make_optimizer_step`` per batch: windows {0, 1}, {2, 3}, {4}; the discriminator's is True."""


GAN_REGIONS = [("closure", "iteration"), ("closure", "epoch"), ("toggle", "iteration"), ("toggle", "epoch")]
"""The call form, and where the loop opens ``context.autocast()``: around each iteration, or around the epoch."""

GAN_VARIES: dict[str, tuple[str, ...]] = {
    "wrappers": ("2",),
    "optimizer": ("Adam", "SGD momentum"),
    "window": ("1 micro-step", "k >= 2 micro-steps", "open while another optimizer steps"),
    "make_optimizer_step": ("True", "False"),
}


@pytest.mark.requirement("PREC-004", "BWD-002", "STEP-001", "STEP-002", "ACC-001", "TOGGLE-001")
@pytest.mark.cells(precisions=("32-true", "bf16-mixed", "16-mixed"))
@pytest.mark.parametrize(("form", "around"), GAN_REGIONS, ids=[f"{form}-{around}" for form, around in GAN_REGIONS])
@pytest.mark.varies(**GAN_VARIES, call_form=("closure, wrapper.backward", "toggle_model block, then step()"))
def test_gan_iteration_in_one_autocast_region(make_context: MakeContext, cell: Cell, around: str, form: str) -> None:
    """A GAN whose generator steps before the discriminator's forward, all inside one ``context.autocast()``.

    The region spans each iteration (as Lightning's ``training_step``) or the whole epoch (a loop written inside
    one ``with``). The generator accumulates windows of two, the discriminator steps every batch and re-runs the
    generator after its step: that forward must see the generator's new parameters (PREC-004), which a cast cached
    by the region before the step would not give. Every backward through the discriminator runs outside autocast
    (BWD-002). The oracle is the plain loop with ``torch.autocast(cache_enabled=False)`` and backward passes outside
    it; parameters are compared after every batch. In 32-true the region casts nothing (the control); 64-true,
    bf16-true and 16-true, which open no region either (PREC-001, PREC-002), would repeat it.
    """
    check_gan_in_regions(make_context, cell, form, around, GEN_CLOSES)


@pytest.mark.requirement("PREC-004", "BWD-002")
@pytest.mark.cells(precisions=("bf16-mixed", "16-mixed"))
@pytest.mark.varies(**GAN_VARIES, call_form=("closure, wrapper.backward",))
def test_closures_in_a_region_the_user_opened_cast_anew(make_context: MakeContext, cell: Cell) -> None:
    """The GAN's closures inside the user's own ``torch.autocast`` (weight cache on, torch's default) per iteration.

    The closures run in the context's region all the same, whose casts are fresh (PREC-004): a region that took
    its cache setting from the user's would hand the discriminator's closure the generator's weights from before
    its step. (In a true precision the context opens no region of its own inside the user's: not a cell here.)
    """
    check_gan_in_regions(make_context, cell, "closure", "own-region", GEN_CLOSES)


# -- BWD-002: the backward outside autocast, wherever it is called ------------------------------------------------


OFFSET = 64.0
"""Added to the float32 head's input: under autocast its backward would round that input to the low precision."""


class _Float32Head(torch.nn.Module):
    """A body under autocast, then a head its forward runs in float32 with autocast off (a precision-sensitive part).

    Run under autocast, the head's backward would compute its weight gradient from a low-precision copy of its input;
    the loss's gradients cancel over the batch, so that rounding is most of the result.
    """

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(23)
        self.body = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 2)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = probe(self.body(x), self.seen)
        with torch.autocast(x.device.type, enabled=False):
            out: torch.Tensor = self.head(hidden.to(self.head.weight.dtype) + OFFSET)
        return out


def _spread(out: torch.Tensor) -> torch.Tensor:
    """The spread of the outputs around their batch mean (its gradients sum to zero over the batch)."""
    return (out - out.mean(0)).pow(2).mean()


def _head_inputs(cell: Cell, count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(31)
    return [torch.randn(6, 4, generator=generator).to(cell_device(cell), cell_dtype(cell)) for _ in range(count)]


def _own_region(cell: Cell) -> AbstractContextManager[None]:
    """A region the user opens: the precision's autocast dtype, or bfloat16 autocast in a true precision."""
    return torch.autocast(cell_device(cell).type, dtype=LOW_DTYPES.get(cell.precision, torch.bfloat16))


HEAD_ACCUMULATE = 2
HEAD_BATCHES = 4


@pytest.mark.requirement("BWD-002", "CLOS-001", "ACC-001")
@pytest.mark.cells(precisions=("32-true", "bf16-mixed", "16-mixed"))
@pytest.mark.parametrize("where", ["closure", "context-region", "own-region"])
@pytest.mark.varies(
    call_form=("closure, wrapper.backward", "backward, then step()"),
    window=("k >= 2 micro-steps",),
    make_optimizer_step=("None",),
    position=("inside batch()",),
)
def test_backward_runs_outside_autocast(make_context: MakeContext, cell: Cell, where: str) -> None:
    """``wrapper.backward`` runs autograd with autocast off: in a closure, in ``context.autocast()``, in the user's.

    ``closure``: the automatic-style closure (its forward relies on the region the closure runs in, CLOS-001; its
    backward through the wrapper). ``context-region``: forward and ``backward`` inside ``context.autocast()``, then
    ``step()``. ``own-region``: the same inside a ``torch.autocast`` the user opened (in true precisions too). A
    probe in the model records where each backward ran; the parameters after two windows of two are the recipe's,
    whose backward runs outside autocast (inside it, the float32 head's weight gradient would be computed from a
    low-precision copy of its input).
    """
    context = make_context(accumulate_grad_batches=HEAD_ACCUMULATE)
    base = _Float32Head()
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    assert isinstance(model, _Float32Head)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=1.0))
    inputs = _head_inputs(cell, HEAD_BATCHES)
    outcomes = []
    for batch_idx, x in enumerate(inputs):
        with context.batch(batch_idx, is_last=batch_idx == HEAD_BATCHES - 1):
            if where == "closure":

                def closure(x: torch.Tensor = x) -> torch.Tensor:
                    loss = _spread(model(x))
                    wrapper.backward(loss)
                    return loss

                wrapper.step(closure)
            else:
                with context.autocast() if where == "context-region" else _own_region(cell):
                    wrapper.backward(_spread(model(x)))
                wrapper.step()
            outcomes.append(wrapper.last_outcome)
    assert_outside_autocast(model.seen, f"wrapper.backward ({where})", HEAD_BATCHES)

    plain, scaler, stepped = torch.optim.SGD(oracle.parameters(), lr=1.0), oracle_scaler(cell), []
    for window in ([0, 1], [2, 3]):
        for batch_idx in window:
            with _own_region(cell) if where == "own-region" else oracle_autocast(cell):
                loss = _spread(oracle(inputs[batch_idx]))
            scaled_backward(loss, scaler, HEAD_ACCUMULATE)
        real_step(plain, len(window), scaler, HEAD_ACCUMULATE)
        stepped.append(update_scaler(scaler) >= 1.0)
        oracle_step_done(cell)
    assert outcomes == expected_outcomes([A, S, A, S], stepped), f"outcomes were {outcomes} ({where})"
    assert_params_close(
        model,
        oracle,
        cell,
        f"two windows of two, backward through the wrapper ({where}), against the recipe's backward outside autocast",
    )


@pytest.mark.requirement("BWD-002", "HOOK-001")
@pytest.mark.features("hooks")
@pytest.mark.cells(precisions=("bf16-mixed", "16-mixed"))
@pytest.mark.parametrize("where", ["closure", "context-region"])
@pytest.mark.varies(call_form=("closure, wrapper.backward", "backward, then step()"), window=("1 micro-step",))
def test_backward_hooks_run_outside_autocast(make_context: MakeContext, cell: Cell, where: str) -> None:
    """``before_backward`` and ``after_backward`` run outside autocast too, as the backward between them does."""
    context = make_context()
    model = context.prepare_module(_Float32Head())
    assert isinstance(model, _Float32Head)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    device_type = cell_device(cell).type
    before: list[bool] = []
    after: list[bool] = []
    handle = context.register_hooks(
        before_backward=lambda w, loss: before.append(torch.is_autocast_enabled(device_type)),
        after_backward=lambda w, loss: after.append(torch.is_autocast_enabled(device_type)),
    )
    try:
        x = _head_inputs(cell, 1)[0]
        with context.batch(0, is_last=True):
            if where == "closure":

                def closure() -> torch.Tensor:
                    loss = _spread(model(x))
                    wrapper.backward(loss)
                    return loss

                wrapper.step(closure)
            else:
                with context.autocast():
                    wrapper.backward(_spread(model(x)))
                wrapper.step()
    finally:
        handle.remove()
    assert_outside_autocast(model.seen, f"wrapper.backward ({where})", 1)
    assert before == [False] and after == [False], (
        f"{where}: the backward hooks saw autocast {'on' if any(before + after) else 'off'} (before_backward: "
        f"{before}, after_backward: {after}); they run outside autocast, as the backward between them (BWD-002)"
    )
