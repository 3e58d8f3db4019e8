"""One loop per optimization mode: the reference inside one run of a Trainer.

A reference strategy connects to a LightningModule and picks, once per run of the Trainer, the loop of the module's
optimization mode: :class:`ManualLoop` (one ``TrainingContext.batch`` block around each ``training_step``) or
:class:`AutomaticLoop` (the block spans the batch's optimization, because Lightning runs ``training_step`` inside the
closure the wrapper's ``step()`` evaluates). The loop runs the context's hooks (Lightning's hooks through its own
dispatch, DDP's preparation before each backward, the global step of manual optimization), and
:class:`~.trainer_patches.TrainerPatches` keeps what it changes on the Trainer, given back at teardown; the run's
settings are :class:`~.settings.RunSettings`. The strategies are in
:mod:`.strategies` and :mod:`.xla` on the base of :mod:`.base`; every field of Lightning touched outside its public
API is in :mod:`.compat`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer
from lightning.pytorch.profilers import Profiler
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.hooks import RemovableHandle

from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.fsdp import fsdp_modules
from lightning_optimizer.reference.lightning import compat
from lightning_optimizer.reference.lightning.precision import ReferencePrecision
from lightning_optimizer.reference.lightning.settings import RunSettings
from lightning_optimizer.reference.lightning.trainer_patches import TrainerPatches
from lightning_optimizer.reference.precision import outside_autocast
from lightning_optimizer.reference.window import evaluates_closure
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec.implementation import GradScalerSettings
from lightning_optimizer.spec.types import StepOutcome

if TYPE_CHECKING:
    from lightning_optimizer.reference.lightning.base import ReferenceStrategyBase

__all__ = ["AutomaticLoop", "Loop", "ManualLoop"]


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
        patches: TrainerPatches,
        *,
        sharded: bool,
    ) -> None:
        self.trainer = trainer
        self.plugin = plugin
        self.settings = settings
        self.patches = patches
        self.sharded = sharded
        self._strategy: Strategy | None = None
        self._hooks: RemovableHandle | None = None
        self._inner: list[torch.optim.Optimizer] = []
        """Every optimizer this run wrapped, in the order it was wrapped."""
        self._wrappers: dict[int, WrappedOptimizer[Any]] = {}
        self._batch_started = False
        """The strategy's ``on_train_batch_start`` ran for the latest training batch."""
        self._batch_ran = False
        """The latest training batch ran its ``training_step``."""
        self._flushing = False
        """The loop is flushing the windows of an epoch cut short (:meth:`_flush_cut_epoch`)."""

    @classmethod
    def start(
        cls, trainer: Trainer, plugin: ReferencePrecision, grad_scaler: GradScalerSettings | None, *, sharded: bool
    ) -> Loop:
        """A run's loop: the Trainer's settings read and checked, then taken over (nothing changes if one is bad)."""
        settings = RunSettings.read(
            trainer, grad_scaler, cls._reference_clip_val(trainer), zero_grad_after_step=cls.zero_grad_after_step
        )
        loop = cls(trainer, plugin, settings, TrainerPatches(trainer), sharded=sharded)
        loop._take_over()
        plugin.configure(settings.precision)
        return loop

    zero_grad_after_step: ClassVar[bool]
    """The context's setting in this mode (ZERO-003): whether a real step clears its gradients itself."""

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
        strategy.check_device(device)
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
        self.patches.decide_accumulation(self._accumulates)
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
        """The wrappers of ``optimizers``, in their order (none before set-up).

        During a fit an optimizer the run has not wrapped yet (one that replaces the configured ones after set-up)
        is wrapped by the run's context now, which refuses one whose parameters another wrapper owns. Lightning's
        ``Tuner.lr_find`` hands back the configured optimizer object itself, whose wrapper this is.
        """
        context = self.plugin.context
        if self._strategy is not None and context is not None:
            for optimizer in optimizers:
                if id(optimizer) not in self._wrappers:
                    self._wrappers[id(optimizer)] = context.wrap(optimizer)
                    self._inner.append(optimizer)
        return [self._wrappers[id(optimizer)] for optimizer in optimizers if id(optimizer) in self._wrappers]

    def wrappers(self) -> list[WrappedOptimizer[Any]]:
        """The wrappers of the strategy's optimizers, in their order (those of ``configure_optimizers``)."""
        return [] if self._strategy is None else self.lightning_optimizers(self._strategy.optimizers)

    # -- Lightning's training iteration ----------------------------------------------------------------------

    def start_batch(self) -> None:
        """A training batch starts (the strategy's ``on_train_batch_start``).

        When the batch before it ran no ``training_step``, the module's ``on_train_batch_start`` returned -1 there,
        which ended that batch's epoch: its open windows are flushed first (:meth:`_flush_cut_epoch`).
        """
        self._end_cut_epoch()
        self._batch_started, self._batch_ran = True, False

    def end_training(self) -> None:
        """Training is over (the strategy's ``on_train_end``): an epoch cut short by -1 is flushed now."""
        self._end_cut_epoch()
        self._batch_started = False

    @abstractmethod
    def end_batch(self) -> None:
        """The training batch's optimization ended or failed."""

    def training_step(self, step: Callable[[], Any]) -> Any:
        """Run Lightning's ``training_step`` (``step``) where the mode runs it."""
        self._batch_ran = True
        return self._run_training_step(step)

    @abstractmethod
    def _run_training_step(self, step: Callable[[], Any]) -> Any:
        """Run ``step`` where the mode runs Lightning's ``training_step``."""

    def _end_cut_epoch(self) -> None:
        """Flush the windows of an epoch that ended at a batch whose ``training_step`` did not run, then end it."""
        if self._batch_started and not self._batch_ran:
            try:
                self._flush_cut_epoch()
            finally:
                self.end_batch()

    def _flush_cut_epoch(self) -> None:
        """Close every window the epoch left open: a real step on each, as its last batch would have taken [ACC-003].

        The module's ``on_train_batch_start`` returned -1, so the batch that ran last was the epoch's last batch,
        but Lightning did not say so when it ran. Its open windows (a wrapper whose last ``step()`` only
        accumulated) would otherwise carry their micro-steps into the next epoch's windows. Each flush is a
        ``step(make_optimizer_step=True)`` without a closure in one iteration of the loop, with Lightning's
        ``on_before_optimizer_step`` (and clipping) as for any real step. That call is a micro-step of its own
        without gradients (ACC-001 takes the mean over ``k + 1`` micro-steps), so the window's ``k`` micro-steps'
        gradients are multiplied by ``(k + 1) / k`` first: the step applies their mean. Under DDP and FSDP the
        window's micro-steps ran without sync and no backward is left to reduce them: refused there.
        """
        context = self.plugin.context
        assert context is not None
        pending = [entry["pending"] for entry in context.state_dict()["optimizers"]]
        wrappers = self.lightning_optimizers(self._inner)  # the context's order
        open_windows = [
            (wrapper, pending[index])
            for index, wrapper in enumerate(wrappers)
            if wrapper.last_outcome is StepOutcome.ACCUMULATED and pending[index]
        ]
        if not open_windows:
            return
        if self.trainer.world_size > 1:
            raise RuntimeError(
                "on_train_batch_start returned -1 inside an accumulation window, which ended the epoch with "
                f"{sum(count for _, count in open_windows)} micro-step(s) that no rank synchronised: under "
                f"{type(self._strategy).__name__} the epoch's last window cannot be flushed without a backward. Return "
                "-1 at a window's first batch (batch_idx % accumulate_grad_batches == 0), or leave the epoch's length "
                "to the data (limit_train_batches)"
            )
        self._flushing = True
        try:
            with self._flush_iteration():
                for wrapper, count in open_windows:
                    with torch.no_grad():
                        for group in wrapper.param_groups:
                            for param in group["params"]:
                                if param.grad is not None:
                                    param.grad.mul_((count + 1) / count)
                    wrapper.step(make_optimizer_step=True)
        finally:
            self._flushing = False

    @abstractmethod
    def _flush_iteration(self) -> AbstractContextManager[None]:
        """The loop iteration the flush of a cut epoch runs in."""

    @abstractmethod
    def backward_region(self, context: TrainingContext) -> AbstractContextManager[Any]:
        """Where Lightning's own backward runs, relative to the context's autocast region."""

    def _iteration(self) -> AbstractContextManager[None]:
        """One training iteration: the context's ``batch`` block at Lightning's position in the epoch."""
        context = self.plugin.context
        if context is None:
            raise RuntimeError("training_step ran before the reference strategy was set up")
        batch_idx, is_last = compat.loop_position(self.trainer)
        return context.batch(batch_idx, is_last=is_last)

    # -- the context's hooks: Lightning's hooks, DDP's preparation, the global step --------------------------

    def _before_backward(self, wrapper: Any, loss: torch.Tensor) -> None:
        """A wrapper's backward, as Lightning's own: the strategy prepares (DDP's reducer), then the hooks.

        Every hook goes through Lightning's own dispatch, so ``Trainer(profiler=...)`` records it as Lightning's loop
        calls do.
        """
        assert self._strategy is not None
        self._strategy.pre_backward(loss)
        compat.call_hook(self.trainer, "on_before_backward", loss)

    def _after_backward(self, wrapper: Any, loss: torch.Tensor) -> None:
        assert self._strategy is not None
        compat.call_hook(self.trainer, "on_after_backward")
        self._strategy.post_backward(loss)

    def _before_optimizer_step(self, wrapper: Any) -> None:
        """After the window's preparation (mean, unscaling, clipping): the gradients the step applies."""
        compat.call_hook(self.trainer, "on_before_optimizer_step", wrapper.optimizer)

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
        self._batch_started = False
        if self._hooks is not None:
            self._hooks.remove()
        strategy, self._hooks, self._strategy = self._strategy, None, None
        self.plugin.step_loss = None
        self.patches.restore()
        for optimizer in self._inner:
            compat.forget_loop_injections(optimizer)
        if strategy is not None:
            compat.set_strategy_optimizers(strategy, strategy.optimizers)
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
    nothing. A real step clears the gradients it applied (``zero_grad_after_step=True``, the proposal's promise), so
    a module that never calls ``opt.zero_grad()`` still gets fresh windows; plain Lightning leaves them until it
    does (a divergence the README's table lists).
    """

    zero_grad_after_step = True

    @staticmethod
    def _reference_clip_val(trainer: Trainer) -> float | None:
        return trainer.gradient_clip_val

    def _take_over(self) -> None:
        self.patches.take_accumulation_and_clipping()

    def _start_training(self) -> None:
        self.patches.give_accumulation_back()

    def end_batch(self) -> None:
        """Nothing: the ``batch`` block closed with ``training_step``."""

    def _run_training_step(self, step: Callable[[], Any]) -> Any:
        """``training_step`` inside one ``batch`` block."""
        with self._iteration():
            return step()

    def _flush_iteration(self) -> AbstractContextManager[None]:
        """A ``batch`` block of its own (the cut epoch's blocks closed with their ``training_step``)."""
        return self._iteration()

    def backward_region(self, context: TrainingContext) -> AbstractContextManager[Any]:
        """Where ``training_step`` calls ``manual_backward``: inside Lightning's forward region, as in Lightning.

        The wrappers' ``opt.backward(loss)`` leaves it itself.
        """
        return nullcontext()

    _PROFILED_STEP = "optimizer_step"
    """What Lightning's manual loop profiles around each ``LightningOptimizer.step()`` that counts a global step."""
    _profiling_step = False
    """The profiler's :attr:`_PROFILED_STEP` action is running (a step's hooks ran, its ``after_step`` has not)."""

    def _before_optimizer_step(self, wrapper: Any) -> None:
        """The hooks, then the profiler's ``optimizer_step`` action, as Lightning's manual loop starts it per step."""
        super()._before_optimizer_step(wrapper)
        self._stop_profiling_step()  # a step that failed after its hooks ran never got to ``_after_step``
        self._profiler().start(self._PROFILED_STEP)
        self._profiling_step = True

    def _after_step(self, wrapper: Any, outcome: StepOutcome) -> None:
        """A step that closed a window: the profiler's action ends and ``trainer.global_step`` counts it."""
        if outcome is StepOutcome.STEPPED or outcome is StepOutcome.SKIPPED_NON_FINITE:
            self._stop_profiling_step()
            compat.count_manual_optimizer_step(self.trainer)

    def _stop_profiling_step(self) -> None:
        if self._profiling_step:
            self._profiling_step = False
            self._profiler().stop(self._PROFILED_STEP)

    def _profiler(self) -> Profiler:
        """``trainer.profiler`` (set by the Trainer's constructor, which Lightning does not annotate)."""
        profiler: Profiler = self.trainer.profiler  # type: ignore[attr-defined]
        return profiler

    def teardown(self) -> None:
        """End the profiler's action of a step that failed, then the loop's teardown."""
        self._stop_profiling_step()
        super().teardown()


class AutomaticLoop(Loop):
    """Automatic optimization: the ``batch`` block spans the batch; Lightning's windows, the reference's micro-steps.

    Lightning runs ``training_step`` inside the closure that the wrapper's ``step()`` evaluates, so the block opens
    at the strategy's ``on_train_batch_start`` and closes when Lightning's automatic loop has run the batch, before
    Lightning steps LR schedulers and calls ``on_train_batch_end`` (checkpoints and loggers read the context). As in
    Lightning, the module's ``optimizer_step`` runs once per window, at the batch that closes it (the epoch's last
    batch closes a shorter one), and is handed the wrapper; each batch before it is a micro-step of the wrapper
    (``step(closure)``, which accumulates), where Lightning would run the closure itself. The closure is Lightning's:
    ``training_step``, ``on_before_zero_grad`` and ``optimizer_zero_grad`` at a window's first batch, the backward.
    Lightning counts ``trainer.global_step``, steps the LR schedulers and logs by its own rule, once per window.
    ``Trainer(gradient_clip_val=...)`` clips through the module's ``configure_gradient_clipping``, as in Lightning.
    Gradients are cleared where Lightning clears them, by the module's ``optimizer_zero_grad`` (handed the wrapper):
    the context leaves a real step's gradients to it (``zero_grad_after_step=False``), so an override that keeps
    them across steps trains as on plain Lightning, the kept part carried as it was applied (ZERO-005).
    """

    zero_grad_after_step = False

    def __init__(
        self,
        trainer: Trainer,
        plugin: ReferencePrecision,
        settings: RunSettings,
        patches: TrainerPatches,
        *,
        sharded: bool,
    ) -> None:
        super().__init__(trainer, plugin, settings, patches, sharded=sharded)
        self._batch = ExitStack()

    @staticmethod
    def _reference_clip_val(trainer: Trainer) -> float | None:
        return None  # Lightning's ``configure_gradient_clipping`` clips, called before each real step

    def _take_over(self) -> None:
        """Nothing: Lightning accepts the Trainer's accumulation and clipping for automatic optimization."""

    def _start_training(self) -> None:
        self.patches.route_automatic_batches(self._micro_step, self.end_batch, self._wrapper_of)

    def _wrapper_of(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """What Lightning's closure hands ``on_before_zero_grad`` and ``optimizer_zero_grad``: the wrapper.

        Its ``zero_grad()`` is where the context learns that the gradients a real step left are cleared (ZERO-005).
        """
        return self._wrappers.get(id(optimizer), optimizer)

    def start_batch(self) -> None:
        """Open the batch's ``batch`` block (after flushing an epoch that -1 cut short, see :meth:`Loop.start_batch`).

        A schedule that changed ``trainer.accumulate_grad_batches`` (``GradientAccumulationScheduler``, at the
        start of an epoch) reaches the context here.
        """
        super().start_batch()
        context = self.plugin.context
        if context is None:
            return
        context.accumulate_grad_batches = self.trainer.accumulate_grad_batches
        self._batch.enter_context(self._iteration())

    def end_batch(self) -> None:
        """Close the batch's ``batch`` block, if one is open: the iteration's scaler update."""
        self._batch.close()

    @contextmanager
    def _flush_iteration(self) -> Iterator[None]:
        """The cut epoch's last ``batch`` block, still open: its batch ran no ``training_step``."""
        yield

    def _micro_step(self, closure: Callable[[], Any]) -> None:
        """A batch that only accumulates: its closure in one micro-step of the (one) wrapper."""
        wrappers = self.wrappers()
        if not wrappers:
            closure()  # no optimizer (``configure_optimizers`` returned None): Lightning's own way
            return
        wrappers[0].step(closure)

    def _run_training_step(self, step: Callable[[], Any]) -> Any:
        """``training_step`` (inside the wrapper's closure), its loss kept for the plugin's backward."""
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
        if not self._batch_ran and not self._flushing and not evaluates_closure(wrapper.optimizer):
            raise MisconfigurationException(
                "The closure hasn't been executed: optimizer_step called optimizer.step() without running "
                "optimizer_closure, which runs training_step, zero_grad and the backward of this batch. Call "
                "optimizer.step(closure=optimizer_closure) in your optimizer_step override (or run optimizer_closure() "
                "before optimizer.step()). The window was not stepped."
            )
        super()._before_optimizer_step(wrapper)
        trainer = self.trainer
        compat.call_module_hook(
            trainer,
            "configure_gradient_clipping",
            wrapper.optimizer,
            gradient_clip_val=trainer.gradient_clip_val,
            gradient_clip_algorithm=trainer.gradient_clip_algorithm,
        )

    def _after_step(self, wrapper: Any, outcome: StepOutcome) -> None:
        """Nothing: Lightning counts the global step itself, one per ``optimizer_step`` of a closing batch."""
