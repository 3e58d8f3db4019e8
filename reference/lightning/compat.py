"""Every field of Lightning that the Lightning integration reads or writes outside its public API.

Lightning has no public way to read ``Trainer(precision=...)`` before its precision plugin is settled (nor, for a
strategy that brings its own plugin, while the Trainer is being built), to ask a LightningModule whether a Trainer
is attached to it without an exception, to call a hook as its own loops do (through the Trainer's profiler), to count
a global step that the strategy's optimizer took, to tell the training loop whether a batch only accumulated (a
strategy can only say that it handles accumulation, not how), to read the loop's position in the epoch, to run a
batch of automatic optimization through the strategy's own optimizer, or to make ``LightningModule.optimizers()``
return other objects than its ``LightningOptimizer``. Each such touch is one function here, and each names the
Lightning versions it was checked on (:data:`CHECKED_ON`);
``tests/test_lightning.py::test_lightning_fields_the_reference_touches_are_where_it_expects`` pins each against the
installed Lightning, so a release that moves one fails there, loudly, not in a training run.

Written against ``lightning.pytorch``; ``lightning_optimizer.reference.pytorch_lightning`` runs this same file with
``pytorch_lightning`` in its place.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer import call
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

__all__ = [
    "CHECKED_ON",
    "LOOP_INJECTED",
    "attached_trainer",
    "call_hook",
    "call_module_hook",
    "count_manual_optimizer_step",
    "decide_accumulation",
    "forget_accumulation_decision",
    "forget_automatic_batches",
    "forget_loop_injections",
    "loop_position",
    "precision_being_settled",
    "requested_precision",
    "route_automatic_batches",
    "set_model_parallel_sizes",
    "set_module_optimizers",
    "set_strategy_optimizers",
    "set_strategy_precision_plugin",
]

OLDEST = "2.5.0"
NEWEST = "2.6.6"

CHECKED_ON: dict[str, tuple[str, ...]] = {}
"""Each function of this module -> the Lightning versions (``lightning`` and ``pytorch_lightning`` alike) it was
checked on by the pin test, which runs in every lane (the pinned newest, and the oldest-Lightning lane)."""

_Function = TypeVar("_Function", bound=Callable[..., Any])


def checked_on(*versions: str) -> Callable[[_Function], _Function]:
    """Record in :data:`CHECKED_ON` the Lightning versions the decorated function was checked on."""

    def record(function: _Function) -> _Function:
        CHECKED_ON[function.__name__] = versions
        return function

    return record


LOOP_INJECTED = ("_on_before_step", "_on_after_step")
"""What Lightning's training loop sets on each optimizer of manual optimization, removed again at teardown."""


@checked_on(OLDEST, NEWEST)
def requested_precision(trainer: Trainer) -> object:
    """``Trainer(precision=...)``, normalised by Lightning ("16" -> "16-mixed"), as the accelerator connector keeps it.

    With a strategy's own precision plugin Lightning never rewrites it (no 16-mixed -> bf16-mixed on the CPU).
    ``None`` when this Lightning keeps it elsewhere.
    """
    return _precision_flag_of(getattr(trainer, "_accelerator_connector", None))


@checked_on(OLDEST, NEWEST)
def precision_being_settled() -> object:
    """``Trainer(precision=...)`` while the Trainer being built hands its strategy the precision plugin, else ``None``.

    Call it from a strategy's ``precision_plugin`` setter. Lightning's accelerator connector settles the precision
    inside ``Trainer.__init__`` and then sets ``strategy.precision_plugin`` (``_lazy_init_strategy``); it passes the
    strategy nothing else that names the precision, and the strategy has no way to its Trainer until it connects
    to a module. So the flag is read from the connector that is calling the setter: the caller's caller.
    ``None`` when the setter was called from elsewhere (the strategy's own constructor, a user).
    """
    frame = inspect.currentframe()
    for _ in range(3):  # this function, the setter, the connector's method
        if frame is None:
            return None
        frame = frame.f_back
        if frame is not None and isinstance(frame.f_locals.get("self"), _AcceleratorConnector):
            return _precision_flag_of(frame.f_locals["self"])
    return None


def _precision_flag_of(connector: object) -> object:
    """The precision flag a Trainer's accelerator connector keeps (see :func:`requested_precision`)."""
    return getattr(connector, "_precision_flag", None)


@checked_on(OLDEST, NEWEST)
def attached_trainer(module: LightningModule) -> Trainer | None:
    """The Trainer attached to ``module``, ``None`` before one is (``module.trainer`` raises then)."""
    trainer: Trainer | None = module._trainer
    return trainer


@checked_on(OLDEST, NEWEST)
def call_hook(trainer: Trainer, name: str, *args: Any) -> None:
    """Lightning's hook ``name`` as its own loops call it: every callback's, then the module's, each profiled.

    ``Trainer(profiler=...)`` records ``[Callback]<state_key>.<name>`` and ``[LightningModule]<class>.<name>``, as for
    the calls of Lightning's own loops, and the module's ``_current_fx_name`` (what ``self.log`` checks) is the hook's.
    """
    call._call_callback_hooks(trainer, name, *args)
    call._call_lightning_module_hook(trainer, name, *args)


@checked_on(OLDEST, NEWEST)
def call_module_hook(trainer: Trainer, name: str, *args: Any, **kwargs: Any) -> Any:
    """The module's hook ``name`` (``configure_gradient_clipping``, ...) as Lightning's loops call it, profiled."""
    return call._call_lightning_module_hook(trainer, name, *args, **kwargs)


