"""Checks that the wrapper is a transparent proxy of its inner optimizer."""

from __future__ import annotations

import copy
import math
import re
import warnings
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, StepLR

from lightning_optimizer.conformance.harness import (
    Halves,
    assert_params_close,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
    run_steps,
    scaler_settings,
)
from lightning_optimizer.conformance.oracles import WindowOracle, oracle_copy
from lightning_optimizer.conformance.plain_loop import PlainWindows, oracle_loss, plain_scaler
from lightning_optimizer.spec import Cell, GradScalerSettings, ImplementationInfo, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
_NOT_XLA = ("cpu", "cuda")
"""Where the oracle comparisons below run: on XLA each new graph compiles (seconds); the proxying checks run there."""
SMALL_SCALE = GradScalerSettings(init_scale=2.0**4)
"""Under 16-mixed: a loss scale that keeps the fp16 gradients of the small model finite (no step is skipped)."""


class QuetzalSGD(torch.optim.SGD):
    """An SGD whose class name no wrapper can take from elsewhere: a user's own optimizer subclass."""


_KINDS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "SGD momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "SGD foreach": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "Adam foreach": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True),
    "Adam fused": lambda ps: torch.optim.Adam(ps, lr=0.01, fused=True),
    "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.01),
    "QuetzalSGD": lambda ps: QuetzalSGD(ps, lr=0.1),
    "LBFGS": lambda ps: torch.optim.LBFGS(ps, lr=0.5),
    "SGD two groups": lambda ps: torch.optim.SGD(
        list[dict[str, Any]]([{"params": [ps[0]]}, {"params": [ps[1]], "lr": 0.4, "momentum": 0.5}]),
        lr=1.0,
        momentum=0.9,
    ),
    "SGD nesterov": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=True),
}
"""The inner optimizers of these checks, by name, each built on the parameters given."""


def _wrapped_adam(make_context: MakeContext, **kwargs: Any) -> tuple[TrainingContext, torch.nn.Module, Any]:
    context = make_context(**kwargs)
    model = context.prepare_module(make_model())
    return context, model, context.wrap(torch.optim.Adam(model.parameters(), lr=0.01))


@pytest.mark.requirement("PROXY-001")
@pytest.mark.varies(optimizer=("Adam",))
def test_isinstance_of_the_inner_class(make_context: MakeContext, cell: Cell) -> None:
    """The wrapper is an instance of the inner optimizer's class and of ``torch.optim.Optimizer``."""
    _, _, wrapper = _wrapped_adam(make_context)
    assert isinstance(wrapper, torch.optim.Adam), f"{type(wrapper).__name__} is not a torch.optim.Adam"
    assert isinstance(wrapper, torch.optim.Optimizer), f"{type(wrapper).__name__} is not a torch.optim.Optimizer"


@pytest.mark.requirement("PROXY-002")
@pytest.mark.varies(optimizer=("Adam",), window=("1 micro-step",))
def test_proxied_objects_are_the_inner_ones(make_context: MakeContext, cell: Cell) -> None:
    """``optimizer``, ``param_groups``, ``state`` and ``defaults`` are the inner optimizer's own objects."""
    context, model, wrapper = _wrapped_adam(make_context)
    inner = wrapper.optimizer
    assert type(inner) is torch.optim.Adam, f"wrapper.optimizer is a {type(inner).__name__}, not the Adam"
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: True)
    assert wrapper.param_groups is inner.param_groups, "param_groups is a copy"
    assert wrapper.state is inner.state, "state is a copy"
    assert wrapper.defaults is inner.defaults, "defaults is a copy"
    assert len(inner.state) == len(list(model.parameters())), "the inner optimizer has no state after a step"


