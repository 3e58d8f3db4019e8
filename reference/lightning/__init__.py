"""Lightning integration: the reference's wrappers inside a real ``lightning.pytorch.Trainer.fit``.

A project changes one argument, the Trainer's ``strategy``::

    import lightning as L
    from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy

    trainer = L.Trainer(strategy=ReferenceSingleDeviceStrategy(), precision="16-mixed", accumulate_grad_batches=2)

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
The strategies are in :mod:`.strategies` and :mod:`.xla`, what they share in :mod:`.base` and (one loop per
optimization mode) :mod:`.loops`, the precision plugin in :mod:`.precision`; every field of Lightning they touch
outside the public API is in :mod:`.compat`.

This package is written against ``lightning.pytorch`` and needs the ``lightning`` distribution
(``pip install 'lightning-optimizer[lightning]'``). For ``pytorch_lightning.Trainer`` (the ``pytorch-lightning``
distribution) use ``lightning_optimizer.reference.pytorch_lightning``: the same source files, with its imports
rewritten as they are imported (:mod:`lightning_optimizer.reference.twin_loader`), with the same names, registered in
``pytorch_lightning``'s registry. ``lightning_optimizer.reference`` itself imports neither.
"""

from __future__ import annotations

from lightning_optimizer.reference.module_optimizers import wrapped_optimizers
from lightning_optimizer.reference.twin_loader import missing_lightning

try:
    from lightning_optimizer.reference.lightning.precision import ReferencePrecision
    from lightning_optimizer.reference.lightning.strategies import (
        STRATEGY_NAMES,
        ReferenceDDPStrategy,
        ReferenceFSDPStrategy,
        ReferenceSingleDeviceStrategy,
        register_strategies,
    )
    from lightning_optimizer.reference.lightning.xla import ReferenceXLAAccelerator, ReferenceXLAStrategy
except ModuleNotFoundError as error:
    raise missing_lightning(__name__, error) from error

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

register_strategies()
