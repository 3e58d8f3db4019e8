"""Lightning integration: the reference's wrappers inside a real ``pytorch_lightning.Trainer.fit``.

A project changes one argument, the Trainer's ``strategy``::

    from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy

    trainer = Trainer(strategy=ReferenceSingleDeviceStrategy(), precision="16-mixed", accumulate_grad_batches=2)

(``ReferenceDDPStrategy`` for several processes, ``ReferenceXLAStrategy`` on one XLA device; or by name, once this
module is imported: ``Trainer(strategy="reference")``, ``"reference_ddp"``, ``"reference_xla"``, ... see
:data:`STRATEGY_NAMES`.) Under manual optimization ``self.optimizers()`` returns the reference's wrappers, so the
proposal's ``opt.backward(loss)`` and ``opt.step(closure=..., make_optimizer_step=...)`` work as the contract
says; under automatic optimization ``optimizer_step`` receives the wrapper, and its
``optimizer.step(closure=optimizer_closure)`` is one micro-step. The Trainer's precision, device,
``accumulate_grad_batches`` and ``gradient_clip_val`` are applied by a :class:`TrainingContext`; Lightning neither
autocasts nor scales: the strategy brings :class:`ReferencePrecision` into Lightning's precision slot. Lightning's
hooks, DDP's preparation before each backward and the global step come from the context's hooks
(``TrainingContext.register_hooks``).

Why a strategy: Lightning settles the precision when the ``Trainer`` is built, before any module or callback
code runs, and there it turns ``precision="16-mixed"`` on the CPU into ``"bf16-mixed"``, unless the strategy
brings its own precision plugin. The strategy also owns what the reference must take over from Lightning: the
precision plugin, the training iteration (one ``TrainingContext.batch`` per batch), the DDP wrapper and the
``backward`` that DDP has to be prepared for, Lightning's accumulation bookkeeping, and ``connect``, the one hook
that runs before Lightning rejects ``accumulate_grad_batches`` and ``gradient_clip_val`` for manual optimization.
Every field of Lightning it touches outside the public API is in :mod:`.lightning_compat`.

This module needs ``pytorch-lightning``; ``lightning_optimizer.reference`` itself does not import it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar, cast, overload

import torch
import torch.distributed as dist
from torch.amp.grad_scaler import GradScaler
from torch.nn.parallel import DistributedDataParallel
from torch.utils.hooks import RemovableHandle

from lightning_optimizer.reference.clipping import ClipAlgorithm
from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.fsdp import fsdp_modules
from lightning_optimizer.reference.precision import outside_autocast
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec.implementation import GradScalerSettings
from lightning_optimizer.spec.types import PRECISIONS, StepOutcome
from lightning_optimizer.spec.types import Precision as PrecisionName

try:
    from pytorch_lightning import Callback, LightningModule, Trainer
    from pytorch_lightning.accelerators import XLAAccelerator
    from pytorch_lightning.plugins.precision import DoublePrecision, HalfPrecision, Precision
    from pytorch_lightning.strategies import (
        DDPStrategy,
        ModelParallelStrategy,
        SingleDeviceStrategy,
        Strategy,
        StrategyRegistry,
    )
    from pytorch_lightning.strategies.single_xla import SingleDeviceXLAStrategy
    from pytorch_lightning.trainer.states import TrainerFn
    from pytorch_lightning.utilities import GradClipAlgorithmType

    from lightning_optimizer.reference import lightning_compat
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

_STATE_FORMAT = 1


# Attributes Lightning's manual-optimization loop sets on every object ``self.optimizers()`` returns; on a
# reference wrapper they land on the inner optimizer, and are removed again at teardown.
def _dtype_plugin(precision: PrecisionName) -> Precision:
    """Lightning's own plugin for what a precision means for dtypes: module, inputs, default dtype in steps."""
    if precision == "64-true":
        return DoublePrecision()
    if precision == "bf16-true":
        return HalfPrecision("bf16-true")
    return Precision()


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_to_cpu(item) for item in value]
    return value