@pytest.mark.requirement("PROXY-003")
@pytest.mark.varies(param_groups=("added after wrap",), optimizer=("Adam",))
def test_writes_reach_the_inner_optimizer(make_context: MakeContext, cell: Cell) -> None:
    """``load_state_dict``, ``add_param_group`` and attribute assignment change the inner optimizer."""
    context, model, wrapper = _wrapped_adam(make_context)
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: True)
    saved = copy.deepcopy(wrapper.optimizer.state_dict())  # the live dict's tensors change in place
    run_steps(context, model, wrapper, make_batches(1, seed=5), cell, lambda i: True)
    wrapper.load_state_dict(saved)
    step = wrapper.optimizer.state_dict()["state"][0]["step"]
    assert float(step) == 1.0, f"load_state_dict did not reach the inner optimizer (its step count is {float(step)})"
    extra = torch.nn.Parameter(torch.zeros(3, device=cell_device(cell), dtype=cell_dtype(cell)))
    wrapper.add_param_group({"params": [extra], "lr": 0.5})
    assert len(wrapper.optimizer.param_groups) == 2, "add_param_group did not reach the inner optimizer"
    assert wrapper.optimizer.param_groups[1]["params"][0] is extra
    wrapper.custom_flag = "set through the wrapper"
    assert getattr(wrapper.optimizer, "custom_flag", None) == "set through the wrapper", (
        "attribute assignment on the wrapper did not reach the inner optimizer"
    )


@pytest.mark.requirement("PROXY-004")
@pytest.mark.varies(window=("k >= 2 micro-steps",), make_optimizer_step=("None",), optimizer=("Adam",))
def test_step_hooks_fire_on_real_steps(make_context: MakeContext, cell: Cell) -> None:
    """Step hooks registered through the wrapper fire once per step taken, never on accumulation.

    Under 16-mixed a small initial scale keeps every step finite; ``test_step_hooks_do_not_fire_on_skipped_steps``
    plants overflows.
    """
    context, model, wrapper = _wrapped_adam(
        make_context, accumulate_grad_batches=2, **scaler_settings(cell, SMALL_SCALE)
    )
    fired: list[str] = []
    wrapper.register_step_pre_hook(lambda optimizer, args, kwargs: fired.append("pre"))
    wrapper.register_step_post_hook(lambda optimizer, args, kwargs: fired.append("post"))
    outcomes = run_steps(context, model, wrapper, make_batches(6), cell)
    taken = outcomes.count(StepOutcome.STEPPED)
    assert StepOutcome.SKIPPED_NON_FINITE not in outcomes, f"a step was skipped at a small loss scale: {outcomes}"
    assert taken > 0, f"no window stepped: {outcomes}"
    assert fired == ["pre", "post"] * taken, f"hooks fired as {fired} for outcomes {outcomes}"


