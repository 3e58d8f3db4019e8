"""ZERO mutants: gradients after a real step.

Cleared, or with ``zero_grad_after_step=False`` left and carried into the wrapper's next window; ``zero_grad()``
inside an open window does nothing.
"""
