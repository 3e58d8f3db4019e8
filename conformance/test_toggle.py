"""Checks of ``requires_grad`` toggling between the optimizers of one model, and the seed's GAN cadences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.assertions import grads, requires_grad_flags
from lightning_optimizer.conformance.harness import (
    assert_params_close,
    cell_device,
    cell_dtype,
    oracle_autocast,
    oracle_scaler,
    oracle_step_done,
    refuses,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import real_step
from lightning_optimizer.spec import Cell, TrainingContext

MakeContext = Callable[..., TrainingContext]


class _Pair(torch.nn.Module):
    """Two halves, each with its own optimizer; ``shared`` belongs to both."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(3)
        self.a = torch.nn.Parameter(torch.randn(4, generator=generator))
        self.b = torch.nn.Parameter(torch.randn(4, generator=generator))
        self.shared = torch.nn.Parameter(torch.randn(4, generator=generator))
        self.frozen_a = torch.nn.Parameter(torch.randn(4, generator=generator), requires_grad=False)
        self.frozen_b = torch.nn.Parameter(torch.randn(4, generator=generator), requires_grad=False)


def _two_wrappers(make_context: MakeContext) -> tuple[TrainingContext, _Pair, Any, Any]:
    context = make_context()
    model = context.prepare_module(_Pair())
    assert isinstance(model, _Pair)
    opt_a = context.wrap(torch.optim.SGD([model.a, model.shared, model.frozen_a], lr=0.1))
    opt_b = context.wrap(torch.optim.SGD([model.b, model.shared, model.frozen_b], lr=0.1))
    return context, model, opt_a, opt_b


@pytest.mark.requirement("TOGGLE-001", "TOGGLE-002")
@pytest.mark.varies(wrappers=("2",), parameters=("shared by two optimizers", "frozen"), make_optimizer_step=("False",))
def test_closure_sees_only_its_parameters(make_context: MakeContext, cell: Cell) -> None:
    """In A's closure B-only parameters do not require grad; shared and A's stay; all flags come back."""
    _, model, opt_a, _ = _two_wrappers(make_context)
    before = requires_grad_flags(model)
    seen: dict[str, bool] = {}

    def closure() -> None:
        seen.update(requires_grad_flags(model))

    opt_a.step(closure, make_optimizer_step=False)
    expected = {"a": True, "b": False, "shared": True, "frozen_a": False, "frozen_b": False}
    assert seen == expected, f"flags inside opt_a's closure: {seen}, expected {expected}"
    assert requires_grad_flags(model) == before, (
        f"flags after the closure: {requires_grad_flags(model)}, before: {before}"
    )


@pytest.mark.requirement("TOGGLE-001", "TOGGLE-002")
@pytest.mark.varies(
    wrappers=("2",), parameters=("shared by two optimizers", "frozen"), faults=("raising toggle_model block",)
)
def test_toggle_model_block(make_context: MakeContext, cell: Cell) -> None:
    """``toggle_model()`` toggles for its block and restores exactly, also when the block raises."""
    _, model, _, opt_b = _two_wrappers(make_context)
    before = requires_grad_flags(model)
    with opt_b.toggle_model():
        inside = requires_grad_flags(model)
    assert inside == {"a": False, "b": True, "shared": True, "frozen_a": False, "frozen_b": False}, inside
    assert requires_grad_flags(model) == before
    with (
        refuses(
            KeyError,
            "opt_b.toggle_model() around a block that raises KeyError",
            "TOGGLE-002: toggle_model() restores the flags when its block raises and lets the exception through",
        ),
        opt_b.toggle_model(),
    ):
        raise KeyError("inside the block")
    assert requires_grad_flags(model) == before, (
        f"flags after a raising block: {requires_grad_flags(model)}, before: {before}"
    )


@pytest.mark.requirement("TOGGLE-002", "CLOS-003")
@pytest.mark.varies(wrappers=("2",), parameters=("shared by two optimizers", "frozen"), faults=("raising closure",))
def test_raising_closure_restores_flags(make_context: MakeContext, cell: Cell) -> None:
    """A closure that raises leaves every flag as it was; user-frozen parameters stay frozen."""
    _, model, opt_a, _ = _two_wrappers(make_context)
    before = requires_grad_flags(model)

    def closure() -> None:
        raise ValueError("closure failed")

    with refuses(
        ValueError,
        "opt_a.step(closure, make_optimizer_step=True) whose closure raises",
        "CLOS-003: a closure's exception propagates out of step()",
        match="closure failed",
    ):
        opt_a.step(closure, make_optimizer_step=True)
    assert requires_grad_flags(model) == before, (
        f"flags after a raising closure: {requires_grad_flags(model)}, before: {before}"
    )