@pytest.mark.requirement("SCHED-001")
@pytest.mark.features("lr_schedulers")
@pytest.mark.parametrize("built_on", ["wrapper", "inner"])
@pytest.mark.varies(window=("k >= 2 micro-steps",), make_optimizer_step=("None",), optimizer=("SGD",))
def test_scheduler_follows_real_steps_without_warnings(make_context: MakeContext, cell: Cell, built_on: str) -> None:
    """A scheduler on the wrapper or the inner optimizer, stepped after each real step, warns nothing."""
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=1.0))
    # The wrapper is a torch.optim.Optimizer at run time [PROXY-001]; the protocol cannot say so statically.
    target = cast(torch.optim.Optimizer, wrapper) if built_on == "wrapper" else wrapper.optimizer
    batches = make_batches(6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduler = StepLR(target, step_size=1, gamma=0.5)
        for batch_idx, batch in enumerate(batches):
            with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
                wrapper.step(_batch_closure(context, model, wrapper, batch, cell))
                if batch_idx % 2 == 1:
                    scheduler.step()
    assert wrapper.param_groups[0]["lr"] == pytest.approx(0.125), "three real steps should halve the lr three times"


@pytest.mark.requirement("PROXY-005")
@pytest.mark.varies(optimizer=("SGD",))
def test_repr_names_the_inner_class_beyond_the_wrapper_class(make_context: MakeContext, cell: Cell) -> None:
    """``repr`` names the inner optimizer's own class (a user's subclass), apart from the wrapper class's name."""
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(QuetzalSGD(model.parameters(), lr=0.1))
    inner_name, wrapper_name = type(wrapper.optimizer).__name__, type(wrapper).__name__
    assert inner_name == "QuetzalSGD", f"wrapper.optimizer is a {inner_name}, not the QuetzalSGD that was wrapped"
    rendered = repr(wrapper)
    assert rendered != object.__repr__(wrapper), f"repr(wrapper) is the default object repr: {rendered}"
    # Where the wrapper's class took the inner's name, any mention of it will do; else one beside the wrapper's name.
    beyond = rendered if wrapper_name == inner_name else rendered.replace(wrapper_name, " ")
    assert re.search(rf"(?<![A-Za-z0-9_]){re.escape(inner_name)}(?![A-Za-z0-9_])", beyond), (
        f"repr(wrapper) does not name the inner optimizer's class {inner_name!r} beyond the wrapper class's own "
        f"name {wrapper_name!r}: {rendered}"
    )


@pytest.mark.requirement("PROXY-001", "PROXY-002")
@pytest.mark.varies(
    optimizer=("SGD", "SGD foreach", "Adam", "AdamW", "LBFGS"), wrappers=("2",), param_groups=("added after wrap",)
)
def test_every_kind_is_an_instance_of_its_own_class(
    make_context: MakeContext, cell: Cell, implementation: ImplementationInfo[Any]
) -> None:
    """Each kind of optimizer, a user's subclass included, gives a wrapper of its own class with its own objects.

    LBFGS is among them when the implementation claims closure-evaluating optimizers.
    """
    lbfgs = "closure_evaluating_optimizers" in implementation.features
    lbfgs &= cell.precision in ("64-true", "32-true", "16-true")  # where LBFGS under 16-mixed is refused is left open
    for name in ["SGD", "SGD foreach", "Adam", "AdamW", "QuetzalSGD"] + ["LBFGS"] * lbfgs:
        context = make_context()
        model = context.prepare_module(make_model())
        first, last = list(model.parameters())[:2], list(model.parameters())[2:]
        inner = _KINDS[name](first)
        wrapper: Any = context.wrap(inner)
        other: Any = context.wrap(torch.optim.SGD(last, lr=0.1))
        assert wrapper.optimizer is inner, f"{name}: wrapper.optimizer is not the optimizer that was wrapped"
        assert isinstance(wrapper, type(inner)), f"{name}: the wrapper is a {type(wrapper).__name__}, not a {name}"
        assert isinstance(wrapper, torch.optim.Optimizer), f"{name}: the wrapper is not a torch.optim.Optimizer"
        assert not isinstance(other, type(inner)) or isinstance(inner, torch.optim.SGD), (
            f"the SGD wrapper of the same context is also a {name}"
        )
        extra = torch.nn.Parameter(torch.zeros(3, device=cell_device(cell), dtype=cell_dtype(cell)))
        wrapper.add_param_group({"params": [extra]})
        for what, got, want in (
            ("param_groups", wrapper.param_groups, inner.param_groups),
            ("state", wrapper.state, inner.state),
            ("defaults", wrapper.defaults, inner.defaults),
        ):
            assert got is want, f"{name}: wrapper.{what} is not the inner optimizer's own object"
        assert other.param_groups is not wrapper.param_groups, f"{name}: two wrappers share one param_groups"
        assert wrapper.param_groups[1]["params"] == [extra], f"{name}: the added group is not the inner's second"


def _batch_closure(
    context: TrainingContext, model: torch.nn.Module, wrapper: Any, batch: Any, cell: Cell, factor: float = 1.0
) -> Callable[[], torch.Tensor]:
    """A closure: the loss on ``batch`` under the context's autocast, times ``factor``, through ``wrapper.backward``."""

    def closure() -> torch.Tensor:
        with context.autocast():
            loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
        loss = loss if factor == 1.0 else loss * factor
        wrapper.backward(loss)
        return loss

    return closure


_ADDED_GROUP: dict[str, dict[str, Any]] = {
    "SGD momentum": {"lr": 0.3, "momentum": 0.5, "weight_decay": 0.1, "dampening": 0.2},
    "Adam": {"lr": 0.05, "betas": (0.5, 0.8), "weight_decay": 0.1, "eps": 1e-6},
}


@pytest.mark.cells(devices=_NOT_XLA)
@pytest.mark.requirement("PROXY-002", "PROXY-003", "CKPT-001")
@pytest.mark.varies(
    param_groups=("added after wrap", "2 with other hyper-parameters"),
    optimizer=("SGD momentum", "Adam"),
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "None"),
)
@pytest.mark.parametrize("kind", ["SGD momentum", "Adam"])
def test_added_group_keeps_its_hyper_parameters(make_context: MakeContext, cell: Cell, kind: str) -> None:
    """A group added through the wrapper is the inner's, with its own lr and the rest, and steps with them."""
    context = make_context(accumulate_grad_batches=2, **scaler_settings(cell, SMALL_SCALE))
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(_KINDS[kind](list(model.parameters())[:2]))
    hyper = _ADDED_GROUP[kind]
    added = list(model.parameters())[2:]
    wrapper.add_param_group({"params": added, **hyper})
    inner = wrapper.optimizer
    assert wrapper.param_groups is inner.param_groups, "after add_param_group, param_groups is not the inner's list"
    assert len(inner.param_groups) == 2, f"the inner optimizer has {len(inner.param_groups)} groups, expected 2"
    group = inner.param_groups[1]
    assert group["params"] == added, "the inner optimizer's new group does not hold the added parameters"
    for key, value in hyper.items():
        assert group[key] == value, f"the added group's {key!r} is {group[key]!r} in the inner optimizer, not {value!r}"

    batches = make_batches(5)
    outcomes = run_steps(context, model, wrapper, batches, cell, lambda i: True if i == 0 else None)
    oracle_optimizer = _KINDS[kind](list(oracle_model.parameters())[:2])
    oracle_optimizer.add_param_group({"params": list(oracle_model.parameters())[2:], **hyper})
    oracle = WindowOracle(oracle_model, oracle_optimizer, cell, 2)
    oracle.scaler = plain_scaler(cell, SMALL_SCALE)
    oracle.train_windows(batches, [[0], [1], [2, 3], [4]])  # True at 0, then windows of 2 and the flushed last
    assert oracle.stepped == [True] * 4, f"the oracle skipped a window: {oracle.stepped}"
    stepped, accumulated = StepOutcome.STEPPED, StepOutcome.ACCUMULATED
    assert outcomes == [stepped, stepped, accumulated, stepped, stepped], f"the five calls took {outcomes}"
    assert_params_close(model, oracle_model, cell, f"{kind} with a group added after wrap, after 4 windows")
    got, want = wrapper.state_dict(), inner.state_dict()
    assert got["param_groups"] == want["param_groups"], "state_dict()'s groups are not the inner optimizer's"
    assert got["param_groups"][1]["lr"] == hyper["lr"], "state_dict() lost the added group's own lr"
    assert sorted(got["state"]) == sorted(want["state"]) == list(range(4)), "state_dict() lacks the added group"


