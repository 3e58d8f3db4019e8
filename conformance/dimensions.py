"""The dimensions that the checks vary, and the per-requirement table of them (``docs/dimensions.md``).

A rule can hold in the case a check tries and break in another: a window of one micro-step but not of three, one
parameter group but not two, SGD but not fused Adam. Each check declares, with ``@pytest.mark.varies(...)``, the
values it tries along each dimension of :data:`DIMENSIONS` (the plugin refuses unknown names and values). The
property checks over generated schedules declare what their generator draws, and ``tests/test_dimensions.py``
checks that their fixed CI budget really reaches every declared value.

``python -m lightning_optimizer.conformance.dimensions [--write PATH]`` prints (or writes) the table: for each
requirement id, every dimension its checks vary and the values they try, with the cells (devices, precisions,
world sizes) where they run. It reads the checks' markers; nothing in it is written by hand.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from lightning_optimizer.spec import DEVICE_KINDS, PRECISIONS, REQUIREMENTS, requirement_group

__all__ = [
    "DIMENSIONS",
    "CheckDimensions",
    "check_modules",
    "collect",
    "dimension_problems",
    "render_markdown",
]

DIMENSIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "window": (
            "1 micro-step",
            "k >= 2 micro-steps",
            "cut short by True",
            "partial, flushed by the last batch",
            "open across epochs",
            "open while another optimizer steps",
            "open across a scale change",
            "carrying the last step's gradients",
        ),
        "make_optimizer_step": ("True", "False", "None"),
        "position": ("inside batch()", "outside batch()"),
        "wrappers": ("1", "2", "3"),
        "param_groups": ("1", "2 with other hyper-parameters", "added after wrap"),
        "optimizer": (
            "SGD",
            "SGD momentum",
            "SGD foreach",
            "Adam",
            "Adam foreach",
            "Adam fused",
            "AdamW",
            "LBFGS",
            "step(closure) recorded",
            "two-pass (SAM)",
        ),
        "parameters": (
            "shared by two optimizers",
            "frozen",
            "frozen after wrap",
            "unfrozen after wrap",
            "no gradient in a window",
        ),
        "call_form": (
            "closure, wrapper.backward",
            "closure, loss.backward",
            "toggle_model block, then step()",
            "backward, then step()",
            "loss.backward(), then step()",
        ),
        "backward_args": ("gradient", "retain_graph", "create_graph", "inputs", "positional", "graph freed"),
        "zero_grad": ("set_to_none=True", "set_to_none=False", "with a window open", "of another wrapper"),
        "outcome_read": ("after its own call", "after every call of every wrapper"),
        "step_kwargs": ("without gradients", "with gradients"),
        "clipping": ("norm", "value", "unscale_gradients() by hand"),
        "loss_scale": ("initial", "backed off", "grown", "settings given to the factory"),
        "copies": (
            "pickle",
            "deepcopy",
            "checkpoint",
            "fresh process",
            "copy then overflow or growth",
            "sharded checkpoint",
        ),
        "faults": (
            "raising closure",
            "raising closure after its backward",
            "raising toggle_model block",
            "raising hook",
            "raising LBFGS evaluation",
            "raising inner step",
            "failing closing step of a prepared window",
            "loss scaler's unscale_ raising before unscaling",
            "loss scaler's unscale_ raising after unscaling",
            "re-entered step",
            "refused load",
            "invalid argument",
            "left gradients changed in place",
            "hook raising before autograd wrote",
            "hook raising after autograd wrote",
            "raising load_state_dict",
            "raising add_param_group",
        ),
        "outside_change": (
            "module zero_grad()",
            "inner optimizer zero_grad()",
            "a gradient set to None",
            "parameter appended to a group",
            "parameter popped from a group",
            "group appended to param_groups",
            "add_param_group on the wrapper",
        ),
        "found_by": (
            "step(closure)",
            "step()",
            "unscale_gradients()",
            "its own backward()",
            "another wrapper's backward()",
        ),
        "recovery": ("discard()", "change undone", "retried"),
        "on_failure": ("discard", "restore"),
        "modules": ("1 prepared module", "2 prepared modules", "nested submodules", "BatchNorm", "buffers"),
        "tensor_dtypes": ("float64", "float32", "bfloat16", "float16", "complex", "integer"),
        "reduction": ("result", "count per window", "graph cuts per window", "reduce-scatters per window"),
        "ranks": ("overflow on one rank",),
        "zero_grad_after_step": ("True", "False"),
    }
)
"""Each dimension a check can vary, and its values (the vocabulary of ``@pytest.mark.varies``)."""


def check_modules() -> list[str]:
    """The suite's check modules (``test_*`` in this package), by name."""
    return sorted(path.stem for path in Path(__file__).parent.glob("test_*.py"))