class ReferencePrecision(Precision):
    """Lightning's precision plugin slot, filled by the reference's :class:`TrainingContext`.

    Module and input dtypes follow Lightning's own plugin for the precision (``64-true``, ``bf16-true``);
    autocast and loss scaling are the context's, applied once. Its checkpoint state is the context's
    ``state_dict()`` (per rank under DDP), so a run resumes with open windows and the loss scaler intact.
    Made by the reference strategies; not passed to the ``Trainer`` on its own.
    """

    def __init__(self) -> None:
        super().__init__()
        self.precision = "32-true"
        self._dtypes: Precision = Precision()
        self.context: TrainingContext | None = None
        """The running context: set up by the strategy, ``None`` outside a run."""
        self._rank, self._world_size = 0, 1
        self._pending_state: dict[str, Any] | None = None
        self.wrappers: dict[int, WrappedOptimizer[Any]] = {}
        """The run's wrappers by the ``id`` of their inner optimizer (set by the strategy)."""
        self.step_loss: torch.Tensor | None = None
        """Automatic optimization: the loss the running ``training_step`` returned, for its backward."""

    def configure(self, precision: PrecisionName) -> None:
        """Take on the Trainer's precision (called by the strategy when it connects)."""
        self.precision = precision
        self._dtypes = _dtype_plugin(precision)

    def attach(self, context: TrainingContext | None, rank: int = 0, world_size: int = 1) -> None:
        """Use ``context`` (``None``: the run ended) on rank ``rank`` of ``world_size``."""
        self.context, self._rank, self._world_size = context, rank, world_size
        self._pending_state = None

    def restore_loaded_state(self) -> None:
        """Give the context the state ``load_state_dict`` received, once training starts.

        Lightning clears every gradient (``LightningModule.zero_grad``) after it restores a checkpoint and before
        training starts; the open windows' gradients are put back after that.
        """
        if self.context is not None and self._pending_state is not None:
            contexts, self._pending_state = self._pending_state["contexts"], None
            self.context.load_state_dict(contexts[self._rank])

    # -- dtypes: Lightning's plugin for the precision -----------------------------------------------------

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast the module to the precision's parameter dtype (before any DDP wrapper is built)."""
        return self._dtypes.convert_module(module)

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point inputs as Lightning does for ``64-true`` and ``bf16-true``."""
        return self._dtypes.convert_input(data)

    def tensor_init_context(self) -> AbstractContextManager[Any]:
        """The default dtype while tensors are created (``Trainer.init_module``)."""
        return self._dtypes.tensor_init_context()

    def module_init_context(self) -> AbstractContextManager[Any]:
        """The default dtype while the module is created (``configure_model``)."""
        return self._dtypes.module_init_context()

    @contextmanager
    def forward_context(self) -> Iterator[None]:
        """Training, validation and prediction steps: the precision's default dtype and the context's autocast."""
        with ExitStack() as stack:
            stack.enter_context(self._dtypes.forward_context())
            if self.context is not None:
                stack.enter_context(self.context.autocast())
            yield

    # -- Lightning's own backward (``self.manual_backward``) -------------------------------------------------

    def pre_backward(self, tensor: torch.Tensor, module: LightningModule) -> torch.Tensor:  # type: ignore[override]
        """Lightning's hooks, then the context's loss scale (16-mixed), as the wrappers' ``backward`` applies it.

        Under automatic optimization the loss is the training step's own (:attr:`step_loss`): Lightning divides it
        by ``accumulate_grad_batches`` first, and the reference takes the window's mean itself, by the window's
        real length (also when the epoch's last window is shorter). Under 16-mixed the scaled loss is the recipe's
        ``scaler.scale(loss / N)`` either way (AMP-007).
        """
        step_loss, self.step_loss = self.step_loss, None
        tensor = super().pre_backward(tensor if step_loss is None else step_loss, module)
        return (
            tensor
            if self.context is None
            else self.context.parts.scaling.scale(tensor, self.context.accumulate_grad_batches)
        )

    def backward(  # type: ignore[override]
        self,
        tensor: torch.Tensor,
        model: LightningModule,
        optimizer: torch.optim.Optimizer | None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Lightning's backward; the 1.x form ``manual_backward(loss, opt)`` is refused before autograd runs.

        ``opt`` would otherwise reach ``Tensor.backward`` as its ``gradient`` and fail inside autograd.
        """
        if args and isinstance(args[0], torch.optim.Optimizer):
            raise TypeError(
                f"manual_backward(loss, {type(args[0]).__name__}) is Lightning 1.x's form; Lightning 2 passes "
                "further arguments to Tensor.backward. Call self.manual_backward(loss), or opt.backward(loss) on "
                "the wrapper of that optimizer"
            )
        super().backward(tensor, model, optimizer, *args, **kwargs)

    def clip_gradients(
        self,
        optimizer: torch.optim.Optimizer,
        clip_val: int | float = 0.0,
        gradient_clip_algorithm: GradClipAlgorithmType = GradClipAlgorithmType.NORM,
    ) -> None:
        """``self.clip_gradients(opt, ...)``: clip what the step will apply, the window's mean, unscaled (once).

        The wrapper's ``unscale_gradients()`` prepares the window first (CLIP-002), so under 16-mixed the clip
        threshold meets unscaled gradients, and the closing ``step()`` does not unscale again. As with
        ``unscale_gradients()``, the next ``step()`` of that optimizer must close its window.
        """
        if clip_val <= 0:
            return
        wrapper = optimizer if isinstance(optimizer, WrappedOptimizer) else self.wrappers.get(id(optimizer))
        if wrapper is not None:
            wrapper.unscale_gradients()
            optimizer = wrapper.optimizer
        super().clip_gradients(optimizer, clip_val, gradient_clip_algorithm)

    # -- checkpoints -----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The context's state (every rank's, gathered on all ranks under DDP); empty outside a run."""
        if self.context is None:
            return {}
        own = _to_cpu(self.context.state_dict())
        if self._world_size == 1:
            contexts: list[Any] = [own]
        else:
            contexts = [None] * self._world_size
            dist.all_gather_object(contexts, own)
        return {"format": _STATE_FORMAT, "precision": self.precision, "contexts": contexts}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check a checkpoint's state now; this rank's part reaches the context when training starts."""
        if state_dict.get("format") != _STATE_FORMAT or not isinstance(state_dict.get("contexts"), list):
            raise ValueError(f"not a ReferencePrecision checkpoint state of format {_STATE_FORMAT}")
        contexts = state_dict["contexts"]
        if len(contexts) != self._world_size:
            raise ValueError(
                f"the checkpoint holds the training-context state of {len(contexts)} ranks, this run has "
                f"{self._world_size}: resume with the world size that saved it"
            )
        self._pending_state = state_dict


@dataclass(frozen=True)
class _Settings:
    """What the reference takes over from the Trainer's arguments."""

    precision: PrecisionName
    accumulate_grad_batches: int
    gradient_clip_val: float | None
    gradient_clip_algorithm: ClipAlgorithm
    grad_scaler: GradScalerSettings | None = None

    def context(self, device: str, *, sharded: bool = False) -> TrainingContext:
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


def _requested_precision(trainer: Trainer) -> PrecisionName:
    flag = lightning_compat.requested_precision(trainer)
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


def _settings_from(trainer: Trainer, grad_scaler: GradScalerSettings | None, *, automatic: bool) -> _Settings:
    """The context's settings; under automatic optimization Lightning's ``configure_gradient_clipping`` clips."""
    clip_val = None if automatic else trainer.gradient_clip_val
    algorithm = trainer.gradient_clip_algorithm
    precision = _requested_precision(trainer)
    if grad_scaler is not None and precision != "16-mixed":
        raise ValueError(
            f"the strategy's grad_scaler settings apply to Trainer(precision='16-mixed'), the one precision that "
            f"scales the loss; this Trainer runs {precision!r}: drop grad_scaler or use 16-mixed"
        )
    settings = _Settings(
        precision=precision,
        accumulate_grad_batches=trainer.accumulate_grad_batches,
        gradient_clip_val=None if clip_val is None or clip_val == 0 else float(clip_val),
        gradient_clip_algorithm="value" if algorithm is not None and algorithm.value == "value" else "norm",
        grad_scaler=grad_scaler,
    )
    settings.context("cpu")  # the reference validates every setting now, before anything changes
    return settings


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


class _BatchBoundary(Callback):
    """Ends automatic optimization's ``batch`` block before any other callback sees the batch's end."""

    def __init__(self, integration: _Integration) -> None:
        self._integration = integration

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        """The iteration is over: the loss scaler updates, before checkpoints or loggers read the context."""
        self._integration.end_batch()


class _Integration:
    """What the reference strategies share: the Trainer settings, the context's lifetime, the wrappers.

    Manual optimization: one ``TrainingContext.batch`` block around each ``training_step``. Automatic
    optimization: the block spans the batch, from the strategy's ``on_train_batch_start`` to the first
    ``on_train_batch_end`` callback, because Lightning runs ``training_step`` inside the closure that the
    wrapper's ``step()`` evaluates; and the loop's accumulation bookkeeping (global step, LR schedulers of
    ``interval="step"``, logging, clearing gradients for validation) follows the steps the wrapper took.
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
        self.settings: _Settings | None = None
        self._trainer_arguments: tuple[int, int | float | None, Any] | None = None
        self._wrappers: dict[int, WrappedOptimizer[Any]] = {}
        self._hooks: RemovableHandle | None = None
        self._inner: list[torch.optim.Optimizer] = []
        self._trainer: Trainer | None = None
        self._strategy: Strategy | None = None
        self.automatic = False
        """The LightningModule uses automatic optimization (set when the strategy connects)."""
        self._open_batch: AbstractContextManager[None] | None = None
        self._boundary: _BatchBoundary | None = None
        self._in_batches = False
        self._stepped_in_batch = False

    def connect(self, model: LightningModule) -> None:
        """Take the precision, accumulation and clipping over from the Trainer, before Lightning validates them."""
        trainer = self._trainer = model.trainer
        self.automatic = model.automatic_optimization
        if self._trainer_arguments is None:
            self.settings = _settings_from(trainer, self.grad_scaler, automatic=self.automatic)
            self._trainer_arguments = (
                trainer.accumulate_grad_batches,
                trainer.gradient_clip_val,
                trainer.gradient_clip_algorithm,
            )
            if not self.automatic:
                # Lightning refuses both for manual optimization; the reference applies them (accumulation is
                # given back once Lightning has checked, for ``trainer.estimated_stepping_batches`` and the loop).
                trainer.accumulate_grad_batches = 1
                trainer.gradient_clip_val = None
        assert self.settings is not None
        self.plugin.configure(self.settings.precision)

    def setup(self, strategy: Strategy, trainer: Trainer) -> None:
        """Build the context once Lightning has placed the model, then wrap every optimizer with it."""
        if self.settings is None:
            raise RuntimeError("the strategy was set up before it was connected to a LightningModule")
        device = strategy.root_device
        if device.type not in ("cpu", "cuda", "xla"):
            raise ValueError(f"the reference strategies run on CPU, CUDA and XLA, not {device.type!r}")
        if device.type == "xla" and not isinstance(strategy, ReferenceXLAStrategy):
            raise ValueError("on an XLA device use strategy=ReferenceXLAStrategy()")
        context = self.settings.context(device.type, sharded=self.sharded)
        self.plugin.attach(context, trainer.global_rank, trainer.world_size)
        if trainer.state.fn != TrainerFn.FITTING:
            return
        model = strategy.model
        assert model is not None
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
        if not self.automatic and self._trainer_arguments is not None:
            trainer.accumulate_grad_batches = self._trainer_arguments[0]  # Lightning has checked its arguments
        self._strategy = strategy
        self._hooks = context.register_hooks(
            before_backward=self._before_backward,
            after_backward=self._after_backward,
            before_optimizer_step=self._before_optimizer_step,
            after_step=self._after_step,
        )
        strategy.optimizers = self._inner  # ``self.optimizers()`` now returns the wrappers
        if self.automatic:
            lightning_compat.decide_accumulation(trainer, self._accumulates)
            self._boundary = _BatchBoundary(self)
            _callbacks(trainer).insert(0, self._boundary)

    # -- the context's hooks: Lightning's hooks, DDP's preparation, the global step --------------------------

    def _before_backward(self, wrapper: Any, loss: torch.Tensor) -> None:
        """A wrapper's backward, as Lightning's own: the strategy prepares (DDP's reducer), then the hooks."""
        assert self._strategy is not None and self._trainer is not None
        self._strategy.pre_backward(loss)
        _call_hooks(self._trainer, "on_before_backward", loss)

    def _after_backward(self, wrapper: Any, loss: torch.Tensor) -> None:
        assert self._strategy is not None and self._trainer is not None
        _call_hooks(self._trainer, "on_after_backward")
        self._strategy.post_backward(loss)

    def _before_optimizer_step(self, wrapper: Any) -> None:
        """After the window's preparation (mean, unscaling, clipping): the gradients the step applies.

        Under automatic optimization Lightning then clips through the module's hook, as its own loop does; the
        window is prepared already, so ``clip_gradients`` unscales nothing again.
        """
        trainer = self._trainer
        assert trainer is not None
        optimizer = wrapper.optimizer
        _call_hooks(trainer, "on_before_optimizer_step", optimizer)
        if self.automatic:
            trainer.lightning_module.configure_gradient_clipping(
                optimizer,
                gradient_clip_val=trainer.gradient_clip_val,
                gradient_clip_algorithm=trainer.gradient_clip_algorithm,
            )

    def _after_step(self, wrapper: Any, outcome: StepOutcome) -> None:
        """One global step per optimizer step applied (an accumulating micro-step or a skipped step is none)."""
        if outcome is StepOutcome.STEPPED and self._trainer is not None:
            self._stepped_in_batch = True
            lightning_compat.count_optimizer_step(self._trainer, automatic=self.automatic)

    def _accumulates(self, lightning_rule: Callable[[], bool]) -> bool:
        """Lightning's question "does this batch only accumulate?", answered by the steps the wrapper took."""
        if not self._in_batches:
            return lightning_rule()  # asked before the first batch of this fit (a restart): Lightning's own rule
        context = self.plugin.context
        return not self._stepped_in_batch or (context is not None and context.holds_open_window())

    def start_batch(self) -> None:
        """A training batch starts: under automatic optimization, open its ``batch`` block.

        A schedule that changed ``trainer.accumulate_grad_batches`` (``GradientAccumulationScheduler``, at the
        start of an epoch) reaches the context here.
        """
        self.end_batch()  # a batch Lightning did not finish (``on_train_batch_start`` returned -1)
        self._in_batches, self._stepped_in_batch = True, False
        context, trainer = self.plugin.context, self._trainer
        if not self.automatic or context is None or trainer is None:
            return
        context.accumulate_grad_batches = trainer.accumulate_grad_batches
        block = self.iteration()
        block.__enter__()
        self._open_batch = block

    def end_batch(self) -> None:
        """Close the automatic-optimization ``batch`` block, if one is open: the iteration's scaler update."""
        block, self._open_batch = self._open_batch, None
        if block is not None:
            block.__exit__(None, None, None)

    def remember_loss(self, output: Any) -> None:
        """The loss ``training_step`` returned (automatic optimization): its backward is the plugin's."""
        loss = output.get("loss") if isinstance(output, Mapping) else output
        self.plugin.step_loss = loss if isinstance(loss, torch.Tensor) else None

    def lightning_optimizers(self, optimizers: list[torch.optim.Optimizer]) -> list[WrappedOptimizer[Any]]:
        """The wrappers of ``optimizers``, in their order (none before set-up)."""
        return [self._wrappers[id(optimizer)] for optimizer in optimizers if id(optimizer) in self._wrappers]

    def wrappers(self) -> list[WrappedOptimizer[Any]]:
        """Every wrapper of this run, in the order of ``configure_optimizers``."""
        return self.lightning_optimizers(self._inner)

    def iteration(self) -> AbstractContextManager[None]:
        """One training iteration: the context's ``batch`` block at Lightning's position in the epoch."""
        context, trainer = self.plugin.context, self._trainer
        if context is None or trainer is None:
            raise RuntimeError("training_step ran before the reference strategy was set up")
        batch_idx, is_last = lightning_compat.loop_position(trainer)
        return context.batch(batch_idx, is_last=is_last)

    def teardown(self) -> None:
        """Remove the step hooks and what the loop set on the optimizers; give the Trainer its arguments back."""
        self.end_batch()
        trainer, self._trainer, self._strategy = self._trainer, None, None
        if self._hooks is not None:
            self._hooks.remove()
        self._hooks = None
        self._in_batches, self._stepped_in_batch = False, False
        self.plugin.step_loss = None
        if trainer is not None:
            lightning_compat.forget_accumulation_decision(trainer)
            if self._boundary is not None and self._boundary in _callbacks(trainer):
                _callbacks(trainer).remove(self._boundary)
        self._boundary = None
        for optimizer in self._inner:
            lightning_compat.forget_loop_injections(optimizer)
        self.plugin.attach(None)
        self.plugin.wrappers = {}
        if trainer is not None and self._trainer_arguments is not None:
            accumulate, clip_val, clip_algorithm = self._trainer_arguments
            trainer.accumulate_grad_batches = accumulate
            trainer.gradient_clip_val = clip_val
            trainer.gradient_clip_algorithm = clip_algorithm
        self._trainer_arguments = None


class _ReferenceStrategy(Strategy):
    """The overrides both reference strategies make to their Lightning strategy."""

    _integration: _Integration

    def connect(self, model: LightningModule) -> None:
        """Connect the model; take the Trainer's precision, accumulation and clipping over for the reference."""
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
        # own: the precision it runs is the Trainer's, read when the strategy connects.
        if isinstance(plugin, ReferencePrecision) and plugin is not self._integration.plugin:
            raise ValueError("a reference strategy runs its own ReferencePrecision; set Trainer(precision=...)")
        lightning_compat.set_strategy_precision_plugin(self, self._integration.plugin)

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

    @property
    def handles_gradient_accumulation(self) -> bool:
        """Under automatic optimization the reference accumulates: Lightning calls ``optimizer_step`` every batch."""
        return self._integration.automatic

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Under automatic optimization, the batch's ``TrainingContext.batch`` block opens here."""
        super().on_train_batch_start(batch, batch_idx)
        self._integration.start_batch()

    def on_exception(self, exception: BaseException) -> None:
        """A failed fit: close the open ``batch`` block."""
        self._integration.end_batch()
        super().on_exception(exception)

    def backward(
        self, closure_loss: torch.Tensor, optimizer: torch.optim.Optimizer | None, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        """Lightning's backward (``manual_backward``, the automatic closure's), where Lightning runs it [BWD-002].

        Automatic optimization: outside autocast, as Lightning's loop runs it after ``training_step`` (the reference
        evaluates the closure inside the context's autocast region). Manual optimization: where ``training_step``
        calls ``manual_backward``, inside Lightning's forward region, as plain Lightning runs it; the wrappers'
        ``opt.backward(loss)`` leaves it. Either way it is a scaled backward for the 16-mixed closure check.
        """
        context = self._integration.plugin.context
        if context is None:
            return super().backward(closure_loss, optimizer, *args, **kwargs)
        leave = outside_autocast(context.device) if self._integration.automatic else nullcontext()
        with leave, context.parts.scaling.backward():  # a scaled backward, for the closure's check [AMP-008]
            return super().backward(closure_loss, optimizer, *args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's training step, inside one ``TrainingContext.batch`` block under manual optimization.

        Under automatic optimization it runs inside the closure of the wrapper's ``step()``, in the block the
        batch opened.
        """
        if self._integration.automatic:
            output = super().training_step(*args, **kwargs)
            self._integration.remember_loss(output)
            return output
        with self._integration.iteration():
            return super().training_step(*args, **kwargs)

    def teardown(self) -> None:
        """Lightning's teardown; the Trainer gets its own arguments back."""
        self._integration.teardown()
        super().teardown()


class ReferenceSingleDeviceStrategy(_ReferenceStrategy, SingleDeviceStrategy):
    """One process, one device (CPU or CUDA), the reference doing precision, accumulation and clipping.

    ``device`` defaults to the device the Trainer's ``accelerator`` and ``devices`` choose. ``grad_scaler``
    configures the loss scaler of ``Trainer(precision="16-mixed")`` (``torch.amp.GradScaler``'s arguments; ``None``:
    torch's defaults).
    """

    def __init__(
        self, device: torch.device | str | int | None = None, *, grad_scaler: GradScalerSettings | None = None
    ) -> None:
        self._integration = _Integration(grad_scaler)
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


class ReferenceDDPStrategy(_ReferenceStrategy, DDPStrategy):
    """Lightning's DDP (one process per device, gloo on CPU, NCCL on CUDA), the reference driving the sync.

    Accepts :class:`~pytorch_lightning.strategies.DDPStrategy`'s arguments (``find_unused_parameters``,
    ``start_method``, ``process_group_backend``, ...) except ``precision_plugin``. Micro-steps that do not close
    a window run under ``no_sync()``: a window costs one all-reduce. With several optimizers each closure's
    backward reaches only its own optimizer's parameters, which DDP allows with ``find_unused_parameters=True``.
    Use ``opt.backward(loss)`` or ``self.manual_backward(loss)`` (DDP must be prepared for each backward).
    ``grad_scaler`` configures the loss scaler of ``Trainer(precision="16-mixed")``, as on the single-device
    strategy.
    """

    def __init__(self, *, grad_scaler: GradScalerSettings | None = None, **kwargs: Any) -> None:
        if "precision_plugin" in kwargs:
            raise TypeError("ReferenceDDPStrategy brings its own precision plugin; set Trainer(precision=...)")
        self._integration = _Integration(grad_scaler)
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


class ReferenceFSDPStrategy(_ReferenceStrategy, ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` for FSDP2 (one process per device), the reference driving the sync.

    Shard the model in the LightningModule's ``configure_model`` with ``fully_shard`` over
    ``self.device_mesh["data_parallel"]``, as Lightning documents for this strategy; the reference keeps that
    sharding. Micro-steps that do not close a window run without gradient sync, so a window costs one
    reduce-scatter round; the window mean, unscaling and clipping (by the global norm) apply to the shards.
    Every rank is one data-parallel rank (``tensor_parallel_size=1``). Checkpoints are Lightning's: sharded through
    ``torch.distributed.checkpoint`` (``save_distributed_checkpoint=True``), the reference's state of every rank
    in the checkpoint's metadata. ``grad_scaler`` configures the loss scaler of ``Trainer(precision="16-mixed")``.
    """

    def __init__(
        self,
        *,
        grad_scaler: GradScalerSettings | None = None,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        **kwargs: Any,
    ) -> None:
        if "precision_plugin" in kwargs or "tensor_parallel_size" in kwargs or "data_parallel_size" in kwargs:
            raise TypeError(
                "ReferenceFSDPStrategy brings its own precision plugin and runs every rank as one data-parallel rank: "
                "set Trainer(precision=...) and Trainer(devices=...)"
            )
        self._integration = _Integration(grad_scaler, sharded=True)
        super().__init__(
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            **kwargs,
        )

    def setup_environment(self) -> None:
        """Lightning's set-up, with a device mesh of one data-parallel axis over every rank."""
        lightning_compat.set_model_parallel_sizes(self, self.num_nodes * self.num_processes, 1)
        super().setup_environment()


class ReferenceXLAAccelerator(XLAAccelerator):
    """Lightning's XLA accelerator, finding devices on every PJRT backend, torch_xla's CPU backend included.

    On a TPU (torch_xla's runtime reports the device type ``"TPU"``) every answer is Lightning's own, so its
    device discovery there is unchanged. On another backend (``PJRT_DEVICE=CPU``), where Lightning's accelerator
    asks the TPU metadata server and reports itself unavailable, the devices are the ones torch_xla's runtime
    addresses. :class:`ReferenceXLAStrategy` brings it; it is not passed to the ``Trainer`` on its own.
    """

    @staticmethod
    def _runtime() -> tuple[str | None, int]:
        from lightning_optimizer.reference.xla import runtime_devices

        return runtime_devices()

    @staticmethod
    def auto_device_count() -> int:  # type: ignore[override]  # Lightning's is wrapped in functools.lru_cache
        """The TPU's devices (Lightning's count) or those of torch_xla's runtime on another backend."""
        if importlib.util.find_spec("torch_xla") is None:
            return 0
        device_type, count = ReferenceXLAAccelerator._runtime()
        if device_type == "TPU":
            return XLAAccelerator.auto_device_count()
        return count

    @staticmethod
    def is_available() -> bool:  # type: ignore[override]  # Lightning's is wrapped in functools.lru_cache
        """torch_xla is installed and its runtime has a device."""
        try:
            return ReferenceXLAAccelerator.auto_device_count() > 0
        except (ValueError, AssertionError, OSError, RuntimeError):
            return False

    @staticmethod
    def parse_devices(devices: int | str | list[int]) -> int | list[int]:
        """``Trainer(devices=...)``: Lightning's rules on a TPU; one device (``1``, ``"1"``, ``[0]``) elsewhere."""
        if ReferenceXLAAccelerator._runtime()[0] == "TPU":
            return XLAAccelerator.parse_devices(devices)
        parsed = int(devices) if isinstance(devices, str) and devices.strip().isdigit() else devices
        if parsed == 1 or parsed == [0]:
            return parsed
        raise ValueError(
            f"Trainer(devices={devices!r}): the reference runs one XLA device through Lightning on this backend; "
            "use devices=1"
        )

    @staticmethod
    def get_parallel_devices(devices: int | list[int]) -> list[torch.device]:
        """The XLA devices the Trainer runs on."""
        parsed = ReferenceXLAAccelerator.parse_devices(devices)
        if isinstance(parsed, int):
            return [torch.device("xla", i) for i in range(parsed)]
        return [torch.device("xla", parsed[0])]


class ReferenceXLAStrategy(_ReferenceStrategy, SingleDeviceXLAStrategy):  # type: ignore[misc]  # plugin: not XLAPrecision
    """One XLA device (a TPU core, or torch_xla's CPU backend), the reference doing precision and the step.

    ``Trainer(strategy=ReferenceXLAStrategy(), devices=1)``: the strategy brings :class:`ReferenceXLAAccelerator`,
    so ``accelerator`` is left out. On a real step the window's gradients are reduced once (torch_xla does nothing
    with one replica), the optimizer steps and the graph is cut once; micro-steps that only accumulate cut
    nothing. Checkpoints go through Lightning's ``XLACheckpointIO``. ``grad_scaler`` configures the 16-mixed loss
    scaler, as on the other strategies.
    """

    def __init__(self, device: int = 0, *, grad_scaler: GradScalerSettings | None = None, debug: bool = False) -> None:
        self._integration = _Integration(grad_scaler)
        super().__init__(
            device=device,
            accelerator=ReferenceXLAAccelerator(),
            precision_plugin=self._integration.plugin,  # type: ignore[arg-type]  # the reference's, not XLAPrecision
            debug=debug,
        )


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
