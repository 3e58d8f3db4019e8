"""The reference's FSDP2 seams: construction checks, the FSDP fields of ``torch_compat``, world-size refusals.

The sharded behaviour itself is checked by the conformance suite's fsdp cells (``conformance/test_fsdp.py``) on two
gloo ranks. Here one rank in a subprocess (a process group of one: ``fully_shard`` needs one) pins what the
reference reads of FSDP2's internals, so a torch release that moves them fails loudly here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_optimizer.reference import TrainingContext

# A hang guard, never a speed check: the longest process here (two FSDP ranks saving a checkpoint) took 10 s on 2 cores
# beside other jobs (load 3.5); 300 s is 30 times that.
TIMEOUT_S = 300

ONE_RANK = textwrap.dedent(
    """
    import os, socket
    import torch, torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from lightning_optimizer.reference import TrainingContext, torch_compat

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    ctx = TrainingContext(accumulate_grad_batches=2, strategy="fsdp")
    model = ctx.prepare_module(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)))
    assert isinstance(model, FSDPModule), type(model)
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    assert len(units) == 3, units  # each Linear, then the root
    opt = ctx.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(5, 4)

    def closure():
        loss = model(x).square().mean()
        opt.backward(loss)
        return loss

    opt.step(closure)  # accumulates: the backward runs without gradient sync
    unsharded = {k: v for unit in units for k, v in torch_compat.fsdp_unsharded_params(unit).items()}
    params = list(model.parameters())
    assert set(map(id, unsharded)) == set(map(id, params)), "every sharded parameter maps to its unsharded one"
    assert all(p.grad is None for p in params), "the shards get nothing before the window syncs"
    assert all(unsharded[p].grad is not None for p in params), "the unsynced sums sit on the unsharded parameters"
    assert not any(torch_compat.fsdp_accumulates_elsewhere(unit) for unit in units)
    state = ctx.state_dict()
    assert state["world_size"] == 1 and state["optimizers"][0]["pending"] == 1
    assert all(g is not None for g in state["optimizers"][0]["grads"])
    elsewhere = state | {"world_size": 2}
    try:
        ctx.load_state_dict(elsewhere)
    except ValueError as error:
        assert "world size 2" in str(error), error
    else:
        raise AssertionError("a state with an open window from another world size was loaded")
    ctx.load_state_dict(state)
    opt.step(closure)
    assert all(p.grad is None for p in params) and opt.last_outcome.value == "stepped"

    # Sharded by the user: the blocks only (as Lightning's configure_model does), or the whole model.
    from torch.distributed.fsdp import fully_shard
    blocks = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    fully_shard(blocks[0]); fully_shard(blocks[2])
    other = TrainingContext(accumulate_grad_batches=2, strategy="fsdp")
    assert other.prepare_module(blocks) is blocks and not isinstance(blocks, FSDPModule)
    units = getattr(other.parts.parallel, "units", None)
    assert units == [blocks[0], blocks[2]], units
    whole = fully_shard(torch.nn.Sequential(torch.nn.Linear(4, 2)))
    assert other.prepare_module(whole) is whole
    dist.destroy_process_group()
    print("ok")
    """
)


def test_fsdp_internals_and_world_size_refusal_on_one_rank() -> None:
    """The unsharded parameters hold a window's unsynced sums; a state with an open window resumes only at its size."""
    run = subprocess.run([sys.executable, "-c", ONE_RANK], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr


def test_sharded_checkpoint_resumes_at_another_world_size(tmp_path: Path) -> None:
    """Saved on 2 ranks after a real step, resumed on 1: a plain loop's result; an open window refused [FSDP-006]."""
    script = str(Path(__file__).with_name("fsdp_world_sizes.py"))
    for what in ("save", "load"):
        run = subprocess.run(
            [sys.executable, script, what, str(tmp_path)], capture_output=True, text=True, timeout=TIMEOUT_S
        )
        assert run.returncode == 0, f"{what}: {run.stdout}{run.stderr[-3000:]}"
    distance, refused = run.stdout.strip().splitlines()[-1].removeprefix("distance ").split("; ")
    assert float(distance) < 1e-5, run.stdout
    assert refused == "open window from world size 2: refused", run.stdout


def test_fsdp_needs_a_process_group() -> None:
    with pytest.raises(ValueError, match="init_process_group"):
        TrainingContext(strategy="fsdp")


def test_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="'ddp' or 'fsdp'"):
        TrainingContext(strategy="zero3")  # type: ignore[arg-type]
