"""Checks of what each precision does to the module and to the forward pass."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from lightning_optimizer.conformance.harness import make_model
from lightning_optimizer.spec import Cell, TrainingContext

MakeContext = Callable[..., TrainingContext]


@pytest.mark.requirement("PREC-001")
@pytest.mark.cells(precisions=("64-true", "32-true"))
@pytest.mark.varies(modules=("1 prepared module",))
def test_true_precision_has_no_autocast(make_context: MakeContext, cell: Cell) -> None:
    """64-true and 32-true keep float64 and float32 parameters and compute the forward pass in that dtype."""
    context = make_context()
    model = context.prepare_module(make_model())
    want = torch.float64 if cell.precision == "64-true" else torch.float32
    dtypes = {param.dtype for param in model.parameters()}
    assert dtypes == {want}, f"{cell.precision}: prepare_module left parameters in {sorted(map(str, dtypes))}"
    x = torch.randn(3, 4, dtype=want, device=next(model.parameters()).device)
    with context.autocast():
        out = model(x)
        enabled = torch.is_autocast_enabled(x.device.type)
    assert not enabled, f"{cell.precision}: autocast is enabled inside context.autocast()"
    assert out.dtype == want, f"{cell.precision}: the forward pass computed in {out.dtype}"
