"""The GAN of the checks of toggling and autocast: its model, batches and losses, a wrapper's call, its plain loop.

The discriminator records, through :func:`probe`, whether autocast was on in each backward pass through it. The
discriminator's loss runs the generator again: after the generator's step, that forward sees its new parameters.
:func:`assert_outside_autocast` checks what a probe saw [BWD-002]; :func:`check_gan_in_regions` runs the GAN inside
one autocast region (around each iteration, the epoch, or the user's own) against its plain loop [PREC-004].
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import torch

from lightning_optimizer.conformance.harness import (
    adam_eps,
    assert_params_close,
    cell_device,
    cell_dtype,
    oracle_autocast,
    oracle_scaler,
    oracle_step_done,
)
from lightning_optimizer.conformance.optimizer_kinds import frozen
from lightning_optimizer.conformance.oracles import expected_outcomes, oracle_copy
from lightning_optimizer.conformance.plain_loop import real_step, scaled_backward, update_scaler
from lightning_optimizer.spec import Cell, OptimizerWrapper, StepOutcome, TrainingContext

__all__ = [
    "LOW_DTYPES",
    "Gan",
    "assert_outside_autocast",
    "check_gan_in_regions",
    "dis_loss",
    "gan_batches",
    "gan_call",
    "gen_loss",
    "plain_gan",
    "probe",
]

GanBatch = tuple[torch.Tensor, torch.Tensor]
Region = Callable[[], AbstractContextManager[Any]]
MakeContext = Callable[..., TrainingContext]
A, S = StepOutcome.ACCUMULATED, StepOutcome.STEPPED

LOW_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
"""The dtype autocast computes in, per mixed precision."""


class _AutocastProbe(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, seen: list[bool]) -> torch.Tensor:
        ctx.seen = seen
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.seen.append(torch.is_autocast_enabled(grad.device.type))
        return grad, None


def probe(tensor: torch.Tensor, seen: list[bool]) -> torch.Tensor:
    """The identity; each backward pass through it appends to ``seen`` whether autocast was on for its device."""
    out: torch.Tensor = _AutocastProbe.apply(tensor, seen)  # type: ignore[no-untyped-call]
    return out


def assert_outside_autocast(seen: list[bool], what: str, count: int | None = None) -> None:
    """A probe's ``seen``: some backward passes (``count`` of them where given), none with autocast on [BWD-002]."""
    assert seen, f"{what}: no backward reached the probe"
    if count is not None:
        assert len(seen) == count, f"{what}: {len(seen)} backward passes reached the probe, expected {count}"
    inside = [i for i, enabled in enumerate(seen) if enabled]
    assert not inside, (
        f"{what}: backward passes {inside} of {len(seen)} ran with autocast on; a wrapper's backward runs autograd "
        "outside autocast wherever it is called (BWD-002)"
    )


class Gan(torch.nn.Module):
    """A seeded generator (3 to 4 features) and discriminator (4 to 1); ``seen`` is the discriminator's probe."""

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
        """The discriminator's verdict on ``samples``, through the probe."""
        judged: torch.Tensor = self.discriminator(probe(samples, self.seen))
        return judged


def gen_loss(gan: Gan, noise: torch.Tensor) -> torch.Tensor:
    """The generator's loss: its samples judged fake."""
    return torch.nn.functional.softplus(-gan.judge(gan.generator(noise)).float()).mean()


