"""Resume the checkpoint scenario in a fresh process.

``python -m lightning_optimizer.conformance.resume_worker IMPL DEVICE PRECISION OUT START=CKPT [START=CKPT ...]``
resumes each checkpoint file ``CKPT`` at batch ``START`` in new objects of this one process, and saves the list
of their trajectories (``{"start", "params", "scales"}`` each) to ``OUT``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from lightning_optimizer.conformance.checkpointing import resume
from lightning_optimizer.conformance.harness import build_context
from lightning_optimizer.conformance.selection import load_implementation
from lightning_optimizer.spec import Cell, TrainingContext


def main(argv: list[str]) -> int:
    """Load the implementation, resume from each checkpoint, save every trajectory."""
    impl, device, precision, out, *resumes = argv
    info = load_implementation(impl).info
    cell = Cell(device, precision)  # type: ignore[arg-type]

    def make_context(**kwargs: Any) -> TrainingContext:
        context: TrainingContext = build_context(info.factory, cell, **kwargs)
        return context

    trajectories = []
    for item in resumes:
        start, _, checkpoint = item.partition("=")
        trajectory = resume(make_context, cell, Path(checkpoint).read_bytes(), int(start))
        trajectories.append({"start": int(start), "params": trajectory.params, "scales": trajectory.scales})
    torch.save(trajectories, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
