"""PREC mutants: the precisions.

The dtypes ``prepare_module`` converts to, as Lightning's plugins do; autocast where a precision has it and nowhere
else, with its weight cache off.
"""