@pytest.mark.requirement("PROXY-003")
@pytest.mark.varies(wrappers=("2",))
def test_assignments_reach_only_their_inner_optimizer(make_context: MakeContext, cell: Cell) -> None:
    """An attribute set through one wrapper is its inner optimizer's alone, and later inner writes show through."""
    context = make_context()
    model = context.prepare_module(make_model())
    params = list(model.parameters())
    opt_a: Any = context.wrap(torch.optim.SGD(params[:2], lr=0.1))
    opt_b: Any = context.wrap(torch.optim.Adam(params[2:], lr=0.01))
    opt_a.custom_flag = "a"
    assert getattr(opt_a.optimizer, "custom_flag", None) == "a", "the assignment did not reach A's inner optimizer"
    assert getattr(opt_b.optimizer, "custom_flag", None) is None, "an assignment to A reached B's inner optimizer"
    opt_a.optimizer.custom_flag = "changed on the inner"
    assert getattr(opt_a, "custom_flag", None) == "changed on the inner", (
        "after the inner optimizer's attribute changed, the wrapper still reads the value assigned through it: "
        "the assignment was stored on the wrapper"
    )
    opt_b.param_groups[0]["lr"] = 0.5
    assert opt_b.optimizer.param_groups[0]["lr"] == 0.5, "a write to param_groups did not reach B's inner optimizer"


