"""CKPT mutants: checkpoints.

The wrapper's state dict is the inner optimizer's; the context's state holds its windows, counts and loss-scaler
state (a pending update too) and refuses a state of another layout.
"""
