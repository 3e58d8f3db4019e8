"""What the reference strategies share: the base strategy, and one loop per optimization mode.

A reference strategy connects to a LightningModule and picks, once per run of the Trainer, the loop of the module's
optimization mode: :class:`ManualLoop` (one ``TrainingContext.batch`` block around each ``training_step``) or
:class:`AutomaticLoop` (the block spans the batch, because Lightning runs ``training_step`` inside the closure the
wrapper's ``step()`` evaluates). The loop runs the context's hooks (Lightning's hooks, DDP's preparation before
each backward, the global step of manual optimization), and :class:`TrainerChanges` keeps what it changes on the
Trainer, given back at teardown. The public strategies are in :mod:`.lightning`; every field of Lightning touched
outside its public API is in :mod:`.lightning_compat`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack, nullcontext, suppress
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from lightning_fabric.utilities.exceptions import MisconfigurationException
from pytorch_lightning import Callback, LightningModule, Trainer
from pytorch_lightning.plugins.precision import Precision
from pytorch_lightning.strategies import Strategy
from pytorch_lightning.trainer.states import TrainerFn
from torch.amp.grad_scaler import GradScaler
from torch.utils.hooks import RemovableHandle

from lightning_optimizer.reference import lightning_compat
from lightning_optimizer.reference.clipping import ClipAlgorithm
from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.fsdp import fsdp_modules
from lightning_optimizer.reference.lightning_precision import ReferencePrecision
from lightning_optimizer.reference.precision import outside_autocast
from lightning_optimizer.reference.window import evaluates_closure
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec.implementation import GradScalerSettings
from lightning_optimizer.spec.types import PRECISIONS, StepOutcome
from lightning_optimizer.spec.types import Precision as PrecisionName

__all__ = [
    "AutomaticLoop",
    "Integration",
    "Loop",
    "ManualLoop",
    "ReferenceStrategyBase",
    "RunSettings",
    "TrainerChanges",
    "reference_precision",
]


def reference_precision(flag: object) -> PrecisionName:
    """``Trainer(precision=...)`` as Lightning keeps it, checked: one of the precisions the reference runs."""
    if not isinstance(flag, str):
        raise RuntimeError(
            "cannot read Trainer(precision=...) from this pytorch_lightning version; the reference strategies "
            "are made for pytorch_lightning 2.6"
        )
    for name in PRECISIONS:
        if flag == name:
            return name
    raise ValueError(
        f"Trainer(precision={flag!r}) is not a precision the reference runs; use one of {', '.join(PRECISIONS)}"
    )


@dataclass(frozen=True)
class RunSettings:
    """What the reference takes over from the Trainer's arguments for one run."""

    precision: PrecisionName
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: ClipAlgorithm
    grad_scaler: GradScalerSettings | None = None

    @classmethod
    def read(
        cls, trainer: Trainer, grad_scaler: GradScalerSettings | None, gradient_clip_val: float | None
    ) -> RunSettings:
        """The Trainer's settings, ``gradient_clip_val`` being the clipping the reference applies, checked now."""
        algorithm = trainer.gradient_clip_algorithm
        precision = reference_precision(lightning_compat.requested_precision(trainer))
        if grad_scaler is not None and precision != "16-mixed":
            raise ValueError(
                f"the strategy's grad_scaler settings apply to Trainer(precision='16-mixed'), the one precision that "
                f"scales the loss; this Trainer runs {precision!r}: drop grad_scaler or use 16-mixed"
            )
        settings = cls(
            precision=precision,
            accumulate_grad_batches=trainer.accumulate_grad_batches,
            gradient_clip_val=None if gradient_clip_val is None or gradient_clip_val == 0 else float(gradient_clip_val),
            gradient_clip_algorithm="value" if algorithm is not None and algorithm.value == "value" else "norm",
            grad_scaler=grad_scaler,
        )
        settings.context("cpu")  # the reference validates every setting now, before anything changes
        return settings

    def context(self, device: str, *, sharded: bool = False) -> TrainingContext:
        """A training context with these settings on ``device`` (FSDP2 when ``sharded``, else one process or DDP)."""
        scaler = None if self.grad_scaler is None else GradScaler(device, **self.grad_scaler.as_kwargs())
        return TrainingContext(
            self.precision,
            device,  # type: ignore[arg-type]  # the context names an unknown device in its error
            self.accumulate_grad_batches,
            gradient_clip_val=self.gradient_clip_val,
            gradient_clip_algorithm=self.gradient_clip_algorithm,
            scaler=scaler,
            strategy="fsdp" if sharded else "ddp",
        )