@pytest.mark.requirement("PROXY-004")
@pytest.mark.varies(
    wrappers=("2",),
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True", "open while another optimizer steps"),
    make_optimizer_step=("True", "False", "None"),
    optimizer=("SGD", "Adam"),
)
def test_step_hooks_fire_only_on_their_wrappers_real_steps(make_context: MakeContext, cell: Cell) -> None:
    """Two wrappers' hooks: each fires on its own wrapper's real steps, during the call, never on the other's."""
    context = make_context(accumulate_grad_batches=2, **scaler_settings(cell, SMALL_SCALE))
    model = context.prepare_module(make_model())
    params, fired = list(model.parameters()), list[str]()
    wrappers = _hooked(context, {"A": torch.optim.Adam(params[:2], lr=0.01), "B": torch.optim.SGD(params[2:])}, fired)
    # A follows the schedule (windows {0, 1}, {2, 3}); B steps at 0 and 3 and accumulates at 1 and 2 ({1, 2, 3}).
    schedule_b: dict[int, bool | None] = {0: True, 1: False, 2: False, 3: True}
    steps_a, steps_b = {1, 3}, {0, 3}
    batches = make_batches(4)
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            for name, make_step, steps in (("A", None, steps_a), ("B", schedule_b[batch_idx], steps_b)):
                fired.clear()
                wrapper = wrappers[name]
                wrapper.step(_batch_closure(context, model, wrapper, batch, cell), make_optimizer_step=make_step)
                want = [f"{name} pre", f"{name} post"] if batch_idx in steps else []
                assert fired == want, (
                    f"batch {batch_idx}, {name}.step(make_optimizer_step={make_step}): hooks fired as {fired}, "
                    f"expected {want} (A steps at batches {sorted(steps_a)}, B at {sorted(steps_b)})"
                )


def _two_scheduled_optimizers_oracle(
    oracle_model: torch.nn.Module, batches: list[Any], steps: dict[str, set[int]], cell: Cell
) -> None:
    """The plain loop of the two-schedulers check: A and B step (and their schedulers with them) at ``steps``.

    Two plain optimizers and schedulers; under 16-mixed one plain GradScaler, updated at the end of each batch (each
    has a step of A or B). In A's backward B's parameters do not take gradients, and back.
    """
    params = list(oracle_model.parameters())
    a, b = _KINDS["SGD two groups"](params[:2]), _KINDS["SGD nesterov"](params[2:])
    schedulers = [StepLR(a, step_size=1, gamma=0.5), LambdaLR(b, lambda step: 1.0 / (step + 1))]
    loop = PlainWindows(cell, [a, b], plain_scaler(cell, SMALL_SCALE))
    for batch_idx, batch in enumerate(batches):
        for index, (name, others) in enumerate((("A", params[2:]), ("B", params[:2]))):
            for param in others:
                param.requires_grad_(False)
            loop.backward(index, oracle_loss(oracle_model, batch, cell, factor=1.0))
            for param in others:
                param.requires_grad_(True)
            if batch_idx in steps[name]:
                loop.step(index)  # the window's mean, unscaled, stepped, cleared
                schedulers[index].step()
        loop.update()


