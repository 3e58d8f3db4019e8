"""PROXY mutants: the wrapper as a proxy of its inner optimizer.

``isinstance``, the inner optimizer's own members, writes that reach it, step hooks on real steps, ``repr``.
"""
