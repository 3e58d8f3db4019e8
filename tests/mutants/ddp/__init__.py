"""DDP mutants: DDP.

Micro-steps run under ``no_sync()``, so a window costs one gradient all-reduce; after a real step every rank holds
the parameters of one process on the global batch.
"""