@pytest.mark.cells(devices=_NOT_XLA)
@pytest.mark.requirement("SCHED-001")
@pytest.mark.features("lr_schedulers")
@pytest.mark.varies(
    param_groups=("2 with other hyper-parameters",),
    wrappers=("2",),
    optimizer=("SGD momentum",),
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "False", "None"),
)
def test_schedulers_of_two_wrappers_with_two_groups(make_context: MakeContext, cell: Cell) -> None:
    """Two SGD wrappers, schedulers on A (two groups; on the wrapper) and B's inner: no warning, every lr followed."""
    context = make_context(accumulate_grad_batches=2, **scaler_settings(cell, SMALL_SCALE))
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    params = list(model.parameters())
    opt_a = context.wrap(_KINDS["SGD two groups"](params[:2]))
    opt_b = context.wrap(_KINDS["SGD nesterov"](params[2:]))
    # A follows the schedule: windows {0, 1}, {2, 3}, {4} (flushed). B: {0} (True), {1, 2} (cut short), {3}, {4}.
    schedule_b: dict[int, bool | None] = {0: True, 1: False, 2: True, 3: None, 4: None}
    steps = {"A": {1, 3, 4}, "B": {0, 2, 3, 4}}
    batches = make_batches(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The wrapper is a torch.optim.Optimizer at run time [PROXY-001]; the protocol cannot say so statically.
        sched_a = StepLR(cast(torch.optim.Optimizer, opt_a), step_size=1, gamma=0.5)
        sched_b = LambdaLR(opt_b.optimizer, lambda step: 1.0 / (step + 1))
        for batch_idx, batch in enumerate(batches):
            with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
                for name, wrapper, make_step, scheduler in (
                    ("A", opt_a, None, sched_a),
                    ("B", opt_b, schedule_b[batch_idx], sched_b),
                ):
                    wrapper.step(_batch_closure(context, model, wrapper, batch, cell), make_optimizer_step=make_step)
                    if batch_idx in steps[name]:
                        assert wrapper.last_outcome is StepOutcome.STEPPED, f"batch {batch_idx}: {name} did not step"
                        scheduler.step()
    lrs = [group["lr"] for group in opt_a.param_groups]
    assert lrs == pytest.approx([0.125, 0.05]), f"A's groups have lr {lrs} after three halvings of [1.0, 0.4]"
    assert opt_b.param_groups[0]["lr"] == pytest.approx(0.01), "B's lr after four steps of LambdaLR 1/(n+1) of 0.05"

    _two_scheduled_optimizers_oracle(oracle_model, batches, steps, cell)
    assert_params_close(model, oracle_model, cell, "two wrappers with LR schedulers, A with two parameter groups")


_SCHEDULER_RUNS: tuple[tuple[int, tuple[bool | None, ...], set[int], int], ...] = (
    (1, (None, None, None), {0, 1, 2}, 0),
    (2, (None,) * 4, {1, 3}, 0),
    (3, (None, True, None, None, None, None), {1, 2, 5}, 0),
    (1, (False, False, True, None), {2, 3}, 0),
    (2, (None,) * 5, {1, 3, 4}, 2),
)
"""Runs of calls, a scheduler stepped after each: ``accumulate_grad_batches``, each call's ``make_optimizer_step``,
the calls that take a real step (worked out by hand from the accumulation rule), the calls run before the scheduler
is built. Inside ``batch()``: a first call that steps (no warning anywhere), windows of two, one of three cut short by
``True`` (the schedule then closes batch 2 alone), accumulation by ``False``, and a scheduler built after a real step
whose first step follows an accumulating call (the last window flushed by the epoch's last batch)."""


@pytest.mark.cells(devices=_NOT_XLA)
@pytest.mark.requirement("SCHED-001")
@pytest.mark.features("lr_schedulers")
@pytest.mark.parametrize("built_on", ["wrapper", "inner"])
@pytest.mark.varies(
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "False", "None"),
    optimizer=("SGD",),
)
def test_scheduler_warns_after_accumulating_calls_as_torch_does(
    make_context: MakeContext, cell: Cell, built_on: str
) -> None:
    """A scheduler stepped after every call, accumulating ones first: it warns exactly where plain PyTorch warns.

    The oracle is the same scheduler on a bare SGD whose ``step`` runs where the patched object's does: torch warns
    when the scheduler's first ``step()`` comes before any ``step()`` of the optimizer it was built on. Built on the
    inner optimizer, that is a first scheduler step after an accumulating call; built on the wrapper, never.
    """
    batches = make_batches(6)
    for k, makes, real, built_after in _SCHEDULER_RUNS:
        run = f"k={k}, calls {list(makes)}, built after {built_after}"
        context = make_context(accumulate_grad_batches=k, **scaler_settings(cell, SMALL_SCALE))
        model = context.prepare_module(make_model())
        wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=1.0))
        # The wrapper is a torch.optim.Optimizer at run time [PROXY-001]; the protocol cannot say so statically.
        target = cast(torch.optim.Optimizer, wrapper) if built_on == "wrapper" else wrapper.optimizer
        bare = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        outcomes, lrs, per_call = [], [], []
        scheduler: LRScheduler | None = None
        plain: LRScheduler | None = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for call, make_step in enumerate(makes):
                start = len(caught)
                if call == built_after:
                    scheduler = StepLR(target, step_size=1, gamma=0.5)
                with context.batch(call, is_last=call == len(makes) - 1):
                    closure = _batch_closure(context, model, wrapper, batches[call], cell)
                    wrapper.step(closure, make_optimizer_step=make_step)
                    outcomes.append(wrapper.last_outcome)
                    if scheduler is not None:
                        scheduler.step()
                middle = len(caught)
                if call == built_after:
                    plain = StepLR(bare, step_size=1, gamma=0.5)
                if built_on == "wrapper" or call in real:
                    bare.step()
                if plain is not None:
                    plain.step()
                parts = (caught[start:middle], caught[middle:])
                per_call.append([[(w.category.__name__, str(w.message)) for w in part] for part in parts])
                lrs.append((wrapper.param_groups[0]["lr"], bare.param_groups[0]["lr"]))
        want = [StepOutcome.STEPPED if call in real else StepOutcome.ACCUMULATED for call in range(len(makes))]
        assert outcomes == want, f"{run}: the calls took {outcomes}, expected {want}"
        for call, (got_warnings, want_warnings) in enumerate(per_call):
            assert got_warnings == want_warnings, (
                f"{run}, scheduler built on the {built_on}: call {call} ({outcomes[call]}) and the scheduler's "
                f"step warned {got_warnings}; plain PyTorch, whose optimizer steps only where the patched "
                f"step runs, warns {want_warnings}"
            )
        got_lrs, want_lrs = zip(*lrs, strict=True)
        assert got_lrs == pytest.approx(want_lrs), f"{run}: the lr after each call was {got_lrs}, torch's {want_lrs}"


