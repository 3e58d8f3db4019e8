"""Checks that the wrapper is a transparent proxy of its inner optimizer."""

from __future__ import annotations

import copy
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.harness import (
    Halves,
    assert_params_close,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
    oracle_autocast,
    oracle_step_done,
    run_steps,
)
from lightning_optimizer.conformance.oracles import WindowOracle, oracle_copy
from lightning_optimizer.conformance.plain_loop import real_step
from lightning_optimizer.spec import Cell, GradScalerSettings, ImplementationInfo, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
_NOT_XLA = ("cpu", "cuda")
"""Where the oracle comparisons below run: on XLA each new graph compiles (seconds); the proxying checks run there."""
SMALL_SCALE = GradScalerSettings(init_scale=2.0**4)
"""Under 16-mixed: a loss scale that keeps the fp16 gradients of the small model finite (no step is skipped)."""


def _finite_scaling(cell: Cell) -> dict[str, Any]:
    """The factory's loss-scaler argument that keeps every step of these checks taken (16-mixed cells only)."""
    return {"grad_scaler": SMALL_SCALE} if cell.precision == "16-mixed" else {}


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
    context, model, wrapper = _wrapped_adam(make_context, accumulate_grad_batches=2, **_finite_scaling(cell))
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
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = make_batches(6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scheduler = torch.optim.lr_scheduler.StepLR(target, step_size=1, gamma=0.5)
        for batch_idx, batch in enumerate(batches):
            with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):

                def closure(batch: Any = batch) -> torch.Tensor:
                    with context.autocast():
                        loss = mse(model, batch, device, dtype)
                    wrapper.backward(loss)
                    return loss

                wrapper.step(closure)
                if batch_idx % 2 == 1:
                    scheduler.step()
    assert wrapper.param_groups[0]["lr"] == pytest.approx(0.125), "three real steps should halve the lr three times"


class QuetzalSGD(torch.optim.SGD):
    """An SGD whose class name no wrapper can take from elsewhere: a user's own optimizer subclass."""


def _named_as_a_word(name: str, text: str) -> int:
    """How often ``name`` appears in ``text`` as a whole identifier (not inside a longer one)."""
    return len(re.findall(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text))


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
    if wrapper_name == inner_name:  # the wrapper's class took the inner's name: any mention of it will do
        named = _named_as_a_word(inner_name, rendered) >= 1
    else:
        named = _named_as_a_word(inner_name, rendered.replace(wrapper_name, " ")) >= 1
    assert named, (
        f"repr(wrapper) does not name the inner optimizer's class {inner_name!r} beyond the wrapper class's own "
        f"name {wrapper_name!r}: {rendered}"
    )


def _inner_kinds(
    cell: Cell, implementation: ImplementationInfo[Any]
) -> dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]]:
    kinds: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
        "SGD": lambda ps: torch.optim.SGD(ps, lr=0.1),
        "SGD foreach": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True),
        "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
        "AdamW": lambda ps: torch.optim.AdamW(ps, lr=0.01),
        "QuetzalSGD": lambda ps: QuetzalSGD(ps, lr=0.1),
    }
    lbfgs = "closure_evaluating_optimizers" in implementation.features
    if lbfgs and cell.precision in ("64-true", "32-true"):  # where LBFGS under 16-mixed is refused is left open
        kinds["LBFGS"] = lambda ps: torch.optim.LBFGS(ps, lr=0.5)
    return kinds


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
    for name, build in _inner_kinds(cell, implementation).items():
        context = make_context()
        model = context.prepare_module(make_model())
        first, last = list(model.parameters())[:2], list(model.parameters())[2:]
        inner = build(first)
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


def _batch_closure(context: TrainingContext, model: torch.nn.Module, wrapper: Any, batch: Any, cell: Cell) -> Any:
    def closure() -> torch.Tensor:
        with context.autocast():
            loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
        wrapper.backward(loss)
        return loss

    return closure


