"""ACC mutants: accumulation.

A real step applies the mean of its window's micro-batch gradients, whatever the window's length or the call form;
an epoch's last partial window is flushed, never dropped or carried over.
"""