def _callbacks(trainer: Trainer) -> list[Callback]:
    """``trainer.callbacks``, the Trainer's own list (a property Lightning does not annotate)."""
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    return callbacks


def _call_hooks(trainer: Trainer, name: str, *args: Any) -> None:
    """Lightning's hook ``name``: every callback's, then the module's (the order of Lightning's own calls)."""
    module = trainer.lightning_module
    for callback in _callbacks(trainer):
        getattr(callback, name)(trainer, module, *args)
    getattr(module, name)(*args)


class TrainerChanges:
    """Everything the reference changes on one Trainer during a run, each saved when made; :meth:`restore` undoes it.

    The Trainer's ``accumulate_grad_batches``, ``gradient_clip_val`` and ``gradient_clip_algorithm`` get their
    values from before the run back, the epoch loop its own accumulation rule, the automatic loop its own way to run
    a batch, the callback list its callbacks.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self._arguments = (trainer.accumulate_grad_batches, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        self._callbacks: list[Callback] = []
        self._decides_accumulation = False
        self._routes_accumulating_batches = False

    def take_accumulation_and_clipping(self) -> None:
        """Hide ``accumulate_grad_batches`` and ``gradient_clip_val`` from Lightning's checks.

        Lightning refuses both for manual optimization; the reference applies them.
        """
        self.trainer.accumulate_grad_batches = 1
        self.trainer.gradient_clip_val = None

    def give_accumulation_back(self) -> None:
        """Give the Trainer its accumulation back, once Lightning has checked its arguments.

        Lightning's loop and ``trainer.estimated_stepping_batches`` read it.
        """
        self.trainer.accumulate_grad_batches = self._arguments[0]

    def decide_accumulation(self, answer: Callable[[Callable[[], bool]], bool]) -> None:
        """Let ``answer`` tell the epoch loop whether a batch only accumulated (see :mod:`.lightning_compat`)."""
        lightning_compat.decide_accumulation(self.trainer, answer)
        self._decides_accumulation = True

    def route_accumulating_batches(self, micro_step: Callable[[Callable[[], Any]], object]) -> None:
        """Have ``micro_step`` run the closure of each batch that only accumulates (see :mod:`.lightning_compat`)."""
        lightning_compat.route_accumulating_batches(self.trainer, micro_step)
        self._routes_accumulating_batches = True

    def insert_callback(self, callback: Callback) -> None:
        """Run ``callback`` before every other callback of the Trainer."""
        _callbacks(self.trainer).insert(0, callback)
        self._callbacks.append(callback)

    def restore(self) -> None:
        """Give the Trainer back every setting, callback and rule as they were before the run."""
        trainer = self.trainer
        if self._decides_accumulation:
            lightning_compat.forget_accumulation_decision(trainer)
            self._decides_accumulation = False
        if self._routes_accumulating_batches:
            lightning_compat.forget_accumulating_batches(trainer)
            self._routes_accumulating_batches = False
        callbacks = _callbacks(trainer)
        for callback in self._callbacks:
            if callback in callbacks:
                callbacks.remove(callback)
        self._callbacks = []
        trainer.accumulate_grad_batches, trainer.gradient_clip_val, trainer.gradient_clip_algorithm = self._arguments


class Loop(ABC):
    """The reference inside one run of a Trainer (fit, validate, test or predict), for one optimization mode.

    Made by :meth:`start` when the strategy connects (it reads and checks the Trainer's settings and takes over
    what the mode needs), set up by :meth:`setup` once Lightning has placed the model, ended by :meth:`teardown`.
    Lightning decides which batches accumulate, by its own rule (``Strategy.handles_gradient_accumulation`` stays
    ``False``): the context's windows close at the same batches.
    """

    def __init__(
        self,
        trainer: Trainer,
        plugin: ReferencePrecision,
        settings: RunSettings,
        changes: TrainerChanges,
        *,
        sharded: bool,
    ) -> None:
        self.trainer = trainer
        self.plugin = plugin
        self.settings = settings
        self.changes = changes
        self.sharded = sharded
        self._strategy: Strategy | None = None
        self._hooks: RemovableHandle | None = None
        self._inner: list[torch.optim.Optimizer] = []
        self._wrappers: dict[int, WrappedOptimizer[Any]] = {}

    @classmethod
    def start(
        cls, trainer: Trainer, plugin: ReferencePrecision, grad_scaler: GradScalerSettings | None, *, sharded: bool
    ) -> Loop:
        """A run's loop: the Trainer's settings read and checked, then taken over (nothing changes if one is bad)."""
        settings = RunSettings.read(trainer, grad_scaler, cls._reference_clip_val(trainer))
        loop = cls(trainer, plugin, settings, TrainerChanges(trainer), sharded=sharded)
        loop._take_over()
        plugin.configure(settings.precision)
        return loop

    @staticmethod
    @abstractmethod
    def _reference_clip_val(trainer: Trainer) -> float | None:
        """The ``Trainer(gradient_clip_val=...)`` the context applies itself."""

    @abstractmethod
    def _take_over(self) -> None:
        """Change what the mode needs changed on the Trainer before Lightning checks its arguments."""

    @abstractmethod
    def _start_training(self) -> None:
        """The fit's wrappers are in place: the mode's last changes."""

    def setup(self, strategy: ReferenceStrategyBase) -> None:
        """Build the context once Lightning has placed the model; in a fit, wrap every optimizer with it."""
        trainer = self.trainer
        device = strategy.root_device
        strategy._check_device(device)
        context = self.settings.context(device.type, sharded=self.sharded)
        self.plugin.attach(context, trainer.global_rank, trainer.world_size)
        self.plugin.backward_region = self.backward_region
        if trainer.state.fn != TrainerFn.FITTING:
            return
        model = strategy.model
        assert model is not None
        self._check_closure_evaluators(strategy.optimizers)
        if self.sharded and not fsdp_modules([model]):
            raise ValueError(
                f"ReferenceFSDPStrategy found no FSDP unit in {type(model).__name__}: shard it in configure_model, "
                'e.g. fully_shard(layer, mesh=self.device_mesh["data_parallel"]) for each block'
            )
        if context.prepare_module(model) is not model:
            raise RuntimeError(
                f"a process group of {dist.get_world_size()} ranks is running: use ReferenceDDPStrategy, which "
                "lets the reference synchronise gradients through Lightning's DistributedDataParallel"
            )
        self._inner = list(strategy.optimizers)
        self._wrappers = {id(optimizer): context.wrap(optimizer) for optimizer in self._inner}
        self.plugin.wrappers = self._wrappers
        self._strategy = strategy
        self._hooks = context.register_hooks(
            before_backward=self._before_backward,
            after_backward=self._after_backward,
            before_optimizer_step=self._before_optimizer_step,
            after_step=self._after_step,
        )
        strategy.optimizers = self._inner  # ``self.optimizers()`` now returns the wrappers
        self.changes.decide_accumulation(self._accumulates)
        self._start_training()

    def _check_closure_evaluators(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Refuse an optimizer that evaluates its closure itself (LBFGS) under accumulation, before training starts.

        The contract refuses it (CLOS-002); Lightning runs it, but zeroes gradients only at a window's first batch,
        so the re-evaluations of the closing batch add onto the window's accumulated gradients.
        """
        every = self.settings.accumulate_grad_batches
        for optimizer in optimizers:
            if every > 1 and evaluates_closure(optimizer):
                name = type(optimizer).__name__
                raise ValueError(
                    f"{name} evaluates its closure several times per step and cannot accumulate gradients, so the "
                    f"reference refuses Trainer(accumulate_grad_batches={every}) for it. Plain Lightning runs it, but "
                    "zeroes the gradients only at a window's first batch: each re-evaluation on the closing batch "
                    f"adds onto the accumulated gradients, and {name} steps on their sum. Use "
                    "Trainer(accumulate_grad_batches=1) for a module that optimizes with "
                    f"{name}"
                )

    def _accumulates(self, lightning_rule: Callable[[], bool]) -> bool:
        """Lightning's question "does this batch only accumulate?": its own rule, or an open window before validation.

        Lightning clears every gradient before a validation run inside training (``on_validation_model_zero_grad``)
        unless it accumulates; a window the context holds open (``make_optimizer_step=False``) keeps its gradients.
        """
        if lightning_rule():
            return True
        context = self.plugin.context
        return bool(self.trainer.validating) and context is not None and context.holds_open_window()

    def lightning_optimizers(self, optimizers: list[torch.optim.Optimizer]) -> list[WrappedOptimizer[Any]]:
        """The wrappers of ``optimizers``, in their order (none before set-up)."""
        return [self._wrappers[id(optimizer)] for optimizer in optimizers if id(optimizer) in self._wrappers]

    def wrappers(self) -> list[WrappedOptimizer[Any]]:
        """Every wrapper of this run, in the order of ``configure_optimizers``."""
        return self.lightning_optimizers(self._inner)

    # -- Lightning's training iteration ----------------------------------------------------------------------

    @abstractmethod
    def start_batch(self) -> None:
        """A training batch starts (the strategy's ``on_train_batch_start``)."""

    @abstractmethod
    def end_batch(self) -> None:
        """The training batch ended or failed."""

    @abstractmethod
    def training_step(self, step: Callable[[], Any]) -> Any:
        """Run Lightning's ``training_step`` (``step``) where the mode runs it."""

    @abstractmethod
    def backward_region(self, context: TrainingContext) -> AbstractContextManager[Any]:
        """Where Lightning's own backward runs, relative to the context's autocast region."""

    def _iteration(self) -> AbstractContextManager[None]:
        """One training iteration: the context's ``batch`` block at Lightning's position in the epoch."""
        context = self.plugin.context
        if context is None:
            raise RuntimeError("training_step ran before the reference strategy was set up")
        batch_idx, is_last = lightning_compat.loop_position(self.trainer)
        return context.batch(batch_idx, is_last=is_last)

    # -- the context's hooks: Lightning's hooks, DDP's preparation, the global step --------------------------

    def _before_backward(self, wrapper: Any, loss: torch.Tensor) -> None:
        """A wrapper's backward, as Lightning's own: the strategy prepares (DDP's reducer), then the hooks."""
        assert self._strategy is not None
        self._strategy.pre_backward(loss)
        _call_hooks(self.trainer, "on_before_backward", loss)

    def _after_backward(self, wrapper: Any, loss: torch.Tensor) -> None:
        assert self._strategy is not None
        _call_hooks(self.trainer, "on_after_backward")
        self._strategy.post_backward(loss)

    def _before_optimizer_step(self, wrapper: Any) -> None:
        """After the window's preparation (mean, unscaling, clipping): the gradients the step applies."""
        _call_hooks(self.trainer, "on_before_optimizer_step", wrapper.optimizer)

    @abstractmethod
    def _after_step(self, wrapper: Any, outcome: StepOutcome) -> None:
        """A wrapper's ``step()`` returned with ``outcome``."""

    def teardown(self) -> None:
        """Remove the step hooks and what Lightning's loop set on the optimizers; give the Trainer its settings back.

        The context is released: nothing of the strategy, the Trainer or the module keeps it or its wrappers
        (``self.optimizers()`` returns Lightning's own ``LightningOptimizer`` again, as after a plain fit), so once
        collected it no longer wraps the optimizers, and a later fit can wrap the same optimizer objects again.
        """
        self.end_batch()
        if self._hooks is not None:
            self._hooks.remove()
        strategy, self._hooks, self._strategy = self._strategy, None, None
        self.plugin.step_loss = None
        self.changes.restore()
        for optimizer in self._inner:
            lightning_compat.forget_loop_injections(optimizer)
        if strategy is not None:
            lightning_compat.set_strategy_optimizers(strategy, strategy.optimizers)
        self.plugin.attach(None)
        self.plugin.wrappers = {}
        self._wrappers = {}


