"""ERR mutants: refused input.

Bad input raises the documented error before anything changes: closures, flags, names, step keyword arguments, state
layouts, parameters ``wrap`` cannot take, optimizers another context wraps.
"""
