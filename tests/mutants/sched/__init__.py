"""SCHED mutants: LR schedulers.

On the wrapper or on the inner optimizer: no warning after a real step, none after a step skipped for non-finite
gradients.
"""
