"""PICKLE mutants: copies.

``pickle`` and ``copy.deepcopy`` of a wrapper or of a whole training state give working, independent copies.
"""
