"""SURFACE mutants: the surface.

Every member of the wrapper and the context, with every call the protocols allow, at run time and to mypy.
"""