@checked_on(OLDEST, NEWEST)
def count_manual_optimizer_step(trainer: Trainer) -> None:
    """Add one to ``trainer.global_step``: one optimizer step applied under manual optimization."""
    progress = trainer.fit_loop.epoch_loop.manual_optimization.optim_step_progress
    progress.increment_ready()
    progress.increment_completed()


@checked_on(OLDEST, NEWEST)
def decide_accumulation(trainer: Trainer, answer: Callable[[Callable[[], bool]], bool]) -> None:
    """Let ``answer`` decide whether the running batch only accumulates (``answer`` gets Lightning's own rule).

    Lightning asks this of its epoch loop before it counts a step of automatic optimization, before it steps LR
    schedulers of ``interval="step"``, before it logs a step, and before it clears gradients for validation.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    lightning_rule: Callable[[], bool] = type(epoch_loop)._should_accumulate.__get__(epoch_loop)
    epoch_loop._should_accumulate = lambda: answer(lightning_rule)  # type: ignore[method-assign]


@checked_on(OLDEST, NEWEST)
def forget_accumulation_decision(trainer: Trainer) -> None:
    """Give the epoch loop its own accumulation rule back."""
    trainer.fit_loop.epoch_loop.__dict__.pop("_should_accumulate", None)


@checked_on(OLDEST, NEWEST)
def route_automatic_batches(
    trainer: Trainer,
    micro_step: Callable[[Callable[[], Any]], object],
    batch_done: Callable[[], None],
    closure_optimizer: Callable[[torch.optim.Optimizer], torch.optim.Optimizer],
) -> None:
    """Run each batch of automatic optimization as Lightning does, through ``micro_step`` and ``batch_done``.

    A batch that only accumulates goes to ``micro_step``; ``batch_done`` is called once the batch's optimization is
    over. Lightning's ``_AutomaticOptimization.run`` builds the batch's closure (``training_step``, the
    ``on_before_zero_grad`` and ``optimizer_zero_grad`` hooks at a window's first batch, the backward), handing it
    the optimizer, here ``closure_optimizer(optimizer)``; on a batch that only accumulates (its
    ``_should_accumulate()``) it calls the closure itself, under its own ``no_sync``, else it calls the module's
    ``optimizer_step`` with it and counts the step. This is that method with ``micro_step(closure)`` in place of
    the first branch (the second is Lightning's own ``_optimizer_step``), and ``batch_done()`` after both, also when
    they raise: before Lightning steps LR schedulers and calls ``on_train_batch_end``.
    """
    loop = trainer.fit_loop.epoch_loop.automatic_optimization

    def run(optimizer: torch.optim.Optimizer, batch_idx: int, kwargs: Any) -> dict[str, Any]:
        try:
            closure = loop._make_closure(kwargs, closure_optimizer(optimizer), batch_idx)
            if trainer.fit_loop._should_accumulate():
                micro_step(closure)
            else:
                loop._optimizer_step(batch_idx, closure)
            result = closure.consume_result()
        finally:
            batch_done()
        return {} if result.loss is None else result.asdict()

    loop.run = run  # type: ignore[method-assign]


@checked_on(OLDEST, NEWEST)
def forget_automatic_batches(trainer: Trainer) -> None:
    """Give the automatic loop its own ``run`` back."""
    trainer.fit_loop.epoch_loop.automatic_optimization.__dict__.pop("run", None)


@checked_on(OLDEST, NEWEST)
def loop_position(trainer: Trainer) -> tuple[int, bool]:
    """The running training batch's index in its epoch, and whether it is the epoch's last."""
    epoch_loop = trainer.fit_loop.epoch_loop
    progress = epoch_loop.batch_progress
    is_last = bool(progress.is_last_batch or progress.current.ready == trainer.num_training_batches)
    return int(epoch_loop.batch_idx), is_last


@checked_on(OLDEST, NEWEST)
def set_strategy_precision_plugin(strategy: Strategy, plugin: Any) -> None:
    """Give ``strategy`` the precision plugin Lightning's connector reads of it, past a subclass's type check.

    ``Strategy.precision_plugin``'s own setter, called directly: ``SingleDeviceXLAStrategy``'s refuses any plugin
    but Lightning's ``XLAPrecision``.
    """
    setter: Any = Strategy.precision_plugin.fset  # type: ignore[attr-defined]
    setter(strategy, plugin)


@checked_on(OLDEST, NEWEST)
def set_strategy_optimizers(strategy: Strategy, optimizers: list[torch.optim.Optimizer]) -> None:
    """Lightning's own ``Strategy.optimizers`` setter (it also builds the ``LightningOptimizer`` list)."""
    setter: Any = Strategy.optimizers.fset  # type: ignore[attr-defined]
    setter(strategy, optimizers)


@checked_on(OLDEST, NEWEST)
def set_module_optimizers(strategy: Strategy, optimizers: list[Any]) -> None:
    """What ``LightningModule.optimizers()`` returns from now on (Lightning's ``LightningOptimizer`` list)."""
    strategy._lightning_optimizers = optimizers


@checked_on(OLDEST, NEWEST)
def forget_loop_injections(optimizer: torch.optim.Optimizer) -> None:
    """Remove what Lightning's loop set on ``optimizer`` (:data:`LOOP_INJECTED`)."""
    for name in LOOP_INJECTED:
        vars(optimizer).pop(name, None)


@checked_on(OLDEST, NEWEST)
def set_model_parallel_sizes(strategy: Strategy, data_parallel: int, tensor_parallel: int) -> None:
    """The mesh sizes ``ModelParallelStrategy`` builds its device mesh from (its constructor's, resolved)."""
    strategy._data_parallel_size = data_parallel  # type: ignore[attr-defined]
    strategy._tensor_parallel_size = tensor_parallel  # type: ignore[attr-defined]
