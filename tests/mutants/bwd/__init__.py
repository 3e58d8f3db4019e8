"""BWD mutants: a wrapper's ``backward``.

``loss.backward`` with every argument forwarded (the loss scaled under 16-mixed); autograd and its hooks run outside
autocast wherever it is called.
"""
