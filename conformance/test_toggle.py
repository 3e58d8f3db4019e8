"""Checks of ``requires_grad`` toggling between the optimizers of one model, and the seed's GAN cadences."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import grads, requires_grad_flags, state_diff
from lightning_optimizer.conformance.gan import Gan, dis_loss, gan_batches, gan_call, gen_loss, plain_gan
from lightning_optimizer.conformance.harness import adam_eps, assert_params_close, refuses
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.spec import Cell, TrainingContext

MakeContext = Callable[..., TrainingContext]


class _Params(torch.nn.Module):
    """Seeded parameters of ``size`` elements, by name; the ``frozen`` ones do not require grad."""

    def __init__(self, seed: int, size: int, names: tuple[str, ...], frozen: tuple[str, ...]) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        for name in names:
            param = torch.nn.Parameter(torch.randn(size, generator=generator), requires_grad=name not in frozen)
            self.register_parameter(name, param)


def _two_wrappers(make_context: MakeContext) -> tuple[torch.nn.Module, Any, Any]:
    """SGD wrappers A and B of two halves sharing ``shared``; each holds a frozen parameter of its own."""
    context = make_context()
    names = ("a", "b", "shared", "frozen_a", "frozen_b")
    model = context.prepare_module(_Params(3, 4, names, frozen=("frozen_a", "frozen_b")))
    opt_a, opt_b = (
        context.wrap(torch.optim.SGD([model.get_parameter(n) for n in (own, "shared", f"frozen_{own}")], lr=0.1))
        for own in "ab"
    )
    return model, opt_a, opt_b


def _raise_inside() -> None:
    raise ValueError("closure failed")


@pytest.mark.requirement("TOGGLE-001", "TOGGLE-002")
@pytest.mark.varies(wrappers=("2",), parameters=("shared by two optimizers", "frozen"), make_optimizer_step=("False",))
def test_closure_sees_only_its_parameters(make_context: MakeContext, cell: Cell) -> None:
    """In A's closure B-only parameters do not require grad; shared and A's stay; all flags come back."""
    model, opt_a, _ = _two_wrappers(make_context)
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
    model, _, opt_b = _two_wrappers(make_context)
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
    model, opt_a, _ = _two_wrappers(make_context)
    before = requires_grad_flags(model)
    with refuses(
        ValueError,
        "opt_a.step(closure, make_optimizer_step=True) whose closure raises",
        "CLOS-003: a closure's exception propagates out of step()",
        match="closure failed",
    ):
        opt_a.step(_raise_inside, make_optimizer_step=True)
    assert requires_grad_flags(model) == before, (
        f"flags after a raising closure: {requires_grad_flags(model)}, before: {before}"
    )


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
    base = Gan()
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    assert isinstance(model, Gan) and isinstance(oracle, Gan)
    opt_gen = context.wrap(torch.optim.Adam(model.generator.parameters(), lr=0.01, eps=adam_eps(cell)))
    opt_dis = context.wrap(torch.optim.SGD(model.discriminator.parameters(), lr=0.05))
    batches = gan_batches(cell, 8)
    for batch_idx, (noise, real) in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            gan_call(opt_gen, partial(gen_loss, model, noise), batch_idx % 2 == 0, region=context.autocast)
            if batch_idx % 4 == 0:
                gan_call(opt_dis, partial(dis_loss, model, noise, real), True, region=context.autocast)

    # The oracle by hand: generator windows close at batches 0, 2, 4, 6 ({0}, {1, 2}, {3, 4}, {5, 6}; 7 stays
    # open); the discriminator steps at 0 and 4. Generator gradients never reach the discriminator's .grad
    # and vice versa, as the toggling requires. Under 16-mixed one plain GradScaler serves both optimizers
    # and is updated once at the end of each batch in which one of them stepped.
    plain = (
        torch.optim.Adam(oracle.generator.parameters(), lr=0.01, eps=adam_eps(cell)),
        torch.optim.SGD(oracle.discriminator.parameters(), lr=0.05),
    )
    list(
        plain_gan(oracle, plain, batches, cell, [i in (0, 2, 4, 6) for i in range(8)], [i in (0, 4) for i in range(8)])
    )
    assert_params_close(model, oracle, cell, "the seed's GAN example over 8 batches")


_OWNERS = {"a": "A", "shared": "AB", "b": "B", "f_b": "B", "u_b": "B", "c": "C", "d": "C", "loose": ""}
"""Which of three wrappers hold each parameter (``d`` through ``add_param_group``; ``loose`` belongs to none)."""


def _three_wrappers(make_context: MakeContext) -> tuple[torch.nn.Module, dict[str, Any]]:
    """:data:`_OWNERS`' wrappers (A and B SGD, C Adam); ``f_b`` frozen after wrap, ``u_b`` unfrozen after wrap."""
    context = make_context()
    model = context.prepare_module(_Params(5, 3, tuple(_OWNERS), frozen=("u_b",)))
    held = {name: [model.get_parameter(p) for p in names] for name, names in _HELD.items()}
    wrappers = {
        "A": context.wrap(torch.optim.SGD(held["A"], lr=0.1)),
        "B": context.wrap(torch.optim.SGD(held["B"], lr=0.1)),
        "C": context.wrap(torch.optim.Adam(held["C"], lr=0.01)),
    }
    wrappers["C"].add_param_group({"params": [model.get_parameter("d")], "lr": 0.02})
    model.get_parameter("f_b").requires_grad_(False)
    model.get_parameter("u_b").requires_grad_(True)
    return model, wrappers


_HELD = {"A": ["a", "shared"], "B": ["b", "shared", "f_b", "u_b"], "C": ["c"]}
"""The parameters each wrapper is built on (C gets ``d`` later)."""


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
            # The rule: parameters held only by the other wrappers are off, the owner's keep their flag. One of no
            # optimizer (loose) is left out: TOGGLE-001 only says that its flag is restored (compared below).
            want = {name: flag and owner in _OWNERS[name] for name, flag in flags.items() if _OWNERS[name]}
            for where in (f"{owner}'s closure", f"{owner}.toggle_model() block"):
                seen: dict[str, bool] = {}

                def backward_everything(seen: dict[str, bool] = seen, wrapper: Any = wrapper) -> None:
                    seen.update(requires_grad_flags(model))  # only parameters that require grad take a gradient
                    wrapper.backward(torch.stack([(p * p).sum() for p in model.parameters()]).sum() * 1e-3)

                before = grads(model.parameters())
                if where.endswith("closure"):
                    wrapper.step(backward_everything, make_optimizer_step=False)
                else:
                    with wrapper.toggle_model():
                        backward_everything()
                    wrapper.step(make_optimizer_step=False)
                held = {name: flag for name, flag in seen.items() if _OWNERS[name]}
                assert held == want, f"{phase}: flags inside {where} are {seen}, expected {want}"
                now = requires_grad_flags(model)
                assert now == flags, f"{phase}: flags after {where} are {now}, not {flags}"
                params = zip(model.named_parameters(), before, strict=True)
                took = {name: state_diff(p.grad, old) is not None for (name, p), old in params if name in want}
                assert took == want, f"{phase}, {where}: gradients taken {took}; exactly where grad is on: {want}"
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
