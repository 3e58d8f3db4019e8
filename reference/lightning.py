"""Lightning integration: the reference's wrappers inside a real ``pytorch_lightning.Trainer.fit``.

A project changes one argument, the Trainer's ``strategy``::

    from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy

    trainer = Trainer(strategy=ReferenceSingleDeviceStrategy(), precision="16-mixed", accumulate_grad_batches=2)

(``ReferenceDDPStrategy`` for several processes, ``ReferenceXLAStrategy`` on one XLA device; or by name, once this
module is imported: ``Trainer(strategy="reference")``, ``"reference_ddp"``, ``"reference_xla"``, ... see
:data:`STRATEGY_NAMES`.) Under manual optimization ``self.optimizers()`` returns the reference's wrappers, so the
proposal's ``opt.backward(loss)`` and ``opt.step(closure=..., make_optimizer_step=...)`` work as the contract
says; under automatic optimization ``optimizer_step`` runs once per window, as in Lightning, and receives the
wrapper, whose ``optimizer.step(closure=optimizer_closure)`` closes the window that the batches before it
accumulated as micro-steps. The Trainer's precision, device,
``accumulate_grad_batches`` and ``gradient_clip_val`` are applied by a :class:`TrainingContext`; Lightning neither
autocasts nor scales: the strategy brings :class:`ReferencePrecision` into Lightning's precision slot. Lightning's
hooks, DDP's preparation before each backward and the global step of manual optimization come from the context's
hooks (``TrainingContext.register_hooks``).

Why a strategy: Lightning settles the precision when the ``Trainer`` is built, before any module or callback
code runs, and there it turns ``precision="16-mixed"`` on the CPU into ``"bf16-mixed"``, unless the strategy
brings its own precision plugin. The strategy also owns what the reference must take over from Lightning: the
precision plugin, the training iteration (one ``TrainingContext.batch`` per batch), the DDP wrapper and the
``backward`` that DDP has to be prepared for, the batches that only accumulate, and ``connect``, the one hook
that runs before Lightning rejects ``accumulate_grad_batches`` and ``gradient_clip_val`` for manual optimization.
The machinery shared by the strategies, one loop per optimization mode, is in :mod:`.lightning_loops`, the
precision plugin in :mod:`.lightning_precision`, the XLA strategy and accelerator in :mod:`.lightning_xla`; every
field of Lightning they touch outside the public API is in :mod:`.lightning_compat`.

This module needs ``pytorch-lightning``; ``lightning_optimizer.reference`` itself does not import it.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar, cast, overload

import torch
from torch.nn.parallel import DistributedDataParallel

from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec.implementation import GradScalerSettings

try:
    from pytorch_lightning import LightningModule, Trainer
    from pytorch_lightning.strategies import (
        DDPStrategy,
        ModelParallelStrategy,
        SingleDeviceStrategy,
        Strategy,
        StrategyRegistry,
    )
    from pytorch_lightning.trainer.states import TrainerFn

    from lightning_optimizer.reference import lightning_compat
    from lightning_optimizer.reference.lightning_loops import Integration, ReferenceStrategyBase
    from lightning_optimizer.reference.lightning_precision import ReferencePrecision
    from lightning_optimizer.reference.lightning_xla import ReferenceXLAAccelerator, ReferenceXLAStrategy
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"{__name__} needs pytorch-lightning ({error}): pip install 'lightning-optimizer[lightning]'",
        name=error.name,
    ) from error

__all__ = [
    "STRATEGY_NAMES",
    "ReferenceDDPStrategy",
    "ReferenceFSDPStrategy",
    "ReferencePrecision",
    "ReferenceSingleDeviceStrategy",
    "ReferenceXLAAccelerator",
    "ReferenceXLAStrategy",
    "wrapped_optimizers",
]

OptA = TypeVar("OptA", bound=torch.optim.Optimizer)
OptB = TypeVar("OptB", bound=torch.optim.Optimizer)
OptC = TypeVar("OptC", bound=torch.optim.Optimizer)
OptD = TypeVar("OptD", bound=torch.optim.Optimizer)


def _parameters(function: Callable[..., Any]) -> set[str]:
    """The keyword arguments ``function`` names (``self`` and ``**kwargs`` left out)."""
    return {
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if name != "self" and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    }


def _check_arguments(
    strategy: str, given: Collection[str], accepted: Collection[str], refused: Mapping[str, str]
) -> None:
    """Refuse, in the constructor, each argument of ``given`` that ``strategy`` refuses or does not know.

    ``refused`` maps a known argument to what to do instead. An unknown one names the closest accepted argument
    (``scaler`` -> ``grad_scaler``).
    """
    for name in given:
        if name in refused:
            raise TypeError(f"{strategy}({name}=...): {refused[name]}")
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted), n=1)
            advice = f"did you mean {close[0]}=...? " if close else ""
            raise TypeError(
                f"{strategy}() got an unknown argument {name!r}: {advice}It takes {', '.join(sorted(accepted))}"
            )


class ReferenceSingleDeviceStrategy(ReferenceStrategyBase, SingleDeviceStrategy):
    """One process, one device (CPU or CUDA), the reference doing precision, accumulation and clipping.

    ``device`` (a CPU or CUDA device) defaults to the device the Trainer's ``accelerator`` and ``devices``
    choose. ``grad_scaler``
    configures the loss scaler of ``Trainer(precision="16-mixed")`` (``torch.amp.GradScaler``'s arguments; ``None``:
    torch's defaults).
    """

    def __init__(
        self, device: torch.device | str | int | None = None, *, grad_scaler: GradScalerSettings | None = None
    ) -> None:
        if device is not None:
            self._check_device(torch.device(device))
        self._integration = Integration(grad_scaler)
        super().__init__(device="cpu" if device is None else device, precision_plugin=self._integration.plugin)
        self._device_given = device is not None
        self.parallel_devices: list[torch.device] | None = None
        """The devices the Trainer chose (Lightning's connector fills this in)."""

    @property
    def root_device(self) -> torch.device:
        """The device given, else the one the Trainer chose."""
        if not self._device_given and self.parallel_devices:
            return self.parallel_devices[0]
        given: torch.device = super().root_device
        return given

    def setup_environment(self) -> None:
        """Refuse several devices before anything starts."""
        if not self._device_given and self.parallel_devices and len(self.parallel_devices) > 1:
            raise ValueError(
                f"ReferenceSingleDeviceStrategy runs on one device, but the Trainer asks for "
                f"{len(self.parallel_devices)}; use strategy=ReferenceDDPStrategy() for several"
            )
        super().setup_environment()


_DDP_REFUSED = {
    "precision_plugin": "ReferenceDDPStrategy brings its own precision plugin; set Trainer(precision=...)",
    "module": "Lightning passes the module to DistributedDataParallel itself",
    "device_ids": "Lightning passes the device ids to DistributedDataParallel itself; set Trainer(devices=...)",
}
_DDP_ARGUMENTS = {"grad_scaler"} | (
    _parameters(DDPStrategy.__init__) | _parameters(DistributedDataParallel.__init__)
) - set(_DDP_REFUSED)
"""What ``ReferenceDDPStrategy`` takes: its own, ``DDPStrategy``'s and ``DistributedDataParallel``'s arguments."""


class ReferenceDDPStrategy(ReferenceStrategyBase, DDPStrategy):
    """Lightning's DDP (one process per device, gloo on CPU, NCCL on CUDA), the reference driving the sync.

    Accepts :class:`~pytorch_lightning.strategies.DDPStrategy`'s arguments (``start_method``,
    ``process_group_backend``, ...) and those it passes on to torch's ``DistributedDataParallel``
    (``find_unused_parameters``, ...), except ``precision_plugin``, ``module`` and ``device_ids``; any other
    argument is refused when the strategy is built. Micro-steps that do not close a window run under
    ``no_sync()``: a window costs one all-reduce. With several optimizers each closure's backward reaches only its
    own optimizer's parameters, which DDP allows with ``find_unused_parameters=True``.
    Use ``opt.backward(loss)`` or ``self.manual_backward(loss)`` (DDP must be prepared for each backward).
    ``grad_scaler`` configures the loss scaler of ``Trainer(precision="16-mixed")``, as on the single-device
    strategy.
    """

    def __init__(self, *, grad_scaler: GradScalerSettings | None = None, **kwargs: Any) -> None:
        _check_arguments("ReferenceDDPStrategy", kwargs, _DDP_ARGUMENTS, _DDP_REFUSED)
        self._integration = Integration(grad_scaler)
        super().__init__(precision_plugin=self._integration.plugin, **kwargs)

    def setup(self, trainer: Trainer) -> None:
        """Lightning's set-up and the reference's; refuse optimizers DDP cannot serve without unused parameters.

        Lightning runs the whole ``training_step`` inside DDP's forward, so DDP's reducer is prepared before each
        wrapper's backward (the context's ``before_backward`` hook calls ``pre_backward``), and not at all under the
        ``no_sync()`` of an accumulating micro-step.
        """
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        model = self.model
        assert isinstance(model, DistributedDataParallel)
        wrappers = self._integration.wrappers()
        if _has_exclusive_parameters(wrappers) and not model.find_unused_parameters:
            raise ValueError(
                f"{len(wrappers)} optimizers own different parameters, so each closure's backward reaches only "
                "some of the model's parameters: use ReferenceDDPStrategy(find_unused_parameters=True)"
            )


_FSDP_MESH = (
    "ReferenceFSDPStrategy brings its own precision plugin and runs every rank as one data-parallel rank: "
    "set Trainer(precision=...) and Trainer(devices=...)"
)
_FSDP_REFUSED = {"precision_plugin": _FSDP_MESH, "tensor_parallel_size": _FSDP_MESH, "data_parallel_size": _FSDP_MESH}
_FSDP_ARGUMENTS = {"grad_scaler"} | _parameters(ModelParallelStrategy.__init__) - set(_FSDP_REFUSED)
"""``ReferenceFSDPStrategy``'s further arguments: Lightning's ``ModelParallelStrategy``'s, the mesh sizes left out."""


class ReferenceFSDPStrategy(ReferenceStrategyBase, ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` for FSDP2 (one process per device), the reference driving the sync.

    Shard the model in the LightningModule's ``configure_model`` with ``fully_shard`` over
    ``self.device_mesh["data_parallel"]``, as Lightning documents for this strategy; the reference keeps that
    sharding. Micro-steps that do not close a window run without gradient sync, so a window costs one
    reduce-scatter round; the window mean, unscaling and clipping (by the global norm) apply to the shards.
    Every rank is one data-parallel rank (``tensor_parallel_size=1``). Checkpoints are Lightning's: sharded through
    ``torch.distributed.checkpoint`` (``save_distributed_checkpoint=True``), the reference's state of every rank
    in the checkpoint's metadata. ``grad_scaler`` configures the loss scaler of ``Trainer(precision="16-mixed")``.
    Further arguments are ``ModelParallelStrategy``'s but its mesh sizes; any other is refused when it is built.
    """

    def __init__(
        self,
        *,
        grad_scaler: GradScalerSettings | None = None,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        **kwargs: Any,
    ) -> None:
        _check_arguments("ReferenceFSDPStrategy", kwargs, _FSDP_ARGUMENTS, _FSDP_REFUSED)
        self._integration = Integration(grad_scaler, sharded=True)
        super().__init__(
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            **kwargs,
        )

    def setup_environment(self) -> None:
        """Lightning's set-up, with a device mesh of one data-parallel axis over every rank."""
        lightning_compat.set_model_parallel_sizes(self, self.num_nodes * self.num_processes, 1)
        super().setup_environment()


def _has_exclusive_parameters(wrappers: list[WrappedOptimizer[Any]]) -> bool:
    owned = [{id(p) for group in wrapper.param_groups for p in group["params"]} for wrapper in wrappers]
    return any(params != owned[0] for params in owned[1:])


@overload
def wrapped_optimizers(module: LightningModule, first: type[OptA], /) -> WrappedOptimizer[OptA]: ...


@overload
def wrapped_optimizers(
    module: LightningModule, first: type[OptA], second: type[OptB], /
) -> tuple[WrappedOptimizer[OptA], WrappedOptimizer[OptB]]: ...


@overload
def wrapped_optimizers(
    module: LightningModule, first: type[OptA], second: type[OptB], third: type[OptC], /
) -> tuple[WrappedOptimizer[OptA], WrappedOptimizer[OptB], WrappedOptimizer[OptC]]: ...


@overload
def wrapped_optimizers(
    module: LightningModule, first: type[OptA], second: type[OptB], third: type[OptC], fourth: type[OptD], /
) -> tuple[WrappedOptimizer[OptA], WrappedOptimizer[OptB], WrappedOptimizer[OptC], WrappedOptimizer[OptD]]: ...


def wrapped_optimizers(
    module: LightningModule, *optimizer_types: type[torch.optim.Optimizer]
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


_STRATEGIES: dict[str, tuple[type[Strategy], dict[str, Any], str]] = {
    "reference": (ReferenceSingleDeviceStrategy, {}, "one device, the reference's precision and accumulation"),
    "reference_ddp": (ReferenceDDPStrategy, {}, "Lightning's DDP driven by the reference: a window, one all-reduce"),
    "reference_ddp_find_unused_parameters_true": (
        ReferenceDDPStrategy,
        {"find_unused_parameters": True},
        "reference_ddp for several optimizers that own different parameters (a GAN)",
    ),
    "reference_ddp_spawn": (ReferenceDDPStrategy, {"start_method": "spawn"}, "reference_ddp, ranks spawned"),
    "reference_xla": (ReferenceXLAStrategy, {}, "one XLA device: a TPU core, or torch_xla's CPU backend"),
    "reference_fsdp": (ReferenceFSDPStrategy, {}, "FSDP2 (fully_shard in configure_model) driven by the reference"),
    "reference_ddp_spawn_find_unused_parameters_true": (
        ReferenceDDPStrategy,
        {"start_method": "spawn", "find_unused_parameters": True},
        "reference_ddp_find_unused_parameters_true, ranks spawned",
    ),
}

STRATEGY_NAMES: tuple[str, ...] = tuple(_STRATEGIES)
"""The names this module registers with Lightning's ``StrategyRegistry``: ``Trainer(strategy="reference")``."""


def _register_strategies() -> None:
    """Register the names (once: a name an earlier import registered is left as it is)."""
    for name, (strategy, init_params, description) in _STRATEGIES.items():
        if name not in StrategyRegistry:
            StrategyRegistry.register(name, strategy, description=description, **init_params)


_register_strategies()
