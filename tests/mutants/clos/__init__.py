"""CLOS mutants: closures.

A closure runs once per call in the context's autocast region, is evaluated by optimizers that evaluate closures
themselves (LBFGS) with gradients cleared per evaluation, and is handed to the inner step; one that raises changes
nothing.
"""