class ManualLoop(Loop):
    """Manual optimization: one ``TrainingContext.batch`` block around each ``training_step``.

    Lightning refuses ``accumulate_grad_batches`` and ``gradient_clip_val`` for manual optimization: the loop hides
    both from it until it has checked its arguments, and the context applies them (``make_optimizer_step=None``
    closes the Trainer's windows; each window's mean is clipped). ``trainer.global_step`` counts the steps that
    close a window, as Lightning counts each ``step()`` of its ``LightningOptimizer`` (a 16-mixed step skipped for
    non-finite gradients included); a micro-step that only accumulates has no counterpart in Lightning and counts
    nothing.
    """

    @staticmethod
    def _reference_clip_val(trainer: Trainer) -> float | None:
        return trainer.gradient_clip_val

    def _take_over(self) -> None:
        self.changes.take_accumulation_and_clipping()

    def _start_training(self) -> None:
        self.changes.give_accumulation_back()

    def start_batch(self) -> None:
        """Nothing: the ``batch`` block opens around ``training_step``."""

    def end_batch(self) -> None:
        """Nothing: the ``batch`` block closed with ``training_step``."""

    def training_step(self, step: Callable[[], Any]) -> Any:
        """``training_step`` inside one ``batch`` block."""
        with self._iteration():
            return step()

    def backward_region(self, context: TrainingContext) -> AbstractContextManager[Any]:
        """Where ``training_step`` calls ``manual_backward``: inside Lightning's forward region, as in Lightning.

        The wrappers' ``opt.backward(loss)`` leaves it itself.
        """
        return nullcontext()

    def _after_step(self, wrapper: Any, outcome: StepOutcome) -> None:
        if outcome is StepOutcome.STEPPED or outcome is StepOutcome.SKIPPED_NON_FINITE:
            lightning_compat.count_manual_optimizer_step(self.trainer)