class _Gan(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(7)
        self.generator = torch.nn.Linear(3, 4)
        self.discriminator = torch.nn.Linear(4, 1)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)


def _gan_losses(model: _Gan, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    noise, real = batch
    fake = model.generator(noise)
    loss_gen = -model.discriminator(fake).mean()
    loss_dis = model.discriminator(fake.detach()).mean() - model.discriminator(real).mean()
    return loss_gen, loss_dis


_GanBatch = tuple[torch.Tensor, torch.Tensor]


def _gan_batches(cell: Cell) -> list[_GanBatch]:
    """Eight seeded ``(noise, real)`` batches, moved to the cell's device and dtype."""
    device, dtype = cell_device(cell), cell_dtype(cell)
    generator = torch.Generator().manual_seed(11)
    batches = [(torch.randn(5, 3, generator=generator), torch.randn(5, 4, generator=generator)) for _ in range(8)]
    return [(noise.to(device, dtype), real.to(device, dtype)) for noise, real in batches]


def _run_gan(context: TrainingContext, model: _Gan, opt_gen: Any, opt_dis: Any, batches: list[_GanBatch]) -> None:
    """The seed's loop: the generator's ``make_optimizer_step`` True every 2nd batch, the discriminator's every 4th."""
    for batch_idx, moved in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):

            def gen_closure(moved: Any = moved) -> None:
                with context.autocast():
                    loss_gen, _ = _gan_losses(model, moved)
                opt_gen.backward(loss_gen)

            def dis_closure(moved: Any = moved) -> None:
                with context.autocast():
                    _, loss_dis = _gan_losses(model, moved)
                opt_dis.backward(loss_dis)

            opt_gen.step(closure=gen_closure, make_optimizer_step=batch_idx % 2 == 0)
            if batch_idx % 4 == 0:
                opt_dis.step(closure=dis_closure, make_optimizer_step=True)


def _oracle_backward(
    oracle: _Gan, batch: _GanBatch, loss: int, frozen: torch.nn.Module, scaler: GradScaler | None, cell: Cell
) -> None:
    """Loss ``loss`` (0: the generator's, 1: the discriminator's), ``frozen`` toggled off by hand, and its backward.

    The forward runs under the cell's plain autocast; under 16-mixed the backward is the plain GradScaler's.
    """
    for param in frozen.parameters():
        param.requires_grad_(False)
    with oracle_autocast(cell):
        loss_value = _gan_losses(oracle, batch)[loss]
    (loss_value if scaler is None else scaler.scale(loss_value)).backward()
    for param in frozen.parameters():
        param.requires_grad_(True)


def _gan_oracle(
    oracle: _Gan, batches: list[_GanBatch], cell: Cell, gen_closes: tuple[int, ...], dis_steps: tuple[int, ...]
) -> None:
    """A plain loop: the generator's window mean applied at ``gen_closes``, the discriminator stepped at ``dis_steps``.

    Under 16-mixed one plain GradScaler serves both, updated once after each batch in which one of them stepped.
    """
    oracle_gen = torch.optim.Adam(oracle.generator.parameters(), lr=0.01)
    oracle_dis = torch.optim.SGD(oracle.discriminator.parameters(), lr=0.05)
    scaler = oracle_scaler(cell)
    gen_window: list[int] = []
    for batch_idx, moved in enumerate(batches):
        _oracle_backward(oracle, moved, 0, oracle.discriminator, scaler, cell)
        gen_window.append(batch_idx)
        if batch_idx in gen_closes:
            with torch.no_grad():
                for param in oracle.generator.parameters():
                    assert param.grad is not None
                    param.grad /= len(gen_window)
            real_step(oracle_gen, 1, scaler)
            gen_window = []
        if batch_idx in dis_steps:
            _oracle_backward(oracle, moved, 1, oracle.generator, scaler, cell)
            real_step(oracle_dis, 1, scaler)
        if scaler is not None and (batch_idx in gen_closes or batch_idx in dis_steps):
            scaler.update()
        oracle_step_done(cell)


