"""``wrapped_optimizers``: a LightningModule's ``optimizers()`` as the reference's wrappers, typed for mypy.

Typed structurally (any object with an ``optimizers()`` method), so the one function serves modules of
``lightning.pytorch`` and of ``pytorch_lightning`` alike; it imports neither. Both
``lightning_optimizer.reference.lightning`` and ``lightning_optimizer.reference.pytorch_lightning`` export it.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, cast, overload

import torch

from lightning_optimizer.reference.wrapper import WrappedOptimizer

__all__ = ["HasOptimizers", "wrapped_optimizers"]

OptA = TypeVar("OptA", bound=torch.optim.Optimizer)
OptB = TypeVar("OptB", bound=torch.optim.Optimizer)
OptC = TypeVar("OptC", bound=torch.optim.Optimizer)
OptD = TypeVar("OptD", bound=torch.optim.Optimizer)


class HasOptimizers(Protocol):
    """What :func:`wrapped_optimizers` needs of a module: Lightning's ``LightningModule.optimizers()``."""

    def optimizers(self) -> object:
        """The run's optimizers: one object, or a list of them."""
        ...


@overload
def wrapped_optimizers(module: HasOptimizers, first: type[OptA], /) -> WrappedOptimizer[OptA]: ...


@overload
def wrapped_optimizers(
    module: HasOptimizers, first: type[OptA], second: type[OptB], /
) -> tuple[WrappedOptimizer[OptA], WrappedOptimizer[OptB]]: ...


@overload
def wrapped_optimizers(
    module: HasOptimizers, first: type[OptA], second: type[OptB], third: type[OptC], /
) -> tuple[WrappedOptimizer[OptA], WrappedOptimizer[OptB], WrappedOptimizer[OptC]]: ...


@overload
def wrapped_optimizers(
    module: HasOptimizers, first: type[OptA], second: type[OptB], third: type[OptC], fourth: type[OptD], /
) -> tuple[WrappedOptimizer[OptA], WrappedOptimizer[OptB], WrappedOptimizer[OptC], WrappedOptimizer[OptD]]: ...


def wrapped_optimizers(
    module: HasOptimizers, *optimizer_types: type[torch.optim.Optimizer]
) -> WrappedOptimizer[Any] | tuple[WrappedOptimizer[Any], ...]:
    """``module.optimizers()``, typed: the reference wrappers, checked against the inner optimizer classes given.

    ``opt_gen, opt_dis = wrapped_optimizers(self, Adam, SGD)`` is ``self.optimizers()`` with the types mypy
    cannot know (``WrappedOptimizer[Adam]``, ``WrappedOptimizer[SGD]``); one class gives one wrapper, as
    ``self.optimizers()`` does for one optimizer. Raises ``TypeError`` when the run's optimizers differ.
    """
    if not optimizer_types:
        raise TypeError("name the inner optimizer class of each optimizer, e.g. wrapped_optimizers(self, Adam, SGD)")
    found = module.optimizers()
    optimizers: list[object] = list(found) if isinstance(found, list) else [found]
    if not all(isinstance(optimizer, WrappedOptimizer) for optimizer in optimizers):
        kinds = ", ".join(type(optimizer).__name__ for optimizer in optimizers)
        raise TypeError(
            f"{type(module).__name__}.optimizers() returned {kinds}, not reference wrappers: run the Trainer with "
            "strategy=ReferenceSingleDeviceStrategy() or ReferenceDDPStrategy()"
        )
    wrappers = cast(list[WrappedOptimizer[Any]], optimizers)
    inner = [type(wrapper.optimizer) for wrapper in wrappers]
    if len(inner) != len(optimizer_types) or not all(
        issubclass(kind, expected) for kind, expected in zip(inner, optimizer_types, strict=False)
    ):
        raise TypeError(
            f"configure_optimizers() made {[kind.__name__ for kind in inner]}, but the call names "
            f"{[kind.__name__ for kind in optimizer_types]}"
        )
    return wrappers[0] if len(wrappers) == 1 else tuple(wrappers)
