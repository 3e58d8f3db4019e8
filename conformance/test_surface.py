"""Surface checks: every member of the contract's protocols is there, with a compatible signature."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
from typing_extensions import get_protocol_members

from lightning_optimizer.spec import Cell, OptimizerWrapper, TrainingContext

_EXTRA = {
    inspect.Parameter.VAR_POSITIONAL: "positional arguments (*args)",
    inspect.Parameter.VAR_KEYWORD: "keyword arguments (**kwargs)",
}


def signature_problems(protocol_member: Callable[..., Any], implemented: Callable[..., Any]) -> list[str]:
    """How ``implemented`` fails to accept every call that ``protocol_member`` allows (empty when it does)."""
    try:
        actual = [p for p in inspect.signature(implemented).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        return []  # builtins without a signature: nothing to compare
    expected = [p for p in inspect.signature(protocol_member).parameters.values() if p.name != "self"]
    by_name, kinds, problems = {p.name: p for p in actual}, {p.kind for p in actual}, []
    for position, want in enumerate(expected):
        got, optional = by_name.get(want.name), want.default is not want.empty
        if want.kind in _EXTRA:
            problems += [] if want.kind in kinds else [f"does not accept extra {_EXTRA[want.kind]}"]
            continue
        if got is None:
            # **kwargs absorbs a keyword-only parameter, not one the contract lets callers pass by position.
            if want.VAR_KEYWORD not in kinds or want.kind is want.POSITIONAL_OR_KEYWORD:
                problems.append(f"has no parameter {want.name!r}")
            continue
        misplaced = got.kind is not got.POSITIONAL_OR_KEYWORD or actual.index(got) != position
        if want.kind is want.POSITIONAL_OR_KEYWORD and misplaced:
            problems.append(f"parameter {want.name!r} must be positional-or-keyword at position {position}")
        if optional and got.default is got.empty:
            problems.append(f"parameter {want.name!r} must be optional")
        if optional and got.default is not got.empty and want.default != got.default:
            problems.append(f"parameter {want.name!r} defaults to {got.default!r}, the contract says {want.default!r}")
    known = {p.name for p in expected}
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    extra = [p.name for p in actual if p.name not in known and p.kind in named and p.default is p.empty]
    return problems + [f"extra parameter {name!r} must have a default" for name in extra]


def check_surface(protocol: type, obj: object) -> list[str]:
    """Every protocol member that ``obj`` lacks or implements with an incompatible signature."""
    problems = []
    for name in sorted(get_protocol_members(protocol)):
        declared = inspect.getattr_static(protocol, name)
        if not hasattr(obj, name):
            problems.append(f"{name}: missing")
        elif not isinstance(declared, property) and not callable(implemented := getattr(obj, name)):
            problems.append(f"{name}: not callable")
        elif not isinstance(declared, property):
            problems += [f"{name}: {problem}" for problem in signature_problems(declared, implemented)]
    return problems


@pytest.mark.requirement("SURFACE-001")
@pytest.mark.varies(optimizer=("SGD",))
def test_wrapper_surface(make_context: Callable[..., TrainingContext], cell: Cell) -> None:
    """The wrapper that ``context.wrap`` returns has every member of ``OptimizerWrapper``."""
    context = make_context()
    model = context.prepare_module(torch.nn.Linear(3, 2))
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    problems = check_surface(OptimizerWrapper, wrapper)
    assert not problems, f"{type(wrapper).__name__} does not match OptimizerWrapper: " + "; ".join(problems)


@pytest.mark.requirement("SURFACE-002")
@pytest.mark.varies(optimizer=("SGD",))
def test_context_surface(make_context: Callable[..., TrainingContext], cell: Cell) -> None:
    """The training context that the factory returns has every member of ``TrainingContext``."""
    context = make_context()
    problems = check_surface(TrainingContext, context)
    assert not problems, f"{type(context).__name__} does not match TrainingContext: " + "; ".join(problems)
    assert context.precision == cell.precision, f"the context runs {context.precision!r}, the cell {cell.precision!r}"
    assert context.accumulate_grad_batches == 1