@pytest.mark.requirement("STEP-001", "STEP-002", "ACC-001", "TOGGLE-001")
@pytest.mark.varies(
    wrappers=("2",),
    optimizer=("Adam", "SGD"),
    window=("1 micro-step", "k >= 2 micro-steps", "open while another optimizer steps"),
    make_optimizer_step=("True", "False"),
)
def test_gan_cadences(make_context: MakeContext, cell: Cell) -> None:
    """The seed's GAN: generator accumulating over 2 batches, discriminator every 4, for 8 batches."""
    context = make_context()
    base = _Gan()
    oracle = oracle_copy(base, cell)
    assert isinstance(oracle, _Gan)
    model = context.prepare_module(base)
    assert isinstance(model, _Gan)
    opt_gen = context.wrap(torch.optim.Adam(model.generator.parameters(), lr=0.01))
    opt_dis = context.wrap(torch.optim.SGD(model.discriminator.parameters(), lr=0.05))
    batches = _gan_batches(cell)
    _run_gan(context, model, opt_gen, opt_dis, batches)

    # The oracle by hand: generator windows close at batches 0, 2, 4, 6 ({0}, {1, 2}, {3, 4}, {5, 6}; 7 stays
    # open); the discriminator steps at 0 and 4. Generator gradients never reach the discriminator's .grad
    # and vice versa, as the toggling requires. Under 16-mixed one plain GradScaler serves both optimizers
    # and is updated once at the end of each batch in which one of them stepped.
    _gan_oracle(oracle, batches, cell, gen_closes=(0, 2, 4, 6), dis_steps=(0, 4))
    assert_params_close(model, oracle, cell, "the seed's GAN example over 8 batches")


class _Trio(torch.nn.Module):
    """Parameters for three optimizers: ``shared`` is A's and B's, ``d`` joins C by ``add_param_group``.

    ``f_b`` (B's) is trainable when wrapped and frozen by the user afterwards; ``u_b`` (B's) is frozen when wrapped
    and made trainable afterwards; ``loose`` belongs to no optimizer.
    """

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(5)
        for name in ("a", "shared", "b", "f_b", "u_b", "c", "d", "loose"):
            self.register_parameter(name, torch.nn.Parameter(torch.randn(3, generator=generator)))
        self.get_parameter("u_b").requires_grad_(False)


_HELD = {"A": ["a", "shared"], "B": ["b", "shared", "f_b", "u_b"], "C": ["c"]}
"""The parameters each wrapper of :class:`_Trio` is built on (C gets ``d`` later)."""


def _three_wrappers(make_context: MakeContext) -> tuple[_Trio, dict[str, Any]]:
    context = make_context()
    model = context.prepare_module(_Trio())
    assert isinstance(model, _Trio)
    held = {name: [model.get_parameter(p) for p in names] for name, names in _HELD.items()}
    wrappers = {
        "A": context.wrap(torch.optim.SGD(held["A"], lr=0.1)),
        "B": context.wrap(torch.optim.SGD(held["B"], lr=0.1)),
        "C": context.wrap(torch.optim.Adam(held["C"], lr=0.01)),
    }
    wrappers["C"].add_param_group({"params": [model.get_parameter("d")], "lr": 0.02})
    model.get_parameter("f_b").requires_grad_(False)  # frozen by the user after wrap
    model.get_parameter("u_b").requires_grad_(True)  # unfrozen by the user after wrap
    return model, wrappers


_OWNERS = {"a": "A", "shared": "AB", "b": "B", "f_b": "B", "u_b": "B", "c": "C", "d": "C", "loose": ""}
"""Which wrappers hold each parameter of :class:`_Trio` (``d`` through ``add_param_group``)."""


def _expected_inside(owner: str, flags: dict[str, bool]) -> dict[str, bool]:
    """By the rule: parameters held only by the other wrappers are off; the owner's keep their flag.

    A parameter of no optimizer (``loose``) is left out: TOGGLE-001 says nothing of it inside the block, only that
    its flag is restored afterwards (which the checks compare on every parameter).
    """
    return {name: flag and owner in _OWNERS[name] for name, flag in flags.items() if _OWNERS[name]}


def _held(flags: dict[str, bool]) -> dict[str, bool]:
    """The flags of the parameters some optimizer holds."""
    return {name: flag for name, flag in flags.items() if _OWNERS[name]}


