"""XLA mutants: XLA.

The window's gradients are reduced across replicas once per real step, after its last backward, and the lazy graph
is cut after the step; under SPMD a window is one graph.
"""
