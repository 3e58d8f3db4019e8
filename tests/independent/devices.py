"""Device names, XLA's own reduction and graph cut, and the DDP process group the context runs in."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def import_torch_xla() -> Any:
    """torch_xla, or an ``ImportError`` that names it and says how to get it."""
    try:
        import torch_xla
    except ImportError as exc:
        raise ImportError(
            "device 'xla' needs torch_xla, which cannot be imported here; install it (pip install torch_xla) or "
            "use device 'cpu' or 'cuda'"
        ) from exc
    return torch_xla


def distributed_world_size() -> int:
    """The number of ranks of the running ``torch.distributed`` process group (1 without one)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def resolve(kind: str) -> torch.device:
    """The ``torch.device`` of a device kind, for this process (its own GPU when several ranks share a host)."""
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was asked for, but torch finds no CUDA device here")
        if distributed_world_size() > 1:
            return torch.device("cuda", dist.get_rank() % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    device: torch.device = import_torch_xla().device()
    return device


def reduce_across_replicas(optimizer: torch.optim.Optimizer) -> None:
    """XLA: torch_xla's own all-reduce of the optimizer's gradients across replicas."""
    import_torch_xla()
    import torch_xla.core.xla_model as xm

    with_grads = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not with_grads:
        return  # an all-reduce of nothing aborts torch_xla
    xm.reduce_gradients(optimizer)
    # The all-reduce is in place; views made before it (by in-place accumulation or division) keep reading the
    # old values in torch_xla, and its clip_grad_norm_ writes through views: fresh tensors end the aliasing.
    for param in with_grads:
        param.grad = None if param.grad is None else param.grad.clone()


def cut_graph() -> None:
    """XLA: cut and run the pending graph once."""
    import_torch_xla().sync()
