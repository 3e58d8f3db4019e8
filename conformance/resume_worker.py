"""Resume the checkpoint scenario in a fresh process: ``python -m ... IMPL DEVICE PRECISION CKPT START OUT``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from lightning_optimizer.conformance.checkpointing import resume
from lightning_optimizer.conformance.selection import load_implementation
from lightning_optimizer.spec import Cell, TrainingContext


def main(argv: list[str]) -> int:
    """Load the implementation, resume from the checkpoint, save the final parameters."""
    impl, device, precision, checkpoint, start, out = argv
    info = load_implementation(impl).info
    cell = Cell(device, precision)  # type: ignore[arg-type]

    def make_context(**kwargs: Any) -> TrainingContext:
        context: TrainingContext = info.factory(cell, **kwargs)
        return context

    torch.save(resume(make_context, cell, Path(checkpoint).read_bytes(), int(start)), out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
