"""The reference implementation of the optimizer-wrapper contract.

Build a :class:`TrainingContext`, prepare the model with it, wrap each optimizer with it::

    from lightning_optimizer.reference import TrainingContext

    ctx = TrainingContext(precision="32-true", device="cpu", accumulate_grad_batches=2)
    model = ctx.prepare_module(model)
    opt = ctx.wrap(torch.optim.Adam(model.parameters()))
"""

from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.suite_info import conformance_info
from lightning_optimizer.reference.window import evaluates_closure
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec import __version__ as __version__

__all__ = ["TrainingContext", "WrappedOptimizer", "conformance_info", "evaluates_closure"]
