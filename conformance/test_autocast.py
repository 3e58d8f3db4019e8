"""Checks of where forward and backward passes run relative to autocast.

PREC-004: a forward after a real step inside the context's autocast region sees the parameters that step produced
(autocast's weight cache would hand it the casts made before the step). BWD-002: a wrapper's ``backward`` runs
autograd, and its hooks, with autocast off, wherever it is called. The oracles are the recipe that torch documents
and Lightning runs: plain ``torch.autocast(..., cache_enabled=False)`` around forward passes, backward passes
outside it, and under 16-mixed one plain ``GradScaler`` (``scaler.scale(loss / N)``, AMP-007).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from typing import Any

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.harness import (
    assert_params_close,
    cell_device,
    cell_dtype,
    oracle_autocast,
    oracle_scaler,
    oracle_step_done,
    tolerance_for,
)
from lightning_optimizer.conformance.oracles import expected_outcomes, oracle_copy
from lightning_optimizer.conformance.plain_loop import real_step, scaled_backward, update_scaler
from lightning_optimizer.spec import Cell, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S = StepOutcome.ACCUMULATED, StepOutcome.STEPPED

LOW_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
"""The dtype autocast computes in, per mixed precision."""


class _AutocastProbe(torch.autograd.Function):
    """The identity; its backward records whether autocast is on for the gradient's device."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, seen: list[bool]) -> torch.Tensor:
        ctx.seen = seen
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.seen.append(torch.is_autocast_enabled(grad.device.type))
        return grad, None


def _probe(tensor: torch.Tensor, seen: list[bool]) -> torch.Tensor:
    out: torch.Tensor = _AutocastProbe.apply(tensor, seen)  # type: ignore[no-untyped-call]
    return out


def _assert_outside(seen: list[bool], what: str, count: int | None = None) -> None:
    assert seen, f"{what}: no backward reached the probe"
    if count is not None:
        assert len(seen) == count, f"{what}: {len(seen)} backward passes reached the probe, expected {count}"
    inside = [i for i, enabled in enumerate(seen) if enabled]
    assert not inside, (
        f"{what}: backward passes {inside} of {len(seen)} ran with autocast on; a wrapper's backward runs autograd "
        "outside autocast wherever it is called (BWD-002)"
    )


# -- PREC-004: a GAN iteration in one autocast region -------------------------------------------------------------


class _Gan(torch.nn.Module):
    """A generator and a discriminator; the discriminator records where each backward through it runs."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(17)
        self.generator = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 4))
        self.discriminator = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        self.seen: list[bool] = []

    def judge(self, samples: torch.Tensor) -> torch.Tensor:
        judged: torch.Tensor = self.discriminator(_probe(samples, self.seen))
        return judged


def _gen_loss(model: _Gan, noise: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.softplus(-model.judge(model.generator(noise)).float()).mean()


def _dis_loss(model: _Gan, noise: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    fake = model.generator(noise).detach()  # after the generator's step: its new parameters (PREC-004)
    real_term = torch.nn.functional.softplus(-model.judge(real).float()).mean()
    return real_term + torch.nn.functional.softplus(model.judge(fake).float()).mean()


def _fresh_first_layer(layer: torch.nn.Linear, noise: torch.Tensor, cell: Cell) -> torch.Tensor:
    """What the generator's first layer computes from its parameters as they are now, cast by hand."""
    low = LOW_DTYPES.get(cell.precision)
    with torch.no_grad():
        if low is None:
            return torch.nn.functional.linear(noise, layer.weight, layer.bias)
        return torch.nn.functional.linear(noise.to(low), layer.weight.to(low), layer.bias.to(low))


GAN_BATCHES = 5
GEN_CLOSES = (False, True, False, True, True)
"""The generator's ``make_optimizer_step`` per batch: windows {0, 1}, {2, 3}, {4}; the discriminator's is True."""


def _gan_batches(cell: Cell) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(29)
    device, dtype = cell_device(cell), cell_dtype(cell)
    return [
        (
            torch.randn(6, 3, generator=generator).to(device, dtype),
            (torch.randn(6, 4, generator=generator) + 1.0).to(device, dtype),
        )
        for _ in range(GAN_BATCHES)
    ]


