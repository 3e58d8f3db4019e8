"""Lightning's own tests of manual optimization and ``LightningOptimizer``, run with the reference swapped in."""