_ADDED_GROUP: dict[str, dict[str, Any]] = {
    "SGD momentum": {"lr": 0.3, "momentum": 0.5, "weight_decay": 0.1, "dampening": 0.2},
    "Adam": {"lr": 0.05, "betas": (0.5, 0.8), "weight_decay": 0.1, "eps": 1e-6},
}


def _first_layer_optimizer(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    first = list(model.parameters())[:2]
    if kind == "Adam":
        return torch.optim.Adam(first, lr=0.01)
    return torch.optim.SGD(first, lr=0.1, momentum=0.9)


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
    context = make_context(accumulate_grad_batches=2, **_finite_scaling(cell))
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(_first_layer_optimizer(kind, model))
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
    oracle_optimizer = _first_layer_optimizer(kind, oracle_model)
    oracle_optimizer.add_param_group({"params": list(oracle_model.parameters())[2:], **hyper})
    oracle = WindowOracle(oracle_model, oracle_optimizer, cell, 2)
    if oracle.scaler is not None:
        oracle.scaler = GradScaler(cell_device(cell).type, **SMALL_SCALE.as_kwargs())
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
    context = make_context(accumulate_grad_batches=2, **_finite_scaling(cell))
    model = context.prepare_module(make_model())
    params = list(model.parameters())
    wrappers: dict[str, Any] = {
        "A": context.wrap(torch.optim.Adam(params[:2], lr=0.01)),
        "B": context.wrap(torch.optim.SGD(params[2:])),
    }
    fired: list[str] = []
    for name, wrapper in wrappers.items():
        wrapper.register_step_pre_hook(lambda optimizer, args, kwargs, name=name: fired.append(f"{name} pre"))
        wrapper.register_step_post_hook(lambda optimizer, args, kwargs, name=name: fired.append(f"{name} post"))
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


def _two_group_sgd(model: torch.nn.Module) -> torch.optim.SGD:
    first = list(model.parameters())[:2]
    groups: list[dict[str, Any]] = [{"params": [first[0]]}, {"params": [first[1]], "lr": 0.4, "momentum": 0.5}]
    return torch.optim.SGD(groups, lr=1.0, momentum=0.9)


def _last_layer_nesterov(model: torch.nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(list(model.parameters())[2:], lr=0.05, momentum=0.8, nesterov=True)


def _inverse_step(step: int) -> float:
    return 1.0 / (step + 1)


def _two_scheduled_optimizers_oracle(
    oracle_model: torch.nn.Module, batches: list[Any], steps: dict[str, set[int]], cell: Cell
) -> None:
    """The plain loop of the two-schedulers check: A and B step (and their schedulers with them) at ``steps``.

    Two plain optimizers and schedulers; under 16-mixed one plain GradScaler, updated at the end of each batch in
    which an optimizer stepped. In A's backward B's parameters do not take gradients, and back.
    """
    oracle_a, oracle_b = _two_group_sgd(oracle_model), _last_layer_nesterov(oracle_model)
    oracle_scheds = {
        "A": torch.optim.lr_scheduler.StepLR(oracle_a, step_size=1, gamma=0.5),
        "B": torch.optim.lr_scheduler.LambdaLR(oracle_b, _inverse_step),
    }
    oracles = {"A": oracle_a, "B": oracle_b}
    scaler = None if cell.precision != "16-mixed" else GradScaler(cell_device(cell).type, **SMALL_SCALE.as_kwargs())
    windows = {"A": 0, "B": 0}
    device, dtype = cell_device(cell), cell_dtype(cell)
    for batch_idx, batch in enumerate(batches):
        for name, optimizer in oracles.items():
            other = oracles["B" if name == "A" else "A"]
            others = [p for group in other.param_groups for p in group["params"]]
            for param in others:
                param.requires_grad_(False)
            with oracle_autocast(cell):
                loss = mse(oracle_model, batch, device, dtype)
            (loss if scaler is None else scaler.scale(loss)).backward()
            for param in others:
                param.requires_grad_(True)
            windows[name] += 1
            if batch_idx in steps[name]:
                real_step(optimizer, windows[name], scaler)  # the window's mean, unscaled, stepped, cleared
                oracle_scheds[name].step()
                windows[name] = 0
        if scaler is not None:
            scaler.update()  # every batch has a step of A or B
        oracle_step_done(cell)


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
    context = make_context(accumulate_grad_batches=2, **_finite_scaling(cell))
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    opt_a, opt_b = context.wrap(_two_group_sgd(model)), context.wrap(_last_layer_nesterov(model))
    # A follows the schedule: windows {0, 1}, {2, 3}, {4} (flushed). B: {0} (True), {1, 2} (cut short), {3}, {4}.
    schedule_b: dict[int, bool | None] = {0: True, 1: False, 2: True, 3: None, 4: None}
    steps = {"A": {1, 3, 4}, "B": {0, 2, 3, 4}}
    batches = make_batches(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The wrapper is a torch.optim.Optimizer at run time [PROXY-001]; the protocol cannot say so statically.
        sched_a = torch.optim.lr_scheduler.StepLR(cast(torch.optim.Optimizer, opt_a), step_size=1, gamma=0.5)
        sched_b = torch.optim.lr_scheduler.LambdaLR(opt_b.optimizer, _inverse_step)
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


@dataclass(frozen=True)
class _SchedulerRun:
    """A run of calls, a scheduler stepped after each: the window length, each call's argument, the real calls."""

    accumulate_grad_batches: int
    make_optimizer_step: tuple[bool | None, ...]
    real: frozenset[int]
    """The calls that take a real step (worked out by hand from the accumulation rule)."""
    built_after: int = 0
    """How many calls run before the scheduler is built."""

    @property
    def id(self) -> str:
        return (
            f"k={self.accumulate_grad_batches}, calls {list(self.make_optimizer_step)}, built after {self.built_after}"
        )


_SCHEDULER_RUNS = (
    _SchedulerRun(1, (None, None, None), frozenset({0, 1, 2})),
    _SchedulerRun(2, (None,) * 4, frozenset({1, 3})),
    _SchedulerRun(3, (None, True, None, None, None, None), frozenset({1, 2, 5})),
    _SchedulerRun(1, (False, False, True, None), frozenset({2, 3})),
    _SchedulerRun(2, (None,) * 5, frozenset({1, 3, 4}), built_after=2),
)
"""Inside ``batch()``: a first call that steps (no warning anywhere), windows of two, one of three cut short by
``True`` (the schedule then closes batch 2 alone), accumulation by ``False``, and a scheduler built after a real step
whose first step follows an accumulating call (the last window flushed by the epoch's last batch)."""


def _warnings_of(caught: list[warnings.WarningMessage]) -> list[tuple[str, str]]:
    return [(type(w.message).__name__ if isinstance(w.message, Warning) else "str", str(w.message)) for w in caught]


def _shown(caught: list[tuple[str, str]]) -> list[str]:
    """Warnings as a failure shows them: the category and the message's first words."""
    return [
        f"{category}: {message[:60]}..." if len(message) > 60 else f"{category}: {message}"
        for category, message in caught
    ]


def _plain_scheduler_warnings(run: _SchedulerRun, built_on: str) -> tuple[list[list[tuple[str, str]]], list[float]]:
    """The plain-PyTorch oracle: per call, what a bare SGD and the same scheduler on it warn, and the lr after it.

    The bare optimizer's ``step`` runs where the object the scheduler patched has its ``step`` called: on the real
    calls for the inner optimizer, on every call for the wrapper (whose own ``step`` the scheduler patched).
    """
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    per_call: list[list[tuple[str, str]]] = []
    lrs: list[float] = []
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in range(len(run.make_optimizer_step)):
            start = len(caught)
            if call == run.built_after:
                scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            if built_on == "wrapper" or call in run.real:
                optimizer.step()
            if scheduler is not None:
                scheduler.step()
            per_call.append(_warnings_of(caught[start:]))
            lrs.append(optimizer.param_groups[0]["lr"])
    return per_call, lrs


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
    for run in _SCHEDULER_RUNS:
        context = make_context(accumulate_grad_batches=run.accumulate_grad_batches, **_finite_scaling(cell))
        model = context.prepare_module(make_model())
        wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=1.0))
        # The wrapper is a torch.optim.Optimizer at run time [PROXY-001]; the protocol cannot say so statically.
        target = cast(torch.optim.Optimizer, wrapper) if built_on == "wrapper" else wrapper.optimizer
        calls = len(run.make_optimizer_step)
        per_call: list[list[tuple[str, str]]] = []
        lrs: list[float] = []
        outcomes: list[StepOutcome | None] = []
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for call, make_step in enumerate(run.make_optimizer_step):
                start = len(caught)
                if call == run.built_after:
                    scheduler = torch.optim.lr_scheduler.StepLR(target, step_size=1, gamma=0.5)
                with context.batch(call, is_last=call == calls - 1):
                    closure = _batch_closure(context, model, wrapper, batches[call], cell)
                    wrapper.step(closure, make_optimizer_step=make_step)
                    outcomes.append(wrapper.last_outcome)
                    if scheduler is not None:
                        scheduler.step()
                per_call.append(_warnings_of(caught[start:]))
                lrs.append(wrapper.param_groups[0]["lr"])
        want_outcomes = [StepOutcome.STEPPED if call in run.real else StepOutcome.ACCUMULATED for call in range(calls)]
        assert outcomes == want_outcomes, f"{run.id}: the calls took {outcomes}, expected {want_outcomes}"
        want, want_lrs = _plain_scheduler_warnings(run, built_on)
        for call, (got_warnings, want_warnings) in enumerate(zip(per_call, want, strict=True)):
            assert got_warnings == want_warnings, (
                f"{run.id}, scheduler built on the {built_on}: call {call} ({outcomes[call]}) and the scheduler's "
                f"step warned {_shown(got_warnings)}; plain PyTorch, whose optimizer steps only where the patched "
                f"step runs, warns {_shown(want_warnings)}"
            )
        assert lrs == pytest.approx(want_lrs), f"{run.id}: the lr after each call was {lrs}, plain PyTorch's {want_lrs}"


_SKIP_KINDS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "SGD": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "Adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "Adam foreach": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True),
    "Adam fused": lambda ps: torch.optim.Adam(ps, lr=0.01, fused=True),
}
"""Under 16-mixed ``GradScaler`` does not call a non-fused optimizer's ``step`` on an overflow; a fused one's it calls
(with ``found_inf``, its kernel skipping inside): a wrapper must keep that step's hooks from firing."""

