"""The README's quickstart runs as written and does what the README says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lightning_optimizer.spec import StepOutcome

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_runs_with_the_cadences_it_describes() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    quickstart = next(block for block in blocks if "opt_gen.step(" in block)
    namespace: dict[str, Any] = {}
    exec(compile(quickstart, "README.md quickstart", "exec"), namespace)
    opt_gen, opt_dis = namespace["opt_gen"], namespace["opt_dis"]
    # 8 batches: the generator steps at batches 0, 2, 4, 6 (batch 7 leaves a window open), the discriminator at 0, 4.
    steps = {float(state["step"]) for state in opt_gen.optimizer.state.values()}
    assert steps == {4.0}, f"the generator's Adam took {steps} steps, expected 4"
    assert opt_gen.last_outcome is StepOutcome.ACCUMULATED
    assert opt_dis.last_outcome is StepOutcome.STEPPED
    assert all(p.grad is not None for p in namespace["gen"].parameters()), "batch 7's window should be open"