def dis_loss(gan: Gan, noise: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The discriminator's loss on ``real`` and on the generator's samples, generated anew (detached)."""
    fake = gan.generator(noise).detach()
    real_term = torch.nn.functional.softplus(-gan.judge(real).float()).mean()
    return real_term + torch.nn.functional.softplus(gan.judge(fake).float()).mean()


def gan_batches(cell: Cell, count: int) -> list[GanBatch]:
    """``count`` seeded ``(noise, real)`` batches of 6, on the cell's device and in its parameter dtype."""
    generator = torch.Generator().manual_seed(29)
    device, dtype = cell_device(cell), cell_dtype(cell)
    return [
        (
            torch.randn(6, 3, generator=generator).to(device, dtype),
            (torch.randn(6, 4, generator=generator) + 1.0).to(device, dtype),
        )
        for _ in range(count)
    ]


def gan_call(
    wrapper: OptimizerWrapper[Any],
    loss_of: Callable[[], torch.Tensor],
    make_optimizer_step: bool,
    form: str = "closure",
    region: Region = nullcontext,
) -> None:
    """One wrapper's call on ``loss_of()``, by ``form``.

    ``"closure"``: ``step(closure)`` whose closure runs the forward in ``region()``, then ``wrapper.backward``;
    ``"toggle"``: the forward and ``wrapper.backward`` in ``toggle_model()``, then ``step()``.
    """
    if form == "closure":

        def closure() -> torch.Tensor:
            with region():
                loss = loss_of()
            wrapper.backward(loss)
            return loss

        wrapper.step(closure, make_optimizer_step=make_optimizer_step)
        return
    with wrapper.toggle_model():
        wrapper.backward(loss_of())
    wrapper.step(make_optimizer_step=make_optimizer_step)


def plain_gan(
    gan: Gan,
    optimizers: tuple[torch.optim.Optimizer, torch.optim.Optimizer],
    batches: Sequence[GanBatch],
    cell: Cell,
    gen_closes: Sequence[bool],
    dis_steps: Sequence[bool],
    region: Region = nullcontext,
) -> Iterator[list[bool]]:
    """The plain GAN loop, batch by batch, in ``region()``; yields whether each real step of the batch stepped.

    The generator's backward every batch, its window's mean stepped where ``gen_closes``; then, where ``dis_steps``,
    the discriminator's backward and step. Each forward runs under the cell's plain autocast, each backward outside
    it with the other half toggled off by hand; under 16-mixed one plain GradScaler serves both, updated once after
    each batch in which one stepped.
    """
    scaler, window = oracle_scaler(cell), 0
    device_type = cell_device(cell).type

    def backward(loss_of: Callable[[], torch.Tensor], other: torch.nn.Module) -> None:
        with frozen(other.parameters()):
            with oracle_autocast(cell):
                loss = loss_of()
            with torch.autocast(device_type, enabled=False):
                scaled_backward(loss, scaler)

    for (noise, real), closes, dis in zip(batches, gen_closes, dis_steps, strict=True):
        stepped = []
        with region():
            backward(partial(gen_loss, gan, noise), gan.discriminator)
            window += 1
            if closes:
                stepped.append(real_step(optimizers[0], window, scaler, check_finite=scaler is not None))
                window = 0
            if dis:
                backward(partial(dis_loss, gan, noise, real), gan.generator)
                stepped.append(real_step(optimizers[1], 1, scaler, check_finite=scaler is not None))
        if stepped:
            update_scaler(scaler)
        oracle_step_done(cell)
        yield stepped


def check_gan_in_regions(
    make_context: MakeContext, cell: Cell, form: str, around: str, gen_closes: Sequence[bool]
) -> None:
    """The GAN in one autocast region against its plain loop: parameters, fresh forwards, backwards, outcomes.

    ``around``: where the loop opens ``context.autocast()`` (``"iteration"``, ``"epoch"``), or ``"own-region"``: the
    user's own ``torch.autocast`` (weight cache on) around each iteration. ``gen_closes``: the generator's
    ``make_optimizer_step`` per batch; the discriminator steps every batch. After the generator's real step its
    forward sees the new parameters [PREC-004]; every backward through the discriminator runs outside autocast
    [BWD-002]; the parameters after every batch, and the outcomes after every call, are the plain loop's.
    """
    low, device_type, count = LOW_DTYPES.get(cell.precision), cell_device(cell).type, len(gen_closes)
    where = f"{form}, region around the {around}"
    context = make_context()
    base = Gan()
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    assert isinstance(model, Gan) and isinstance(oracle, Gan)
    opt_gen = context.wrap(torch.optim.Adam(model.generator.parameters(), lr=0.05, eps=adam_eps(cell)))
    opt_dis = context.wrap(torch.optim.SGD(model.discriminator.parameters(), lr=0.5, momentum=0.5))
    plain = (
        torch.optim.Adam(oracle.generator.parameters(), lr=0.05, eps=adam_eps(cell)),
        torch.optim.SGD(oracle.discriminator.parameters(), lr=0.5, momentum=0.5),
    )
    batches = gan_batches(cell, count)

    def own() -> AbstractContextManager[object]:
        """The user's own region (its weight cache on), around each iteration of both loops."""
        return torch.autocast(device_type, dtype=low) if around == "own-region" and low is not None else nullcontext()

    # The plain loop's epoch, then the implementation's: regions are thread state, and one must not run inside the
    # other's. The oracle's parameters after each batch are kept, and compared after the implementation's batch.
    oracle_after, stepped = [], []
    for ran in plain_gan(oracle, plain, batches, cell, gen_closes, [True] * count, own):
        oracle_after.append(copy.deepcopy(oracle))
        stepped += ran
    outcomes: list[tuple[StepOutcome | None, StepOutcome | None]] = []
    with context.autocast() if around == "epoch" else nullcontext():
        for batch_idx, ((noise, real), closes) in enumerate(zip(batches, gen_closes, strict=True)):
            iteration = context.autocast() if around == "iteration" else nullcontext()
            with context.batch(batch_idx, is_last=batch_idx == count - 1), iteration, own():
                gan_call(opt_gen, partial(gen_loss, model, noise), closes, form)
                outcomes.append((opt_gen.last_outcome, opt_dis.last_outcome))
                if closes:
                    _assert_fresh_forward(model, noise, low, cell, f"{where}, batch {batch_idx}")
                gan_call(opt_dis, partial(dis_loss, model, noise, real), True, form)
                outcomes.append((opt_gen.last_outcome, opt_dis.last_outcome))
            assert_params_close(model, oracle_after[batch_idx], cell, f"{where}, after batch {batch_idx}")
    assert_outside_autocast(model.seen, f"{where}: the backward passes through the discriminator")
    calls = expected_outcomes([outcome for closes in gen_closes for outcome in (S if closes else A, S)], stepped)
    dis_before: list[StepOutcome | None] = [None, *calls[1::2]]  # the generator's call, then the discriminator's
    want_outcomes = [
        pair for i in range(count) for pair in ((calls[2 * i], dis_before[i]), tuple(calls[2 * i : 2 * i + 2]))
    ]
    assert outcomes == want_outcomes, f"(generator, discriminator) outcomes were {outcomes}, expected {want_outcomes}"


def _assert_fresh_forward(model: Gan, noise: torch.Tensor, low: torch.dtype | None, cell: Cell, where: str) -> None:
    """The generator's first layer computes from its parameters as they are now, cast by hand [PREC-004]."""
    first = model.generator[0]
    assert isinstance(first, torch.nn.Linear)
    got = first(noise)
    with torch.no_grad():
        cast = [t if low is None else t.to(low) for t in (noise, first.weight, first.bias)]
        want = torch.nn.functional.linear(*cast)
    fresh = (
        torch.allclose(got, want, rtol=1e-2, atol=1e-3)  # XLA fuses, and may round otherwise
        if cell.device == "xla"
        else torch.equal(got, want)
    )
    assert fresh, (
        f"{where}: the generator's forward after its real step, inside the same "
        "autocast region, used other parameters than the step produced (max abs diff "
        f"{(got.double() - want.double()).abs().max().item():.3g}): a cast cached before the step "
        "(PREC-004)"
    )
