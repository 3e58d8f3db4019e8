"""The base of every reference strategy, and its side of each run of a Trainer.

:class:`ReferenceStrategyBase` holds the overrides every reference strategy makes to its Lightning strategy;
:class:`LoopSelector` chooses, once per run, the loop of the module's optimization mode (:mod:`.loops`) and hands it
the strategy's hooks. The public strategies are in :mod:`.strategies` and :mod:`.xla`.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any, ClassVar

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import Strategy

from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.lightning import compat
from lightning_optimizer.reference.lightning.loops import AutomaticLoop, Loop, ManualLoop
from lightning_optimizer.reference.lightning.precision import ReferencePrecision
from lightning_optimizer.reference.lightning.settings import reference_precision
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec.implementation import GradScalerSettings

__all__ = ["LoopSelector", "ReferenceStrategyBase"]


class LoopSelector:
    """A reference strategy's side of each run: its precision plugin, and the loop of the running mode.

    The loop is chosen once per run, by the module's ``automatic_optimization``: when the strategy connects to a
    module a Trainer is attached to (as ``Trainer.fit`` connects it), else when the strategy is set up.
    """

    def __init__(self, grad_scaler: GradScalerSettings | None = None, *, sharded: bool = False) -> None:
        if grad_scaler is not None and not isinstance(grad_scaler, GradScalerSettings):
            raise TypeError(
                f"grad_scaler must be a lightning_optimizer.spec.GradScalerSettings or None, got "
                f"{type(grad_scaler).__name__}"
            )
        self.grad_scaler = grad_scaler
        self.sharded = sharded
        """The model is sharded with FSDP2 (``ReferenceFSDPStrategy``)."""
        self.plugin = ReferencePrecision()
        self.loop: Loop | None = None
        """The running loop: chosen for a run, ``None`` outside one."""

    def connect(self, model: LightningModule) -> None:
        """Choose the loop, if a Trainer is attached to ``model``: before Lightning validates its arguments."""
        trainer = compat.attached_trainer(model)
        if trainer is not None:
            self._choose(trainer, model)

    def setup(self, strategy: ReferenceStrategyBase, trainer: Trainer) -> None:
        """Set the run's loop up (chosen now if the strategy connected before a Trainer was attached)."""
        loop = self.loop
        if loop is None or loop.trainer is not trainer:
            model = strategy.lightning_module
            if model is None:
                raise RuntimeError("the strategy was set up before it was connected to a LightningModule")
            loop = self._choose(trainer, model)
        loop.setup(strategy)

    def _choose(self, trainer: Trainer, model: LightningModule) -> Loop:
        """The loop of ``model``'s mode on ``trainer``: the one running, or a new one (the old one ended first)."""
        kind: type[Loop] = AutomaticLoop if model.automatic_optimization else ManualLoop
        loop = self.loop
        if loop is not None and loop.trainer is trainer and type(loop) is kind:
            return loop
        self.teardown()
        self.loop = kind.start(trainer, self.plugin, self.grad_scaler, sharded=self.sharded)
        return self.loop

    def lightning_optimizers(self, optimizers: list[torch.optim.Optimizer]) -> list[WrappedOptimizer[Any]]:
        """The running loop's wrappers of ``optimizers``, in their order (none outside a fit)."""
        return [] if self.loop is None else self.loop.lightning_optimizers(optimizers)

    def wrappers(self) -> list[WrappedOptimizer[Any]]:
        """Every wrapper of the running fit, in the order of ``configure_optimizers``."""
        return [] if self.loop is None else self.loop.wrappers()

    def teardown(self) -> None:
        """End the running loop, if any."""
        loop, self.loop = self.loop, None
        if loop is not None:
            loop.teardown()


