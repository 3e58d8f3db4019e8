"""The reference strategies for ``pytorch_lightning.Trainer``, from ``lightning_optimizer.reference.lightning``'s files.

They are built from the same source files with ``pytorch_lightning`` and ``lightning_fabric`` in place of
``lightning.pytorch`` and ``lightning.fabric`` (see :mod:`lightning_optimizer.reference.twin_loader`).

Importing this module replaces it by that package, which registers the ``Trainer(strategy="reference")`` names in
``pytorch_lightning``'s ``StrategyRegistry``. Its public names are those of ``lightning_optimizer.reference.lightning``.
"""

import sys

from lightning_optimizer.reference.twin_loader import load_twin

sys.modules[__name__] = load_twin()
