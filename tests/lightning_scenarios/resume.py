"""Resume the 16-mixed GAN from a checkpoint saved inside an accumulation window, in a fresh process.

``python -m lightning_scenarios.resume CHECKPOINT OUTPUT ROOT`` writes the final parameters and the global step
to OUTPUT (``torch.save``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from lightning_scenarios.shared import ResumableBatches, gan_batches, run_gan


def main(checkpoint: Path, output: Path, root: Path) -> None:
    model, trainer = run_gan(root, ResumableBatches(gan_batches()), ckpt_path=checkpoint)
    params = [param.detach().clone() for param in model.parameters()]
    torch.save({"params": params, "global_step": trainer.global_step}, output)


if __name__ == "__main__":
    main(*(Path(arg) for arg in sys.argv[1:4]))
