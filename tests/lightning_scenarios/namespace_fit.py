"""``python -m lightning_scenarios.namespace_fit OUT``: the reference's strategies in the run's Lightning namespace.

Written against ``lightning``, as the other scenarios; ``LIGHTNING_NAMESPACE`` (:mod:`lightning_scenarios.namespace`)
decides whether it runs ``lightning.pytorch`` or ``pytorch_lightning``. Writes ``OUT`` (``torch.save``): where the
Trainer and the strategies come from, what the namespace's ``StrategyRegistry`` holds for each of ``STRATEGY_NAMES``
and which strategy ``Trainer(strategy=name)`` builds, and the parameters of the proposal's GAN after two epochs on
``ReferenceSingleDeviceStrategy()`` in 32-true.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import StrategyRegistry

from lightning_optimizer.reference.lightning import STRATEGY_NAMES, ReferenceSingleDeviceStrategy
from lightning_scenarios.shared import ResumableBatches, gan_batches, gan_class, reference_trainer

BUILT_BY_NAME = {
    "reference": 1,
    "reference_ddp": 2,
    "reference_ddp_find_unused_parameters_true": 2,
    "reference_ddp_spawn": 2,
    "reference_ddp_spawn_find_unused_parameters_true": 2,
    "reference_fsdp": 2,
}
"""Each name a CPU ``Trainer`` is built with (not run), and its devices; ``reference_xla`` needs an XLA device."""


def qualified(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def main(out: Path) -> None:
    registered: dict[str, Any] = {
        name: {
            "strategy": qualified(StrategyRegistry[name]["strategy"]),
            "init_params": StrategyRegistry[name]["init_params"],
        }
        for name in STRATEGY_NAMES
        if name in StrategyRegistry
    }
    by_name = {
        name: qualified(type(Trainer(strategy=name, accelerator="cpu", devices=devices, logger=False).strategy))
        for name, devices in BUILT_BY_NAME.items()
    }
    model = gan_class()()
    trainer = reference_trainer(out.parent, "32-true")
    trainer.fit(model, train_dataloaders=ResumableBatches(gan_batches()))
    torch.save(
        {
            "trainer": qualified(type(trainer)),
            "strategy": qualified(type(trainer.strategy)),
            "strategy_class": qualified(ReferenceSingleDeviceStrategy),
            "registered": registered,
            "by_name": by_name,
            "params": [param.detach().clone() for param in model.parameters()],
            "global_step": trainer.global_step,
        },
        out,
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