def dimension_problems(varies: Mapping[str, Iterable[str]]) -> list[str]:
    """What is wrong with the keyword arguments of a ``varies`` marker: unknown dimensions or values."""
    problems = []
    for name, values in varies.items():
        known = DIMENSIONS.get(name)
        if known is None:
            problems.append(f"unknown dimension {name!r} (known: {', '.join(DIMENSIONS)})")
            continue
        if isinstance(values, str):
            problems.append(f"dimension {name!r}: give a tuple of values, not the string {values!r}")
            continue
        for value in values:
            if value not in known:
                problems.append(f"dimension {name!r}: unknown value {value!r} (known: {', '.join(known)})")
    return problems


@dataclass
class CheckDimensions:
    """One check's requirement ids, cells and declared dimensions, read from its markers."""

    name: str
    module: str
    requirements: tuple[str, ...]
    devices: tuple[str, ...] = DEVICE_KINDS
    precisions: tuple[str, ...] = PRECISIONS
    world_sizes: tuple[int, ...] = (1,)
    varies: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _marks(function: Callable[..., Any]) -> Iterator[Any]:
    yield from getattr(function, "pytestmark", [])


def _check_of(module: str, name: str, function: Callable[..., Any]) -> CheckDimensions:
    check = CheckDimensions(name=name, module=module, requirements=())
    for mark in _marks(function):
        if mark.name == "requirement":
            check.requirements += tuple(mark.args)
        elif mark.name == "cells":
            check.devices = tuple(mark.kwargs.get("devices", check.devices))
            check.precisions = tuple(mark.kwargs.get("precisions", check.precisions))
            check.world_sizes = tuple(mark.kwargs.get("world_sizes", check.world_sizes))
        elif mark.name == "varies":
            for dimension, values in mark.kwargs.items():
                known = check.varies.get(dimension, ())
                check.varies[dimension] = known + tuple(value for value in values if value not in known)
    takes_cell = "cell" in inspect.signature(function).parameters
    if not takes_cell:
        check.devices, check.precisions, check.world_sizes = (), (), ()
    return check


def collect(modules: Iterable[str] | None = None) -> list[CheckDimensions]:
    """Every check of the suite's modules (all of them by default), with what its markers declare."""
    checks = []
    for module_name in check_modules() if modules is None else modules:
        module = importlib.import_module(f"lightning_optimizer.conformance.{module_name}")
        for name, function in sorted(vars(module).items()):
            if name.startswith("test_") and callable(function):
                checks.append(_check_of(module_name, name, function))
    return checks


def _ordered(values: Iterable[str], vocabulary: tuple[str, ...]) -> list[str]:
    found = set(values)
    return [value for value in vocabulary if value in found]


def _cells(checks: list[CheckDimensions]) -> str:
    """Per device, the precisions and world sizes where the checks run."""
    parts = []
    for device in DEVICE_KINDS:
        there = [check for check in checks if device in check.devices]
        if not there:
            continue
        precisions = _ordered((p for check in there for p in check.precisions), PRECISIONS)
        sizes = sorted({size for check in there for size in check.world_sizes})
        parts.append(f"{device} ({', '.join(precisions)}; world size {', '.join(map(str, sizes))})")
    return "; ".join(parts) if parts else "none: the checks take no cell"


def render_markdown(checks: Iterable[CheckDimensions]) -> str:
    """The per-requirement table: each requirement's checks, cells and the values of every dimension varied."""
    checks = list(checks)
    lines = [
        "# What the checks vary, per requirement",
        "",
        "Generated by `python -m lightning_optimizer.conformance.dimensions --write docs/dimensions.md` from the",
        "checks' `requirement`, `cells` and `varies` markers (`make dimensions`); do not edit by hand. The values of a",
        "dimension are the union over the requirement's checks, separated by semicolons. The property checks over",
        "generated schedules (`test_generated_schedules_*`, CPU and CUDA) declare what their generator draws; a test",
        "checks that their fixed CI budget reaches every one of those values.",
        "",
    ]
    for rule_id in sorted(REQUIREMENTS, key=lambda rid: (requirement_group(rid), rid)):
        mine = [check for check in checks if rule_id in check.requirements]
        lines.append(f"## {rule_id}")
        lines.append("")
        lines.append(REQUIREMENTS[rule_id].split(". ")[0].rstrip(".") + ".")
        lines.append("")
        if not mine:
            lines += ["No check names this requirement.", ""]
            continue
        lines += ["| dimension | values the checks try |", "|---|---|"]
        lines.append(f"| checks | {', '.join(f'`{check.name}`' for check in mine)} |")
        lines.append(f"| cells | {_cells(mine)} |")
        for dimension, vocabulary in DIMENSIONS.items():
            values = _ordered((v for check in mine for v in check.varies.get(dimension, ())), vocabulary)
            if values:
                lines.append(f"| {dimension.replace('_', ' ')} | {'; '.join(values)} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the table, or write it to ``--write PATH``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", metavar="PATH", help="write the Markdown table to PATH instead of printing it")
    args = parser.parse_args(argv)
    text = render_markdown(collect())
    if args.write:
        Path(args.write).write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
