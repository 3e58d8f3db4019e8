"""Benchmarks of the reference wrapper against raw PyTorch and the peer frameworks (``make bench``).

Not an installed package: run it from the repository root as ``python -m bench`` (or ``python bench/run.py``).
"""