class ReferenceStrategyBase(Strategy):
    """The overrides every reference strategy makes to its Lightning strategy.

    A subclass makes its :class:`LoopSelector` before calling its Lightning strategy's constructor.
    """

    _loop_selector: LoopSelector
    _DEVICE_TYPES: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    @classmethod
    def check_device(cls, device: torch.device) -> None:
        """Refuse a device this strategy does not run on (a device given to it, or the one the Trainer chose)."""
        if device.type in cls._DEVICE_TYPES:
            return
        if device.type == "xla":
            raise ValueError(f"{cls.__name__} does not run on XLA devices: use strategy=ReferenceXLAStrategy()")
        raise ValueError(f"the reference strategies run on CPU, CUDA and XLA, not {device.type!r}")

    def connect(self, model: LightningModule) -> None:
        """Connect the model, as Lightning does, also before a Trainer is attached to it.

        With a Trainer attached the reference takes its precision, accumulation and clipping over now, before
        Lightning checks them; without one, when the strategy is set up.
        """
        self._loop_selector.connect(model)
        super().connect(model)

    def setup(self, trainer: Trainer) -> None:
        """Lightning's set-up, then the reference's context and wrappers."""
        super().setup(trainer)
        self._loop_selector.setup(self, trainer)

    @property
    def precision_plugin(self) -> Precision:
        """The reference's :class:`ReferencePrecision`, always."""
        return self._loop_selector.plugin

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        # Lightning's connector hands a strategy made from a registered name a plugin of its own choosing (for
        # 16-mixed on the CPU, after switching the Trainer to bf16-mixed with a warning). The reference keeps its
        # own, and takes on the precision the connector settled, so ``trainer.precision`` reads it from the start.
        own = self._loop_selector.plugin
        if isinstance(plugin, ReferencePrecision) and plugin is not own:
            raise ValueError("a reference strategy runs its own ReferencePrecision; set Trainer(precision=...)")
        compat.set_strategy_precision_plugin(self, own)
        flag = compat.precision_being_settled()
        if flag is not None and own.context is None:
            with suppress(ValueError):  # not a precision the reference runs: refused when it connects, before training
                own.configure(reference_precision(flag))

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The inner optimizers (checkpoints and LR schedulers see these)."""
        inner: list[torch.optim.Optimizer] = super().optimizers
        return inner

    @optimizers.setter
    def optimizers(self, optimizers: list[torch.optim.Optimizer]) -> None:
        compat.set_strategy_optimizers(self, optimizers)
        # What ``LightningModule.optimizers()`` returns: the reference's wrappers instead of LightningOptimizers.
        compat.set_module_optimizers(self, self._loop_selector.lightning_optimizers(optimizers))

    @property
    def reference_context(self) -> TrainingContext | None:
        """The reference's training context of the running fit, ``None`` outside one."""
        return self._loop_selector.plugin.context

    def on_train_start(self) -> None:
        """Restore a checkpoint's open windows (after Lightning's ``zero_grad`` at the start of the run)."""
        super().on_train_start()
        self._loop_selector.plugin.restore_loaded_state()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """A training batch starts: under automatic optimization its ``TrainingContext.batch`` block opens here.

        An epoch that the module's ``on_train_batch_start`` ended early (it returned -1) has its open windows
        flushed first (ACC-003).
        """
        super().on_train_batch_start(batch, batch_idx)
        if self._loop_selector.loop is not None:
            self._loop_selector.loop.start_batch()

    def on_train_end(self) -> None:
        """Training is over: an epoch that ``on_train_batch_start`` ended early has its open windows flushed."""
        if self._loop_selector.loop is not None:
            self._loop_selector.loop.end_training()
        super().on_train_end()

    def on_exception(self, exception: BaseException) -> None:
        """A failed fit: close the open ``batch`` block."""
        if self._loop_selector.loop is not None:
            self._loop_selector.loop.end_batch()
        super().on_exception(exception)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's training step, where the running loop runs it.

        Manual optimization: inside one ``TrainingContext.batch`` block. Automatic optimization: inside the closure
        of the wrapper's ``step()``, in the block the batch opened. Outside a run (before setup, after teardown: a
        loop driven by hand) it is Lightning's own, on the Trainer's own optimizers.
        """
        loop = self._loop_selector.loop
        if loop is None:
            return super().training_step(*args, **kwargs)
        return loop.training_step(lambda: super(ReferenceStrategyBase, self).training_step(*args, **kwargs))

    def teardown(self) -> None:
        """Lightning's teardown; the Trainer gets its own settings back."""
        self._loop_selector.teardown()
        super().teardown()