_K, _A, _S = StepOutcome.SKIPPED_NON_FINITE, StepOutcome.ACCUMULATED, StepOutcome.STEPPED


def _hooked(wrapper: Any, name: str, fired: list[str]) -> None:
    wrapper.register_step_pre_hook(lambda optimizer, args, kwargs: fired.append(f"{name} pre"))
    wrapper.register_step_post_hook(lambda optimizer, args, kwargs: fired.append(f"{name} post"))


def _hooks_for(name: str, outcome: StepOutcome | None) -> list[str]:
    return [f"{name} pre", f"{name} post"] if outcome is StepOutcome.STEPPED else []


def _overflowing_loss(context: TrainingContext, model: torch.nn.Module, batch: Any, cell: Cell, infinite: bool) -> Any:
    with context.autocast():
        loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
    return loss * math.inf if infinite else loss


def _hooked_halves(
    make_context: MakeContext, cell: Cell, kind: str, fired: list[str]
) -> tuple[TrainingContext, dict[str, Any], dict[str, torch.nn.Module]]:
    """A context, its wrappers ``"A"`` (a ``kind`` on ``Halves(3, 4).a``) and ``"B"`` (SGD on ``.b``), and the halves.

    Each wrapper's step hooks record ``"<name> pre"`` and ``"<name> post"`` in ``fired``.
    """
    pair = make_context(**_finite_scaling(cell))
    halves = pair.prepare_module(Halves(3, 4))
    assert isinstance(halves, Halves)
    wrappers: dict[str, Any] = {
        "A": pair.wrap(_SKIP_KINDS[kind](halves.a.parameters())),
        "B": pair.wrap(torch.optim.SGD(halves.b.parameters(), lr=0.1)),
    }
    for name, each in wrappers.items():
        _hooked(each, name, fired)
    return pair, wrappers, {"A": halves.a, "B": halves.b}


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
@pytest.mark.parametrize("kind", list(_SKIP_KINDS), ids=["sgd", "adam", "foreach", "fused"])
def test_step_hooks_do_not_fire_on_skipped_steps(make_context: MakeContext, cell: Cell, kind: str) -> None:
    """Overflows planted in some windows: the wrapper's step hooks fire on exactly the calls that report ``STEPPED``.

    A skipped step (non-finite gradients) is not taken, fused optimizers included, whose inner ``step``
    ``GradScaler`` calls anyway. One wrapper with windows of three (one cut short by ``True``, the last flushed),
    overflowing in its first and last windows; then two wrappers stepping every call in the backward-then-step
    form, the first overflowing twice in a row while the other (SGD) steps.
    """
    context = make_context(accumulate_grad_batches=3, **_finite_scaling(cell))
    model = context.prepare_module(make_model())
    wrapper: Any = context.wrap(_SKIP_KINDS[kind](model.parameters()))
    fired: list[str] = []
    _hooked(wrapper, "A", fired)
    # Windows {0, 1, 2} (overflows at 1), {3, 4} (cut short by True), {5} (the schedule), {6, 7} (flushed; overflows).
    infinite, make_step, calls = {1, 7}, {4: True}, 8
    want = [_A, _A, _K, _A, _S, _S, _A, _K]
    outcomes: list[StepOutcome | None] = []
    batches = make_batches(calls)
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == calls - 1):

            def closure(batch: Any = batch, blow_up: bool = batch_idx in infinite) -> Any:
                loss = _overflowing_loss(context, model, batch, cell, blow_up)
                wrapper.backward(loss)
                return loss

            fired.clear()
            wrapper.step(closure, make_optimizer_step=make_step.get(batch_idx))
            outcomes.append(wrapper.last_outcome)
            assert fired == _hooks_for("A", want[batch_idx]), (
                f"{kind}, batch {batch_idx} (expected {want[batch_idx].value}, reported {wrapper.last_outcome}; "
                f"overflows at batches {sorted(infinite)}): the step hooks fired as {fired}; they fire on a step "
                "taken, never on a skipped or accumulating call"
            )
    assert outcomes == want, f"check precondition: {kind}'s calls took {outcomes}, overflowing at {sorted(infinite)}"

    pair, wrappers, halves_of = _hooked_halves(make_context, cell, kind, fired)
    infinite_a = {1, 2}
    expected = {"A": [_S, _K, _K, _S, _S], "B": [_S] * 5}
    seen: dict[str, list[StepOutcome | None]] = {"A": [], "B": []}
    for batch_idx, batch in enumerate(make_batches(5, seed=3)):
        with pair.batch(batch_idx):
            for name, each in wrappers.items():
                fired.clear()
                blow_up = name == "A" and batch_idx in infinite_a
                each.backward(_overflowing_loss(pair, halves_of[name], batch, cell, blow_up))
                each.step()
                seen[name].append(each.last_outcome)
                want_now = expected[name][batch_idx]
                assert fired == _hooks_for(name, want_now), (
                    f"{kind} as A beside an SGD B, batch {batch_idx}: {name}.step() (expected {want_now.value}, "
                    f"reported {each.last_outcome}) fired the hooks as {fired}; only {name}'s fire, and only on a "
                    f"step taken (A overflows at batches {sorted(infinite_a)})"
                )
    assert seen == expected, f"check precondition: the calls took {seen}, expected {expected}"
