"""CTX mutants: the context's arguments and blocks.

``accumulate_grad_batches`` and ``gradient_clip_val`` checked at construction; ``batch()`` blocks that do not nest
and leave nothing behind.
"""
