"""The reference strategies for one device, DDP and FSDP2, and the names they are registered under.

The XLA strategy is in :mod:`.xla`; what every strategy shares, in :mod:`.base`.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import (
    DDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
    Strategy,
    StrategyRegistry,
)
from lightning.pytorch.trainer.states import TrainerFn
from torch.nn.parallel import DistributedDataParallel

from lightning_optimizer.reference.lightning import compat
from lightning_optimizer.reference.lightning.base import LoopSelector, ReferenceStrategyBase
from lightning_optimizer.reference.lightning.xla import ReferenceXLAStrategy
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec.implementation import GradScalerSettings

__all__ = [
    "STRATEGY_NAMES",
    "ReferenceDDPStrategy",
    "ReferenceFSDPStrategy",
    "ReferenceSingleDeviceStrategy",
    "register_strategies",
]


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
            self.check_device(torch.device(device))
        self._loop_selector = LoopSelector(grad_scaler)
        super().__init__(device="cpu" if device is None else device, precision_plugin=self._loop_selector.plugin)
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
    "mixed_precision": (
        "DistributedDataParallel's own mixed precision would cast the parameters and reduce the gradients in "
        "another dtype beside the reference's precision, which applies Trainer(precision=...) to the whole step "
        "(autocast, loss scaling, the window's mean): set Trainer(precision='bf16-mixed') or '16-mixed' instead"
    ),
    "module": "Lightning passes the module to DistributedDataParallel itself",
    "device_ids": "Lightning passes the device ids to DistributedDataParallel itself; set Trainer(devices=...)",
}
_DDP_ARGUMENTS = {"grad_scaler"} | (
    _parameters(DDPStrategy.__init__) | _parameters(DistributedDataParallel.__init__)
) - set(_DDP_REFUSED)
"""What ``ReferenceDDPStrategy`` takes: its own, ``DDPStrategy``'s and ``DistributedDataParallel``'s arguments."""


class ReferenceDDPStrategy(ReferenceStrategyBase, DDPStrategy):
    """Lightning's DDP (one process per device, gloo on CPU, NCCL on CUDA), the reference driving the sync.

    Accepts :class:`~lightning.pytorch.strategies.DDPStrategy`'s arguments (``start_method``,
    ``process_group_backend``, ...) and those it passes on to torch's ``DistributedDataParallel``
    (``find_unused_parameters``, ...), except ``precision_plugin``, ``module``, ``device_ids`` and
    ``mixed_precision`` (``Trainer(precision=...)`` is the reference's); any other
    argument is refused when the strategy is built. Micro-steps that do not close a window run under
    ``no_sync()``: a window costs one all-reduce. With several optimizers each closure's backward reaches only its
    own optimizer's parameters, which DDP allows with ``find_unused_parameters=True``.
    Use ``opt.backward(loss)`` or ``self.manual_backward(loss)`` (DDP must be prepared for each backward).
    ``grad_scaler`` configures the loss scaler of ``Trainer(precision="16-mixed")``, as on the single-device
    strategy.
    """

    def __init__(self, *, grad_scaler: GradScalerSettings | None = None, **kwargs: Any) -> None:
        _check_arguments("ReferenceDDPStrategy", kwargs, _DDP_ARGUMENTS, _DDP_REFUSED)
        self._loop_selector = LoopSelector(grad_scaler)
        super().__init__(precision_plugin=self._loop_selector.plugin, **kwargs)

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
        wrappers = self._loop_selector.wrappers()
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
        self._loop_selector = LoopSelector(grad_scaler, sharded=True)
        super().__init__(
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            **kwargs,
        )

    def setup_environment(self) -> None:
        """Lightning's set-up, with a device mesh of one data-parallel axis over every rank."""
        compat.set_model_parallel_sizes(self, self.num_nodes * self.num_processes, 1)
        super().setup_environment()


def _has_exclusive_parameters(wrappers: list[WrappedOptimizer[Any]]) -> bool:
    owned = [{id(p) for group in wrapper.param_groups for p in group["params"]} for wrapper in wrappers]
    return any(params != owned[0] for params in owned[1:])


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


def register_strategies() -> None:
    """Register :data:`STRATEGY_NAMES` in this Lightning's ``StrategyRegistry``.

    ``lightning.pytorch``'s here, ``pytorch_lightning``'s in the twin package; a name an earlier import registered is
    left as it is.
    """
    for name, (strategy, init_params, description) in _STRATEGIES.items():
        if name not in StrategyRegistry:
            StrategyRegistry.register(name, strategy, description=description, **init_params)