class _BatchBoundary(Callback):
    """Ends automatic optimization's ``batch`` block before any other callback sees the batch's end."""

    def __init__(self, loop: AutomaticLoop) -> None:
        self._loop = loop

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        """The iteration is over: the loss scaler updates, before checkpoints or loggers read the context."""
        self._loop.end_batch()


class AutomaticLoop(Loop):
    """Automatic optimization: the ``batch`` block spans the batch; Lightning's windows, the reference's micro-steps.

    Lightning runs ``training_step`` inside the closure that the wrapper's ``step()`` evaluates, so the block opens
    at the strategy's ``on_train_batch_start`` and closes at the first ``on_train_batch_end`` callback. As in
    Lightning, the module's ``optimizer_step`` runs once per window, at the batch that closes it (the epoch's last
    batch closes a shorter one), and is handed the wrapper; each batch before it is a micro-step of the wrapper
    (``step(closure)``, which accumulates), where Lightning would run the closure itself. The closure is Lightning's:
    ``training_step``, ``on_before_zero_grad`` and ``optimizer_zero_grad`` at a window's first batch, the backward.
    Lightning counts ``trainer.global_step``, steps the LR schedulers and logs by its own rule, once per window.
    ``Trainer(gradient_clip_val=...)`` clips through the module's ``configure_gradient_clipping``, as in Lightning.
    """

    def __init__(
        self,
        trainer: Trainer,
        plugin: ReferencePrecision,
        settings: RunSettings,
        changes: TrainerChanges,
        *,
        sharded: bool,
    ) -> None:
        super().__init__(trainer, plugin, settings, changes, sharded=sharded)
        self._batch = ExitStack()
        self._closure_ran = False
        """The running batch's ``training_step`` ran (its closure was executed)."""

    @staticmethod
    def _reference_clip_val(trainer: Trainer) -> float | None:
        return None  # Lightning's ``configure_gradient_clipping`` clips, called before each real step

    def _take_over(self) -> None:
        """Nothing: Lightning accepts the Trainer's accumulation and clipping for automatic optimization."""

    def _start_training(self) -> None:
        self.changes.route_accumulating_batches(self._micro_step)
        self.changes.insert_callback(_BatchBoundary(self))

    def start_batch(self) -> None:
        """Open the batch's ``batch`` block.

        A schedule that changed ``trainer.accumulate_grad_batches`` (``GradientAccumulationScheduler``, at the
        start of an epoch) reaches the context here.
        """
        self.end_batch()  # a batch Lightning did not finish (``on_train_batch_start`` returned -1)
        self._closure_ran = False
        context = self.plugin.context
        if context is None:
            return
        context.accumulate_grad_batches = self.trainer.accumulate_grad_batches
        self._batch.enter_context(self._iteration())

    def end_batch(self) -> None:
        """Close the batch's ``batch`` block, if one is open: the iteration's scaler update."""
        self._batch.close()

    def _micro_step(self, closure: Callable[[], Any]) -> None:
        """A batch that only accumulates: its closure in one micro-step of the (one) wrapper."""
        wrappers = self.wrappers()
        if not wrappers:
            closure()  # no optimizer (``configure_optimizers`` returned None): Lightning's own way
            return
        wrappers[0].step(closure)

    def training_step(self, step: Callable[[], Any]) -> Any:
        """``training_step`` (inside the wrapper's closure), its loss kept for the plugin's backward."""
        self._closure_ran = True
        output = step()
        loss = output.get("loss") if isinstance(output, Mapping) else output
        self.plugin.step_loss = loss if isinstance(loss, torch.Tensor) else None
        return output

    def backward_region(self, context: TrainingContext) -> AbstractContextManager[Any]:
        """Outside autocast, as Lightning's loop runs it after ``training_step``.

        The reference evaluates the closure inside the context's autocast region.
        """
        return outside_autocast(context.device)

    def _before_optimizer_step(self, wrapper: Any) -> None:
        """Refuse a step whose batch never ran its closure; the hooks, then Lightning's clipping, as its loop does.

        The window is prepared already, so ``clip_gradients`` unscales nothing again.
        """
        if not self._closure_ran and not evaluates_closure(wrapper.optimizer):
            raise MisconfigurationException(
                "The closure hasn't been executed: optimizer_step called optimizer.step() without running "
                "optimizer_closure, which runs training_step, zero_grad and the backward of this batch. Call "
                "optimizer.step(closure=optimizer_closure) in your optimizer_step override (or run optimizer_closure() "
                "before optimizer.step()). The window was not stepped."
            )
        super()._before_optimizer_step(wrapper)
        trainer = self.trainer
        trainer.lightning_module.configure_gradient_clipping(
            wrapper.optimizer,
            gradient_clip_val=trainer.gradient_clip_val,
            gradient_clip_algorithm=trainer.gradient_clip_algorithm,
        )

    def _after_step(self, wrapper: Any, outcome: StepOutcome) -> None:
        """Nothing: Lightning counts the global step itself, one per ``optimizer_step`` of a closing batch."""