def _raise_inside() -> None:
    raise ValueError("closure failed")


def _backward_everything(model: torch.nn.Module, wrapper: Any) -> None:
    """Backpropagate a loss that involves every parameter: only those that require grad take a gradient."""
    loss = sum((param * param).sum() for param in model.parameters())
    assert isinstance(loss, torch.Tensor)
    wrapper.backward(loss * 1e-3)


def _assert_gradients_only_where_on(
    before: list[torch.Tensor | None], model: torch.nn.Module, on: dict[str, bool], what: str
) -> None:
    """The parameters that require grad (``on``) took a gradient since ``before`` (:func:`.grads`), no other did."""
    for (name, param), old in zip(model.named_parameters(), before, strict=True):
        if name not in on:
            continue
        new = param.grad
        changed = (old is None) != (new is None) or (old is not None and new is not None and not torch.equal(old, new))
        assert changed == on[name], (
            f"{what}: parameter {name!r} {'took' if changed else 'took no'} gradient, but it "
            f"{'requires' if on[name] else 'must not require'} grad there"
        )


@pytest.mark.requirement("TOGGLE-001", "TOGGLE-002")
@pytest.mark.varies(
    wrappers=("3",),
    parameters=("shared by two optimizers", "frozen", "frozen after wrap", "unfrozen after wrap"),
    param_groups=("added after wrap",),
    call_form=("closure, wrapper.backward", "toggle_model block, then step()"),
    faults=("raising closure", "raising toggle_model block"),
    make_optimizer_step=("False",),
)
def test_toggling_follows_flags_and_groups_changed_after_wrap(make_context: MakeContext, cell: Cell) -> None:
    """Three wrappers, flags changed and a group added after wrap: the rule holds on today's flags and groups."""
    model, wrappers = _three_wrappers(make_context)
    for phase in ("after wrap", "after the user flipped f_b and u_b again"):
        if phase != "after wrap":
            model.get_parameter("f_b").requires_grad_(True)
            model.get_parameter("u_b").requires_grad_(False)
        flags = requires_grad_flags(model)
        for owner, wrapper in wrappers.items():
            want = _expected_inside(owner, flags)
            seen: dict[str, bool] = {}

            def closure(seen: dict[str, bool] = seen, wrapper: Any = wrapper) -> None:
                seen.update(requires_grad_flags(model))
                _backward_everything(model, wrapper)

            before = grads(model.parameters())
            wrapper.step(closure, make_optimizer_step=False)
            assert _held(seen) == want, f"{phase}: flags inside {owner}'s closure are {seen}, expected {want}"
            assert requires_grad_flags(model) == flags, (
                f"{phase}: flags after {owner}'s closure are {requires_grad_flags(model)}, not {flags}"
            )
            _assert_gradients_only_where_on(before, model, want, f"{phase}, {owner}'s closure")
            before = grads(model.parameters())
            with wrapper.toggle_model():
                inside = requires_grad_flags(model)
                _backward_everything(model, wrapper)
            wrapper.step(make_optimizer_step=False)
            assert _held(inside) == want, f"{phase}: flags inside {owner}.toggle_model() are {inside}, expected {want}"
            assert requires_grad_flags(model) == flags, (
                f"{phase}: flags after {owner}.toggle_model() are {requires_grad_flags(model)}"
            )
            _assert_gradients_only_where_on(before, model, want, f"{phase}, {owner}.toggle_model() block")
            with refuses(
                ValueError,
                f"{phase}: wrapper {owner}'s step(closure, make_optimizer_step=False) whose closure raises",
                "TOGGLE-002: a closure that raises gets every flag restored and its exception propagated",
                match="closure failed",
            ):
                wrapper.step(_raise_inside, make_optimizer_step=False)
            assert requires_grad_flags(model) == flags, (
                f"{phase}: flags after {owner}'s raising closure are {requires_grad_flags(model)}"
            )
            with (
                refuses(
                    KeyError,
                    f"{phase}: wrapper {owner}'s toggle_model() around a block that raises KeyError",
                    "TOGGLE-002: toggle_model() restores the flags when its block raises and lets the exception "
                    "through",
                ),
                wrapper.toggle_model(),
            ):
                raise KeyError("inside the block")
            assert requires_grad_flags(model) == flags, (
                f"{phase}: flags after {owner}'s raising block are {requires_grad_flags(model)}"
            )