_K, _A, _S = StepOutcome.SKIPPED_NON_FINITE, StepOutcome.ACCUMULATED, StepOutcome.STEPPED


def _hooked(context: TrainingContext, inners: dict[str, torch.optim.Optimizer], fired: list[str]) -> dict[str, Any]:
    """Each optimizer wrapped by ``context``, its step hooks recording ``"<name> pre"`` and ``"<name> post"``."""
    wrappers: dict[str, Any] = {name: context.wrap(inner) for name, inner in inners.items()}
    for name, wrapper in wrappers.items():
        wrapper.register_step_pre_hook(lambda *_, name=name: fired.append(f"{name} pre"))
        wrapper.register_step_post_hook(lambda *_, name=name: fired.append(f"{name} post"))
    return wrappers


@pytest.mark.cells(devices=_NOT_XLA, precisions=("16-mixed",))
@pytest.mark.requirement("PROXY-004")
@pytest.mark.varies(
    optimizer=("SGD", "Adam", "Adam foreach", "Adam fused"),
    window=(
        "1 micro-step",
        "k >= 2 micro-steps",
        "cut short by True",
        "partial, flushed by the last batch",
    ),
    make_optimizer_step=("True", "None"),
    call_form=("closure, wrapper.backward", "backward, then step()"),
    wrappers=("1", "2"),
    loss_scale=("backed off",),
)
# Under 16-mixed ``GradScaler`` does not call a non-fused optimizer's ``step`` on an overflow; a fused one's it calls
# (with ``found_inf``, its kernel skipping inside): a wrapper must keep that step's hooks from firing.
@pytest.mark.parametrize("kind", ["SGD", "Adam", "Adam foreach", "Adam fused"], ids=["sgd", "adam", "foreach", "fused"])
def test_step_hooks_do_not_fire_on_skipped_steps(make_context: MakeContext, cell: Cell, kind: str) -> None:
    """Overflows planted in some windows: the wrapper's step hooks fire on exactly the calls that report ``STEPPED``.

    A skipped step (non-finite gradients) is not taken, fused optimizers included, whose inner ``step``
    ``GradScaler`` calls anyway. One wrapper with windows of three (one cut short by ``True``, the last flushed),
    overflowing in its first and last windows; then two wrappers stepping every call in the backward-then-step
    form, the first overflowing twice in a row while the other (SGD) steps.
    """
    context = make_context(accumulate_grad_batches=3, **scaler_settings(cell, SMALL_SCALE))
    model = context.prepare_module(make_model())
    fired: list[str] = []
    wrapper = _hooked(context, {"A": _KINDS[kind](model.parameters())}, fired)["A"]
    # Windows {0, 1, 2} (overflows at 1), {3, 4} (cut short by True), {5} (the schedule), {6, 7} (flushed; overflows).
    infinite, make_step, calls = {1, 7}, {4: True}, 8
    want = [_A, _A, _K, _A, _S, _S, _A, _K]
    outcomes: list[StepOutcome | None] = []
    batches = make_batches(calls)
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == calls - 1):
            fired.clear()
            factor = math.inf if batch_idx in infinite else 1.0
            closure = _batch_closure(context, model, wrapper, batch, cell, factor)
            wrapper.step(closure, make_optimizer_step=make_step.get(batch_idx))
            outcomes.append(wrapper.last_outcome)
            assert fired == ["A pre", "A post"] * (want[batch_idx] is _S), (
                f"{kind}, batch {batch_idx} (expected {want[batch_idx].value}, reported {wrapper.last_outcome}; "
                f"overflows at batches {sorted(infinite)}): the step hooks fired as {fired}; they fire on a step "
                "taken, never on a skipped or accumulating call"
            )
    assert outcomes == want, f"check precondition: {kind}'s calls took {outcomes}, overflowing at {sorted(infinite)}"

    pair = make_context(**scaler_settings(cell, SMALL_SCALE))
    halves: Any = pair.prepare_module(Halves(3, 4))
    inners = {"A": _KINDS[kind](halves.a.parameters()), "B": torch.optim.SGD(halves.b.parameters(), lr=0.1)}
    wrappers, halves_of = _hooked(pair, inners, fired), {"A": halves.a, "B": halves.b}
    infinite_a = {1, 2}
    expected = {"A": [_S, _K, _K, _S, _S], "B": [_S] * 5}
    seen: dict[str, list[StepOutcome | None]] = {"A": [], "B": []}
    for batch_idx, batch in enumerate(make_batches(5, seed=3)):
        with pair.batch(batch_idx):
            for name, each in wrappers.items():
                fired.clear()
                factor = math.inf if name == "A" and batch_idx in infinite_a else 1.0
                _batch_closure(pair, halves_of[name], each, batch, cell, factor)()  # backward, then step()
                each.step()
                seen[name].append(each.last_outcome)
                want_now = expected[name][batch_idx]
                assert fired == [f"{name} pre", f"{name} post"] * (want_now is _S), (
                    f"{kind} as A beside an SGD B, batch {batch_idx}: {name}.step() (expected {want_now.value}, "
                    f"reported {each.last_outcome}) fired the hooks as {fired}; only {name}'s fire, and only on a "
                    f"step taken (A overflows at batches {sorted(infinite_a)})"
                )
    assert seen == expected, f"check precondition: the calls took {seen}, expected {expected}"