class Integration:
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
        trainer = lightning_compat.attached_trainer(model)
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

    A subclass makes its :class:`Integration` before calling its Lightning strategy's constructor.
    """

    _integration: Integration
    _DEVICE_TYPES: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    @classmethod
    def _check_device(cls, device: torch.device) -> None:
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
        self._integration.connect(model)
        super().connect(model)

    def setup(self, trainer: Trainer) -> None:
        """Lightning's set-up, then the reference's context and wrappers."""
        super().setup(trainer)
        self._integration.setup(self, trainer)

    @property
    def precision_plugin(self) -> Precision:
        """The reference's :class:`ReferencePrecision`, always."""
        return self._integration.plugin

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        # Lightning's connector hands a strategy made from a registered name a plugin of its own choosing (for
        # 16-mixed on the CPU, after switching the Trainer to bf16-mixed with a warning). The reference keeps its
        # own, and takes on the precision the connector settled, so ``trainer.precision`` reads it from the start.
        own = self._integration.plugin
        if isinstance(plugin, ReferencePrecision) and plugin is not own:
            raise ValueError("a reference strategy runs its own ReferencePrecision; set Trainer(precision=...)")
        lightning_compat.set_strategy_precision_plugin(self, own)
        flag = lightning_compat.precision_being_settled()
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
        lightning_compat.set_strategy_optimizers(self, optimizers)
        # What ``LightningModule.optimizers()`` returns: the reference's wrappers instead of LightningOptimizers.
        lightning_compat.set_module_optimizers(self, self._integration.lightning_optimizers(optimizers))

    @property
    def reference_context(self) -> TrainingContext | None:
        """The reference's training context of the running fit, ``None`` outside one."""
        return self._integration.plugin.context

    def on_train_start(self) -> None:
        """Restore a checkpoint's open windows (after Lightning's ``zero_grad`` at the start of the run)."""
        super().on_train_start()
        self._integration.plugin.restore_loaded_state()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Under automatic optimization, the batch's ``TrainingContext.batch`` block opens here."""
        super().on_train_batch_start(batch, batch_idx)
        if self._integration.loop is not None:
            self._integration.loop.start_batch()

    def on_exception(self, exception: BaseException) -> None:
        """A failed fit: close the open ``batch`` block."""
        if self._integration.loop is not None:
            self._integration.loop.end_batch()
        super().on_exception(exception)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's training step, where the running loop runs it.

        Manual optimization: inside one ``TrainingContext.batch`` block. Automatic optimization: inside the closure
        of the wrapper's ``step()``, in the block the batch opened. Outside a run (before setup, after teardown: a
        loop driven by hand) it is Lightning's own, on the Trainer's own optimizers.
        """
        loop = self._integration.loop
        if loop is None:
            return super().training_step(*args, **kwargs)
        return loop.training_step(lambda: super(ReferenceStrategyBase, self).training_step(*args, **kwargs))

    def teardown(self) -> None:
        """Lightning's teardown; the Trainer gets its own settings back."""
        self._integration.teardown()
        super().teardown()
