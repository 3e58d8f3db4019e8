"""FSDP mutants: sharded training.

Modules sharded by ``fully_shard``, no gradient sync in micro-steps, the global batch's result on every rank, one
skip decision for all ranks, checkpoints through ``torch.distributed.checkpoint``.
"""