@contextmanager
def _region(enter: Callable[[], AbstractContextManager[None]], around: str, where: str) -> Iterator[None]:
    """``enter()`` if the region spans ``where`` (``"iteration"`` or ``"epoch"``), else nothing."""
    with enter() if around == where else nullcontext():
        yield


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
    it; parameters are compared after every batch. In 32-true the region casts nothing (the control); 64-true and
    bf16-true would repeat it.
    """
    _gan_scenario(make_context, cell, form, around)


@pytest.mark.requirement("PREC-004", "BWD-002")
@pytest.mark.cells(precisions=("bf16-mixed", "16-mixed"))
@pytest.mark.varies(**GAN_VARIES, call_form=("closure, wrapper.backward",))
def test_closures_in_a_region_the_user_opened_cast_anew(make_context: MakeContext, cell: Cell) -> None:
    """The GAN's closures inside the user's own ``torch.autocast`` (weight cache on, torch's default) per iteration.

    The closures run in the context's region all the same, whose casts are fresh (PREC-004): a region that took
    its cache setting from the user's would hand the discriminator's closure the generator's weights from before
    its step. (In a true precision the context opens no region of its own inside the user's: not a cell here.)
    """
    _gan_scenario(make_context, cell, "closure", "own-region")


def _gan_scenario(make_context: MakeContext, cell: Cell, form: str, around: str) -> None:
    """The GAN of the two checks above, against its plain loop (``around``: iteration, epoch or own-region)."""
    low = LOW_DTYPES.get(cell.precision)
    context = make_context()
    base = _Gan()
    oracle = oracle_copy(base, cell)
    assert isinstance(oracle, _Gan)
    model = context.prepare_module(base)
    assert isinstance(model, _Gan)
    opt_gen = context.wrap(torch.optim.Adam(model.generator.parameters(), lr=0.05))
    opt_dis = context.wrap(torch.optim.SGD(model.discriminator.parameters(), lr=0.5, momentum=0.5))
    plain_gen = torch.optim.Adam(oracle.generator.parameters(), lr=0.05)
    plain_dis = torch.optim.SGD(oracle.discriminator.parameters(), lr=0.5, momentum=0.5)
    scaler = oracle_scaler(cell)
    batches = _gan_batches(cell)
    device = cell_device(cell)
    outcomes: list[tuple[StepOutcome | None, StepOutcome | None]] = []
    stepped: list[bool] = []

    def generator_call(noise: torch.Tensor, closes: bool) -> None:
        if form == "closure":

            def gen_closure() -> torch.Tensor:
                loss = _gen_loss(model, noise)
                opt_gen.backward(loss)
                return loss

            opt_gen.step(gen_closure, make_optimizer_step=closes)
            return
        with opt_gen.toggle_model():
            opt_gen.backward(_gen_loss(model, noise))
        opt_gen.step(make_optimizer_step=closes)

    def discriminator_call(noise: torch.Tensor, real: torch.Tensor) -> None:
        if form == "closure":

            def dis_closure() -> torch.Tensor:
                loss = _dis_loss(model, noise, real)
                opt_dis.backward(loss)
                return loss

            opt_dis.step(dis_closure, make_optimizer_step=True)
            return
        with opt_dis.toggle_model():
            opt_dis.backward(_dis_loss(model, noise, real))
        opt_dis.step(make_optimizer_step=True)

    def plain_call(loss_of: Callable[[], torch.Tensor], others: list[torch.nn.Parameter]) -> None:
        for param in others:
            param.requires_grad_(False)
        with oracle_autocast(cell) if own_region else nullcontext():
            loss = loss_of()
        with torch.autocast(device.type, enabled=False):
            scaled_backward(loss, scaler)
        for param in others:
            param.requires_grad_(True)

    def plain_step(optimizer: torch.optim.Optimizer, window: int) -> None:
        stepped.append(real_step(optimizer, window, scaler, check_finite=scaler is not None))

    # The implementation's epoch, then the plain loop's: regions are thread state, and one must not run inside the
    # other's. Parameters after each batch are kept and compared.
    own_region = around == "own-region" and low is not None
    after_batches: list[list[torch.Tensor]] = []
    with context.autocast() if around == "epoch" else nullcontext():
        for batch_idx, (noise, real) in enumerate(batches):
            closes = GEN_CLOSES[batch_idx]
            last = batch_idx == GAN_BATCHES - 1
            own = torch.autocast(device.type, dtype=low) if own_region and low is not None else nullcontext()
            with context.batch(batch_idx, is_last=last), _region(context.autocast, around, "iteration"), own:
                generator_call(noise, closes)
                outcomes.append((opt_gen.last_outcome, opt_dis.last_outcome))
                if closes:
                    first = model.generator[0]
                    assert isinstance(first, torch.nn.Linear)
                    got, want = first(noise), _fresh_first_layer(first, noise, cell)
                    fresh = (
                        torch.allclose(got, want, rtol=1e-2, atol=1e-3)  # XLA fuses, and may round otherwise
                        if cell.device == "xla"
                        else torch.equal(got, want)
                    )
                    assert fresh, (
                        f"{form}, region around the {around}, batch {batch_idx}: the generator's forward after its "
                        "real step, inside the same autocast region, used other parameters than the step produced "
                        f"(max abs diff {(got.double() - want.double()).abs().max().item():.3g}): a cast cached "
                        "before the step (PREC-004)"
                    )
                discriminator_call(noise, real)
                outcomes.append((opt_gen.last_outcome, opt_dis.last_outcome))
            after_batches.append([param.detach().clone() for param in model.parameters()])
    _assert_outside(model.seen, f"{form}, region around the {around}: the backward passes through the discriminator")

    gen_window = 0
    with oracle_autocast(cell) if around == "epoch" else nullcontext():
        for batch_idx, (noise, real) in enumerate(batches):
            closes = GEN_CLOSES[batch_idx]
            # The user's own region: each forward of the plain loop in a cache-free region inside it.
            own = torch.autocast(device.type, dtype=low) if own_region and low is not None else nullcontext()
            with _region(lambda: oracle_autocast(cell), around, "iteration"), own:
                plain_call(partial(_gen_loss, oracle, noise), list(oracle.discriminator.parameters()))
                gen_window += 1
                if closes:
                    plain_step(plain_gen, gen_window)
                    gen_window = 0
                plain_call(partial(_dis_loss, oracle, noise, real), list(oracle.generator.parameters()))
                plain_step(plain_dis, 1)
            update_scaler(scaler)
            oracle_step_done(cell)
            _assert_close_to(
                after_batches[batch_idx], oracle, cell, f"{form}, region around the {around}, after batch {batch_idx}"
            )

    calls = expected_outcomes([outcome for closes in GEN_CLOSES for outcome in (S if closes else A, S)], stepped)
    want_outcomes: list[tuple[StepOutcome | None, StepOutcome | None]] = []
    latest: list[StepOutcome | None] = [None, None]
    for i, outcome in enumerate(calls):  # the generator's call, then the discriminator's, each batch
        latest[i % 2] = outcome
        want_outcomes.append((latest[0], latest[1]))
    assert outcomes == want_outcomes, f"(generator, discriminator) outcomes were {outcomes}, expected {want_outcomes}"


def _assert_close_to(values: list[torch.Tensor], oracle: torch.nn.Module, cell: Cell, what: str) -> None:
    """``values`` (a module's parameters, in order) are the oracle's, in the cell's tolerance."""
    tol = tolerance_for(cell)
    for (name, want), got in zip(oracle.named_parameters(), values, strict=True):
        got_cpu, want_cpu = got.double().cpu(), want.detach().double().cpu()
        if not torch.allclose(got_cpu, want_cpu, rtol=tol.rtol, atol=tol.atol):
            raise AssertionError(
                f"{what}: parameter {name!r} differs from the plain-PyTorch oracle on {cell.id} "
                f"(max abs diff {(got_cpu - want_cpu).abs().max().item():.3g}, rtol {tol.rtol}, atol {tol.atol})"
            )


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
        hidden = _probe(self.body(x), self.seen)
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
    _assert_outside(model.seen, f"wrapper.backward ({where})", HEAD_BATCHES)

    plain = torch.optim.SGD(oracle.parameters(), lr=1.0)
    scaler = oracle_scaler(cell)
    stepped = []
    for window in ([0, 1], [2, 3]):
        for batch_idx in window:
            with _own_region(cell) if where == "own-region" else oracle_autocast(cell):
                loss = _spread(oracle(inputs[batch_idx]))
            scaled_backward(loss, scaler, HEAD_ACCUMULATE)
        stepped.append(_plain_real_step(plain, len(window), scaler, HEAD_ACCUMULATE))
        oracle_step_done(cell)
    assert outcomes == expected_outcomes([A, S, A, S], stepped), f"outcomes were {outcomes} ({where})"
    assert_params_close(
        model,
        oracle,
        cell,
        f"two windows of two, backward through the wrapper ({where}), against the recipe's backward outside autocast",
    )


def _plain_real_step(optimizer: torch.optim.Optimizer, window: int, scaler: GradScaler | None, accumulate: int) -> bool:
    """The recipe's real step (the window's mean, unscaled, stepped; the scaler updated); whether it stepped."""
    real_step(optimizer, window, scaler, accumulate)
    return update_scaler(scaler) >= 1.0


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
    _assert_outside(model.seen, f"wrapper.backward ({where})", 1)
    assert before == [False] and after == [False], (
        f"{where}: the backward hooks saw autocast {'on' if any(before + after) else 'off'} (before_backward: "
        f"{before}, after_backward: {after}); they run outside autocast, as the backward between them (BWD-002)"
    )
